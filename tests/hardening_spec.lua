-- corral.hardening: which variables may reach a tenant. Each refusal is listed beside
-- look-alikes that must pass, so a pattern that refused everything would fail here.
local hardening = require "corral.hardening"

describe("tenant environment refusals", function()
  it("refuses credential-shaped names, and passes ordinary ones", function()
    for _, name in ipairs({ "GITHUB_TOKEN", "DB_PASS", "MYSQL_PWD", "PGPASSWORD", "aws_secret_access_key",
                            "ANTHROPIC_API_KEY", "SESSION_ID" }) do
      assert.truthy(hardening.refusal(name, "x"), name)
    end
    for _, name in ipairs({ "FOO", "LANG", "COLUMNS", "PYTHONPATH", "EDITOR" }) do
      assert.is_nil(hardening.refusal(name, "x"), name)
    end
  end)

  it("refuses values that carry a credential, whatever the name", function()
    local refused = {
      "postgres://app:hunter2@db/x",
      "Server=db;User Id=app;Password=hunter2;",
      "Driver={x};Server=db;Uid=app;Pwd=hunter2",
      "ghp_0123456789abcdefghijklmnopqrstuvwxyz",
      "github_pat_11ABCDEFG0123456789_abcdefghijkl",
      "glpat-abcdefghijklmnopqrst",
      "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
      "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
      "AKIAIOSFODNN7EXAMPLE",
      "xoxb-1234-5678-abcdefghijkl",
      "-----BEGIN OPENSSH PRIVATE KEY-----\nabc",
    }
    for _, v in ipairs(refused) do assert.truthy(hardening.refusal("V", v), v) end
    local passed = {
      "https://pypi.org/simple",        -- a URL without user information
      "Server=db;Database=app;",         -- a connection string without a secret
      "task-abcdefghijklmnopqrstuvwxyz0123", -- "sk-" inside a word
      "highs_and_lows",
      "/usr/local/bin:/usr/bin",
      "-----BEGIN CERTIFICATE-----",
    }
    for _, v in ipairs(passed) do assert.is_nil(hardening.refusal("V", v), v) end
  end)

  it("finds user information in a URL as the pattern does, in linear time on a long value", function()
    local pattern = "%a[%w+.-]*://[^/%s@]+@"
    local alphabet = { "a", "1", ":", "/", "@", " ", ".", "+", "-", "Z" }
    math.randomseed(12)
    for _ = 1, 5000 do
      local t = {}
      for i = 1, math.random(1, 14) do t[i] = alphabet[math.random(#alphabet)] end
      local v = table.concat(t)
      local why = hardening.refusal("V", v)
      if not why or why:find("URL", 1, true) then
        assert.are.equal(v:find(pattern) ~= nil, why ~= nil, v)
      end
    end
    -- the unanchored pattern took seconds of CPU here (quadratic); every caller variable is
    -- checked. CPU time, not wall time: a busy machine must not decide it.
    local t0 = os.clock()
    assert.is_nil(hardening.refusal("V", string.rep("X", 200000)))
    assert.truthy(os.clock() - t0 < 1, "a 200,000-letter value took over 1 s of CPU")
  end)
end)

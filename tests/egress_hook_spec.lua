-- A policy written as code: `network = {decide = fn}` without an allowlist makes the
-- hook the sole authority (corral.egress.decision). The hook is asked about each name
-- at DNS time and about each connection, against a test server of the test's own.
local corral = require "corral"
local h = require "helpers"
local internet = require "internet"

describe("egress with a decide hook and no allowlist #root #netns", function()
  local net

  setup(function() net = internet.start() end)
  teardown(function() if net then internet.stop(net) end end)

  it("resolves and connects what the hook allows, and nothing it refuses (attempts first, then the control)",
    function()
      local root = h.tmpdir("egress-hook")
      os.execute("chmod 0711 " .. root)
      local seen = {}
      local sb = assert(corral.sandbox({ id = "hook", storage_root = root, network = {
        internal = { net.cidr }, resolve = { ["pypi.org"] = net.ip, ["evil.test"] = net.ip },
        decide = function(ctx)
          seen[#seen + 1] = (ctx.phase or "connect") .. " " .. ctx.name .. (ctx.port and (":" .. ctx.port) or "")
          if ctx.name ~= "pypi.org" then return false, "not pypi" end
          return ctx.phase == "dns" or ctx.port == 8080, "pypi on 8080"
        end } }))
      assert(corral.provision("native", sb))
      local out_path = root .. "/out"
      local r = assert(corral.exec("native", sb, { "sh", "-c",
        "getent hosts evil.test || echo evil-unresolved; " ..
        "curl -s --max-time 3 http://pypi.org:9444/ >/dev/null || echo port-refused; " ..
        "curl -s --max-time 5 http://pypi.org:8080/index.html" }, { output = out_path }))
      corral.destroy("native", sb)
      local out = h.read(out_path) or ""
      h.rmrf(root)
      assert.are.equal(0, r.code, out)
      assert.matches("evil%-unresolved", out)
      assert.matches("port%-refused", out)
      assert.matches("hello%-from%-the%-internet", out) -- the control, last
      local asked = table.concat(seen, ",")
      assert.matches("dns evil%.test", asked)
      assert.matches("dns pypi%.org", asked)
      assert.matches("connect pypi%.org:9444", asked)
      assert.matches("connect pypi%.org:8080", asked)
      assert.not_matches("connect evil", asked)
    end)
end)

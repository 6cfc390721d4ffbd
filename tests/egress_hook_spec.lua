-- A policy written as code: `network = {decide = fn}` without an allowlist makes the
-- hook the sole authority (corral.egress.decision, docs/boundary.md "The decide hook").
-- Every valid name resolves to a synthetic address; the hook is asked once per
-- connection, always with its port. Tested as a user writes it, with curl in a native
-- tenant against a python3 HTTP server of the test's own on the host's loopback; each
-- refused connection first, the allowed one after it. The events of each decision carry
-- `by` (the hook, or the allowlist), in corral.egress.recent() and in the JSON log.
local corral = require "corral"
local events = require "corral.egress.events"
local h = require "helpers"

-- A python3 HTTP server on 127.0.0.1, serving a page of its own; stopped when the test ends.
local function http_server(finally)
  local dir = h.tmpdir("hook-www")
  h.write(dir .. "/index.html", "hello-from-the-hook-test\n")
  local port = h.free_port()
  local p, pid = h.child(string.format("exec /usr/bin/python3 -m http.server %d --bind 127.0.0.1 --directory %s",
    port, h.quote(dir)))
  h.defer(finally, function()
    os.execute("kill " .. pid .. " 2>/dev/null")
    p:close()
    h.rmrf(dir)
  end)
  assert(h.wait_for(function()
    return h.sh(string.format("ss -ltnH 'sport = :%d' | grep -c LISTEN", port)):match("^1")
  end, 10), "the HTTP server did not start")
  return port
end

local function mine(id, kind)
  local out = {}
  for _, ev in ipairs(events.recent()) do
    if ev.sandbox == id and ev.kind == kind then out[#out + 1] = ev end
  end
  return out
end

describe("egress with a decide hook and no allowlist #root #netns", function()
  before_each(function()
    if not io.open("/usr/bin/python3") then pending("needs /usr/bin/python3 for the test's HTTP server") end
    if not h.sh("command -v curl"):find("curl", 1, true) then pending("needs curl in the tenant") end
  end)

  it("asks a hook written to the docs once per connection, with its port; names resolve (attempts, then control)",
    function()
      local port = http_server(finally)
      local root = h.tmpdir("egress-hook")
      os.execute("chmod 0711 " .. root)
      local asked = {}
      -- the hook exactly as docs/boundary.md says to write one: name and port
      local function decide(ctx)
        asked[#asked + 1] = ctx
        return ctx.name == "api.test" and ctx.port == port, "api.test on its port only"
      end
      local log = root .. "/decisions.jsonl"
      local writer, closer = assert(events.json_lines_writer(log))
      events.subscribe(writer)
      local sb = assert(corral.sandbox({ id = "hook", storage_root = root, network = {
        internal = { "127.0.0.0/8" }, resolve = { ["api.test"] = "127.0.0.1", ["evil.test"] = "127.0.0.1" },
        decide = decide } }))
      assert(corral.provision("native", sb))
      local out_path = root .. "/out"
      local r = assert(corral.exec("native", sb, { "sh", "-c",
        "getent hosts evil.test || echo evil-unresolved; " ..
        "curl -s --max-time 5 http://evil.test:" .. port .. "/ >/dev/null || echo evil-refused; " ..
        "curl -s --max-time 5 http://api.test:" .. (port + 1) .. "/ >/dev/null || echo port-refused; " ..
        "echo control; curl -sS --max-time 5 http://api.test:" .. port .. "/index.html" }, { output = out_path }))
      corral.destroy("native", sb)
      events.unsubscribe(writer)
      closer()
      local out = h.read(out_path) or ""
      local lines = h.read(log) or ""
      h.rmrf(root)
      assert.are.equal(0, r.code, out)
      -- a name the hook will refuse still resolves (synthetic), and its connection is reset
      assert.truthy(out:match("198%.18%.%d+%.%d+%s+evil%.test") or out:match("64:ff9b:1::[%x:]+%s+evil%.test"), out)
      assert.is_nil(out:find("evil-unresolved", 1, true), out)
      assert.matches("evil%-refused", out)
      assert.matches("port%-refused", out)
      assert.matches("control\nhello%-from%-the%-hook%-test", out) -- the control, last
      -- every call named a port; one call per connection the acceptor decided
      local connects = mine("hook", "connect")
      assert.are.equal(#connects, #asked)
      local seen = {}
      for _, ctx in ipairs(asked) do
        assert.is_number(ctx.port)
        assert.are.equal("tcp", ctx.protocol or "tcp")
        seen[ctx.name .. ":" .. ctx.port] = true
      end
      assert.truthy(seen["evil.test:" .. port], out)
      assert.truthy(seen["api.test:" .. (port + 1)], out)
      assert.truthy(seen["api.test:" .. port], out)
      -- each decision says the hook made it: recent() and the JSON log
      local allowed = 0
      for _, ev in ipairs(connects) do
        assert.are.equal("hook", ev.by, ev.reason)
        if ev.verdict == "allow" then allowed = allowed + 1 end
      end
      assert.is_true(allowed >= 1)
      assert.is_true(#connects > allowed)
      local n = 0
      for line in lines:gmatch("[^\n]+") do
        if line:find('"kind":"connect"', 1, true) then
          n = n + 1
          assert.truthy(line:find('"by":"hook"', 1, true), line)
        end
      end
      assert.are.equal(#connects, n)
    end)
end)

describe("egress events name the allowlist that decided #root #netns", function()
  before_each(function()
    if not io.open("/usr/bin/python3") then pending("needs /usr/bin/python3 for the test's HTTP server") end
  end)

  it("writes by = allowlist on a denied address and an allowed name, in --log-json and in recent()", function()
    local port = http_server(finally)
    local dir = h.tmpdir("egress-by")
    local log = dir .. "/decisions.jsonl"
    -- 192.0.2.1 (TEST-NET-1) reaches the acceptor on the allowed port and no entry names it
    local out, status = h.corral("run", "--allow", "api.test:" .. port, "--resolve", "api.test=127.0.0.1",
      "--internal", "127.0.0.0/8", "--log-json", log, "--", "sh", "-c",
      h.attempt_then_control("curl -s --max-time 5 http://192.0.2.1:" .. port .. "/",
        "curl -sS --max-time 5 http://api.test:" .. port .. "/index.html"))
    local lines = h.read(log) or ""
    h.rmrf(dir)
    assert.are.equal(0, status, out)
    local rc = h.after_attempt(out, "hello%-from%-the%-hook%-test")
    h.assert_refused(rc, out)
    local deny = lines:match('[^\n]*"kind":"connect"[^\n]*"ip":"192%.0%.2%.1"[^\n]*')
    assert.truthy(deny, lines)
    assert.truthy(deny:find('"verdict":"deny"', 1, true), deny)
    assert.truthy(deny:find('"by":"allowlist"', 1, true), deny)
    local allow = lines:match('[^\n]*"kind":"connect"[^\n]*"name":"api%.test"[^\n]*"verdict":"allow"[^\n]*')
    assert.truthy(allow, lines)
    assert.truthy(allow:find('"by":"allowlist"', 1, true), allow)

    -- the same decisions in this process's ring (the Lua API's sandbox)
    local root = h.tmpdir("egress-by-ring")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "by-ring", storage_root = root, network = {
      allow = { "api.test:" .. port }, internal = { "127.0.0.0/8" }, resolve = { ["api.test"] = "127.0.0.1" } } }))
    assert(corral.provision("native", sb))
    local r = assert(corral.exec("native", sb, { "sh", "-c", h.attempt_then_control(
      "curl -s --max-time 5 http://192.0.2.1:" .. port .. "/",
      "curl -sS --max-time 5 http://api.test:" .. port .. "/index.html") }, { output = root .. "/out" }))
    corral.destroy("native", sb)
    out = h.read(root .. "/out") or ""
    h.rmrf(root)
    assert.are.equal(0, r.code, out)
    h.after_attempt(out, "hello%-from%-the%-hook%-test")
    local by = {}
    for _, ev in ipairs(mine("by-ring", "connect")) do by[ev.verdict .. " " .. (ev.name or ev.ip)] = ev.by end
    assert.are.equal("allowlist", by["deny 192.0.2.1"])
    assert.are.equal("allowlist", by["allow api.test"])
    -- the facade's own decide() reports it too
    local v = require("corral.egress").decide({ sandbox = "nobody-has-this", name = "api.test", port = 1 })
    assert.are.equal("policy", v.by)
    assert.are.equal("policy", events.recent(1)[1].by)
  end)
end)

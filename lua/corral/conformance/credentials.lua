--- Conformance checks: credentials never reach a tenant.
--
-- The host holds tokens the tenant must not see: in a host process's environment, and
-- in whatever data store a consumer probes with its own `credentials` hook. A permitted
-- variable given to the sandbox is the control that the environment arrives at all.
--
-- The environment is every mechanism's duty, whatever it claims (docs/mechanisms.md: the
-- tenant gets `sb.env`, after corral.hardening), so cred.forbidden_env needs no claim. A
-- host process's environment is read through /proc, the tenant's filesystem: a root of
-- its own has a /proc of its own pid namespace, where no host process appears.
-- @module corral.conformance.credentials
local core = require "corral.core"

-- Whether the sandbox API refuses a variable (the fixed forbidden list, by name or value).
local function forbidden(name, value)
  local sb, err = require("corral").sandbox({ id = "envcheck", storage_root = "/nonexistent",
    env = { [name] = value } })
  return sb == nil and type(err) == "table" and err.code == "refused_env"
end

return {
  {
    id = "cred.forbidden_env", needs = {},
    guarantee = "a tenant's environment holds no variable the forbidden list names, and no credential of the host's",
    attempt = "list the tenant's whole environment (every variable a mechanism might pass through)",
    control = "the permitted variable given to the sandbox arrives; A's own storage read and written back",
    run = function(w)
      local permitted = w:token()
      local a, err = w:sandbox({ env = { CORRAL_CONFORMANCE_PERMITTED = permitted } })
      if not a then return { refused = err } end
      local out, ok, detail = w:attempt(a, "env; echo ENV-END")
      local env = out:match("^(.-)ENV%-END") or ""
      local evidence
      for line in env:gmatch("[^\n]+") do
        local name, value = line:match("^([%w_]+)=(.*)$")
        if name and forbidden(name, value) then
          evidence = "the tenant holds " .. name .. " (a variable the sandbox API refuses)"
          break
        end
      end
      -- and no value of a forbidden variable of the host's own environment
      for name, value in pairs(core.proc.environ and core.proc.environ() or {}) do
        if #value >= 8 and forbidden(name, value) and env:find(value, 1, true) then
          evidence = "the host's " .. name .. " reached the tenant"
        end
      end
      local got = env:find("CORRAL_CONFORMANCE_PERMITTED=" .. permitted, 1, true) ~= nil
      return { evidence = evidence, control_ok = ok and got,
               control_detail = got and detail or "the permitted variable did not arrive: " .. detail }
    end,
  },
  {
    id = "cred.host_environ", needs = { "filesystem_confinement" },
    guarantee = "a tenant cannot read a host process's environment (/proc/1/environ, /proc/PID/environ)",
    attempt = "read /proc/1/environ, the host holder's /proc/PID/environ and every /proc/*/environ",
    control = "A reads its own /proc/self/environ, then its own storage",
    run = function(w)
      local secret = w:token()
      local a, err = w:sandbox()
      if not a then return { refused = err } end
      -- the holder runs as the tenant's own host id: a root-owned one is refused by the
      -- uid check alone, which would hold even with no pid namespace
      local holder, herr = w:host_process("while :; do sleep 1; done", { "CORRAL_CONFORMANCE_SECRET=" .. secret },
        a.host_id)
      if not holder then return { unavailable = "cannot start the host holder: " .. tostring(herr) } end
      local out, ok, detail = w:attempt(a, string.format("cat /proc/1/environ /proc/%d/environ; " ..
        "for f in /proc/[0-9]*/environ; do cat $f; done; " ..
        "grep -qa HOME=/ /proc/self/environ && echo SELF-ENV:1", holder:pid()))
      local self_ok = out:find("SELF-ENV:1", 1, true) ~= nil
      return { evidence = out:find(secret, 1, true) and "the host holder's secret was read from inside" or nil,
               control_ok = ok and self_ok, control_detail = self_ok and detail or "its own environ was unreadable" }
    end,
  },
  {
    id = "cred.store_hook",
    guarantee = "a consumer's own data store is unreachable from inside (the consumer's `credentials` hook)",
    attempt = "what the consumer's hook attempts against its data store",
    control = "what the consumer's hook names as its control; A's own storage",
    run = function(w, opts)
      local hook = opts.credentials
      if type(hook) ~= "function" then
        return { unavailable = "no credentials probe hook given: this package has no data store of its own to probe" }
      end
      local a, err = w:sandbox()
      if not a then return { refused = err } end
      local ok_hook, probe = pcall(hook, { storage = a.dir, id = a.id })
      if not ok_hook or type(probe) ~= "table" or type(probe.attempt) ~= "string" or type(probe.secret) ~= "string" then
        return { unavailable = "the credentials hook did not return {attempt =, secret =, control? =}: " ..
          tostring(probe) }
      end
      local marker = w:token()
      local script = probe.attempt
      if probe.control then
        script = script .. "\n( " .. probe.control .. " ) >/dev/null 2>&1 && echo HOOK-CTL:" .. marker
      end
      local out, ok, detail = w:attempt(a, script)
      local hook_ok = probe.control == nil or out:find("HOOK-CTL:" .. marker, 1, true) ~= nil
      return { evidence = out:find(probe.secret, 1, true) and "the data store's secret was read from inside" or nil,
               control_ok = ok and hook_ok, control_detail = hook_ok and detail or "the hook's control failed",
               attempt = probe.describe }
    end,
  },
}

--- Conformance checks: the tenant's root holds no privilege, and cannot gain one.
-- @module corral.conformance.privilege
local core = require "corral.core"

local PRIV = { "privilege_separation" }

local BIND = [[
import socket
for port in (80, 8080):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port)); print("BOUND:%d" % port)
    except OSError as e:
        print("bind", port, e.errno)
]]

local function tenant(w)
  local a, err = w:sandbox()
  if not a then return nil, { refused = err } end
  return a
end

return {
  {
    id = "priv.setuid", needs = PRIV,
    guarantee = "executing a setuid-root file gains nothing (no_new_privs, unmapped owner)",
    attempt = "run a setuid-root copy of cat the host put in the storage, and read its own credentials",
    control = "the same file, run, prints A's own token; A's own storage",
    run = function(w)
      if core.proc.geteuid() ~= 0 then
        return { unavailable = "only root can make a setuid-root file to attempt it with" }
      end
      local a, refused = tenant(w)
      if not a then return refused end
      local path = a.dir .. "/suid-cat"
      os.execute(string.format("cp /bin/cat '%s' && chown 0:0 '%s' && chmod 4755 '%s'", path, path, path))
      local out, ok, detail = w:attempt(a, "/storage/suid-cat /proc/self/status | grep -E '^(Uid|CapEff):'; " ..
        "/storage/suid-cat /storage/own | sed 's/^/RAN:/'")
      local r, e = out:match("Uid:%s+(%d+)%s+(%d+)")
      local eff = out:match("CapEff:%s+(%x+)")
      local evidence
      if (r and e and r ~= e) or (eff and tonumber(eff, 16) ~= 0) then
        evidence = "the setuid file ran with other credentials: Uid " .. tostring(r) .. "/" .. tostring(e) ..
          ", CapEff " .. tostring(eff)
      end
      local ran = out:find("RAN:" .. a.own, 1, true) ~= nil
      return { evidence = evidence, control_ok = ok and ran,
               control_detail = ran and detail or "the setuid file did not run at all" }
    end,
  },
  {
    id = "priv.nested_userns", needs = PRIV, tools = { "unshare", "readlink" },
    guarantee = "a tenant cannot create a nested user namespace (and with it new capabilities)",
    attempt = "unshare -U, reading the new namespace's identity",
    control = "A reads its own user namespace's identity; A's own storage",
    run = function(w)
      local a, refused = tenant(w)
      if not a then return refused end
      local out, ok, detail = w:attempt(a, "echo OWN:$(readlink /proc/self/ns/user); " ..
        "echo NEW:$(unshare -U readlink /proc/self/ns/user)")
      local own, new = out:match("OWN:(user:%[%d+%])"), out:match("NEW:(user:%[%d+%])")
      return { evidence = (own and new and own ~= new) and ("a nested user namespace " .. new .. " was made") or nil,
               control_ok = ok and own ~= nil, control_detail = own and detail or "its own namespace was unreadable" }
    end,
  },
  {
    id = "priv.capabilities", needs = PRIV, tools = { "hostname", "grep" },
    guarantee = "the tenant's root holds no capability: it cannot even rename its own UTS namespace",
    attempt = "sethostname to a fresh token, and read CapEff",
    control = "A reads its hostname; A's own storage",
    run = function(w)
      local a, refused = tenant(w)
      if not a then return refused end
      local name = "cf" .. w:token():sub(1, 12)
      local out, ok, detail = w:attempt(a, "hostname " .. name .. "; echo HOST:$(hostname); " ..
        "grep ^CapEff: /proc/self/status")
      local eff = out:match("CapEff:%s+(%x+)")
      local evidence
      if out:find("HOST:" .. name, 1, true) then evidence = "the hostname became the tenant's token"
      elseif eff and tonumber(eff, 16) ~= 0 then evidence = "CapEff is " .. eff end
      local read = out:match("HOST:(%S+)") ~= nil
      return { evidence = evidence, control_ok = ok and read, control_detail = read and detail or "no hostname read" }
    end,
  },
  {
    id = "priv.low_port", needs = PRIV, tools = { "python3" },
    guarantee = "the tenant's root cannot bind a privileged port (below 1024)",
    attempt = "bind 127.0.0.1:80",
    control = "bind 127.0.0.1:8080 right after; A's own storage",
    run = function(w)
      local a, refused = tenant(w)
      if not a then return refused end
      w:write(a, "bind.py", BIND)
      local out, ok, detail = w:attempt(a, "python3 /storage/bind.py")
      local high = out:find("BOUND:8080", 1, true) ~= nil
      if out:find("BOUND:80\n", 1, true) then return { evidence = "port 80 was bound" } end
      -- only a refusal for want of privilege distinguishes anything: port 80 already in
      -- use (a network shared with the host) fails the bind for another reason
      local errno = out:match("bind 80 (%d+)")
      if errno and errno ~= "13" then
        return { unavailable = "port 80 could not be bound for another reason (errno " .. errno .. ")" }
      end
      return { control_ok = ok and high and errno ~= nil,
               control_detail = high and detail or "port 8080 did not bind either" }
    end,
  },
}

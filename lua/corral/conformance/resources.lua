--- Conformance checks: a sandbox's limits bound what its tenant can take.
--
-- Memory, pids and cpu are checked only where the mechanism claims resource_limits,
-- disk only where it claims disk_quota; wall is the life cycle's own (`exec` bounds
-- every run by `limits.wall`). A limit that ends the attempt may end everything in the
-- sandbox with it, so the control here runs after it as a second command in the same
-- sandbox.
-- @module corral.conformance.resources
local core = require "corral.core"

local RL = { "resource_limits" }

local ALLOC = [[
import sys
n = int(sys.argv[1]) << 20
b = bytearray(n)
for i in range(0, n, 4096): b[i] = 1
print("ALLOC-OK:%d" % (n >> 20), flush=True)
]]

-- Eight spinners for one second, their CPU summed over the wall time. What an uncapped
-- spin gets depends on the host's load (a busy 2-core machine gave a lone session 0.25
-- to 0.40 of a core, eight spinners as much: the scheduler groups a session's tasks), so
-- the host spins the same script itself, just before and just after, as the reference,
-- and the cap is a twentieth of a core, which such a host still tells from no cap.
local SPIN = [[
import os, time
t0 = time.monotonic()
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() - t0 < 1.0: pass
        os._exit(0)
    kids.append(pid)
for k in kids: os.waitpid(k, 0)
t = os.times()
print("CPU:%.3f" % ((t.children_user + t.children_system) / (time.monotonic() - t0)), flush=True)
]]

-- The share of a core SPIN gets on the host, in a session of its own; or nil.
local function host_spin(w, python)
  local script, out = w.root .. "/host-spin.py", w.root .. "/host-spin.out"
  local f = assert(io.open(script, "w"))
  f:write(SPIN)
  f:close()
  local o, devnull = assert(io.open(out, "w")), assert(io.open("/dev/null"))
  local p = core.spawn.start({ plain = true, new_session = true, path = python, argv = { "python3", script },
    env = {}, stdin = devnull, stdout = o, stderr = o })
  o:close()
  devnull:close()
  if not p then return nil end
  if not p:wait(10) then p:kill() p:wait() end
  p:close()
  return tonumber((require("corral.file").read(out) or ""):match("CPU:([%d%.]+)") or "")
end

-- A box with `limits`, its attempt, then a second command as the control.
local function limited(w, limits, attempt, control, script_name, script)
  local a, err = w:sandbox({ limits = limits })
  if not a then return nil, { refused = err } end
  if script then w:write(a, script_name, script) end
  local out = w:run(a, "( " .. attempt .. " ) 2>&1")
  local cout, ok, detail = w:attempt(a, control)
  return a, out or "", cout, ok, detail
end

return {
  {
    id = "res.memory", needs = RL, tools = { "python3" },
    guarantee = "a tenant cannot use more memory than limits.memory",
    attempt = "touch 256 MiB under a 64 MiB cap",
    control = "8 MiB allocated in the same sandbox afterwards; A's own storage",
    run = function(w)
      local a, out, cout, ok, detail = limited(w, { memory = "64M" }, "python3 /storage/alloc.py 256",
        "python3 /storage/alloc.py 8", "alloc.py", ALLOC)
      if not a then return out end
      local small = cout:find("ALLOC-OK:8", 1, true) ~= nil
      return { evidence = out:find("ALLOC-OK:256", 1, true) and "256 MiB were touched under a 64 MiB cap" or nil,
               control_ok = ok and small, control_detail = small and detail or "not even 8 MiB could be allocated" }
    end,
  },
  {
    id = "res.pids", needs = RL,
    guarantee = "a tenant cannot run more processes than limits.pids",
    attempt = "start 64 background processes under a cap of 16",
    control = "a child started in the same sandbox afterwards; A's own storage",
    run = function(w)
      local a, out, cout, ok, detail = limited(w, { pids = 16 },
        "i=0; while [ $i -lt 64 ]; do sleep 2 & i=$((i+1)); echo F$i; done; kill $(jobs -p) 2>/dev/null",
        "sleep 0 & wait $! && echo CHILD-OK")
      if not a then return out end
      local child = cout:find("CHILD-OK", 1, true) ~= nil
      return { evidence = out:find("F64\n", 1, true) and "64 processes ran under a cap of 16" or nil,
               control_ok = ok and child, control_detail = child and detail or "no child could start" }
    end,
  },
  {
    id = "res.cpu", needs = RL, tools = { "python3" },
    guarantee = "a tenant cannot use more CPU than limits.cpu",
    attempt = "spin eight processes for one second under a cap of a twentieth of a core",
    control = "the spin did run (measured some CPU); A's own storage",
    run = function(w)
      local a, err = w:sandbox({ limits = { cpu = 0.05 } })
      if not a then return { refused = err } end
      w:write(a, "spin.py", SPIN)
      local before = host_spin(w, w.tool("python3"))
      local out, ok, detail = w:attempt(a, "python3 /storage/spin.py")
      local after = host_spin(w, w.tool("python3"))
      local share = tonumber(out:match("CPU:([%d%.]+)") or "")
      if not share then return { control_ok = false, control_detail = "it never spun; " .. detail } end
      -- a cap of 0.05 never measures above 0.2; below it, only a host that spun well
      -- faster on either side shows that a cap, not the load, held the tenant back
      if share > 0.2 then return { evidence = string.format("%.2f cores under a cap of 0.05", share) } end
      local ref = math.min(before or 0, after or 0)
      if share > 0.5 * ref then
        return { unavailable = string.format("the tenant spun at %.2f of a core, the host itself at %.2f just " ..
          "before and %.2f just after: the host's load alone could hold a spin that low", share, before or 0,
          after or 0) }
      end
      return { control_ok = ok and share > 0.02,
               control_detail = string.format("%s; it spun at %.2f of a core, the host at %.2f", detail, share, ref) }
    end,
  },
  {
    id = "res.wall", needs = {},
    guarantee = "a run ends at limits.wall: nothing of it outlives the limit",
    attempt = "sleep 4 s under a wall of 1.5 s, then write a file",
    control = "a quick command in the same sandbox afterwards writes its file",
    run = function(w)
      -- 1.5 s leaves an engine's own exec start-up (oci: ~0.3-1 s on a busy machine) room
      -- to run the quick control inside the same limit.
      local a, err = w:sandbox({ limits = { wall = 1.5 } })
      if not a then return { refused = err } end
      local t0 = core.clock.monotime()
      local _, r = w:exec(a, "sleep 4; echo late > /storage/late")
      local took = core.clock.monotime() - t0
      while core.clock.monotime() - t0 < 4.5 do w:pump(0.05) end
      local late = w:read(a, "late")
      local cout, r2 = w:exec(a, "echo quick > /storage/quick; cat /storage/own")
      local quick = w:read(a, "quick") and cout:find(a.own, 1, true) and r2 and r2.code == 0
      local evidence
      if late then evidence = "the command wrote its file after the wall"
      elseif took > 3.5 then evidence = string.format("the run lasted %.1f s under a wall of 1.5 s", took) end
      return { evidence = evidence, control_ok = quick and true or false,
               control_detail = quick and string.format("ended after %.2f s (%s); a quick command then ran", took,
                 tostring(r and r.limit)) or "the quick command did not run" }
    end,
  },
  {
    id = "res.disk", needs = { "disk_quota" }, tools = { "dd" },
    guarantee = "a tenant cannot fill the host's disk beyond its quota",
    attempt = "write 512 MiB into a storage of limits.disk = 64M",
    control = "the file removed, A's own storage read and written back",
    run = function(w)
      -- the host's free space says what landed, whatever the tenant reports; 512 MiB is 8
      -- times the cap, far above what other writers on the host move meanwhile
      local before = core.fs.statvfs(w.root)
      if not before or before.available < 1024 ^ 3 then
        return { unavailable = "the host has under 1 GiB free beside the storage: the attempt could not tell a " ..
          "quota from a full disk" }
      end
      local a, err = w:sandbox({ limits = { disk = "64M" } })
      if not a then return { refused = err } end
      local out, ok, detail = w:attempt(a, "dd if=/dev/zero of=/storage/fill bs=1M count=512 2>&1; " ..
        "echo LANDED:$(wc -c < /storage/fill); rm -f /storage/fill", 120)
      local after = core.fs.statvfs(w.root)
      local landed = tonumber(out:match("LANDED:(%d+)") or "0")
      local host_took = before.available - after.available
      if math.max(landed, host_took) >= 256 * 1024 ^ 2 then
        return { evidence = string.format("%d MiB landed (the host lost %d MiB) under a disk of 64 MiB",
          landed // 1024 ^ 2, host_took // 1024 ^ 2) }
      end
      if not out:find("No space left", 1, true) and not out:lower():find("quota", 1, true) then
        -- a sandbox that killed the writer shows nothing either way: its control says which
        if not ok then return { control_ok = false, control_detail = detail } end
        return { unavailable = "the write stopped, but not for want of room: " .. out:sub(1, 120) }
      end
      return { control_ok = ok, control_detail = string.format("%s; the write stopped at %d MiB (ENOSPC)", detail,
        landed // 1024 ^ 2) }
    end,
  },
}

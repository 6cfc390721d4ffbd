-- Sandboxes built inside `corral exec-confined`, in each layer mode, as root and as an
-- unprivileged caller: a user namespace (unshare -Ur), bubblewrap, and corral's own
-- wrapper with a narrower boundary (Landlock stacked on Landlock). Each widening
-- attempt from inside the nested sandbox comes first, then, in the same run, the nested
-- tool's own success as its control.
local h = require "helpers"

local SECRET = "sibling-secret-51c0"
local MODES = { "ns", "ns,landlock", "bwrap", "bwrap,landlock", "landlock" }
local CALLERS = {
  root = {},
  nobody = { "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups" },
}

-- Landlock forbids every mount and pivot_root to a process it restricts (the kernel's
-- rule for any Landlock domain that handles filesystem access), so a nested sandbox
-- that builds a mount namespace (bubblewrap) runs only under the layers without it;
-- under them, the refusal is what is asserted.
local function mounts_allowed(mode)
  return not mode:find("landlock", 1, true)
end

describe("nesting inside exec-confined #root", function()
  local root, box, sib

  before_each(function()
    root = h.tmpdir("nest")
    box = root .. "/box"
    sib = root .. "/sibling"
    assert(os.execute("mkdir -p " .. box .. "/inner " .. sib))
    h.write(sib .. "/secret", SECRET)
    h.write(box .. "/outer-file", "OUTER-DATA\n")
    h.write(box .. "/inner/f", "INNER-DATA\n")
    -- the wrapper a nested agent would run, copied into the boundary where it is
    -- visible in every mode
    assert(os.execute("cp " .. h.host_program .. " " .. box .. "/corral"))
    -- searchable and readable by the unprivileged caller outside, so that each denial
    -- below is the confinement's and not the file mode's
    assert(os.execute("chmod 755 " .. root .. " && chmod 644 " .. sib .. "/secret && chown -R 65534:65534 " .. box ..
      " && chmod 777 " .. box))
  end)

  after_each(function()
    h.rmrf(root)
  end)

  local function run(caller, mode, argv)
    local full = {}
    for _, a in ipairs(CALLERS[caller]) do full[#full + 1] = a end
    for _, a in ipairs({ "env", "-i", "PATH=" .. h.PATH, h.host, "exec-confined", "--layers", mode,
      "--permit", box, "--" }) do
      full[#full + 1] = a
    end
    for _, a in ipairs(argv) do full[#full + 1] = a end
    return h.capture(full)
  end

  -- `unshare` as the confined command itself: the tool writes its own id maps, which
  -- Landlock alone (on the host's /proc) grants to that process only. As root without
  -- a namespace of its own there is no parent in which the command could hold
  -- CAP_SETFCAP, which mapping uid 0 needs (Linux 5.12): there the nested namespace is
  -- made unmapped (-U), and the refusal of -Ur is a test of its own below.
  local function maps_root(caller, mode) return not (caller == "root" and mode == "landlock") end
  local function in_userns(caller, mode, script, extra)
    return run(caller, mode, { "unshare", (maps_root(caller, mode) and "-Ur" or "-U") .. (extra or ""),
      "sh", "-c", script, "sh", sib })
  end
  local function as_root_inside(caller, mode)
    return maps_root(caller, mode) and '[ "$(id -u)" = 0 ] && ' or ""
  end

  for caller in pairs(CALLERS) do
    for _, mode in ipairs(MODES) do
      local tag = caller .. ", layers " .. mode
      local userns_ok = maps_root(caller, mode)

      it("a user namespace inside (" .. tag .. "): the outer boundary's sibling stays unreadable", function()
        local out, status = in_userns(caller, mode, h.attempt_then_control('cat "$1/secret"',
          as_root_inside(caller, mode) .. "cat outer-file && echo nested-ok"))
        h.assert_refused(h.after_attempt(out, "OUTER%-DATA\nnested%-ok"), out)
        assert.is_nil(out:find(SECRET, 1, true), out)
        assert.are.equal(0, status, out)
      end)

      it("a user namespace inside (" .. tag .. "): /proc/sys stays unwritable", function()
        local out, status = in_userns(caller, mode, h.attempt_then_control(
          'echo corral-nest > /proc/sys/kernel/domainname',
          'echo w > written && echo nested-ok'))
        h.assert_refused(h.after_attempt(out, "nested%-ok"), out)
        assert.are_not.equal("corral-nest\n", h.read("/proc/sys/kernel/domainname"))
        assert.are.equal("w\n", h.read(box .. "/written"))
        assert.are.equal(0, status, out)
      end)

      it("unshare -Urn inside (" .. tag .. "): the host's loopback is out of reach from the nested netns; " ..
        "control: only lo there", function()
        local core = require "corral.core"
        local listener, port = assert(core.sock.listen("127.0.0.1", 0))
        local dial = string.format("/usr/bin/python3 -c 'import socket; " ..
          "socket.create_connection((\"127.0.0.1\", %d), 2)'", port)
        -- the listener answers the confined command itself: what the nested netns loses
        local out = run(caller, mode, { "sh", "-c", dial .. " && echo outer-ok" })
        assert.matches("outer%-ok", out)
        local status
        out, status = in_userns(caller, mode, h.attempt_then_control(dial, as_root_inside(caller, mode) ..
          "awk -F: 'NR > 2 { gsub(/ /, \"\", $1); print $1 }' /proc/net/dev && cat outer-file && echo nested-ok"),
          "n")
        listener:close()
        local rc, control = h.after_attempt(out, "nested%-ok")
        h.assert_refused(rc, out)
        assert.are.equal("lo\nOUTER-DATA\nnested-ok\n", control)
        assert.are.equal(0, status, out)
      end)

      if not userns_ok then
        it("a nested user namespace (" .. tag .. ") cannot map uid 0: that needs CAP_SETFCAP in the host's " ..
          "namespace, never kept; control: the namespace itself, unmapped, in the same process", function()
          local script = [[
local ns = require("corral.core").ns
assert(ns.unshare(ns.CLONE_NEWUSER))
local f = assert(io.open("/proc/self/uid_map", "w"))
f:setvbuf("no")
local ok, err = f:write("0 0 1")
f:close()
io.write(tostring(err), "\nattempt-rc=", ok and 0 or 1, "\n")
io.write(io.open("outer-file"):read("a"), "nested-ok\n")
]]
          local out, status = run(caller, mode, { box .. "/corral", "-e", script })
          local rc, _, attempt = h.after_attempt(out, "OUTER%-DATA\nnested%-ok")
          h.assert_refused(rc, out)
          assert.matches("Operation not permitted", attempt)
          assert.are.equal(0, status, out)
        end)
      else
        it("a nested user namespace (" .. tag .. ") cannot map a host id the caller does not hold", function()
          local own = caller == "root" and 0 or 65534
          local other = caller == "root" and 1000 or 0
          -- corral's own core does the unshare and the writes in one process: a shell
          -- would exec after unsharing and lose the capabilities the write needs
          local script = string.format([[
local ns = require("corral.core").ns
assert(ns.unshare(ns.CLONE_NEWUSER))
local function map(line)
  local f = assert(io.open("/proc/self/uid_map", "w"))
  f:setvbuf("no")
  local ok, err = f:write(line)
  f:close()
  if not ok then io.write(err, "\n") end
  return ok
end
io.write("attempt-rc=", map("0 %d 1") and 0 or 1, "\n")
if map("0 %d 1") then io.write("uid ", io.open("/proc/self/uid_map"):read("a"), "nested-ok\n") end
]], other, own)
          local out, status = run(caller, mode, { box .. "/corral", "-e", script })
          local rc, control = h.after_attempt(out, "nested%-ok")
          h.assert_refused(rc, out)
          assert.matches("uid%s+0%s+" .. own .. "%s+1", control)
          assert.are.equal(0, status, out)
        end)
      end

      it("no file capability can be set from inside (" .. tag .. ")", function()
        -- a v3 security.capability (cap_net_raw+ep) on a file in the boundary: where the
        -- command keeps CAP_SETFCAP for nested id maps its owner would be host root
        local script = [[
import os
cap = bytes.fromhex("0000000302000000000000000000000000000000") + (0).to_bytes(4, "little")
try:
    os.setxattr("f", "security.capability", cap)
    print("attempt-rc=0")
except OSError as e:
    print("attempt-rc=%d" % e.errno)
open("written", "w").write("w\n")
print("nested-ok")
]]
        local out, status = run(caller, mode, { "sh", "-c", "cd " .. box .. " && : > f && /usr/bin/python3 -c \"$1\"",
          "sh", script })
        h.assert_refused(h.after_attempt(out, "nested%-ok"), out)
        -- seen from the host: the file carries no capability
        local caps = h.sh("/usr/bin/python3 -c 'import os, sys\ntry: " ..
          "os.getxattr(sys.argv[1], \"security.capability\"); print(\"has-caps\")\n" ..
          "except OSError as e: print(\"no-caps\", e.errno)' " .. box .. "/f")
        assert.matches("no%-caps", caps)
        assert.are.equal("w\n", h.read(box .. "/written"))
        assert.are.equal(0, status, out)
      end)

      if mounts_allowed(mode) then
        it("bwrap inside (" .. tag .. "): the outer boundary's sibling stays unreadable", function()
          local bw = "bwrap --unshare-user --ro-bind / / "
          local out, status = run(caller, mode, { "sh", "-c", h.attempt_then_control(
            bw .. 'cat "$1/secret"', bw .. "cat " .. box .. "/outer-file && echo nested-ok"), "sh", sib })
          h.assert_refused(h.after_attempt(out, "OUTER%-DATA\nnested%-ok"), out)
          assert.is_nil(out:find(SECRET, 1, true), out)
          assert.are.equal(0, status, out)
        end)
      else
        it("bwrap inside (" .. tag .. ") is refused by the kernel (no mount under Landlock); control: " ..
          "corral's own narrower wrapper in the same command", function()
          local out, status = run(caller, mode, { "sh", "-c", h.attempt_then_control(
            "bwrap --unshare-user --ro-bind / / cat " .. box .. "/outer-file",
            "./corral exec-confined --layers landlock --permit " .. box .. "/inner -- cat " .. box ..
            "/inner/f && echo nested-ok") })
          local rc, _, attempt = h.after_attempt(out, "INNER%-DATA\nnested%-ok")
          h.assert_refused(rc, out)
          assert.is_nil(attempt:find("OUTER-DATA", 1, true), out)
          -- mount refused where bubblewrap gets that far; under landlock alone its id map
          -- is refused first (the shell is the command, bubblewrap its child)
          assert.truthy(attempt:find("Failed to make / slave: Operation not permitted", 1, true) or
            (mode == "landlock" and attempt:find("uid map: Permission denied", 1, true)), out)
          assert.are.equal(0, status, out)
        end)
      end

      it("exec-confined inside (" .. tag .. "): a narrower boundary holds, none wider is made", function()
        local inner = box .. "/inner"
        local nest = "./corral exec-confined --layers landlock --permit "
        local script = table.concat({
          h.attempt_then_control(nest .. inner .. " -- cat " .. box .. "/outer-file",
            nest .. inner .. " -- cat " .. inner .. "/f && echo nested-ok-1"),
          h.attempt_then_control(nest .. '"$1" -- cat "$1/secret"',
            nest .. inner .. " -- cat " .. inner .. "/f && echo nested-ok-2"),
          h.attempt_then_control(nest .. "/ -- cat " .. box .. "/outer-file",
            nest .. inner .. " -- cat " .. inner .. "/f && echo nested-ok-3"),
          -- a valid boundary wider than the outer one (its parent): the outer one still holds
          h.attempt_then_control(nest .. root .. ' -- cat "$1/secret"',
            nest .. root .. " -- cat " .. inner .. "/f && echo nested-ok-4"),
        }, "; ")
        local out, status = run(caller, mode, { "sh", "-c", script, "sh", sib })
        local rest = out
        for i = 1, 4 do
          local rc, control, attempt = h.after_attempt(rest, "INNER%-DATA\nnested%-ok%-" .. i)
          h.assert_refused(rc, out)
          assert.is_nil(attempt:find("OUTER-DATA", 1, true), out)
          assert.is_nil(attempt:find(SECRET, 1, true), out)
          rest = control:sub(select(2, control:find("nested%-ok%-" .. i)) + 1)
        end
        assert.are.equal(0, status, out)
      end)
    end
  end
end)

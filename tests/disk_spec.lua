-- disk_quota, constructed (corral.disk): `--disk SIZE` puts the storage on a filesystem
-- of its own, an image beside the storage directory. A write past its size fails with
-- ENOSPC and a small one after it succeeds in the same sandbox; the files persist across
-- runs; another size is refused rather than silently taken; nothing stays attached or
-- mounted afterwards.
local corral = require "corral"
local core = require "corral.core"
local h = require "helpers"

local function has_bwrap() return require("corral.probe").check("bwrap").holds end

-- Loop devices whose backing file is `path` (none once the sandbox is gone).
local function attached(path)
  return (h.sh("losetup -j " .. h.quote(path)))
end

local FILL = "dd if=/dev/zero of=/storage/fill bs=1M count=32"

describe("a disk of its own #root", function()
  local root

  before_each(function()
    root = h.tmpdir("disk")
    assert(core.fs.chmod(root, tonumber("711", 8)))
  end)
  after_each(function() h.rmrf(root) end)

  for _, mech in ipairs({ "native", "bwrap" }) do
    it("bounds what " .. mech .. "'s tenant writes: ENOSPC past it, then a small write (control); kept across " ..
      "runs; nothing left attached", function()
      if mech == "bwrap" and not has_bwrap() then return pending("bubblewrap is not runnable here") end
      local box, image = root .. "/box", root .. "/.box.disk"
      local out, rc = h.corral("run", "--mechanism", mech, "--storage", box, "--disk", "16M", "--", "sh", "-c",
        h.attempt_then_control(FILL, "rm /storage/fill && echo kept > /storage/kept && echo disk-ok"))
      assert.are.equal(0, rc, out)
      local arc, _, attempt = h.after_attempt(out, "disk%-ok")
      h.assert_refused(arc, out)
      assert.matches("No space left on device", attempt)
      -- on the host: the image, at its size, took no more than that; the directory is empty
      local st = assert(core.fs.lstat(image))
      assert.are.same({ "file", 0, tonumber("600", 8), 16 * 1024 * 1024 }, { st.type, st.uid, st.mode, st.size })
      assert.truthy(st.allocated <= st.size, st.allocated)
      assert.are.same({}, core.fs.listdir(box))
      assert.are.equal("", attached(image))
      -- the next run of the same storage finds its files
      out, rc = h.corral("run", "--mechanism", mech, "--storage", box, "--disk", "16M", "--", "cat", "/storage/kept")
      assert.are.equal(0, rc, out)
      assert.are.equal("kept\n", out)
      assert.are.equal("", attached(image))
      assert.is_nil(h.read("/proc/self/mountinfo"):find(image, 1, true))
    end)
  end

  it("refuses another size than its image has, and a run without --disk; control: the same size", function()
    local box = root .. "/sized"
    local out, rc = h.corral("run", "--storage", box, "--disk", "16M", "--", "sh", "-c", "echo 1 > /storage/one")
    assert.are.equal(0, rc, out)
    for _, args in ipairs({ { "--disk", "32M" }, { "--disk", "8M" }, {} }) do
      local argv = { "run", "--storage", box }
      for _, a in ipairs(args) do argv[#argv + 1] = a end
      argv[#argv + 1] = "--"
      argv[#argv + 1] = "true"
      out, rc = h.corral(table.unpack(argv))
      assert.are.equal(2, rc, table.concat(args, " ") .. ": " .. out)
      assert.matches("%-%-disk", out)
      assert.matches("16M", out)
    end
    out, rc = h.corral("run", "--storage", box, "--disk", "16M", "--", "cat", "/storage/one")
    assert.are.equal(0, rc, out)
    assert.are.equal("1\n", out)
  end)

  it("refuses a size too small for ext4, a mechanism that cannot build it, and an image it did not make", function()
    local out, rc = h.corral("run", "--disk", "1M", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-disk: must be at least 8M", out)
    -- past what an integer holds, and past what the filesystem allows a file to be
    out, rc = h.corral("run", "--disk", "9000000T", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-disk: must be a size like", out)
    out, rc = h.corral("run", "--storage", root .. "/huge", "--disk", "100T", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-disk: 100T is more than the filesystem of .* has free", out)
    assert.is_nil(corral.core.fs.lstat(root .. "/.huge.disk"))
    out, rc = h.corral("run", "--mechanism", "oci", "--disk", "16M", "--", "true")
    assert.are.equal(3, rc, out)
    assert.matches("disk_quota", out)
    -- an image another user could write: the kernel would parse whatever it holds
    h.write(root .. "/.planted.disk", "")
    h.must("truncate -s 16M " .. root .. "/.planted.disk && chmod 666 " .. root .. "/.planted.disk")
    out, rc = h.corral("run", "--storage", root .. "/planted", "--disk", "16M", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("is not a disk image corral made", out)
    -- a directory in its place is the same refusal, not a host failure
    assert(corral.core.fs.mkdir(root .. "/.dir.disk", tonumber("700", 8)))
    out, rc = h.corral("run", "--storage", root .. "/dir", "--disk", "16M", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("is not a disk image corral made", out)
    -- control: the same arguments for a storage with no image yet
    out, rc = h.corral("run", "--storage", root .. "/fresh", "--disk", "16M", "--", "sh", "-c", "df -k /storage")
    assert.are.equal(0, rc, out)
    local blocks = tonumber(out:match("\n%S+%s+(%d+)"))
    assert.truthy(blocks and blocks > 8 * 1024 and blocks <= 16 * 1024, out)
  end)

  it("refuses a disk larger than the free space of the filesystem holding it, naming both sizes, and makes " ..
    "nothing; control: one that fits", function()
    local free = assert(core.fs.statvfs(root)).available
    local gib = free // (1024 * 1024 * 1024) + 2
    local out, rc = h.corral("run", "--storage", root .. "/big", "--disk", gib .. "G", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-disk: " .. gib .. "G is more than the filesystem of " .. root:gsub("%p", "%%%0") ..
      " has free %(%d[%d.]*G%)", out)
    assert.are.same({}, core.fs.listdir(root))
    out, rc = h.corral("run", "--storage", root .. "/big", "--disk", "16M", "--", "sh", "-c", "echo ok > /storage/ok")
    assert.are.equal(0, rc, out)
  end)

  it("an image without a filesystem (a run killed while making it) is refused, naming --disk and what to do; " ..
    "control: removed, the next run makes it afresh", function()
    -- what a run killed between creating and formatting its image left, before images were
    -- made under a temporary name: a zero-filled image of the right size in place
    local box, image = root .. "/k5", root .. "/.k5.disk"
    h.must("truncate -s 16M " .. image .. " && chmod 600 " .. image)
    for _ = 1, 2 do -- and it stays so: the refusal changes nothing
      local out, rc = h.corral("run", "--storage", box, "--disk", "16M", "--", "true")
      assert.are.equal(2, rc, out)
      assert.matches("%-%-disk: this storage's disk %(" .. image:gsub("%p", "%%%0") .. "%) holds no filesystem", out)
      assert.truthy(out:find("rm " .. image, 1, true), out)
    end
    assert.is_nil(core.fs.lstat(box))
    os.remove(image)
    local out, rc = h.corral("run", "--storage", box, "--disk", "16M", "--", "sh", "-c", "echo ok > /storage/ok")
    assert.are.equal(0, rc, out)
    assert.are.equal(16 * 1024 * 1024, core.fs.lstat(image).size)
  end)

  it("a new image is made under a temporary name; one a dead run left is swept, one of a live process stays",
    function()
    -- a dead process's pid: the shell that printed it has exited
    local dead = math.tointeger(tonumber((h.sh("echo $$"))))
    assert.is_nil(core.fs.lstat("/proc/" .. dead))
    local left = string.format("%s/.k6.disk-%d.new", root, dead)
    local live = string.format("%s/.k7.disk-%d.new", root, h.own_pid())
    for _, p in ipairs({ left, live }) do h.must("truncate -s 16M " .. p .. " && chmod 600 " .. p) end
    local out, rc = h.corral("run", "--storage", root .. "/k6", "--disk", "16M", "--", "sh", "-c",
      "echo ok > /storage/ok")
    assert.are.equal(0, rc, out)
    assert.is_nil(core.fs.lstat(left))
    assert.are.equal("file", core.fs.lstat(live).type)
    local names = core.fs.listdir(root)
    table.sort(names)
    assert.are.same({ ".k6.disk", ".k7.disk-" .. h.own_pid() .. ".new", "k6" }, names)
  end)

  it("a run refused before its command starts leaves nothing it made; a storage and image there before stay; " ..
    "control: the same storage runs", function()
    -- refused after the storage and its disk were made: a workspace with a hard link out of it
    -- (exit 2), a --link to a file that is no network namespace (exit 3; beside the --allow a link needs)
    local ws, nsfile = root .. "/ws", root .. "/nsfile"
    assert(core.fs.mkdir(ws, tonumber("755", 8)))
    h.write(nsfile, "")
    h.must("ln " .. nsfile .. " " .. ws .. "/link && chown -R 4242:4242 " .. ws)
    local refusals = {
      { 2, "--workspace", ws },
      { 3, "--link", nsfile .. ",10.0.0.2/24,10.0.0.1", "--allow", "a.test:443" },
    }
    for _, r in ipairs(refusals) do
      for _, disk in ipairs({ { "--disk", "16M" }, {} }) do
        local argv = { "run", "--storage", root .. "/n2", table.unpack(r, 2) }
        for _, a in ipairs(disk) do argv[#argv + 1] = a end
        for _, a in ipairs({ "--", "true" }) do argv[#argv + 1] = a end
        local out, rc = h.corral(table.unpack(argv))
        assert.are.equal(r[1], rc, r[2] .. ": " .. out)
        assert.is_nil(core.fs.lstat(root .. "/n2"), out)
        assert.is_nil(core.fs.lstat(root .. "/.n2.disk"), out)
      end
    end
    -- a storage and its disk kept from an earlier run stay, with their files
    local out, rc = h.corral("run", "--storage", root .. "/n2", "--disk", "16M", "--", "sh", "-c",
      "echo kept > /storage/kept")
    assert.are.equal(0, rc, out)
    for _, r in ipairs(refusals) do
      local argv = { "run", "--storage", root .. "/n2", "--disk", "16M", table.unpack(r, 2) }
      for _, a in ipairs({ "--", "true" }) do argv[#argv + 1] = a end
      out, rc = h.corral(table.unpack(argv))
      assert.are.equal(r[1], rc, out)
      assert.are.equal("dir", core.fs.lstat(root .. "/n2").type)
    end
    out, rc = h.corral("run", "--storage", root .. "/n2", "--disk", "16M", "--", "cat", "/storage/kept")
    assert.are.equal(0, rc, out)
    assert.are.equal("kept\n", out)
  end)

  it("a run a signal ends before its command starts leaves nothing it made; control: one undisturbed keeps them",
    function()
    -- SIGTERM the moment the new image appears (the run is making its disk: the command
    -- cannot have started); a try whose signal landed later is not counted
    local watch = [[
import os, signal, subprocess, sys, time
box, image = sys.argv[2], sys.argv[3]
p = subprocess.Popen([sys.argv[1], "run", "--storage", box, "--disk", "16M", "--", "true"], stderr=subprocess.PIPE)
deadline = time.monotonic() + 10
while not os.path.exists(image) and p.poll() is None and time.monotonic() < deadline:
    pass
p.send_signal(signal.SIGTERM)
err = p.communicate()[1].decode()
print(p.returncode, "early" if "arrived before the command started" in err else "late", err.strip())
]]
    local early = 0
    for try = 1, 8 do
      local box, image = root .. "/s" .. try, root .. "/.s" .. try .. ".disk"
      local out = h.capture({ "/usr/bin/python3", "-c", watch, h.host, box, image })
      if out:find("^143 early") then
        early = early + 1
        assert.is_nil(core.fs.lstat(box), out)
        assert.is_nil(core.fs.lstat(image), out)
        assert.are.equal("", attached(image))
      end
    end
    assert.truthy(early > 0, "no signal landed before the command started: the test proves nothing")
    local out, rc = h.corral("run", "--storage", root .. "/kept", "--disk", "16M", "--", "true")
    assert.are.equal(0, rc, out)
    assert.are.equal("dir", core.fs.lstat(root .. "/kept").type)
    assert.are.equal("file", core.fs.lstat(root .. "/.kept.disk").type)
  end)

  it("refuses a root others may write, where anyone could swap two sandboxes' images; control: made sticky",
    function()
    assert(core.fs.chmod(root, tonumber("777", 8)))
    local out, rc = h.corral("run", "--storage", root .. "/open", "--disk", "16M", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-disk: .* lets others rename the disk images in it", out)
    assert.is_nil(core.fs.lstat(root .. "/.open.disk"))
    assert(core.fs.chmod(root, tonumber("1777", 8)))
    out, rc = h.corral("run", "--storage", root .. "/open", "--disk", "16M", "--", "sh", "-c", "echo ok > /storage/f")
    assert.are.equal(0, rc, out)
    assert.are.equal("file", core.fs.lstat(root .. "/.open.disk").type)
  end)

  it("from Lua: limits.disk, the host's view of it while provisioned, and nothing held after destroy", function()
    local sb = assert(corral.sandbox({ id = "lua", storage_root = root, limits = { disk = "16M" } }))
    assert.is_true(corral.provision("native", sb))
    local mech = require("corral.mechanism").load("native")
    local view = mech.storage_view(sb)
    h.write(view .. "/from-host", "H\n")
    local r = assert(corral.exec("native", sb, { "/bin/sh", "-c", "cat /storage/from-host; echo T > /storage/t" },
      { output = root .. "/out" }))
    assert.are.equal(0, r.code)
    assert.are.equal("H\n", h.read(root .. "/out"))
    assert.are.equal("T\n", h.read(view .. "/t"))
    assert.is_true(corral.destroy("native", sb))
    assert.is_nil(io.open(view .. "/t"))
    assert.are.equal("", attached(root .. "/.lua.disk"))
  end)
end)

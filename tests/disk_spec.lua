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
    assert.matches("%-%-disk: 100T is larger than the filesystem of .* allows", out)
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

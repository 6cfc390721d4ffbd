-- Storage and workspaces someone else made, shown to the tenant through idmapped mounts
-- (corral.idmapped): they work, the tenant's files land owned by the directory's owner,
-- nothing of theirs is chowned; and what such a mount could hand over — a setuid bit, a
-- device node, a hard link to a file outside, a symlink planted for the host to follow —
-- is refused or harmless, each attempt followed by its control in the same sandbox.
local corral = require "corral"
local core = require "corral.core"
local h = require "helpers"

local MECHS = { "native", "bwrap" }

local function has_bwrap() return require("corral.probe").check("bwrap").holds end

local function stat(path) return assert(core.fs.lstat(path), path) end

local function run(...)
  return h.corral("run", ...)
end

-- A refusal before anything ran: exit 2, naming the flag and saying why (plain text).
local function assert_refused_flag(out, rc, flag, why)
  assert.are.equal(2, rc, out)
  assert.truthy(out:find(flag, 1, true), out)
  assert.truthy(out:find(why, 1, true), out)
end

describe("operator-made storage and workspaces #root", function()
  local root

  before_each(function()
    root = h.tmpdir("idmap")
    assert(core.fs.chmod(root, tonumber("755", 8)))
  end)
  after_each(function() h.rmrf(root) end)

  -- a storage as provisioning tools make it: root's, mode 0755, a file already in it
  local function operator_storage(name)
    local dir = root .. "/" .. name
    assert(core.fs.mkdir(dir, tonumber("755", 8)))
    h.write(dir .. "/pre", "PRE\n")
    return dir
  end

  for _, mech in ipairs(MECHS) do
    it("an operator-made storage (root, 0755) works under " .. mech .. "; its files stay root's, nothing is chowned",
      function()
      if mech == "bwrap" and not has_bwrap() then return pending("bubblewrap is not runnable here") end
      local dir = operator_storage("alice")
      local out, rc = run("--mechanism", mech, "--storage", dir, "--", "sh", "-c",
        'stat -c "%u:%g %a" /storage /storage/pre && echo new > /storage/new && echo more >> /storage/pre && ' ..
        'mkdir /storage/d && grep " /storage " /proc/self/mountinfo')
      assert.are.equal(0, rc, out)
      -- inside: the tenant's root owns its storage and the operator's file
      assert.matches("^0:0 755\n0:0 644\n", out)
      -- and the mount says how: idmapped, nosuid, nodev
      local opts = out:match(" /storage (%S+)")
      assert.truthy(opts and opts:find("nosuid", 1, true) and opts:find("nodev", 1, true), out)
      assert.matches("idmapped", out)
      -- on the host: everything the tenant made is root's, the directory as it was made
      for _, p in ipairs({ "new", "pre", "d" }) do
        local st = stat(dir .. "/" .. p)
        assert.are.same({ 0, 0 }, { st.uid, st.gid }, p)
      end
      assert.are.equal("PRE\nmore\n", h.read(dir .. "/pre"))
      local st = stat(dir)
      assert.are.same({ 0, 0, tonumber("755", 8) }, { st.uid, st.gid, st.mode })
    end)

    it("a workspace checked out by another user is writable under " .. mech .. "; files land as that user's; " ..
      "a third user's file stays closed (control: the owner's)", function()
      if mech == "bwrap" and not has_bwrap() then return pending("bubblewrap is not runnable here") end
      local ws = root .. "/repo"
      assert(core.fs.mkdir(ws, tonumber("755", 8)))
      h.write(ws .. "/README", "readme\n")
      h.write(ws .. "/foreign", "foreign\n")
      h.must("chown -R 4242:4343 " .. ws .. " && chown 5555:5555 " .. ws .. "/foreign")
      local out, rc = run("--mechanism", mech, "--workspace", ws, "--", "sh", "-c", h.attempt_then_control(
        "echo changed >> /workspace/foreign",
        'echo more >> /workspace/README && echo new > /workspace/new && mkdir /workspace/src && echo ws-ok'))
      assert.are.equal(0, rc, out)
      h.assert_refused(h.after_attempt(out, "ws%-ok"), out)
      assert.are.equal("foreign\n", h.read(ws .. "/foreign"))
      assert.are.equal("readme\nmore\n", h.read(ws .. "/README"))
      for _, p in ipairs({ "README", "new", "src" }) do
        local st = stat(ws .. "/" .. p)
        assert.are.same({ 4242, 4343 }, { st.uid, st.gid }, p)
      end
      assert.are.same({ 5555, 5555 }, { stat(ws .. "/foreign").uid, stat(ws .. "/foreign").gid })
    end)
  end

  it("no setuid or setgid bit can be set on it (root's on the host); control: an ordinary chmod", function()
    local dir = operator_storage("bits")
    local out, rc = run("--storage", dir, "--", "sh", "-c",
      h.attempt_then_control("chmod u+s /storage/pre || chmod g+s /storage/pre",
        "chmod 750 /storage/pre && echo chmod-ok"))
    assert.are.equal(0, rc, out)
    h.assert_refused(h.after_attempt(out, "chmod%-ok"), out)
    local st = stat(dir .. "/pre")
    assert.are.same({ 0, tonumber("750", 8) }, { st.uid, st.mode })
  end)

  it("a device node planted in it cannot be opened (nodev), nor one made; control: a file beside it", function()
    local dir = operator_storage("dev")
    h.must("mknod -m 666 " .. dir .. "/null c 1 3")
    local out, rc = run("--storage", dir, "--", "sh", "-c", table.concat({
      h.attempt_then_control("echo x > /storage/null", "cat /storage/pre && echo open-ok"),
      h.attempt_then_control("mknod /storage/made c 1 3", "echo f > /storage/plain && echo make-ok") }, "; "))
    assert.are.equal(0, rc, out)
    local rc1, rest = h.after_attempt(out, "PRE\nopen%-ok")
    h.assert_refused(rc1, out)
    h.assert_refused(h.after_attempt(rest, "make%-ok"), out)
    assert.is_nil(core.fs.lstat(dir .. "/made"))
    assert.are.equal("f\n", h.read(dir .. "/plain"))
  end)

  it("a hard link to a file outside is refused before anything runs; the link replaced by a copy, it runs; " ..
    "the tenant cannot make one (control: a link inside)", function()
    local dir = operator_storage("links")
    local victim = root .. "/victim"
    h.write(victim, "VICTIM\n")
    h.must("ln " .. victim .. " " .. dir .. "/planted")
    local out, rc = run("--storage", dir, "--", "sh", "-c", "echo pwned > /storage/planted")
    assert_refused_flag(out, rc, "--storage", dir .. "/planted is a hard link to a file outside it")
    assert.are.equal("VICTIM\n", h.read(victim))
    -- control: the same storage with a copy in its place
    h.must("rm " .. dir .. "/planted && cp " .. victim .. " " .. dir .. "/planted")
    out, rc = run("--storage", dir, "--", "sh", "-c", h.attempt_then_control("ln /etc/hostname /storage/h",
      "echo mine > /storage/planted && echo a > /storage/a && ln /storage/a /storage/b && echo link-ok"))
    assert.are.equal(0, rc, out)
    h.assert_refused(h.after_attempt(out, "link%-ok"), out)
    assert.are.equal("VICTIM\n", h.read(victim))
    assert.are.equal("mine\n", h.read(dir .. "/planted"))
    -- links inside it (the tenant's own) are no reason to refuse it next time
    out, rc = run("--storage", dir, "--", "cat", "/storage/b")
    assert.are.equal(0, rc, out)
    assert.are.equal("a\n", out)
  end)

  -- a write through a shared mapping keeps a setuid bit and a file capability: with the
  -- program shown, the tenant could rewrite a setuid-root program any host user runs
  local MMAP_WRITE = "/usr/bin/python3 -c 'import mmap, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); " ..
    "m = mmap.mmap(fd, 4096); m[0:6] = b\"TENANT\"; m.flush()' "

  it("a setuid or file-capability program in it is refused before anything runs; the bit removed, it runs " ..
    "(control: the tenant's write through a shared mapping lands, the mode kept)", function()
    local dir = operator_storage("setuid")
    h.write(dir .. "/prog", string.rep("\0", 4096))
    h.must("chmod 4755 " .. dir .. "/prog")
    local out, rc = run("--storage", dir, "--", "sh", "-c", MMAP_WRITE .. "/storage/prog")
    assert_refused_flag(out, rc, "--storage", dir .. "/prog is setuid, setgid or has file capabilities")
    h.must("chmod 0755 " .. dir .. "/prog && setcap cap_setuid+ep " .. dir .. "/prog")
    out, rc = run("--workspace", dir, "--", "true")
    assert_refused_flag(out, rc, "--workspace", "has file capabilities")
    assert.are.equal(string.rep("\0", 4096), h.read(dir .. "/prog"))
    -- control: without the capability the same write through a mapping lands, the mode as it was
    h.must("setcap -r " .. dir .. "/prog")
    out, rc = run("--storage", dir, "--", "sh", "-c", MMAP_WRITE .. "/storage/prog && echo mapped-ok")
    assert.are.equal(0, rc, out)
    assert.matches("mapped%-ok", out)
    assert.are.equal("TENANT", h.read(dir .. "/prog"):sub(1, 6))
    local st = stat(dir .. "/prog")
    assert.are.same({ 0, tonumber("755", 8) }, { st.uid, st.mode })
  end)

  it("a directory another user made in advance under a root others may write is refused, not adopted, and " ..
    "another sandbox's is too; control: root's there, and one corral makes", function()
    assert(core.fs.chmod(root, tonumber("1777", 8)))
    local squat = root .. "/job"
    assert(core.fs.mkdir(squat, tonumber("777", 8)))
    assert(core.fs.chown(squat, h.TEST_UID, h.TEST_UID))
    local out, rc = run("--storage", squat, "--", "sh", "-c", "echo secret > /storage/result")
    assert_refused_flag(out, rc, "--storage",
      "owned by uid " .. h.TEST_UID .. ", in " .. root .. " (uid 0, mode 1777), which others may write")
    assert.is_nil(core.fs.lstat(squat .. "/result"))
    -- a directory of a host id (another sandbox's storage), even in a root only root writes
    assert(core.fs.chmod(root, tonumber("755", 8)))
    local theirs = operator_storage("theirs")
    assert(core.fs.chown(theirs, 1500000000, 1500000000))
    out, rc = run("--storage", theirs, "--", "sh", "-c", "echo secret > /storage/result")
    assert.are.equal(2, rc, out)
    assert.matches("another sandbox's host id", out)
    assert.is_nil(core.fs.lstat(theirs .. "/result"))
    -- controls: in the same shared root, a directory root made is shown; a new one corral makes
    assert(core.fs.chmod(root, tonumber("1777", 8)))
    local mine = operator_storage("provisioned")
    out, rc = run("--storage", mine, "--", "sh", "-c", "echo ok > /storage/ok")
    assert.are.equal(0, rc, out)
    assert.are.equal(0, stat(mine .. "/ok").uid)
    out, rc = run("--storage", root .. "/fresh", "--", "sh", "-c", "echo ok > /storage/ok")
    assert.are.equal(0, rc, out)
    assert.are.equal("ok\n", h.read(root .. "/fresh/ok"))
  end)

  it("a directory anyone may write (/tmp) is no one's tree: as a workspace it is shown as it is, root's file " ..
    "there closed (control: the tenant's own lands as its host id); as a storage it is refused", function()
    local shared = root .. "/shared"
    assert(core.fs.mkdir(shared, tonumber("755", 8)))
    assert(core.fs.chmod(shared, tonumber("1777", 8)))
    h.write(shared .. "/roots", "ROOT\n")
    local out, rc = run("--workspace", shared, "--", "sh", "-c", h.attempt_then_control(
      "echo pwned > /workspace/roots", "echo mine > /workspace/mine && echo ws-ok"))
    assert.are.equal(0, rc, out)
    h.assert_refused(h.after_attempt(out, "ws%-ok"), out)
    assert.are.equal("ROOT\n", h.read(shared .. "/roots"))
    assert.truthy(require("corral.sandbox").is_host_id(stat(shared .. "/mine").uid))
    out, rc = run("--storage", shared, "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("is writable by everyone %(mode 1777%)", out)
  end)

  it("no storage is shown inside another, either way round: the outer tenant would reach the inner one's files " ..
    "and disk image (nor is a workspace holding one); control: side by side, and a workspace holding " ..
    "the sandbox's own storage", function()
    local outer = operator_storage("outer")
    local out, rc = run("--storage", outer .. "/b", "--disk", "16M", "--", "sh", "-c", "echo inner > /storage/x")
    assert.are.equal(0, rc, out)
    local image = h.read(outer .. "/.b.disk")
    out, rc = run("--storage", outer, "--", "sh", "-c", "cat /storage/.b.disk > /dev/null; " ..
      "printf XXXX | dd of=/storage/.b.disk bs=1 seek=1080 conv=notrunc")
    assert.are.equal(2, rc, out)
    assert.matches(outer .. "/b is where another sandbox keeps its files", out, nil, true)
    assert.are.equal(image, h.read(outer .. "/.b.disk"))
    -- the other way round: the outer storage in use first, then one made inside it
    h.must("rm -rf " .. outer .. "/b " .. outer .. "/.b.disk")
    out, rc = run("--storage", outer, "--", "sh", "-c", "mkdir /storage/c")
    assert.are.equal(0, rc, out)
    for _, args in ipairs({ { outer .. "/c" }, { outer .. "/d", "--disk", "16M" } }) do
      out, rc = run("--storage", table.unpack(args), "--", "true")
      assert.are.equal(2, rc, out)
      assert.matches("is inside " .. outer .. ", where another sandbox keeps its files", out, nil, true)
    end
    assert.is_nil(core.fs.lstat(outer .. "/.d.disk"))
    -- nor a directory holding it, as a workspace: idmapped, its tenant would own the other's
    for _, mech in ipairs(MECHS) do
      if mech ~= "bwrap" or has_bwrap() then
        out, rc = run("--mechanism", mech, "--workspace", root, "--", "true")
        assert_refused_flag(out, rc, "--workspace", outer .. " is where another sandbox keeps its files")
      end
    end
    -- controls: side by side; a workspace holding this sandbox's own storage
    out, rc = run("--storage", root .. "/beside", "--disk", "16M", "--", "sh", "-c", "echo ok > /storage/ok")
    assert.are.equal(0, rc, out)
    local proj = operator_storage("proj")
    out, rc = run("--storage", proj .. "/store", "--workspace", proj, "--", "sh", "-c", "echo w > /workspace/w")
    assert.are.equal(0, rc, out)
    assert.are.equal("w\n", h.read(proj .. "/w"))
  end)

  it("a workspace that is or lies inside another sandbox's storage is refused under each mechanism, its " ..
    "0600 file unread and nothing planted; control: a plain directory", function()
    local other = root .. "/other"
    local out, rc = run("--storage", other, "--", "sh", "-c",
      "echo SECRET > /storage/secret && chmod 600 /storage/secret && mkdir /storage/sub")
    assert.are.equal(0, rc, out)
    for _, mech in ipairs(MECHS) do
      if mech ~= "bwrap" or has_bwrap() then
        for _, ws in ipairs({ other, other .. "/sub" }) do
          out, rc = run("--mechanism", mech, "--workspace", ws, "--", "sh", "-c",
            "cat /workspace/secret /workspace/../secret; echo planted > /workspace/planted")
          assert_refused_flag(out, rc, "--workspace", "where another sandbox keeps its files")
          assert.is_nil(out:find("SECRET", 1, true), out)
          assert.is_nil(core.fs.lstat(ws .. "/planted"))
        end
        local plain = root .. "/plain-" .. mech
        assert(core.fs.mkdir(plain, tonumber("755", 8)))
        out, rc = run("--mechanism", mech, "--workspace", plain, "--", "sh", "-c", "echo w > /workspace/w")
        assert.are.equal(0, rc, out)
        assert.are.equal("w\n", h.read(plain .. "/w"))
      end
    end
    -- the other sandbox's files are as it left them
    out, rc = run("--storage", other, "--", "sh", "-c", "cat /storage/secret; ls /storage")
    assert.are.equal(0, rc, out)
    assert.are.equal("SECRET\nsecret\nsub\n", out)
  end)

  it("a workspace that is, lies in or holds a kernel interface filesystem is refused, judged by the filesystem " ..
    "not only its path; control: a plain directory", function()
    -- a proc and a sysfs mounted where no path rule names them
    local procdir, holder = root .. "/p", root .. "/holder"
    assert(core.fs.mkdir(procdir, tonumber("755", 8)))
    assert(core.fs.mkdir(holder, tonumber("755", 8)))
    assert(core.fs.mkdir(holder .. "/sys", tonumber("755", 8)))
    h.must("mount -t proc proc " .. procdir)
    h.defer(finally, function() os.execute("umount " .. procdir) end)
    h.must("mount -t sysfs sysfs " .. holder .. "/sys")
    h.defer(finally, function() os.execute("umount " .. holder .. "/sys") end)
    local cases = { "/proc", "/proc/1", "/sys", "/sys/fs/cgroup", "/dev", "/", procdir, procdir .. "/1", holder }
    for _, mech in ipairs(MECHS) do
      if mech ~= "bwrap" or has_bwrap() then
        for _, ws in ipairs(cases) do
          local out, rc = run("--mechanism", mech, "--workspace", ws, "--", "sh", "-c",
            "ls /workspace; cat /workspace/1/cmdline /workspace/sys/kernel/uevent_seqnum")
          assert.are.equal(2, rc, ws .. ": " .. out)
          assert.matches("^corral run: invalid_argument: %-%-workspace: ", out)
          assert.is_nil(out:find("\n.", 1), out) -- one line: nothing ran
        end
        local out, rc = run("--mechanism", mech, "--workspace", root, "--", "sh", "-c", "ls /workspace")
        assert.are.equal(2, rc, out) -- it holds them still
        local plain = root .. "/plain-" .. mech
        assert(core.fs.mkdir(plain, tonumber("755", 8)))
        out, rc = run("--mechanism", mech, "--workspace", plain, "--", "sh", "-c",
          "echo w > /workspace/w && ls /workspace")
        assert.are.equal(0, rc, out)
        assert.are.equal("w\n", out)
      end
    end
    for _, ws in ipairs({ procdir, holder }) do
      local out = run("--workspace", ws, "--", "true")
      assert.truthy(out:find(ws == procdir and "is on proc, a kernel interface filesystem" or
        holder .. "/sys (sysfs), a kernel interface filesystem", 1, true), out)
    end
  end)

  it("a workspace with a hard link to its owner's file outside is refused (control: without it)", function()
    local ws, outside = root .. "/ws", root .. "/elsewhere"
    assert(core.fs.mkdir(ws, tonumber("755", 8)))
    h.write(outside, "theirs\n")
    h.must("ln " .. outside .. " " .. ws .. "/objects && chown -R 4242:4242 " .. ws .. " " .. outside)
    local out, rc = run("--workspace", ws, "--", "true")
    assert_refused_flag(out, rc, "--workspace", "hard link to a file outside")
    h.must("rm " .. ws .. "/objects")
    out, rc = run("--workspace", ws, "--", "sh", "-c", "echo w > /workspace/w")
    assert.are.equal(0, rc, out)
    assert.are.equal(4242, stat(ws .. "/w").uid)
  end)

  it("a symlink the tenant plants where the host writes after the run (--learn) is not followed; " ..
    "control: its own file lands", function()
    local dir = operator_storage("learn")
    local victim = root .. "/victim"
    h.write(victim, "VICTIM\n")
    local out, rc = run("--storage", dir, "--learn", dir .. "/learned", "--", "sh", "-c",
      h.attempt_then_control("rm -f /storage/learned && ln -s " .. victim .. " /storage/learned",
        "echo after > /storage/after && echo learn-ok"))
    assert.are.equal(0, rc, out)
    local arc = h.after_attempt(out, "learn%-ok")
    assert.are.equal(0, arc, out) -- planting it succeeds; following it is what must not happen
    assert.are.equal("VICTIM\n", h.read(victim))
    assert.matches("%-%-learn: not written: .*replaced during the run", out)
    assert.are.equal("after\n", h.read(dir .. "/after"))
  end)

  it("a link a tenant put on the way to a later run's --learn or --log-json file, or a FIFO in its place, is " ..
    "refused before anything runs; control: a file of its own beside them", function()
    local dir = operator_storage("planted")
    local victim = root .. "/victim"
    assert(core.fs.mkdir(victim, tonumber("755", 8)))
    assert(core.fs.mkdir(victim .. "/etc", tonumber("755", 8)))
    h.write(victim .. "/etc/passwd", "VICTIM\n")
    local out, rc = run("--storage", dir, "--", "sh", "-c", h.attempt_then_control(
      "ln -s " .. victim .. " /storage/sub && mkfifo /storage/decisions.json",
      "echo after > /storage/after && echo plant-ok"))
    assert.are.equal(0, rc, out)
    assert.are.equal(0, h.after_attempt(out, "plant%-ok"), out) -- planting succeeds; the host's use must not
    -- killed rather than hang the suite, should an open block on the FIFO
    local function bounded(...)
      return require("corral.shell").capture({ "timeout", "-s", "KILL", "60", h.host, "run", ... })
    end
    out, rc = bounded("--storage", dir, "--learn", dir .. "/sub/etc/passwd", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-learn: .*/sub is a symbolic link inside the sandbox's storage", out)
    assert.are.equal("VICTIM\n", h.read(victim .. "/etc/passwd"))
    out, rc = bounded("--storage", dir, "--allow", "a.test:443", "--log-json", dir .. "/decisions.json", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-log%-json: .* is not a regular file", out)
    -- control: the same storage, a file of its own
    out, rc = bounded("--storage", dir, "--learn", dir .. "/learned", "--log-json", dir .. "/log.json", "--", "true")
    assert.are.equal(0, rc, out)
    assert.matches("%-%-learn: 0 entries written", out)
    assert.are.equal("file", stat(dir .. "/learned").type)
  end)

  it("a temporary storage is removed without following a symlink planted to a host directory; " ..
    "control: its own file was written", function()
    local keep = root .. "/keep"
    assert(core.fs.mkdir(keep, tonumber("755", 8)))
    h.write(keep .. "/precious", "P\n")
    local out, rc = run("--", "sh", "-c", h.attempt_then_control("ln -s " .. keep .. " /storage/link",
      "echo mine > /storage/mine && cat /storage/mine"))
    assert.are.equal(0, rc, out)
    h.after_attempt(out, "mine")
    assert.are.equal("P\n", h.read(keep .. "/precious"))
  end)

  it("is refused at a runtime or kernel path, never handed over; control: one beside them", function()
    for _, p in ipairs({ "/etc", "/usr", "/proc" }) do
      local out, rc = run("--storage", p, "--", "true")
      assert.are.equal(2, rc, p .. ": " .. out)
      assert.matches("cannot be handed to a tenant", out)
    end
    local st = stat("/etc")
    assert.are.same({ 0, tonumber("755", 8) }, { st.uid, st.mode })
    -- nor is one made there, named directly or through a root that is a link into the runtime
    local fresh = "corral-test-" .. core.proc.getpid()
    h.must("ln -s /etc " .. root .. "/etc-link")
    for _, p in ipairs({ "/etc/" .. fresh, root .. "/etc-link/" .. fresh, "/usr/" .. fresh }) do
      local out, rc = run("--storage", p, "--", "true")
      assert.are.equal(2, rc, p .. ": " .. out)
      assert.matches("inside the runtime read set", out)
    end
    assert.is_nil(core.fs.lstat("/etc/" .. fresh))
    assert.is_nil(core.fs.lstat("/usr/" .. fresh))
    local dir = operator_storage("beside")
    local out, rc = run("--storage", dir, "--", "sh", "-c", "echo ok > /storage/ok")
    assert.are.equal(0, rc, out)
    assert.are.equal(0, stat(dir .. "/ok").uid)
  end)

  it("where idmapped mounts are unavailable (ramfs) keeps today's rule and says why; control: a storage " ..
    "corral makes there", function()
    local fs = root .. "/ramfs"
    assert(core.fs.mkdir(fs, tonumber("755", 8)))
    h.must("mount -t ramfs ramfs " .. fs .. " && chmod 0711 " .. fs)
    local ok, err = pcall(function()
      assert(core.fs.mkdir(fs .. "/alice", tonumber("755", 8)))
      local out, rc = run("--storage", fs .. "/alice", "--", "true")
      assert.are.equal(2, rc, out)
      assert.matches("owned by uid 0; a tenant storage must be created by corral", out)
      assert.matches("idmapped mounts are unavailable here: the filesystem of .* does not support idmapped", out)
      out, rc = run("--storage", fs .. "/bob", "--", "sh", "-c", "echo hi > /storage/f && cat /storage/f")
      assert.are.equal(0, rc, out)
      assert.are.equal("hi\n", out)
    end)
    os.execute("umount " .. fs)
    assert(ok, err)
  end)

  it("native needs nothing of the directories above its storage; bwrap, which opens it by path, says so", function()
    assert(core.fs.chmod(root, tonumber("700", 8)))
    local dir = operator_storage("closed")
    local out, rc = run("--storage", dir, "--", "sh", "-c", "echo n > /storage/n")
    assert.are.equal(0, rc, out)
    assert.are.equal("n\n", h.read(dir .. "/n"))
    if not has_bwrap() then return end
    out, rc = run("--mechanism", "bwrap", "--storage", dir, "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("is not searchable by the sandbox's host id", out)
  end)

  it("the Lua API hands back the idmap's namespace and releases it at destroy; oci refuses, saying why", function()
    local dir = operator_storage("api")
    local sb = assert(corral.sandbox({ id = "api", storage_root = root }))
    assert.is_true(corral.provision("native", sb))
    local r = assert(corral.exec("native", sb, { "/bin/sh", "-c", "echo api > /storage/api" }))
    assert.are.equal(0, r.code)
    assert.is_true(corral.destroy("native", sb))
    assert.are.equal(0, stat(dir .. "/api").uid)
    local _, why = require("corral.storage").prepare(sb, { mechanism = "oci" })
    assert.are.equal("invalid_argument", why.code)
    assert.matches("the oci mechanism cannot show it through an idmapped mount", why.detail)
  end)
end)

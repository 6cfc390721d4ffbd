-- core.path.resolve_executable / resolve_path / resolve_file against real files; every
-- successful resolution is cross-checked with realpath(1) from coreutils.
local core = require "corral.core"
local h = require "helpers"

local function realpath(p)
  local f = assert(io.popen("realpath -e -- " .. h.quote(p) .. " 2>/dev/null"))
  local out = f:read("l")
  f:close()
  return out
end

describe("path resolution", function()
  local root

  setup(function()
    local f = assert(io.popen("mktemp -d /tmp/corral-path-spec-XXXXXX"))
    root = realpath(f:read("l"))
    f:close()
    h.must(table.concat({
      "cd " .. h.quote(root),
      "mkdir -p dir/sub x/y bin noexec real",
      "touch file noexec/tool real/tool",
      "chmod 0644 noexec/tool && chmod 0755 real/tool",
      "ln -s b a && ln -s c b && ln -s dir c",
      "ln -s ../x/y dir/up",
      "ln -s " .. h.quote(root .. "/x/y") .. " link",
      "ln -s lb la && ln -s la lb",
      "ln -s ../real/tool bin/tool",
      "ln -s file tofile",
    }, " && "))
  end)

  teardown(function()
    if root then h.must("rm -rf " .. h.quote(root)) end
  end)

  it("follows a chain of links to a directory", function()
    assert.equal(root .. "/dir", core.path.resolve(root .. "/a"))
    assert.equal(realpath(root .. "/a"), core.path.resolve(root .. "/a"))
    assert.equal(root .. "/dir/sub", core.path.resolve(root .. "/a/sub"))
  end)

  it("reads relative targets against the link's directory, `..` included", function()
    assert.equal(root .. "/x/y", core.path.resolve(root .. "/dir/up"))
    assert.equal(realpath(root .. "/dir/up"), core.path.resolve(root .. "/dir/up"))
  end)

  it("applies `..` after a link to the link's target", function()
    -- link -> <root>/x/y: link/.. is <root>/x, where a lexical clean-up says <root>.
    assert.equal(root .. "/x", core.path.resolve(root .. "/link/.."))
    assert.equal(realpath(root .. "/link/.."), core.path.resolve(root .. "/link/.."))
  end)

  it("refuses a loop with ELOOP", function()
    local r, msg, errno = core.path.resolve_file(root .. "/la")
    assert.is_nil(r)
    assert.equal(core.errno.ELOOP, errno)
    assert.matches("la", msg)
    -- Control: a chain of the same length that ends somewhere resolves.
    assert.equal(root .. "/dir", core.path.resolve_file(root .. "/b"))
  end)

  it("answers ENOENT for a missing name and ENOTDIR for a file mid-path", function()
    local r, _, errno = core.path.resolve_file(root .. "/nope")
    assert.is_nil(r)
    assert.equal(core.errno.ENOENT, errno)
    r, _, errno = core.path.resolve_file(root .. "/file/x")
    assert.is_nil(r)
    assert.equal(core.errno.ENOTDIR, errno)
    -- Control: the file itself resolves.
    assert.equal(root .. "/file", core.path.resolve_file(root .. "/file"))
  end)

  it("resolve_path requires a directory, resolve_file takes any type", function()
    local r, _, errno = core.path.resolve(root .. "/tofile")
    assert.is_nil(r)
    assert.equal(core.errno.ENOTDIR, errno)
    assert.equal(root .. "/file", core.path.resolve_file(root .. "/tofile"))
    assert.equal(realpath(root .. "/tofile"), core.path.resolve_file(root .. "/tofile"))
  end)

  it("raises on an embedded NUL instead of resolving a shorter path", function()
    assert.has_error(function() core.path.resolve(root .. "\0/etc") end)
    assert.has_error(function() core.path.resolve_file(root .. "\0") end)
    assert.has_error(function() core.path.resolve_executable("sh\0x") end)
    assert.has_error(function() core.path.resolve_executable("sh", "/bin\0") end)
    assert.equal(root, core.path.resolve(root)) -- control
  end)

  it("finds a name on PATH through its symlink, skipping a non-executable file", function()
    local path_env = root .. "/nonexistent:" .. root .. "/noexec:" .. root .. "/bin"
    assert.equal(root .. "/real/tool", core.path.resolve_executable("tool", path_env))
    -- Control for the skip: once executable, the earlier entry wins.
    h.must("chmod 0755 " .. h.quote(root .. "/noexec/tool"))
    assert.equal(root .. "/noexec/tool", core.path.resolve_executable("tool", path_env))
    h.must("chmod 0644 " .. h.quote(root .. "/noexec/tool"))
  end)

  it("returns a name that is nowhere on PATH unchanged", function()
    assert.equal("corral-no-such-command",
      core.path.resolve_executable("corral-no-such-command", root .. "/bin"))
    assert.equal("tool", core.path.resolve_executable("tool", root .. "/noexec"))
    assert.equal(root .. "/bin/nope", core.path.resolve_executable(root .. "/bin/nope"))
  end)

  it("keeps ELOOP and refuses the empty command", function()
    local r, _, errno = core.path.resolve_executable(root .. "/la")
    assert.is_nil(r)
    assert.equal(core.errno.ELOOP, errno)
    r, _, errno = core.path.resolve_executable("")
    assert.is_nil(r)
    assert.equal(core.errno.EINVAL, errno)
  end)

  it("defaults path_env to the process's PATH", function()
    local f = assert(io.popen("command -v sh"))
    local found = f:read("l")
    f:close()
    assert.equal(realpath(found), core.path.resolve_executable("sh"))
    assert.equal(realpath(found), core.path.resolve_executable("sh", os.getenv("PATH")))
  end)
end)

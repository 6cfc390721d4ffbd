-- One rule for a missing storage root, from Lua and from the CLI: corral creates the
-- sandbox's own directory and refuses a root that does not exist (never creating it).
local corral = require "corral"
local h = require "helpers"

describe("a missing storage root", function()
  local dir
  before_each(function()
    dir = h.tmpdir("root")
    os.execute("chmod 0711 " .. dir)
  end)
  after_each(function() h.rmrf(dir) end)

  it("is refused by the Lua API, naming storage_root, and left uncreated; control: an existing root", function()
    local missing = dir .. "/not/yet"
    local sb = assert(corral.sandbox({ id = "r1", storage_root = missing }))
    local ok, err = corral.provision("native", sb)
    assert.is_nil(ok)
    assert.are.equal("invalid_argument", err.code)
    assert.are.equal("storage_root", err.argument)
    assert.matches("does not exist", err.detail)
    assert.is_nil(corral.core.fs.lstat(dir .. "/not"))
    -- control
    local good = assert(corral.sandbox({ id = "r1", storage_root = dir }))
    assert.is_true(corral.provision("native", good))
    assert.are.equal("dir", corral.core.fs.lstat(dir .. "/r1").type)
    assert.is_true(corral.destroy("native", good))
  end)

  it("is refused by corral run --storage the same way (exit 2); control: DIR under an existing root", function()
    local out, rc = h.corral("run", "--storage", dir .. "/not/yet/box", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-storage", out)
    assert.matches("does not exist", out)
    assert.is_nil(corral.core.fs.lstat(dir .. "/not"))
    -- a file where the root should be, and a symbolic link as the storage, each said as such
    h.write(dir .. "/afile", "x\n")
    out, rc = h.corral("run", "--storage", dir .. "/afile/box", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-storage: [^\n]*/afile is not a directory", out)
    assert(os.execute("mkdir " .. dir .. "/real && ln -s " .. dir .. "/real " .. dir .. "/link"))
    out, rc = h.corral("run", "--storage", dir .. "/link", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-storage: [^\n]*/link is a symbolic link", out)
    out, rc = h.corral("run", "--storage", dir .. "/box", "--", "sh", "-c", "echo kept > /storage/f")
    assert.are.equal(0, rc, out)
    assert.are.equal("kept\n", h.read(dir .. "/box/f"))
  end)
end)

-- The front (`corral`, core/front/front.c): it serves `corral exec` itself and hands
-- every other command line to the host program beside it, argv unchanged. Each test
-- builds a directory of its own holding a copy of the front, with or without the host.
local h = require "helpers"

-- the copies' modules: the repository's (a copy in a temporary directory has no lua/ beside)
local LUA_PATH = "LUA_PATH=" .. os.getenv("PWD") .. "/lua/?.lua;" .. os.getenv("PWD") .. "/lua/?/init.lua;;"

describe("the corral front", function()
  local dir, front
  before_each(function()
    dir = h.tmpdir("front")
    front = dir .. "/corral"
    h.must("cp " .. h.quote(h.host) .. " " .. h.quote(front))
  end)
  after_each(function() h.rmrf(dir) end)

  local function with_host()
    h.must("cp " .. h.quote(h.host_program) .. " " .. h.quote(dir .. "/corral-host"))
  end

  it("hands another command line to the host with argv intact, argv[0] included", function()
    with_host()
    h.write(dir .. "/show.lua", "print(#arg, arg[-1], ...)\n")
    -- through a link of another name: the host sees the name it was called by
    h.must("ln -s corral " .. h.quote(dir .. "/other-name"))
    local args = { dir .. "/show.lua", "a b", "", "--help", "exec" }
    local out, status = h.capture({ dir .. "/other-name", table.unpack(args) })
    assert.are.equal(0, status, out)
    assert.are.equal("4\t" .. dir .. "/other-name\ta b\t\t--help\texec\n", out)
    -- control: the host run directly with the same arguments says the same of them
    out, status = h.capture({ dir .. "/corral-host", table.unpack(args) })
    assert.are.equal(0, status, out)
    assert.are.equal("4\t" .. dir .. "/corral-host\ta b\t\t--help\texec\n", out)
  end)

  it("keeps corral-runtime's dispatch: a link of that name reaches the runtime's command line", function()
    with_host()
    h.must("ln -s corral " .. h.quote(dir .. "/corral-runtime"))
    local out, status = h.capture({ "env", LUA_PATH, dir .. "/corral-runtime", "--help" })
    assert.are.equal(0, status, out)
    assert.matches("^usage: corral%-runtime", out)
    -- control: the same word to the front by its own name is corral's help
    out, status = h.capture({ "env", LUA_PATH, front, "--help" })
    assert.are.equal(0, status, out)
    assert.is_nil(out:match("^usage: corral%-runtime"), out)
  end)

  it("without the host beside it: a clear error naming the path, exit 125; then the control", function()
    local out, status = h.capture({ front, "ls" })
    assert.are.equal(125, status, out)
    assert.are.equal("corral: cannot run the corral host program " .. dir ..
      "/corral-host: No such file or directory\n", out)
    -- `corral exec` is the front's own: it answers without any host (no such sandbox)
    out, status = h.capture({ front, "exec", "front-spec-none", "--", "/bin/true" })
    assert.are.equal(2, status, out)
    assert.matches("no live sandbox front%-spec%-none", out)
    -- control, after: the host put beside it, the same line runs
    with_host()
    out, status = h.capture({ "env", LUA_PATH, front, "-v" })
    assert.are.equal(0, status, out)
    assert.matches("^corral %d", out)
  end)
end)

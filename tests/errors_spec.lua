-- Structured errors keep the system error behind a refusal, so a caller can tell
-- ENOENT from EACCES without parsing text.
local core = require "corral.core"
local errors = require "corral.errors"
local run_options = require "corral.egress.run_options"

describe("corral.errors", function()
  it("keeps the errno of the system call that refused, and prints as before", function()
    local f, msg, errno = io.open("/nonexistent/allow-list")
    assert.is_nil(f)
    local e = errors.invalid_argument("--allow-file", msg, errno)
    assert.are.equal(core.errno.ENOENT, e.errno)
    assert.are.equal("invalid_argument: --allow-file: " .. msg, tostring(e))
    -- control: an error with no system call behind it has no errno
    assert.is_nil(errors.invalid_argument("--memory", "must be a size").errno)
  end)

  it("reaches the caller of the CLI's option checks", function()
    local _, err = run_options.network({ ["allow-file"] = "/nonexistent/allow-list" })
    assert.are.equal("--allow-file", err.argument)
    assert.are.equal(core.errno.ENOENT, err.errno)
    -- control: a readable file is accepted
    local dir = assert(core.fs.mkdtemp("/tmp/corral-errors-"))
    local path = dir .. "/allow"
    local out = assert(io.open(path, "w"))
    out:write("api.test:443\n")
    out:close()
    local net, nerr = run_options.network({ ["allow-file"] = path })
    core.fs.remove_tree(dir)
    assert.is_nil(nerr)
    assert.truthy(net)
  end)
end)

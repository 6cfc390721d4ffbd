-- Sequential create/destroy cycles of sandboxes with an allowlist leave nothing behind:
-- processes, network namespaces, nsfs mounts, mounts, cgroups, nft tables, the driver's
-- own fds, temporary directories, control sockets. The driver is the bench's
-- (scripts/bench/cycles.lua, 1,000 cycles there; fewer here): each cycle's tenant looks a
-- name up and sends a line through the relay to a real server, through the Lua API in
-- one process and through `corral run`. It runs in its own cgroup and namespaces, so the
-- census is this run's alone. Every counter is first shown to see an object while it
-- exists (a sandbox alive, or a mount, an nsfs mount and an nft table the driver made):
-- a counter that cannot see a leak would pass any run.
local h = require "helpers"
local json = require "dkjson"

-- ~10 s on an idle 2-core VM (about 40 ms an API cycle, 60 ms a `corral run`)
local N = 100

describe("create/destroy cycles #root #netns", function()
  local r

  setup(function()
    local out = h.sh(h.quote(h.host) .. " scripts/bench/cycles.lua --json " .. N .. " both")
    r = json.decode(out)
    assert.truthy(r, "the driver printed no result: " .. tostring(out))
  end)

  -- The counters each control raises, and by how much.
  local SEEN = {
    processes = { cli = "up" },
    netns = { api = 1, cli = 1 },
    ["nsfs mounts"] = { made = 1 },
    mounts = { made = 2 },
    cgroups = { api = "up", cli = "up" },
    ["nft tables"] = { made = 1 },
    ["driver fds"] = { api = "up", cli = 1 }, -- cli: the pipe to its stdin
    ["temp dirs"] = { api = 1, cli = 1 },
    registrations = { cli = 1 },
  }

  it("counts what a live sandbox holds (controls: each counter sees the objects while they exist)", function()
    for _, k in ipairs(r.counters) do
      local seen = assert(SEEN[k], "no control for counter " .. k)
      for control, by in pairs(seen) do
        local n = assert(r.seen[control], "control " .. control .. " did not run")[k]
        if by == "up" then
          assert.truthy(n > 0, k .. " saw nothing while the " .. control .. " control's object existed")
        else
          assert.are.equal(by, n, k .. " while the " .. control .. " control's object existed")
        end
      end
    end
    assert.are.same({}, r.left) -- and the controls' objects are gone
  end)

  it("ran every cycle through the relay, and nothing was there after that was not before", function()
    assert.are.same({}, r.failures)
    assert.are.equal(2 * N, r.expected)
    assert.are.equal(r.expected, r.received)
    for _, k in ipairs(r.counters) do
      assert.truthy(r.after[k] <= r.before[k], k .. " after " .. N .. " cycles: " .. r.before[k] .. " before, " ..
        r.after[k] .. " after: new " .. table.concat(r.grew[k] or {}, ", "))
    end
    assert.are.same({}, r.grew)
    assert.are.same({}, r.cgroups_left)
  end)
end)

-- scripts/soak's driver: runs scripts/soak.d/drive.sh in a world of its own (the bench's
-- census.run_private: a cgroup, pid, mount and network namespaces, /tmp and /run/corral
-- on tmpfs), then reads what it left (account.lua) and prints the figures against the
-- goals. Exit 0 when every goal is met, 1 otherwise.
-- Usage: corral scripts/soak.d/main.lua SECONDS WORKERS  (--inside: the run_private half)
local root = arg[0]:match("^(.*)/scripts/soak%.d/") or "."
package.path = root .. "/scripts/bench/?.lua;" .. root .. "/scripts/soak.d/?.lua;" .. package.path
local census = require "census"
local account = require "account"
local json = require "dkjson"
local shell = require "corral.shell"

local function inside(seconds, workers)
  local work = "/tmp/soak"
  local env = string.format("C=%s WORK=%s SECONDS_TO_RUN=%d WORKERS=%d STOP=%s", shell.quote(census.HOST), work,
    seconds, workers, shell.quote(os.getenv("SOAK_STOP") or "/nonexistent"))
  -- pid 1 of a pid namespace of its own is bash, which reaps the orphans (keepers)
  local ok = os.execute(env .. " unshare --pid --fork --mount-proc --kill-child bash " ..
    shell.quote(root .. "/scripts/soak.d/drive.sh") .. " >&2")
  local result = account.summarise(work)
  result.ok = ok == true
  print(json.encode(result))
end

local function outside(seconds, workers)
  local r = census.run_private("scripts/soak.d/main.lua", { seconds, workers })
  return account.report(r, seconds, workers)
end

if arg[1] == "--inside" then
  inside(tonumber(arg[2]), tonumber(arg[3]))
else
  os.exit(outside(tonumber(arg[1]), tonumber(arg[2])) and 0 or 1)
end

--- The host process's file descriptors, which bound how many connections its egress
-- plane can relay at once.
--
-- Each relayed connection holds six fds once bytes have moved both ways (the tenant's
-- socket, the upstream socket, a pipe of two fds per direction), and more while its
-- addresses are raced. A shell's default soft RLIMIT_NOFILE (1024 on Debian) holds
-- about 150 of them: past that, accept, socket and pipe2 fail with EMFILE. So the first
-- plane raises this process's soft limit to its hard limit (the kernel lets any process
-- do so), and a sandbox's connection cap is lowered to what the hard limit can hold,
-- `PER_CONNECTION` each beyond `RESERVE` for everything else the host keeps open.
--
-- The raise is the host's own: tenants started afterwards get the soft limit the host
-- was started with (`inherited`, which `corral.tenant_root` hands to the spawn), so a
-- program that sizes a table by its soft limit or still uses select(2) sees what it
-- would have seen without corral.
-- @module corral.egress.fdlimit
local core = require "corral.core"

local M = {}

--- Fds one relayed connection holds (two sockets, two pipes).
M.PER_CONNECTION = 6

--- Fds kept back for the rest of the host: the loop's own, listeners, responders, DNS
-- over TCP, pidfds, the log, control sockets.
M.RESERVE = 256

local original -- {soft, hard} as this process started, once raised

--- Raises this process's soft RLIMIT_NOFILE to its hard limit, once; idempotent.
-- @treturn integer|number the soft limit now (math.huge: unlimited)
-- @treturn integer|number the hard limit
function M.raise()
  local soft, hard = core.proc.nofile()
  if not soft then return nil, hard end
  if soft < hard then
    -- an unlimited hard limit still stops at fs.nr_open
    local target = hard
    if target == math.huge then
      local f = io.open("/proc/sys/fs/nr_open")
      target = f and math.tointeger(tonumber(f:read("l"))) or 1048576
      if f then f:close() end
    end
    if soft < target and core.proc.set_nofile(target) then
      original = original or { soft, hard == math.huge and target or hard }
      soft = target
    end
  end
  return soft, hard
end

--- The connection cap a sandbox gets for `requested`: `requested` when the soft limit
-- (raised first) holds that many, else as many as it holds (at least 1).
-- @tparam integer requested the sandbox's `max_connections`
-- @treturn integer the cap
-- @treturn[opt] string why it is lower than requested, naming the limit
function M.fit(requested)
  local soft = M.raise()
  if not soft or soft == math.huge then return requested end
  local fits = math.max(1, (math.tointeger(soft) - M.RESERVE) // M.PER_CONNECTION)
  if requested <= fits then return requested end
  return fits, string.format("this process may open %d files (RLIMIT_NOFILE), enough for %d connections at %d fds "
    .. "each; raise its hard limit (ulimit -Hn) for more", soft, fits, M.PER_CONNECTION)
end

--- The RLIMIT_NOFILE a tenant should start with: `{soft, hard}` as this process was
-- started, or nil when it was never raised (the tenant inherits it as it is).
-- @treturn table|nil
function M.inherited()
  return original and { original[1], original[2] } or nil
end

return M

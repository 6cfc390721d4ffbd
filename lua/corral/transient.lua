--- What counts as a transient resource failure: a resource that ran out for a moment
-- (file descriptors, memory, space, a process limit), or a probe's child killed by a
-- signal it did not raise itself. Such a failure says nothing of what the host can
-- enforce: it is never `cannot_enforce` (exit 3) but a setup failure (exit 120), and a
-- probe that fails so is "not known", never "absent" (corral.errors, corral.probe).
-- @module corral.transient
local core = require "corral.core"

local M = {}

-- errno name, what ran out, and the system's texts for it: glibc's, then musl's where
-- it differs (the static confinement wrapper's). ENFILE before EMFILE: its text
-- contains EMFILE's.
local RESOURCES = {
  { "ENFILE", "the system ran out of open files", "Too many open files in system" },
  { "EMFILE", "this process ran out of file descriptors", "Too many open files", "No file descriptors available" },
  { "ENOMEM", "memory ran out", "Cannot allocate memory", "Out of memory" },
  { "ENOSPC", "a filesystem or a namespace count ran out of room", "No space left on device" },
  { "EDQUOT", "a disk quota ran out", "Disk quota exceeded", "Quota exceeded" },
  { "EAGAIN", "a process or thread limit was reached", "Resource temporarily unavailable" },
  { "ENOBUFS", "the kernel ran out of buffer space", "No buffer space available" },
}

-- Signals a process raises by what it does itself (a fault, abort, a seccomp kill, a
-- write to a closed pipe, its own rlimits): what it did, not what befell it.
local SELF_RAISED = { [4] = true, [5] = true, [6] = true, [7] = true, [8] = true, [11] = true, [13] = true,
                      [24] = true, [25] = true, [31] = true }

--- What ran out, when `e` (an errno, or a message with the system's text for one)
-- names a transient resource failure.
-- @param e integer errno, or string
-- @treturn string|nil what ran out, e.g. "this process ran out of file descriptors"
function M.of(e)
  for _, r in ipairs(RESOURCES) do
    if math.type(e) == "integer" and core.errno[r[1]] == e then return r[2] end
    for i = 3, type(e) == "string" and #r or 0 do
      if e:find(r[i], 1, true) then return r[2] end
    end
  end
  -- a sandbox's first process killed from outside before its release (core.spawn's
  -- "release child (it was killed by signal N first)")
  local sig = type(e) == "string" and tonumber(e:match("it was killed by signal (%d+) first"))
  if sig and not SELF_RAISED[sig] then
    return string.format("the sandbox's first process was killed by signal %d before it was released", sig)
  end
  return nil
end

--- What befell a child that ended with `code` (128+N for signal N) by a signal it did
-- not raise itself (a kill, the OOM killer, a timeout), or nil.
-- @tparam integer code the exit code as core's wait gives it
-- @treturn string|nil
function M.killed(code)
  local sig = math.type(code) == "integer" and code > 128 and code - 128
  if not sig or sig > 64 or SELF_RAISED[sig] then return nil end
  return string.format("a probe's child was killed by signal %d, which it did not raise itself", sig)
end

--- The words that close a transient failure's message.
-- @tparam string what what ran out (`M.of`, `M.killed`)
-- @treturn string
function M.suffix(what)
  return " (" .. what .. "; not a protection this host lacks)"
end

return M

--- corral: process confinement with a C core and Lua policy.
--
-- `require "corral"` gives the entry points; each lives in its own module.
-- @module corral
local M = {}

M._VERSION = "corral 0.1"

M.core = require "corral.core"
M.errors = require "corral.errors"

--- Confines a trusted control-plane process to one directory (see corral.confinement).
-- @function confine
M.confine = function(...) return require("corral.confinement").confine(...) end

--- The capability probe (see corral.capability).
-- @function probe
M.probe = function(...) return require("corral.capability").probe(...) end

--- Resolves a command the way the kernel will (PATH, then every symlink).
-- @function resolve_executable
M.resolve_executable = M.core.resolve_executable

return M

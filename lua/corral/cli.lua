--- The `corral` subcommands (placeholder: the real dispatcher replaces this).
local M = {}

M.commands = { help = true }

--- Whether name is a subcommand.
function M.is_command(name)
  return M.commands[name] ~= nil
end

--- Runs a subcommand; argv[1] is its name. Returns the exit status.
function M.main(argv)
  if argv[1] == "help" then
    io.write("corral: commands: help\n")
    return 0
  end
  io.stderr:write("corral: unknown command\n")
  return 2
end

return M

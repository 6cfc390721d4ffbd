--- Fuzz target: the file `corral run --allow-file FILE` reads (every input is such a
-- file), through corral.egress.run_options as `run` reads it. It must answer, never
-- raise: a network table, or a refusal that names --allow-file; every entry it accepts
-- is one the grammar accepts again on its own.
local S = require "support"
local errors = require "corral.errors"
local grammar = require "corral.egress.grammar"
local request_rules = require "corral.egress.request_rules"
local run_options = require "corral.egress.run_options"

return function(data)
  local path = S.write("allow", data)
  local network, err = S.no_raise("run_options.network", run_options.network, { ["allow-file"] = path })
  if not network then
    if err == nil then return end -- a file of comments and blank lines: nothing asked
    S.check(errors.is(err, "invalid_argument") and err.argument == "--allow-file",
      "a refusal names --allow-file: " .. tostring(err))
    return
  end
  for _, e in ipairs(network.allow or {}) do
    local dest = request_rules.split(e) or e
    local _, aerr = S.no_raise("grammar.parse_entry", grammar.parse_entry, dest)
    S.check(not aerr, "an accepted entry parses again: " .. tostring(e))
  end
end

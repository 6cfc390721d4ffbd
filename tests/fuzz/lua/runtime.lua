--- Fuzz target: a bundle's config.json as corral-runtime reads it for `create` (every
-- input is the file): corral.runtime.bundle reads it, corral.runtime.annotations reads
-- its `corral.dev/*` annotations into a plane's network, and the config is confined
-- (the plane's netns in, the network capabilities and sysctls out) and written again
-- when they ask for a plane.
-- None of it may raise: a config that is not a JSON object is refused naming --bundle,
-- an annotation refused names its annotation.
local S = require "support"
local annotations = require "corral.runtime.annotations"
local bundle = require "corral.runtime.bundle"
local errors = require "corral.errors"
local json = require "corral.json"

local dir = S.scratch .. "/bundle"
os.execute("mkdir -p " .. dir)

return function(data)
  S.write("bundle/config.json", data)
  local config, err = S.no_raise("bundle.read", bundle.read, dir)
  if not config then
    S.check(errors.is(err, "invalid_argument") and err.argument == "--bundle", "refused naming --bundle")
    return
  end
  local network, opts = S.no_raise("annotations.network", annotations.network, config.annotations)
  if network == nil then
    S.check(errors.is(opts, "invalid_argument") and tostring(opts.argument):find(annotations.PREFIX, 1, true) == 1,
      "a refusal names its annotation: " .. tostring(opts))
    return
  end
  if not network then return end -- no corral.dev/ annotation: the engine's runtime runs it as it is
  S.no_raise("bundle.confine", bundle.confine, config, "/run/netns/fuzz")
  S.no_raise("the config written again", json.encode, config)
end

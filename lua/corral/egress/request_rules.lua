--- Request rules on terminated connections (the hosts a `--secret` is bound to): what a
-- request may be once its host is allowed, asked by the TLS terminator of every request
-- that passed the stand-in rules (core/lib/intercept.h, ASK), HTTP/1.1 or HTTP/2 alike.
--
-- - `--allow 'https://HOST[:PORT]/PATH'`: the entry admits HOST:PORT as `https://HOST`
--   would, and on that host every request's path (its query cut) must match one of the
--   host's path entries: PATH itself, or what starts with PATH's text before a final
--   `*`. A plain `--allow HOST` beside it admits the connection only, never other paths:
--   once a host has a path entry, only its path entries admit its requests. A path with
--   a dot segment or a percent-encoded `/`, `\` or `.` is refused on such a host (the
--   server could read it as a path no entry admits). HOST:PORT must be one a `--secret`
--   is bound to: elsewhere TLS is spliced and no path can be seen.
-- - `--method M[,M…]`: on every terminated host, a request's method must be one of these.
-- - `network.request` (the Lua API): a hook asked last, under the `decide` hook's
--   instruction budget (`network.budget`), with `{method =, host =, port =, path =,
--   headers = {name, ...}}`: header names only, lower-case, never a value. It answers as
--   `decide` does; anything but an allow refuses the request.
--
-- A refusal is the request's 403, its words naming the flag that would admit it.
-- @module corral.egress.request_rules
local decision = require "corral.egress.decision"

local M = {}

--- A path entry: "https://api.test:8443/repos/acme/*" → the destination entry
-- ("https://api.test:8443") and the rule `{host =, port =, path =, text =}`; nil for any
-- other entry (the grammar judges it), or nil, nil, why.
-- @tparam string text an --allow entry
function M.split(text)
  local scheme, authority, path = text:match("^(%a[%w+.-]*)://([^/?#@]+)(/[^?#]*)$")
  if not scheme or path == "/" then return nil end
  if scheme:lower() ~= "https" then
    return nil, nil, string.format("%s: a path is enforced on https:// entries only (TLS a --secret terminates)",
      text)
  end
  local host, port = authority:match("^([^:%[%]]+):(%d+)$")
  host = (host or authority):lower()
  if host:find("[:%[%]]") then return nil, nil, text .. ": a path entry names a host, not an address" end
  return "https://" .. authority, { host = host, port = tonumber(port) or 443, path = path, text = text }
end

--- "GET,HEAD" → {GET = true, HEAD = true, text = "GET,HEAD"}, or nil and why.
-- @tparam string text
function M.methods(text)
  local set = { text = text:upper() }
  for m in (text .. ","):gmatch("([^,]*),") do
    if not m:upper():match("^%u+$") then
      return nil, string.format("%q is not a method (write e.g. GET,HEAD)", m)
    end
    set[m:upper()] = true
  end
  return set
end

--- Why the rules cannot hold with these secrets, or nil: a path entry on a host no
-- secret is bound to, --method without any secret.
-- @tparam table requests `{rules =, methods =}`
-- @tparam {table,...}|nil list `network.secrets`
-- @tparam function bound `corral.egress.secrets.bound`
-- @treturn string|nil flag
-- @treturn string why
function M.check(requests, list, bound)
  for _, r in ipairs(requests.rules or {}) do
    if not list or not bound(list, r.host, r.port) then
      return "--allow", string.format("%s: a path is enforced only where TLS is terminated: bind a secret to "
        .. "%s:%d with --secret", r.text, r.host, r.port)
    end
  end
  if requests.methods and not list then
    return "--method", "applies to requests on the hosts a --secret is bound to: give --secret too"
  end
end

local function hostport(host, port)
  return port == 443 and host or (host .. ":" .. port)
end

local function admits(rule, path)
  if rule.path:sub(-1) == "*" then return path:sub(1, #rule.path - 1) == rule.path:sub(1, -2) end
  return path == rule.path
end

-- Whether a path could name, once decoded or normalised, another than it reads.
local function ambiguous(path)
  local p = path:lower()
  return p:find("%%2[ef]") or p:find("%%5c") or p:find("\\", 1, true) or ("/" .. p .. "/"):find("/%.%.?/")
end

--- The verdict on one request.
-- @tparam table spec `{rules =, methods =, hook =, budget =}`
-- @tparam table req `{method =, host =, port =, path =, names = {...}}` (an ASK event)
-- @treturn boolean may it go
-- @treturn string|nil why not
function M.judge(spec, req)
  if spec.methods and not spec.methods[req.method] then
    return false, string.format("%s is not among --method %s (--method %s,%s would admit it)", req.method,
      spec.methods.text, spec.methods.text, req.method)
  end
  local mine, where = {}, hostport(req.host, req.port)
  for _, r in ipairs(spec.rules or {}) do
    if r.host == req.host and r.port == req.port then mine[#mine + 1] = r end
  end
  if #mine > 0 then
    if ambiguous(req.path) then
      return false, string.format("path %s on %s has a dot segment or an encoded separator, refused where "
        .. "--allow https://%s/... entries apply", req.path, where, where)
    end
    local ok = false
    for _, r in ipairs(mine) do ok = ok or admits(r, req.path) end
    if not ok then
      return false, string.format("path %s on %s is under no --allow https://%s/... entry (--allow "
        .. "'https://%s%s' would admit it)", req.path, where, where, where, req.path)
    end
  end
  if spec.hook then
    local names = {}
    for i, n in ipairs(req.names or {}) do names[i] = n end
    local ok, why = decision.run_hook(spec.hook, { method = req.method, host = req.host, port = req.port,
      path = req.path, headers = names }, spec.budget, "request")
    if not ok then return false, "refused by the network's request hook: " .. why end
  end
  return true
end

--- Whether any rule or hook is there to ask.
-- @tparam table spec
function M.any(spec)
  return spec.hook ~= nil or spec.methods ~= nil or #(spec.rules or {}) > 0
end

return M

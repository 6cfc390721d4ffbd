--- `corral run --learn FILE`: the program runs with nothing allowed that was not, every
-- name it asks for answered (so that it goes on to connect), and every connection (and
-- UDP flow) it then makes denied and recorded — name (or address), port and protocol,
-- a UDP flow as `udp:name:port`. At the end the
-- suggested allowlist is written to FILE, one entry per line with how often it was
-- wanted, ready for `--allow-file FILE`: the way an operator builds the list for a new
-- job. Names asked for but never connected to are listed as comments. FILE is written
-- mode 0600 (see `start`).
-- @module corral.egress.learn
local events = require "corral.egress.events"
local errors = require "corral.errors"
local core = require "corral.core"
local grammar = require "corral.egress.grammar"

local M = {}

local function host(ev)
  local h = ev.name or ev.ip
  if h and h:find(":", 1, true) then h = "[" .. h .. "]" end
  return h
end

--- Checks, before anything runs, that FILE can be written at the end as `start` opens
-- it: a name in an existing directory, and no symbolic link, nothing but a regular file
-- and no other user's file there already.
-- @tparam string path
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] table invalid_argument on --learn
function M.check(path)
  local function refuse(why) return nil, errors.invalid_argument("--learn", why) end
  if path == "" or path:sub(-1) == "/" then return refuse('"' .. path .. '": name a file') end
  -- not standard output (as --log-json - is): the file is written once the run ends, and
  -- would be mixed into what the command printed there
  if path == "-" then return refuse('"-": name a file (written when the run ends; ./- for a file named "-")') end
  local dir = path:match("^(.*)/[^/]*$") or "."
  if dir == "" then dir = "/" end
  local st = core.fs.lstat(dir)
  if st and st.type == "link" then
    local real = core.path.resolve(dir)
    st = real and core.fs.lstat(real)
  end
  if not st or st.type ~= "dir" then return refuse(path .. ": the directory " .. dir .. " does not exist") end
  st = core.fs.lstat(path)
  if not st then return true end
  if st.type == "link" then return refuse(path .. ": a symbolic link (name the file itself)") end
  if st.type ~= "file" then
    return refuse(path .. ": " .. (st.type == "dir" and "a directory" or "a FIFO, socket or device") ..
      ", not a regular file")
  end
  if st.uid ~= core.proc.geteuid() then
    return refuse(string.format("%s: owned by uid %d, not by this process's (%d)", path, st.uid, core.proc.geteuid()))
  end
  return true
end

--- The suggested allowlist from what was recorded (see `start`).
-- @tparam table seen `{wanted = {entry = count}, order = {entry...}, names = {name = count}}`
-- @treturn string the file's text
-- @treturn integer how many entries it lists (an entry --allow-file would refuse is a
--   comment)
function M.render(seen)
  local out = { "# corral run --learn: what the program connected to (each denied), with how often;",
    "# review, then: corral run --allow-file THIS-FILE -- ..." }
  local entries = {}
  for _, e in ipairs(seen.order) do entries[#entries + 1] = e end
  table.sort(entries, function(a, b)
    if seen.wanted[a] ~= seen.wanted[b] then return seen.wanted[a] > seen.wanted[b] end
    return a < b
  end)
  local listed = 0
  for _, e in ipairs(entries) do
    local n = seen.wanted[e]
    local how = e:sub(1, 4) == "udp:" and string.format("udp, %d flow%s", n, n == 1 and "" or "s")
      or string.format("tcp, %d connection%s", n, n == 1 and "" or "s")
    -- what --allow-file would refuse (a single-label name, port 53 …) is said, never
    -- listed: one such line would refuse the whole file
    local _, refused = grammar.parse_entry(e)
    if refused then
      out[#out + 1] = string.format("# %s  # %s; not an entry --allow-file takes: %s", e, how,
        tostring(refused.detail or refused):gsub("\n", " "))
    else
      listed = listed + 1
      out[#out + 1] = string.format("%s  # %s", e, how)
    end
  end
  local only = {}
  for name, n in pairs(seen.names) do
    if not seen.connected[name] then
      only[#only + 1] = string.format("# %s: resolved %d times, never connected to", name, n)
    end
  end
  table.sort(only)
  for _, l in ipairs(only) do out[#out + 1] = l end
  return table.concat(out, "\n") .. "\n", listed
end

--- Starts recording the events of sandbox `opts.sandbox` (all, without it). FILE is
-- opened now, before the tenant runs, and written through that handle at the end: FILE
-- may lie where the tenant writes (its storage, its workspace), and a symbolic link it
-- put there meanwhile must not carry the host's write elsewhere. One there already is
-- refused.
-- @tparam string path FILE
-- @tparam[opt] table opts `{sandbox =}`
-- @treturn table with `finish()`: unsubscribes, writes FILE and returns true and how
--   many entries it holds, or nil and why; and `cancel()`: unsubscribes, FILE untouched
--   (the command never ran)
function M.start(path, opts)
  opts = opts or {}
  local file, ferr
  local st = core.fs.lstat(path)
  if st and st.type == "link" then
    ferr = path .. ": a symbolic link (name the file itself)"
  else
    -- mode 0600 whatever the umask, like the log: it lists what the tenant asked for;
    -- never through a link, never into a FIFO or another user's file
    file, ferr = core.fs.open_private(path, "w")
  end
  local seen = { wanted = {}, order = {}, names = {}, connected = {} }
  local function on(ev)
    if opts.sandbox and ev.sandbox ~= opts.sandbox then return end
    if ev.kind == "dns" and ev.name and ev.answer == "answered" then
      seen.names[ev.name] = (seen.names[ev.name] or 0) + 1
    elseif (ev.kind == "connect" or ev.kind == "udp") and ev.verdict == "deny" and ev.port and host(ev)
        and ev.reason ~= "direct connection to the acceptor" and ev.reason ~= "direct datagram to the UDP relay" then
      local e = (ev.kind == "udp" and "udp:" or "") .. host(ev) .. ":" .. ev.port
      if not seen.wanted[e] then seen.order[#seen.order + 1] = e end
      seen.wanted[e] = (seen.wanted[e] or 0) + (ev.count or 1)
      if ev.name then seen.connected[ev.name] = true end
    end
  end
  events.subscribe(on)
  return {
    seen = seen,
    finish = function()
      events.unsubscribe(on)
      if not file then return nil, ferr end
      local text, listed = M.render(seen)
      file:write(text)
      file:close()
      local now = core.fs.lstat(path)
      if not now or now.type ~= "file" then
        return nil, path .. " was replaced during the run (now " .. (now and now.type or "missing") ..
          "); nothing was written through what replaced it"
      end
      return true, listed
    end,
    cancel = function() events.unsubscribe(on) end,
  }
end

return M

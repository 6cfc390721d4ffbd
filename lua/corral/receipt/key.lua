--- The host key that signs receipts: where it lives, made at first use, its public half.
--
-- The key is the caller's: root's in /var/lib/corral, anyone else's in
-- $XDG_STATE_HOME/corral (default ~/.local/state/corral); $CORRAL_STATE_DIR, when set,
-- names the directory instead (a test's, an operator's). It lives on the host only: a
-- storage, workspace, confinement boundary, extra or step grant that holds it is refused
-- (corral.state_dir.refusal). The private key never
-- reaches Lua: corral.sign reads it from its file for each signature.
--
-- corral.sign is a C module of its own, the only one linked against libcrypto, loaded
-- here at the first signature or verification (docs/receipts.md says why).
-- @module corral.receipt.key
local core = require "corral.core"
local errors = require "corral.errors"
local state_dir = require "corral.state_dir"

local M = {}

local sign_module

-- corral/sign.so beside the running host's modules (the build tree's corral/, an
-- install's lib/lua/5.4/corral/), else wherever package.cpath finds it.
local function candidates()
  local list = {}
  local host = core.proc.host_executable()
  local root = host and host:match("^(.*)/[^/]+/[^/]+$")
  if root then
    list[#list + 1] = root .. "/corral/sign.so"
    list[#list + 1] = root .. "/lib/lua/" .. _VERSION:match("%d+%.%d+") .. "/corral/sign.so"
  end
  local found = package.searchpath("corral.sign", package.cpath)
  if found then list[#list + 1] = found end
  return list
end

--- corral.sign, loaded once.
-- @treturn table the module, or nil and cannot_enforce("receipt_signature")
function M.module()
  if sign_module then return sign_module end
  local tried = {}
  for _, path in ipairs(candidates()) do
    local st = core.fs.lstat(path)
    if st and st.type == "file" then
      local open, err = package.loadlib(path, "luaopen_corral_sign")
      if open then
        sign_module = open()
        return sign_module
      end
      tried[#tried + 1] = tostring(err)
    else
      tried[#tried + 1] = path .. ": missing"
    end
  end
  return nil, errors.cannot_enforce("receipt_signature", "corral/sign.so (libcrypto) cannot be loaded: " ..
    table.concat(tried, "; "))
end

--- The caller's state directory (corral.state_dir).
-- @treturn string
-- @treturn[opt] string a directory that must already exist (the caller's $HOME), and
--   the variable naming it
M.dir = state_dir.dir

--- The private key's path.
-- @treturn string
M.path = state_dir.key_path

-- The directory and each missing parent, made 0700 for the caller.
local function make_dir(dir)
  local parent = dir:match("^(.+)/[^/]+$")
  if parent and not core.fs.lstat(parent) then
    local ok, err = make_dir(parent)
    if not ok then return nil, err end
  end
  local ok, err, errno = core.fs.mkdir(dir, tonumber("700", 8))
  if not ok and errno ~= core.errno.EEXIST then return nil, err end
  return true
end

-- A directory others may write to lets them replace the key (rename over it), unless it
-- is sticky and the key is ours (checked by check_private); one that is not ours, or a
-- symbolic link, is someone else's choice of key.
local function check_dir(dir)
  local st = core.fs.lstat(dir)
  if not st then return nil, dir .. " does not exist" end
  if st.type == "link" then return nil, dir .. " is a symbolic link" end
  if st.type ~= "dir" then return nil, dir .. " is not a directory" end
  local me = core.proc.geteuid()
  if st.uid ~= me and st.uid ~= 0 then return nil, dir .. " is not the caller's (uid " .. st.uid .. ")" end
  local sticky = st.mode & tonumber("1000", 8) ~= 0
  if st.mode & tonumber("022", 8) ~= 0 and not (sticky and st.uid == me) then
    return nil, string.format("%s has mode %o: others may replace the key in it (0700 expected)", dir, st.mode & 4095)
  end
  return true
end

-- A key anyone else could read or replace signs nothing the caller alone vouches for.
local function check_private(path)
  local st = core.fs.lstat(path)
  if not st or st.type ~= "file" then return nil, path .. " is not a regular file" end
  if st.uid ~= core.proc.geteuid() then return nil, path .. " is not the caller's (uid " .. st.uid .. ")" end
  if st.mode & tonumber("077", 8) ~= 0 then
    return nil, string.format("%s has mode %o: others may read it (0600 expected)", path, st.mode & 511)
  end
  return true
end

--- The host key, made at first use: its path, public PEM, raw bytes and fingerprint.
-- @treturn table `{path =, pem =, raw =, fingerprint = "sha256:<hex>", created =}`, or nil and
--   cannot_enforce("receipt_signature")
function M.load()
  local sign, serr = M.module()
  if not sign then return nil, serr end
  local path = M.path()
  local function refuse(detail) return nil, errors.cannot_enforce("receipt_signature", detail) end
  local dir, base, var = M.dir()
  if base and not core.fs.lstat(base) then
    return refuse("the key's directory " .. dir .. ": $" .. var .. " (" .. base .. ") does not exist " ..
      "(set XDG_STATE_HOME or CORRAL_STATE_DIR)")
  end
  local ok, err = make_dir(dir)
  if not ok then return refuse("the key's directory: " .. tostring(err)) end
  ok, err = check_dir(dir)
  if not ok then return refuse("the key's directory: " .. err) end
  local lst = core.fs.lstat(path)
  if lst and lst.type ~= "file" then
    return refuse(path .. (lst.type == "link" and " is a symbolic link" or " is not a regular file") ..
      ": the key must be a file of its own")
  end
  local created
  created, err = sign.ensure_key(path)
  if created == nil then return refuse(tostring(err)) end
  ok, err = check_private(path)
  if not ok then return refuse(err) end
  local pem, raw = sign.public_key(path)
  if not pem then return refuse(tostring(raw)) end
  return { path = path, pem = pem, raw = raw, fingerprint = M.fingerprint(raw), created = created }
end

--- A public key's fingerprint: the SHA-256 of its 32 raw bytes (the DSSE keyid).
-- @tparam string raw
-- @treturn string `sha256:<hex>`
function M.fingerprint(raw)
  return "sha256:" .. assert(core.digest.sha256(raw))
end

--- Signs bytes with the host key.
-- @tparam table key from `M.load`
-- @tparam string msg
-- @treturn string the 64-byte signature, or nil and why
function M.sign(key, msg)
  return M.module().sign(key.path, msg)
end

return M

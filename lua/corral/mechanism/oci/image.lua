--- The `oci` mechanism's own image: an empty root holding only the mount points and the
-- links of a tenant root plan (corral.tenant_root). The runtime itself is bound from the
-- host read-only at run time, as native and bwrap show it, so the image holds no
-- program and no registry is needed: the engine imports a tar corral writes.
--
-- The tag is the SHA-256 of that tar (`localhost/corral-root:<24 hex digits>`): the
-- same plan gives the same tag, so the image is made once per host and reused, and a
-- host whose runtime layout changes gets a new one. `ensure` has the engine import it
-- (corral.mechanism.oci.engine) when this host does not have it yet.
-- @module corral.mechanism.oci.image
local core = require "corral.core"
local engine = require "corral.mechanism.oci.engine"

local M = {}

local ready = {} -- image → true, or the path of its mark (corral's own)

M.REPOSITORY = "localhost/corral-root"

-- A ustar header block for a directory ("5") or a symbolic link ("2"), owned by root,
-- dated at the epoch so that the archive depends on the entries alone.
local function header(name, kind, mode, link)
  local function field(s, n) return s .. string.rep("\0", n - #s) end
  local function octal(v, n) return string.format("%0" .. (n - 1) .. "o", v) .. "\0" end
  local parts = {
    field(name, 100), octal(mode, 8), octal(0, 8), octal(0, 8), octal(0, 12), octal(0, 12),
    "        ", kind, field(link or "", 100), "ustar\0", "00", field("root", 32), field("root", 32),
    octal(0, 8), octal(0, 8), field("", 155), field("", 12),
  }
  local block = table.concat(parts)
  local sum = 0
  for i = 1, #block do sum = sum + block:byte(i) end
  return block:sub(1, 148) .. string.format("%06o", sum) .. "\0 " .. block:sub(157)
end

--- The tar of an empty root for a root plan's mounts: every bind's destination and the
-- fixed mount points a directory, every link a link.
-- @tparam table plan a tenant root plan (only `mounts` is read)
-- @treturn string the archive
function M.tar(plan)
  local dirs, links, seen = {}, {}, {}
  local function dir(path)
    local rel = path:gsub("^/+", "")
    if rel == "" or seen[rel] then return end
    local parent = rel:match("^(.*)/[^/]+$")
    if parent then dir(parent) end
    seen[rel] = true
    dirs[#dirs + 1] = rel
  end
  for _, d in ipairs({ "proc", "dev", "sys", "tmp", "storage", "workspace", "etc", "run" }) do dir(d) end
  for _, m in ipairs(plan.mounts) do
    if m.type == "symlink" then
      links[#links + 1] = { m.dest:gsub("^/+", ""), m.target }
    elseif not m.own then -- a file bound over one the runtime shows: no mount point of the image's
      dir(m.dest)
    end
  end
  table.sort(links, function(a, b) return a[1] < b[1] end)
  local out = {}
  for _, d in ipairs(dirs) do out[#out + 1] = header(d .. "/", "5", d == "tmp" and tonumber("1777", 8) or 493) end
  for _, l in ipairs(links) do
    if not seen[l[1]] then out[#out + 1] = header(l[1], "2", 511, l[2]) end
  end
  out[#out + 1] = string.rep("\0", 1024)
  return table.concat(out)
end

--- The tag an archive is imported as.
-- @tparam string archive
-- @treturn string
function M.tag(archive)
  return M.REPOSITORY .. ":" .. core.digest.sha256(archive):sub(1, 24)
end

--- The image a sandbox runs: the operator's, or corral's own, imported when this host
-- does not have it yet.
-- @tparam table root a tenant root plan
-- @treturn[1] string the image
-- @return[2] nil
-- @treturn[2] table the engine's error
function M.ensure(root)
  if engine.config.image then
    if not ready[engine.config.image] then
      local _, err = engine.call({ "image", "inspect", "--format", "{{.Id}}", engine.config.image })
      if err then return nil, err end
      ready[engine.config.image] = true
    end
    return engine.config.image
  end
  local present = {}
  for _, m in ipairs(root.mounts) do
    if m.type == "symlink" or not m.optional or core.fs.lstat(m.src) then present[#present + 1] = m end
  end
  local archive = M.tar({ mounts = present })
  local tag = M.tag(archive)
  if ready[tag] then return tag end
  -- A mark in corral's root-only directory saves the engine call on every later run
  -- (measured: it was a third of `corral run`'s time); a run that then finds the image
  -- gone (status 125) drops the mark, and the next provision imports it again.
  local mark = engine.scratch_dir() .. "/image-" .. tag:match(":(.*)$")
  if core.fs.lstat(mark) then
    ready[tag] = mark
    return tag
  end
  if not engine.call({ "image", "inspect", "--format", "{{.Id}}", tag }) then
    local path = engine.scratch_dir() .. "/root-" .. core.proc.getpid() .. ".tar"
    assert(engine.write_private(path, archive))
    local _, err = engine.call({ "import", path, tag })
    os.remove(path)
    if err then return nil, err end
  end
  engine.write_private(mark, tag .. "\n")
  ready[tag] = mark
  return tag
end

--- Forgets the marks of corral's images (a run found one gone: status 125), so that
-- the next `ensure` asks the engine again.
function M.forget()
  for tag, mark in pairs(ready) do
    if type(mark) == "string" then os.remove(mark) ready[tag] = nil end
  end
end

return M

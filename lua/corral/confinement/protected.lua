--- The read-only paths inside a `corral confine` boundary: files and directories that
-- run code later on the operator's behalf (git's hooks and config, direnv's .envrc, an
-- editor's tasks, shell start-up files), which a confined agent may read but not change.
--
-- Found at the top of each boundary directory (`--permit`, a directory `--extra`) and in
-- every git repository beneath it, to a bounded depth; `--read-only PATH` adds one,
-- `--writable PATH` drops the defaults at or beneath PATH. The wrapper binds each one
-- read-only over itself (core/host/confine.c); Landlock alone cannot take a path out of
-- the tree it grants, so under it alone they are listed as not held.
-- @module corral.confinement.protected
local core = require "corral.core"
local errors = require "corral.errors"

local M = {}

--- Names protected in every repository (and at the top of each boundary directory):
-- each runs code when the operator's tools next open the tree.
M.REPOSITORY = {
  ".git/hooks", ".git/config", -- git runs hooks; config names fsmonitor, hooksPath, sshCommand, filters, aliases
  ".envrc",                    -- direnv
  ".vscode", ".idea",          -- editor tasks, launch configurations, interpreter paths
  ".devcontainer", ".devcontainer.json", -- initializeCommand runs on the host
  ".npmrc", ".yarnrc", ".yarnrc.yml",   -- script-shell, yarnPath: a program npm or yarn runs
}

--- Names protected at the top of each boundary directory only (a HOME given as the
-- boundary): shell start-up files, git's and ssh's user configuration.
M.HOME = {
  ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile",
  ".zshenv", ".zshrc", ".zprofile", ".zlogin", ".zlogout",
  ".kshrc", ".cshrc", ".tcshrc", ".login", ".logout", ".config/fish",
  ".gitconfig", ".config/git", ".ssh",
}

--- The search for repositories: directories this deep below a boundary directory (its
-- children are depth 1), at most this many entries looked at in all.
M.DEPTH, M.ENTRIES = 3, 5000

--- Why a protected name is not held: the texts the plan lists beside it (a count of
-- hard links, or the symlink on the way, goes before `hard_links` and `on_the_way`).
-- Data, like the lists above: core/host/confine_fast.c's copy is generated from them.
M.WHY = {
  link = "a symlink: the link itself could be replaced; give --read-only with its target",
  special = "neither a file nor a directory",
  hard_links = " hard links: another name of it could be written",
  on_the_way = " on its way is a symlink; give --read-only with its target",
}

local function lstat(path) return core.fs.lstat(path) end

-- Every git repository (a directory holding a .git directory) beneath `root`, breadth
-- first, within the bounds; and whether a bound stopped the search.
local function repositories(root, budget)
  local found, queue = {}, { { root, 0 } }
  local head = 1
  while head <= #queue do
    local dir, depth = queue[head][1], queue[head][2]
    head = head + 1
    local names = depth < M.DEPTH and core.fs.listdir(dir) or {}
    for _, name in ipairs(names) do
      if budget.left == 0 then return found, true end
      budget.left = budget.left - 1
      local path = dir .. "/" .. name
      local st = name ~= ".git" and lstat(path)
      -- symlinks are not followed, nor other filesystems entered
      if st and st.type == "dir" and st.dev == budget.dev then
        -- a .git that is a symlink is found too: what lies beneath it is then listed as
        -- not protected, rather than the repository passed over unsaid
        local git = lstat(path .. "/.git")
        if git and (git.type == "dir" or git.type == "link") then found[#found + 1] = path end
        queue[#queue + 1] = { path, depth + 1 }
      end
    end
  end
  return found, false
end

-- Submodules keep their git directories in .git/modules/NAME: their config and hooks.
local function submodule_names(repo)
  local out = {}
  for _, name in ipairs(core.fs.listdir(repo .. "/.git/modules") or {}) do
    out[#out + 1] = ".git/modules/" .. name .. "/config"
    out[#out + 1] = ".git/modules/" .. name .. "/hooks"
  end
  return out
end

-- Sorts one candidate into the plan: held, absent, or unprotected with why.
local function judge(plan, path)
  if plan.seen[path] then return end
  plan.seen[path] = true
  local st = lstat(path)
  if not st then
    plan.absent[#plan.absent + 1] = path
  elseif st.type == "link" then
    plan.unprotected[#plan.unprotected + 1] = { path = path, why = M.WHY.link }
  elseif st.type ~= "dir" and st.type ~= "file" then
    plan.unprotected[#plan.unprotected + 1] = { path = path, why = M.WHY.special }
  elseif st.type == "file" and st.nlink > 1 then
    plan.unprotected[#plan.unprotected + 1] = { path = path, why = st.nlink .. M.WHY.hard_links }
  else
    plan.paths[#plan.paths + 1] = path
  end
end

-- The first symlink among the directories of `name` (".git" of ".git/config") beneath
-- `base`, or nil: the wrapper binds only paths with no symlink on the way.
local function linked_on_the_way(base, name)
  local at = base
  for part in name:gmatch("([^/]+)/") do
    at = at .. "/" .. part
    local st = lstat(at)
    if st and st.type == "link" then return at end
  end
end

local function dropped(path, writable)
  for _, w in ipairs(writable) do
    if core.path.is_beneath(path, w) then return true end
  end
  return false
end

--- The read-only plan of a boundary.
-- @tparam {string,...} roots the boundary directories (resolved): `--permit` first, then
--   each directory `--extra`
-- @tparam {string,...} read_only resolved paths asked for (checked by `resolve`)
-- @tparam {string,...} writable resolved paths whose defaults are dropped
-- @treturn table `{paths = {…} (held read-only, sorted), absent = {…}, unprotected =
--   {{path =, why =}, …}, stopped = bool (a search bound was reached)}`; or nil and
--   invalid_argument for a `writable` path inside one that stays read-only
function M.plan(roots, read_only, writable)
  local plan = { paths = {}, absent = {}, unprotected = {}, seen = {}, stopped = false }
  for _, p in ipairs(read_only) do judge(plan, p) end
  local function add(base, names)
    for _, n in ipairs(names) do
      local path = base .. "/" .. n
      -- false: dropped or judged already; nil: no symlink on the way
      local link = not dropped(path, writable) and not plan.seen[path] and linked_on_the_way(base, n)
      if link then
        plan.seen[path] = true
        plan.unprotected[#plan.unprotected + 1] = { path = path, why = link .. M.WHY.on_the_way }
      elseif link == nil then
        judge(plan, path)
      end
    end
  end
  for _, root in ipairs(roots) do
    local st = lstat(root)
    local budget = { left = M.ENTRIES, dev = st and st.dev }
    add(root, M.HOME)
    local repos, stopped = repositories(root, budget)
    plan.stopped = plan.stopped or stopped
    table.insert(repos, 1, root)
    for _, repo in ipairs(repos) do
      add(repo, M.REPOSITORY)
      add(repo, submodule_names(repo))
    end
  end
  plan.seen = nil
  -- a path inside one held read-only cannot be writable: said, not silently ignored
  for i, w in ipairs(writable) do
    for _, p in ipairs(plan.paths) do
      if w ~= p and core.path.is_beneath(w, p) then
        return nil, errors.invalid_argument("writable[" .. i .. "]", w .. " is inside " .. p ..
          ", which stays read-only; give --writable " .. p)
      end
    end
  end
  table.sort(plan.paths)
  table.sort(plan.absent)
  return plan
end

--- What the plan holds under `layers`: the spec's `read_only` table and the wrapper's
-- arguments. Only a layer that builds a mount namespace (ns, bwrap) can bind a path
-- read-only inside a writable one; under Landlock alone the plan is reported as not
-- held, and a path the caller named is refused (fail closed).
-- @tparam table plan from `plan`
-- @tparam {string,...} layers the spec's layers
-- @tparam integer asked how many paths the caller named (`--read-only`)
-- @treturn table `{held = bool, by = layer|nil, why = text|nil, paths, absent, unprotected,
--   stopped}` and {string,...} the wrapper's `--read-only` arguments; or nil and cannot_enforce
function M.for_layers(plan, layers, asked)
  local by
  for _, l in ipairs(layers) do
    if l == "ns" or l == "bwrap" then by = l end
  end
  local out = { held = by ~= nil, by = by, paths = plan.paths, absent = plan.absent,
                unprotected = plan.unprotected, stopped = plan.stopped }
  local args = {}
  if not by then
    out.why = "Landlock alone cannot take a path out of the tree it grants: these stay writable"
    if asked > 0 then
      return nil, errors.cannot_enforce("read_only_paths", "--read-only needs the ns or bwrap layer; " .. out.why)
    end
    return out, args
  end
  for _, p in ipairs(plan.paths) do
    args[#args + 1] = "--read-only"
    args[#args + 1] = p
  end
  return out, args
end

--- Resolves a `--read-only` (must exist: a file or directory) or `--writable` (may be
-- missing: its parent is resolved) path, inside the boundary and not a boundary
-- directory itself.
-- @tparam string name the argument's name, for errors (`read_only[1]`)
-- @tparam string value the path as given
-- @tparam boolean must_exist
-- @tparam {string,...} roots the boundary directories (resolved)
-- @tparam function check_text the caller's text check of an absolute path argument
-- @treturn string the resolved path, or nil and invalid_argument
function M.resolve(name, value, must_exist, roots, check_text)
  local bad = check_text(name, value)
  if bad then return nil, bad end
  local resolved, err, errno = core.path.resolve_file(value)
  if not resolved and not must_exist and errno == core.errno.ENOENT then
    local parent, base = value:match("^(.*)/([^/]+)$")
    local dir = parent and base ~= "." and base ~= ".." and core.path.resolve(parent == "" and "/" or parent)
    resolved = dir and (dir == "/" and "" or dir) .. "/" .. base
  end
  if not resolved then return nil, errors.invalid_argument(name, err) end
  local inside = false
  for _, r in ipairs(roots) do
    if resolved == r then
      return nil, errors.invalid_argument(name, resolved .. " is a boundary directory itself; give a path beneath it")
    end
    inside = inside or core.path.is_beneath(resolved, r)
  end
  if not inside then
    return nil, errors.invalid_argument(name, resolved ..
      " is outside the boundary (--permit and each directory --extra)")
  end
  if must_exist then
    local st = lstat(resolved)
    if not st or (st.type ~= "dir" and st.type ~= "file") then
      return nil, errors.invalid_argument(name, resolved .. " is neither a file nor a directory")
    end
    if st.type == "file" and st.nlink > 1 then
      return nil, errors.invalid_argument(name, string.format("%s has %d hard links: another of its names " ..
        "could still be written; give a file with one name", resolved, st.nlink))
    end
  end
  return resolved
end

return M

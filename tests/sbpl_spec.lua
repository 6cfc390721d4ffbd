-- The macOS control-plane profile (corral.confinement.sandbox_exec_spec over corral.sbpl's
-- runtime read set and core.sbpl.emit): the emitted profile is read back with a small
-- s-expression reader (string literals with `\` escapes, `;` comments), so each check is
-- about what a Scheme reader sees, not about bytes. Paths are real directories, resolved.
local core = require "corral.core"
local sbpl = require "corral.sbpl"
local confinement = require "corral.confinement"
local errors = require "corral.errors"

local h = require "helpers"

-- Reads text into a list of top-level forms. A form is {list = true, ...}; an atom is
-- {atom = "x"}; a string is {str = "decoded"}. Returns nil, why on any syntax error.
local function read_sexprs(text)
  local pos, len = 1, #text
  local function skip()
    while true do
      local _, e = text:find("^[ \t\r\n]+", pos)
      if e then pos = e + 1 end
      if text:sub(pos, pos) ~= ";" then return end
      local nl = text:find("\n", pos, true)
      pos = nl and nl + 1 or len + 1
    end
  end
  local datum
  function datum()
    skip()
    local c = text:sub(pos, pos)
    if c == "(" then
      pos = pos + 1
      local l = { list = true }
      while true do
        skip()
        if pos > len then return nil, "unterminated list" end
        if text:sub(pos, pos) == ")" then
          pos = pos + 1
          return l
        end
        local d, err = datum()
        if not d then return nil, err end
        l[#l + 1] = d
      end
    elseif c == '"' then
      pos = pos + 1
      local buf = {}
      while pos <= len do
        local ch = text:sub(pos, pos)
        if ch == '"' then
          pos = pos + 1
          return { str = table.concat(buf) }
        end
        if ch == "\\" then
          pos = pos + 1
          if pos > len then break end
          ch = text:sub(pos, pos)
        end
        buf[#buf + 1] = ch
        pos = pos + 1
      end
      return nil, "unterminated string"
    elseif c == ")" or c == "" then
      return nil, "unexpected " .. (c == "" and "end" or ")")
    end
    local s, e = text:find('^[^ \t\r\n()";]+', pos)
    pos = e + 1
    return { atom = text:sub(s, e) }
  end
  local forms = {}
  while true do
    skip()
    if pos > len then return forms end
    local d, err = datum()
    if not d then return nil, err end
    if not d.list then return nil, "top-level atom" end
    forms[#forms + 1] = d
  end
end

local function has_atom(form, a)
  for _, x in ipairs(form) do
    if x.atom == a then return true end
  end
  return false
end

-- Index of the first (allow … op … (filter "path")) form, or nil.
local function find_grant(forms, op, filter, path)
  for i, f in ipairs(forms) do
    if f[1].atom == "allow" and has_atom(f, op) then
      for k = 2, #f do
        local flt = f[k]
        if flt.list and #flt == 2 and flt[1].atom == filter and flt[2].str == path then
          return i
        end
      end
    end
  end
end

describe("the s-expression reader used by these tests", function()
  it("reads strings with escapes and comments, and rejects unbalanced text", function()
    local forms = assert(read_sexprs('(a "x\\")(\\\\" b) ; (open in a comment\n(c)'))
    assert.equal(2, #forms)
    assert.equal('x")(\\', forms[1][2].str)
    assert.is_nil(read_sexprs("(a (b)"))
    assert.is_nil(read_sexprs("(a))"))
    assert.is_nil(read_sexprs('(a "b)'))
    assert.is_nil(read_sexprs('(a "b\\")'))
  end)
end)

local UNIX_SOCKET_DENY = assert(read_sexprs("(deny network-outbound (remote unix-socket))"))[1]

-- The profile `corral sbpl` prints and `corral confine` runs under on macOS, or nil and
-- the error.
local function profile(permit, extras)
  local spec, err = confinement.sandbox_exec_spec({ "/bin/sh" },
    { permit_path = permit, permit_extra_subpaths = extras })
  if not spec then return nil, err end
  return spec.profile
end

describe("the control-plane SBPL profile", function()
  local root

  setup(function()
    root = h.tmpdir("sbpl")
    h.must(table.concat({
      "cd " .. h.quote(root),
      "mkdir -p work cache other/deep real-work 'a\"b\\c' 'nl\nx' 'cr\rx'",
      "ln -s real-work work-link",
      "touch file",
      "mkfifo fifo",
    }, " && "))
  end)

  teardown(function()
    h.rmrf(root)
  end)

  it("lists the runtime read set as fresh absolute paths", function()
    local paths = sbpl.runtime_read_paths()
    assert.is_true(#paths >= 10)
    for _, p in ipairs(paths) do
      assert.matches("^/", p)
      assert.not_matches("/$", p)
    end
    for _, want in ipairs { "/usr/lib", "/System", "/private/etc", "/bin" } do
      local seen = false
      for _, p in ipairs(paths) do seen = seen or p == want end
      assert.is_true(seen, want)
    end
    paths[1] = "/changed"
    assert.not_equal("/changed", sbpl.runtime_read_paths()[1])
  end)

  it("emits version, deny default, the runtime, the boundary, then the extras", function()
    local text = assert(profile(root .. "/work", { root .. "/cache", root .. "/other/deep" }))
    local forms = assert(read_sexprs(text))
    assert.same({ { atom = "version" }, { atom = "1" }, list = true }, forms[1])
    assert.same({ { atom = "deny" }, { atom = "default" }, list = true }, forms[2])
    -- One deny past the default: unix-socket connects, taken back from (allow network*)
    -- before any socket is granted (later rules win), so it narrows and never cancels a grant.
    local socket_deny
    for i = 3, #forms do
      if forms[i][1].atom == "deny" then
        assert.is_nil(socket_deny, "a second deny: form " .. i)
        assert.same(UNIX_SOCKET_DENY, forms[i], "form " .. i)
        socket_deny = i
      else
        assert.equal("allow", forms[i][1].atom, "form " .. i .. " is not an allow")
      end
    end
    assert.is_truthy(socket_deny)

    local net, last_runtime
    for i, f in ipairs(forms) do
      if #f == 2 and f[2].atom == "network*" then net = i end
    end
    assert.is_truthy(net)
    for _, p in ipairs(sbpl.runtime_read_paths()) do
      local r = find_grant(forms, "file-read*", "subpath", p)
      assert.is_truthy(r, p)
      assert.is_false(has_atom(forms[r], "file-write*"), p)
      last_runtime = math.max(last_runtime or 0, r)
    end

    local b = find_grant(forms, "file-write*", "subpath", root .. "/work")
    local x1 = find_grant(forms, "file-write*", "subpath", root .. "/cache")
    local x2 = find_grant(forms, "file-write*", "subpath", root .. "/other/deep")
    assert.is_truthy(b and x1 and x2)
    assert.is_true(b > last_runtime and b > net)
    assert.is_true(has_atom(forms[b], "file-read*"))
    assert.is_true(x1 > b and x2 > x1)
    -- Later rules win: nothing after the last extra, so nothing can take it back.
    assert.equal(#forms, x2)
    -- The parent of the boundary: metadata for getcwd, never its contents.
    assert.is_truthy(find_grant(forms, "file-read-metadata", "literal", root))
    assert.is_nil(find_grant(forms, "file-read*", "subpath", root))
  end)

  it("escapes \" and \\ so the path reads back whole", function()
    local dir = root .. '/a"b\\c'
    local text = assert(profile(dir))
    assert.truthy(text:find('a\\"b\\\\c"', 1, true))
    local forms = assert(read_sexprs(text))
    assert.equal(#forms, find_grant(forms, "file-write*", "subpath", dir))
  end)

  it("grants a symlinked permit_path as its resolved target", function()
    local text = assert(profile(root .. "/work-link"))
    local forms = assert(read_sexprs(text))
    assert.equal(#forms, find_grant(forms, "file-write*", "subpath", root .. "/real-work"))
    assert.is_nil(text:find("work-link", 1, true))
  end)

  it("refuses a resolved path with a newline or CR, and names the argument", function()
    for _, bad in ipairs { "/nl\nx", "/cr\rx" } do
      local p, err = profile(root .. bad)
      assert.is_nil(p)
      assert.is_true(errors.is(err, "invalid_argument"))
      assert.equal("permit_path", err.argument)
      p, err = profile(root .. "/work", { root .. "/cache", root .. bad })
      assert.is_nil(p)
      assert.equal("permit_extra_subpaths[2]", err.argument)
    end
    -- Control: the same call with only the good paths.
    assert.is_string(profile(root .. "/work", { root .. "/cache" }))
  end)

  it("refuses paths that do not exist, are not directories (extras: nor files nor sockets), or are /", function()
    -- an extra may be one regular file or socket; a fifo is neither
    for _, bad in ipairs { root .. "/nope", root .. "/file", root .. "/fifo", "/", "relative", "a\0b", 42 } do
      local p, err = profile(bad)
      assert.is_nil(p)
      assert.is_true(errors.is(err, "invalid_argument"), tostring(bad))
      assert.equal("permit_path", err.argument)
      if bad ~= root .. "/file" then
        p, err = profile(root .. "/work", { bad })
        assert.is_nil(p)
        assert.equal("permit_extra_subpaths[1]", err.argument)
      end
    end
    local p, err = profile(root .. "/work", "not a list")
    assert.is_nil(p)
    assert.equal("permit_extra_subpaths", err.argument)
    assert.is_string(profile(root .. "/work", {})) -- control
  end)
end)

-- What sandbox-exec decides for connect(2) to a pathname unix socket, read off the
-- profile as Seatbelt reads it: the last rule whose operation and filters match wins.
-- Only the forms the profile uses are understood; any other filter under a network rule
-- fails the test rather than being guessed at.
local function unix_connect_verdict(forms, path)
  local verdict
  for _, f in ipairs(forms) do
    local action, op_match, filters = f[1].atom, false, {}
    for k = 2, #f do
      local x = f[k]
      if x.atom then
        local op = x.atom
        op_match = op_match or op == "default" or op == "network-outbound" or
          (op:sub(-1) == "*" and ("network-outbound"):sub(1, #op - 1) == op:sub(1, -2))
      else
        filters[#filters + 1] = x
      end
    end
    local match = op_match
    if op_match and #filters > 0 then
      match = false
      for _, flt in ipairs(filters) do
        if flt[1].atom == "remote" and flt[2].atom == "unix-socket" then
          local sub = flt[3]
          if not sub then
            match = true
          elseif sub[1].atom == "subpath" then
            match = match or core.path.is_beneath(path, sub[2].str)
          elseif sub[1].atom == "path-literal" then
            match = match or path == sub[2].str
          else
            error("a unix-socket filter this reader does not know: " .. sub[1].atom)
          end
        elseif f[2].atom and f[2].atom:match("^network") then
          error("a network filter this reader does not know: " .. tostring(flt[1].atom))
        end
      end
    end
    if match then verdict = action end
  end
  return verdict
end

describe("unix sockets in the control-plane SBPL profile", function()
  local root

  setup(function()
    root = h.tmpdir("sbpl-sock")
    h.must("cd " .. h.quote(root) .. " && mkdir work agent && /usr/bin/python3 -c '" ..
      "import socket,sys\nfor n in sys.argv[1:]: socket.socket(socket.AF_UNIX).bind(n)' " ..
      "agent/granted.sock agent/sibling.sock")
  end)

  teardown(function()
    h.rmrf(root)
  end)

  it("lets the command connect to the granted socket and not to its sibling", function()
    local spec = assert(confinement.sandbox_exec_spec({ "/bin/sh" },
      { permit_path = root .. "/work", permit_extra_subpaths = { root .. "/agent/granted.sock" } }))
    local forms = assert(read_sexprs(spec.profile))
    -- the attempt: the sibling, in the same directory
    assert.equal("deny", unix_connect_verdict(forms, root .. "/agent/sibling.sock"))
    assert.equal("deny", unix_connect_verdict(forms, "/var/run/docker.sock"))
    -- the controls: the granted socket, one inside the boundary, mDNSResponder (egress)
    assert.equal("allow", unix_connect_verdict(forms, root .. "/agent/granted.sock"))
    assert.equal("allow", unix_connect_verdict(forms, root .. "/work/s.sock"))
    assert.equal("allow", unix_connect_verdict(forms, "/private/var/run/mDNSResponder"))
    -- nothing else of the directory: neither its listing nor the sibling as a file
    assert.is_nil(find_grant(forms, "file-read*", "subpath", root .. "/agent"))
    assert.is_truthy(find_grant(forms, "file-read-metadata", "literal", root .. "/agent"))
  end)

  it("grants a file alone, read-only", function()
    h.write(root .. "/agent/config", "x")
    local spec = assert(confinement.sandbox_exec_spec({ "/bin/sh" },
      { permit_path = root .. "/work", permit_extra_subpaths = { root .. "/agent/config" } }))
    local forms = assert(read_sexprs(spec.profile))
    local r = find_grant(forms, "file-read*", "literal", root .. "/agent/config")
    assert.is_truthy(r)
    assert.is_false(has_atom(forms[r], "file-write*"))
    assert.is_nil(find_grant(forms, "file-read*", "literal", root .. "/agent/granted.sock"))
  end)

  it("holds under sandbox-exec itself #macos", function()
    if core.proc.uname() ~= "Darwin" then
      pending("sandbox-exec runs only on macOS; above, the profile is read as Seatbelt reads it")
      return
    end
    local spec = assert(confinement.sandbox_exec_spec({ "/bin/sh", { "-c", h.attempt_then_control(
      [[/usr/bin/python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$1/sibling.sock"]],
      [[/usr/bin/python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' ]] ..
      [["$1/granted.sock"]] ..
      " && echo granted-connected"), "sh", root .. "/agent" } },
      { permit_path = root .. "/work", permit_extra_subpaths = { root .. "/agent/granted.sock" } }))
    local servers = h.sh([[cd "$1" && /usr/bin/python3 -c '
import socket, os, sys, time
for n in ("granted.sock", "sibling.sock"):
    os.unlink(n)
    s = socket.socket(socket.AF_UNIX); s.bind(n); s.listen(4); globals()[n] = s
time.sleep(30)' >/dev/null 2>&1 & echo $!]], root .. "/agent"):match("%d+")
    h.defer(finally, function() os.execute("kill " .. servers) end)
    assert(h.wait_for(function() return h.sh('test -S "$1/granted.sock" && echo y', root .. "/agent"):match("y") end))
    local argv = { spec.cmd }
    for _, a in ipairs(spec.args) do argv[#argv + 1] = a end
    local out = h.capture(argv)
    h.assert_refused(h.after_attempt(out, "granted%-connected"), out)
  end)
end)

describe("core.sbpl.emit", function()
  local rt = { "/usr/lib", "/System" }

  it("refuses relative, NUL, newline and CR paths in every position", function()
    for _, bad in ipairs { "rel/ative", "/a\0b", "/a\nb", "/a\rb", "/a/../b", "/a/" } do
      local t, msg, errno = core.sbpl.emit(bad, {}, rt)
      assert.is_nil(t)
      assert.equal(core.errno.EINVAL, errno)
      assert.matches("permit_path", msg)
      t, msg, errno = core.sbpl.emit("/work", { "/ok", bad }, rt)
      assert.is_nil(t)
      assert.equal(core.errno.EINVAL, errno)
      assert.matches("extras%[2%]", msg)
      t, msg, errno = core.sbpl.emit("/work", {}, { bad })
      assert.is_nil(t)
      assert.equal(core.errno.EINVAL, errno)
      assert.matches("runtime_reads%[1%]", msg)
    end
    assert.is_string(core.sbpl.emit("/work", { "/ok" }, rt)) -- control
  end)

  it("raises on arguments of the wrong type", function()
    assert.has_error(function() core.sbpl.emit(nil) end)
    assert.has_error(function() core.sbpl.emit("/work", "/x") end)
    assert.has_error(function() core.sbpl.emit("/work", { 42 }) end)
    assert.has_error(function() core.sbpl.emit("/work", {}, { true }) end)
    assert.is_string(core.sbpl.emit("/work")) -- control: lists are optional
  end)

  it("is balanced and carries egress and the device literals", function()
    -- Unescaped, this would close the grant and add a top-level (allow … (subpath "/")).
    local inj = '/x")) (allow file-write* (subpath "/")) (("'
    local text = assert(core.sbpl.emit("/work", { inj }, rt))
    local forms = assert(read_sexprs(text))
    assert.is_truthy(find_grant(forms, "file-write*", "literal", "/dev/null"))
    assert.is_truthy(find_grant(forms, "file-read*", "literal", "/dev/urandom"))
    assert.is_truthy(text:find("\n(allow network*)\n", 1, true))
    -- The would-be injection is one string in the last form; / is never writable.
    assert.equal(#forms, find_grant(forms, "file-write*", "subpath", inj))
    assert.is_nil(find_grant(forms, "file-write*", "subpath", "/"))
    -- Control: the same rule written without escaping is read as a grant of / by this
    -- reader, so the check above can tell an injection from its absence.
    local naive = assert(read_sexprs('(allow file-read* file-write* (subpath "' .. inj .. '"))'))
    assert.is_truthy(find_grant(naive, "file-write*", "subpath", "/"))
  end)
end)

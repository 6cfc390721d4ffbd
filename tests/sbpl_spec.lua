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
    for i = 3, #forms do
      assert.equal("allow", forms[i][1].atom, "form " .. i .. " is not an allow")
    end

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

  it("refuses paths that do not exist, are not directories, or are /", function()
    for _, bad in ipairs { root .. "/nope", root .. "/file", "/", "relative", "a\0b", 42 } do
      local p, err = profile(bad)
      assert.is_nil(p)
      assert.is_true(errors.is(err, "invalid_argument"), tostring(bad))
      assert.equal("permit_path", err.argument)
      p, err = profile(root .. "/work", { bad })
      assert.is_nil(p)
      assert.equal("permit_extra_subpaths[1]", err.argument)
    end
    local p, err = profile(root .. "/work", "not a list")
    assert.is_nil(p)
    assert.equal("permit_extra_subpaths", err.argument)
    assert.is_string(profile(root .. "/work", {})) -- control
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

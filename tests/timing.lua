-- A busted output handler that prints what the default one prints and, when
-- CORRAL_TEST_TIMES names a file, appends where the time went, one tab-separated
-- line per test and per spec file:
--   test <file> <seconds in the it> <seconds since the previous test ended> <name>
--   file <file> <seconds>
-- The second figure of a test line counts the set-ups (lazy_setup, before_each) and
-- the previous test's teardowns that busted runs outside the it.
-- Use: CORRAL_TEST_TIMES=/tmp/t.tsv busted -o tests/timing.lua tests/x_spec.lua
--      scripts/test-times /tmp/t.tsv
return function(options)
  local busted = require("busted")
  local handler = require("busted.outputHandlers.plainTerminal")(options)
  local path = os.getenv("CORRAL_TEST_TIMES")
  if not path or path == "" then
    return handler
  end
  local out = assert(io.open(path, "a"))
  out:setvbuf("line")
  local mark

  local function file_of(element)
    local trace = element.trace
    return trace and trace.short_src or "?"
  end

  busted.subscribe({ "file", "start" }, function()
    mark = busted.monotime()
    return nil, true
  end)
  busted.subscribe({ "file", "end" }, function(file)
    out:write(("file\t%s\t%.3f\n"):format(file.name, file.duration or 0))
    return nil, true
  end)
  busted.subscribe({ "test", "end" }, function(element)
    local now = busted.monotime()
    local name = handler.getFullName(element):gsub("[\t\n]", " ")
    out:write(("test\t%s\t%.3f\t%.3f\t%s\n"):format(file_of(element), element.duration or 0,
      now - (mark or now), name))
    mark = now
    return nil, true
  end)
  return handler
end

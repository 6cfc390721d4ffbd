--- What the Lua fuzz targets share (tests/fuzz/fuzz_lua.c runs them): `check`, which
-- raises the error the driver reads as a broken invariant (any other error is a refused
-- input), `no_raise`, for a parser documented to answer nil and why rather than raise,
-- and the scratch directory the driver made for this process.
local M = {}

M.scratch = assert(os.getenv("CORRAL_FUZZ_SCRATCH"), "run by tests/fuzz/fuzz_lua.c")

function M.check(cond, what)
  if not cond then error({ fuzz_check = tostring(what) }, 2) end
  return cond
end

--- fn(...)'s results; an error it raises is a broken invariant, its message kept.
function M.no_raise(what, fn, ...)
  local r = table.pack(pcall(fn, ...))
  if not r[1] then
    local err = r[2]
    if type(err) == "table" and err.fuzz_check then error(err, 0) end
    error({ fuzz_check = what .. " raised: " .. tostring(err) }, 0)
  end
  return table.unpack(r, 2, r.n)
end

--- Writes data to a file of the scratch directory; its path.
function M.write(name, data)
  local path = M.scratch .. "/" .. name
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
  return path
end

--- The input's lines, as a server splits what it reads (every "\n"-ended line, then
-- what is left).
function M.lines(data)
  local out = {}
  for line in data:gmatch("([^\n]*)\n") do out[#out + 1] = line end
  local rest = data:match("[^\n]*$")
  if rest ~= "" then out[#out + 1] = rest end
  return out
end

return M

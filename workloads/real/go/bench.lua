-- roam real-program suite: the Lua benchmark (see ../lua/bench.lua) in Lua 5.1,
-- for gopher-lua. The driver (main.go) sets the global N (scales the work).
-- gopher-lua is about ten times slower than C Lua, so each kernel does a
-- tenth of the C version's work per unit of N.
-- Deterministic: fixed random seed, no clock, no output that depends on
-- table iteration order. Prints one line per kernel and a final checksum.
local N = N or 1
math.randomseed(42)

local checksum = 0
local function mix(x)
  checksum = (checksum * 31 + x) % 4294967296
end

-- 1. recursion
local function fib(n) if n < 2 then return n end return fib(n - 1) + fib(n - 2) end
local f = 0
for _ = 1, N do f = f + fib(16) end
print(string.format("fib      %d", f)); mix(f)

-- 2. sieve over a table
local primes = 0
for _ = 1, N do
  local lim, sieve = 6000, {}
  for i = 2, lim do sieve[i] = true end
  for i = 2, lim do
    if sieve[i] then
      primes = primes + 1
      for j = i * i, lim, i do sieve[j] = false end
    end
  end
end
print(string.format("sieve    %d", primes)); mix(primes)

-- 3. strings: building, formatting, patterns
local words = 0
for r = 1, N do
  local parts = {}
  for i = 1, 200 do parts[#parts + 1] = string.format("w%d_%x", i * r, i * 7919) end
  local s = table.concat(parts, " ")
  for w in s:gmatch("w(%d+)_") do words = words + #w end
  s = s:gsub("_(%x+)", function(h) return "-" .. #h end)
  words = words + #s
end
print(string.format("strings  %d", words)); mix(words)

-- 4. sorting with a comparator, random data from a fixed seed
local sorted = 0
for _ = 1, N do
  local t = {}
  for i = 1, 500 do t[i] = math.random(1, 1000000) end
  table.sort(t, function(a, b) return a > b end)
  for i = 1, #t, 97 do sorted = (sorted + t[i] * i) % 1000000007 end
end
print(string.format("sort     %d", sorted)); mix(sorted)

-- 5. objects: metatables, closures, method calls
local Vec = {}
Vec.__index = Vec
function Vec.new(x, y) return setmetatable({x = x, y = y}, Vec) end
function Vec.__add(a, b) return Vec.new(a.x + b.x, a.y + b.y) end
function Vec:dot(o) return self.x * o.x + self.y * o.y end
local acc = Vec.new(0, 0)
local dots = 0
for r = 1, N do
  for i = 1, 2000 do
    local v = Vec.new(i % 17, (i * r) % 13)
    acc = acc + v
    dots = (dots + v:dot(acc)) % 1000000007
  end
end
print(string.format("objects  %d %d %d", acc.x, acc.y, dots)); mix(dots)

-- 6. coroutines
local gen = coroutine.wrap(function()
  local a, b = 0, 1
  while true do coroutine.yield(a); a, b = b, (a + b) % 1000003 end
end)
local co = 0
for _ = 1, 500 * N do co = (co + gen()) % 1000000007 end
print(string.format("coro     %d", co)); mix(co)

-- 7. floating point (IEEE-exact operations only)
local x, sum = 0.5, 0.0
for i = 1, 5000 * N do
  x = 3.7 * x * (1.0 - x)
  sum = sum + x / i
end
print(string.format("float    %.9f", sum)); mix(math.floor(sum * 1e6))

print(string.format("checksum %08x", checksum))

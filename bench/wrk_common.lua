-- Shared by the wrk scripts of bench/ (stamp.lua, tsa.lua, soak.lua). Each loads it from its own
-- directory, whatever wrk's working directory:
--
--   local common = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "") .. "wrk_common.lua")
--
-- wrk runs a script once in its main Lua state (setup, done) and once in each thread's (init,
-- request, response); each state loads this file too. The counters bad, bad_status and first_bad
-- are globals so that done() can read them from each thread with thread:get().

local M = {}

M.threads = {}
local next_id = 0

-- setup(): give each thread its number (the global tid) and keep it for done().
function M.setup(thread)
   thread:set("tid", next_id)
   next_id = next_id + 1
   table.insert(M.threads, thread)
end

-- PREFIX (22 hex digits, zeros by default) .. 2 hex digits of this thread: 24 of a commit id.
function M.thread_prefix(prefix)
   return (prefix or string.rep("0", 22)) .. string.format("%02x", tid % 256)
end

-- 16 hex digits of n; n stays far below 2^53, split so string.format never sees more than 32 bits.
function M.hex16(n)
   local hi = math.floor(n / 4294967296)
   local lo = n - hi * 4294967296
   return string.format("%08x%08x", hi, lo)
end

-- A JSON string.
function M.jstr(s)
   s = string.gsub(s, '[%c"\\]', function(c)
      return string.format("\\u%04x", string.byte(c))
   end)
   return '"' .. s .. '"'
end

-- The sum of the global `name` over all threads (in done()).
function M.sum(name)
   local n = 0
   for _, t in ipairs(M.threads) do n = n + (t:get(name) or 0) end
   return n
end

-- The first thread's non-empty string global `name` (in done()), or "".
function M.first(name)
   for _, t in ipairs(M.threads) do
      local s = t:get(name) or ""
      if s ~= "" then return s end
   end
   return ""
end

-- The answer counters of stamp.lua and tsa.lua, and their samples.
bad = 0
bad_status = 0
first_bad = ""
local good, saved, sample_dir = 0, 0, nil

-- SAMPLES argument: a directory with trailing slash, or "-" / "" for none.
function M.samples(dir)
   if dir == "-" or dir == "" then dir = nil end
   sample_dir = dir
end

-- A wrong answer: why (only the first is kept), and whether its status was not 200.
function M.bad(why, status)
   bad = bad + 1
   if status then bad_status = bad_status + 1 end
   if first_bad == "" then first_bad = why end
end

-- A good answer: its body written as <thread>-<n><ext> to SAMPLES when it is the 1st, 2nd or
-- every `every`th (at most 4 a thread).
function M.good(body, every, ext)
   good = good + 1
   if sample_dir and saved < 4 and (good <= 2 or good % every == 0) then
      local f = io.open(sample_dir .. tid .. "-" .. good .. ext, "wb")
      if f then
         f:write(body)
         f:close()
         saved = saved + 1
      end
   end
end

-- done(): one line "BENCH-RESULT <json>" with the request count, the wrong answers, the socket
-- errors and the latency percentiles in microseconds.
function M.done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'BENCH-RESULT {"requests": %d, "duration_us": %d, "bad": %d, "bad_status": %d, '
         .. '"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d, '
         .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %.1f, '
         .. '"first_bad": %s}\n',
      summary.requests, summary.duration, M.sum("bad"), M.sum("bad_status"),
      e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean, M.jstr(M.first("first_bad"))))
end

return M

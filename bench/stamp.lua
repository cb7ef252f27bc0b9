-- wrk script for stampd / zeitgitterd: one Zeitgitter stamp request per call, each with a
-- distinct commit id, and a shape check of every response.
--
--   wrk -t1 -c16 -d5s -s bench/stamp.lua http://127.0.0.1:PORT/ -- MODE PREFIX [SAMPLES/|-]
--       [ARMOR [FIELDS]]
--
-- MODE    "tag" (stamp-tag-v1) or "branch" (stamp-branch-v1)
-- PREFIX  22 hex digits unique to this wrk run; the commit id of request n of thread t is
--         PREFIX .. 2 hex digits of t .. 16 hex digits of n (40 in all), so ids never repeat
--         within or across runs.
-- SAMPLES a directory (with trailing slash): each thread writes the bodies of its 1st, 2nd
--         and every 100th good response there (at most 4), as <thread>-<n>.obj, for the
--         caller to check and verify (gpg --verify or ssh-keygen -Y verify); "-" for none.
-- ARMOR   "PGP" (default) or "SSH": the signature every response must carry
--         (-----END PGP SIGNATURE----- or -----END SSH SIGNATURE-----).
-- FIELDS  extra form fields appended to every request, already URL-encoded, e.g.
--         "key=SHA256%3A..." to ask stampd for one of its extra keys (default: none).
--
-- done() prints one line to stdout: "BENCH-RESULT <json>" with the request count, the
-- number of wrong responses (status other than 200 or a body of the wrong shape), the
-- socket errors and the latency percentiles in microseconds.

local threads = {}
local next_id = 0

function setup(thread)
   thread:set("tid", next_id)
   next_id = next_id + 1
   table.insert(threads, thread)
end

local mode, prefix, expect, tree, sample_dir, armor_tail, extra
local counter = 0
local good = 0
local saved = 0
-- globals, so that done() can read them from each thread with thread:get()
bad = 0
bad_status = 0
first_bad = ""

local headers = { ["Content-Type"] = "application/x-www-form-urlencoded" }

function init(args)
   mode = args[1] or "tag"
   sample_dir = args[3]
   if sample_dir == "-" or sample_dir == "" then sample_dir = nil end
   local armor = args[4] or "PGP"
   if armor ~= "PGP" and armor ~= "SSH" then error("armor must be PGP or SSH") end
   armor_tail = "-----END " .. armor .. " SIGNATURE-----"
   extra = (args[5] and args[5] ~= "") and ("&" .. args[5]) or ""
   prefix = (args[2] or string.rep("0", 22)) .. string.format("%02x", tid % 256)
   if mode == "tag" then
      expect = "object "
   elseif mode == "branch" then
      expect = "tree "
      tree = string.rep("e", 40)
   else
      error("mode must be tag or branch")
   end
end

local function hex16(n)
   -- n stays far below 2^53; split it so string.format never sees more than 32 bits.
   local hi = math.floor(n / 4294967296)
   local lo = n - hi * 4294967296
   return string.format("%08x%08x", hi, lo)
end

function request()
   counter = counter + 1
   local commit = prefix .. hex16(counter)
   local body
   if mode == "tag" then
      body = "request=stamp-tag-v1&commit=" .. commit .. "&tagname=bench-" .. counter
   else
      body = "request=stamp-branch-v1&commit=" .. commit .. "&tree=" .. tree
   end
   return wrk.format("POST", "/", headers, body .. extra)
end

function response(status, hdrs, body)
   if status ~= 200 then
      bad = bad + 1
      bad_status = bad_status + 1
      if first_bad == "" then
         first_bad = "status " .. status .. ": " .. string.sub(body or "", 1, 120)
      end
   elseif body == nil or string.sub(body, 1, #expect) ~= expect
      or not string.find(body, armor_tail, 1, true) then
      bad = bad + 1
      if first_bad == "" then
         first_bad = "bad body: " .. string.sub(body or "", 1, 120)
      end
   else
      good = good + 1
      if sample_dir and saved < 4 and (good <= 2 or good % 100 == 0) then
         local f = io.open(sample_dir .. tid .. "-" .. good .. ".obj", "wb")
         if f then
            f:write(body)
            f:close()
            saved = saved + 1
         end
      end
   end
end

local function jstr(s)
   s = string.gsub(s, '[%c"\\]', function(c)
      return string.format("\\u%04x", string.byte(c))
   end)
   return '"' .. s .. '"'
end

function done(summary, latency, requests)
   local nbad, nstatus, example = 0, 0, ""
   for _, t in ipairs(threads) do
      nbad = nbad + (t:get("bad") or 0)
      nstatus = nstatus + (t:get("bad_status") or 0)
      if example == "" then example = t:get("first_bad") or "" end
   end
   local e = summary.errors
   io.write(string.format(
      'BENCH-RESULT {"requests": %d, "duration_us": %d, "bad": %d, "bad_status": %d, '
         .. '"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d, '
         .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %.1f, '
         .. '"first_bad": %s}\n',
      summary.requests, summary.duration, nbad, nstatus,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean, jstr(example)))
end

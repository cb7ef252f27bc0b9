-- wrk script for the RFC 3161 bench (bench/tsa.py): POST one DER TimeStampReq per call, in
-- turn from a set of pre-made queries, and check every answer.
--
--   wrk -t1 -c16 -d10s -s bench/tsa.lua http://127.0.0.1:PORT/ -- QUERIES/ COUNT [SAMPLES/|-]
--
-- QUERIES a directory (trailing slash) holding q0.tsq .. q<COUNT-1>.tsq (openssl ts -query);
--         thread t, request n sends query (t * 7 + n) % COUNT.
-- SAMPLES a directory (trailing slash): each thread writes its 1st, 2nd and every 500th good
--         answer there (at most 4) as <thread>-<n>.tsr, for the caller to check with
--         `openssl ts -verify -queryfile` against the query with the token's nonce (every
--         query has its own nonce); "-" for none.
--
-- An answer is good when its status is 200, its Content-Type application/timestamp-reply and
-- its body a DER TimeStampResp whose PKIStatusInfo is exactly { granted } followed by a token
-- (a rejection, or a granted status with no token, is bad). done() prints one line to stdout:
-- "BENCH-RESULT <json>" with the request count, the bad answers, the socket errors and the
-- latency percentiles in microseconds.

local threads = {}
local next_id = 0

function setup(thread)
   thread:set("tid", next_id)
   next_id = next_id + 1
   table.insert(threads, thread)
end

local queries = {}
local count, sample_dir
local counter = 0
local good = 0
local saved = 0
-- globals, so that done() can read them from each thread with thread:get()
bad = 0
bad_status = 0
first_bad = ""

local headers = { ["Content-Type"] = "application/timestamp-query" }

function init(args)
   local dir = args[1]
   count = tonumber(args[2])
   sample_dir = args[3]
   if sample_dir == "-" or sample_dir == "" then sample_dir = nil end
   for i = 0, count - 1 do
      local f = assert(io.open(dir .. "q" .. i .. ".tsq", "rb"))
      queries[i] = wrk.format("POST", "/", headers, f:read("*a"))
      f:close()
   end
   counter = tid * 7
end

function request()
   local i = counter % count
   counter = counter + 1
   return queries[i]
end

-- Length of the DER header at position p (1-based) of s, or nil when it is not definite-length.
local function header_len(s, p)
   local b = string.byte(s, p + 1)
   if b == nil then return nil end
   if b < 0x80 then return 2 end
   if b >= 0x81 and b <= 0x84 then return 2 + (b - 0x80) end
   return nil
end

local GRANTED = "\48\3\2\1\0"  -- SEQUENCE { INTEGER 0 }: PKIStatusInfo { granted }

local function is_granted(body)
   if body == nil or string.byte(body, 1) ~= 0x30 then return false end
   local h = header_len(body, 1)
   if h == nil then return false end
   if string.sub(body, h + 1, h + 5) ~= GRANTED then return false end
   -- then the token: a ContentInfo SEQUENCE holding id-signedData (1.2.840.113549.1.7.2)
   return string.byte(body, h + 6) == 0x30
      and string.find(body, "\6\9\42\134\72\134\247\13\1\7\2", h + 6, true) ~= nil
end

function response(status, hdrs, body)
   local ctype = hdrs["Content-Type"] or hdrs["content-type"] or ""
   if status ~= 200 then
      bad = bad + 1
      bad_status = bad_status + 1
      if first_bad == "" then first_bad = "status " .. status end
   elseif ctype ~= "application/timestamp-reply" or not is_granted(body) then
      bad = bad + 1
      if first_bad == "" then
         first_bad = "bad answer (" .. ctype .. ", " .. #(body or "") .. " bytes)"
      end
   else
      good = good + 1
      if sample_dir and saved < 4 and (good <= 2 or good % 500 == 0) then
         local f = io.open(sample_dir .. tid .. "-" .. good .. ".tsr", "wb")
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

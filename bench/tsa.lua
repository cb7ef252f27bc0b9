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

local common = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "") .. "wrk_common.lua")
setup = common.setup
done = common.done

local queries = {}
local count
local counter = 0

local headers = { ["Content-Type"] = "application/timestamp-query" }

function init(args)
   local dir = args[1]
   count = tonumber(args[2])
   common.samples(args[3])
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
      common.bad("status " .. status, true)
   elseif ctype ~= "application/timestamp-reply" or not is_granted(body) then
      common.bad("bad answer (" .. ctype .. ", " .. #(body or "") .. " bytes)")
   else
      common.good(body, 500, ".tsr")
   end
end

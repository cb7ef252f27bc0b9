-- wrk script of `make soak` (bench/soak.py): Zeitgitter tag stamps, each with a commit id of
-- its own; every answer's status counted, and the commit id of every good answer written down
-- so that the soak can check each one is journaled as signed and published in the log.
--
--   wrk -t1 -c32 -d60s --timeout 10s -s bench/soak.lua http://127.0.0.1:PORT/ -- PREFIX DIR/
--
-- PREFIX  22 hex digits unique to this wrk run; the commit id of request n of thread t is
--         PREFIX .. 2 hex digits of t .. 16 hex digits of n (40 in all).
-- DIR/    a directory (with trailing slash): thread t writes the commit id of each good answer
--         (status 200, a signed tag object) to DIR/<t>.ids, one per line.
--
-- done() prints one line: "SOAK-RESULT <json>": requests, good answers, non-200 answers by
-- status, answers with status 200 but the wrong body, socket errors, latency percentiles (us).

local common = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "") .. "wrk_common.lua")
setup = common.setup

local prefix, ids_file
local counter = 0
local statuses = {}
-- globals, so that done() can read them from each thread with thread:get()
good = 0
wrong_body = 0
hist = ""   -- "<status>=<count>,..." of the non-200 answers
first_bad = ""

local headers = { ["Content-Type"] = "application/x-www-form-urlencoded" }
local tail = "-----END PGP SIGNATURE-----"

function init(args)
   prefix = common.thread_prefix(args[1])
   ids_file = assert(io.open((args[2] or "./") .. tid .. ".ids", "w"))
   ids_file:setvbuf("line")
end

function request()
   counter = counter + 1
   local commit = prefix .. common.hex16(counter)
   local body = "request=stamp-tag-v1&commit=" .. commit .. "&tagname=soak-" .. counter
   return wrk.format("POST", "/", headers, body)
end

function response(status, hdrs, body)
   if status ~= 200 then
      statuses[status] = (statuses[status] or 0) + 1
      local parts = {}
      for s, n in pairs(statuses) do table.insert(parts, s .. "=" .. n) end
      hist = table.concat(parts, ",")
      if first_bad == "" then
         first_bad = "status " .. status .. ": " .. string.sub(body or "", 1, 120)
      end
      return
   end
   -- A tag object names its commit on its first line: "object <40 hex>".
   local commit = body and string.match(body, "^object (%x+)\n")
   if commit == nil or string.sub(commit, 1, #prefix) ~= prefix
      or not string.find(body, tail, 1, true) then
      wrong_body = wrong_body + 1
      if first_bad == "" then
         first_bad = "bad body: " .. string.sub(body or "", 1, 120)
      end
      return
   end
   good = good + 1
   ids_file:write(commit, "\n")
end

function done(summary, latency, requests)
   local merged = {}
   for _, t in ipairs(common.threads) do
      for s, n in string.gmatch(t:get("hist") or "", "(%d+)=(%d+)") do
         merged[s] = (merged[s] or 0) + tonumber(n)
      end
   end
   local parts = {}
   for s, n in pairs(merged) do table.insert(parts, '"' .. s .. '": ' .. n) end
   local e = summary.errors
   io.write(string.format(
      'SOAK-RESULT {"requests": %d, "duration_us": %d, "good": %d, "wrong_body": %d, '
         .. '"non200": {%s}, "connect": %d, "read": %d, "write": %d, "timeout": %d, '
         .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "first_bad": %s}\n',
      summary.requests, summary.duration, common.sum("good"), common.sum("wrong_body"),
      table.concat(parts, ", "),
      e.connect, e.read, e.write, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, common.jstr(common.first("first_bad"))))
end

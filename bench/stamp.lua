-- wrk script for stampd / zeitgitterd: one Zeitgitter stamp request per call, each with a
-- distinct commit id, and a shape check of every response.
--
--   wrk -t1 -c16 -d5s -s bench/stamp.lua http://127.0.0.1:PORT/ -- MODE PREFIX [SAMPLES/|-]
--       [ARMOR [FIELDS]]
--
-- MODE    "tag" (stamp-tag-v1), "branch" (stamp-branch-v1) or "digest" (POST /v1/stamps of a
--         sha256: the commit id and 24 more hex digits; the answer is a receipt)
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

local common = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "") .. "wrk_common.lua")
setup = common.setup
done = common.done

local mode, prefix, expect, tree, armor_tail, extra
local counter = 0

local headers = { ["Content-Type"] = "application/x-www-form-urlencoded" }

function init(args)
   mode = args[1] or "tag"
   common.samples(args[3])
   local armor = args[4] or "PGP"
   if armor ~= "PGP" and armor ~= "SSH" then error("armor must be PGP or SSH") end
   armor_tail = "-----END " .. armor .. " SIGNATURE-----"
   extra = (args[5] and args[5] ~= "") and ("&" .. args[5]) or ""
   prefix = common.thread_prefix(args[2])
   if mode == "tag" then
      expect = "object "
   elseif mode == "branch" then
      expect = "tree "
      tree = string.rep("e", 40)
   elseif mode == "digest" then
      expect = "-----BEGIN PGP SIGNED MESSAGE-----"
   else
      error("mode must be tag, branch or digest")
   end
end

function request()
   counter = counter + 1
   local commit = prefix .. common.hex16(counter)
   local body
   if mode == "digest" then
      return wrk.format("POST", "/v1/stamps", headers,
                        "sha256=" .. commit .. string.rep("d", 24) .. extra)
   elseif mode == "tag" then
      body = "request=stamp-tag-v1&commit=" .. commit .. "&tagname=bench-" .. counter
   else
      body = "request=stamp-branch-v1&commit=" .. commit .. "&tree=" .. tree
   end
   return wrk.format("POST", "/", headers, body .. extra)
end

function response(status, hdrs, body)
   if status ~= 200 then
      common.bad("status " .. status .. ": " .. string.sub(body or "", 1, 120), true)
   elseif body == nil or string.sub(body, 1, #expect) ~= expect
      or not string.find(body, armor_tail, 1, true) then
      common.bad("bad body: " .. string.sub(body or "", 1, 120))
   else
      common.good(body, 100, ".obj")
   end
end

-- wrk script for `bench proxy`: absolute-URI proxy requests with PolyMix-like
-- recurrence. With probability REPEAT a request repeats a URL this thread has
-- already asked for (a potential hit), else it asks for a new URL (a miss),
-- whose object is one of FILES files of PolyMix-3 sizes on the origin.
-- Counts Squid's X-Cache verdicts and HTTP errors; done() prints one JSON line.
-- Placeholders filled by proxybench.py: ORIGIN, FILES, REPEAT, HISTORY, RUN (a tag per
-- wrk run, so a new run does not repeat the last run's "new" URLs).
local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(id * 7919 + 17)
  hist, nhist, n = {}, 0, 0
  hits, misses, bad = 0, 0, 0
end

function request()
  local url
  if nhist > 0 and math.random() < REPEAT then
    url = hist[math.random(nhist)]
  else
    n = n + 1
    url = "http://ORIGIN/o/RUN" .. id .. "-" .. n .. "/" .. math.random(FILES)
    if nhist < HISTORY then nhist = nhist + 1; hist[nhist] = url else hist[math.random(HISTORY)] = url end
  end
  -- Host must match the absolute URI's authority: HAProxy answers 400 when they differ
  return wrk.format("GET", url, {["Host"] = "ORIGIN"})
end

function response(status, headers, body)
  local xc = headers["X-Cache"] or headers["x-cache"] or ""     -- HAProxy sends header names in lower case
  if string.find(xc, "HIT", 1, true) then hits = hits + 1 else misses = misses + 1 end
  if status >= 400 then bad = bad + 1 end
end

function done(summary, latency, requests)
  local h, m, b = 0, 0, 0
  for _, t in ipairs(threads) do h = h + t:get("hits"); m = m + t:get("misses"); b = b + t:get("bad") end
  local e = summary.errors
  io.write(string.format('PROXYBENCH {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "p999": %d, "max": %d, "mean": %.1f}, ' ..
    '"x_cache_hits": %d, "x_cache_misses": %d, "http_errors": %d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.max, latency.mean, h, m, b))
end

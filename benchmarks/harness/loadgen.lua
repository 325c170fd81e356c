-- wrk script: POST one of N distinct chat bodies (round robin), stop after a request budget,
-- and print the result as one JSON line ("JSON {...}") for loadgen.py to parse.
-- args: keys max_requests_per_thread model path [pin [bodies_file]]
-- bodies_file (bodies.py writes it): requests separated by NUL, each its header lines, an
-- empty line and its body; without it, `keys` short bodies built here.
local reqs, nreq, sent, budget = {}, 0, 0, 0

local function read_bodies(file, path, pin)
  local f = assert(io.open(file, "rb"))
  local data = f:read("*a")
  f:close()
  local start = 1
  while start <= #data do
    local stop = string.find(data, "\0", start, true) or (#data + 1)
    local block = string.sub(data, start, stop - 1)
    local split = string.find(block, "\n\n", 1, true)
    local headers = {}
    for line in string.gmatch(string.sub(block, 1, split), "([^\n]+)\n") do
      local name, value = string.match(line, "^([^:]+): (.*)$")
      headers[name] = value
    end
    local key = "k" .. (#reqs + 1)
    headers["X-Session-ID"], headers["X-SMG-Routing-Key"] = key, key
    if pin and pin ~= "" then headers["x-grm-pin-replica"] = pin end
    reqs[#reqs + 1] = wrk.format("POST", path, headers, string.sub(block, split + 2))
    start = stop + 1
  end
  return #reqs
end

function init(args)
  local keys = tonumber(args[1])
  budget = tonumber(args[2])
  local model, path, pin, file = args[3], args[4], args[5], args[6]
  if file and file ~= "" then
    nreq = read_bodies(file, path, pin)
    sent = math.random(0, nreq - 1)
    return
  end
  for i = 1, keys do
    local key = "k" .. i
    local body = string.format(
      '{"model":"%s","messages":[{"role":"user","content":"score prompt %d"}],'
        .. '"seed":42,"max_tokens":8,"temperature":0}', model, i)
    -- The peers hash a header, grm-service hashes the body: send both, same key.
    local headers = {["Content-Type"] = "application/json", ["X-Session-ID"] = key,
                     ["X-SMG-Routing-Key"] = key}
    if pin and pin ~= "" then headers["x-grm-pin-replica"] = pin end
    reqs[i] = wrk.format("POST", path, headers, body)
  end
  nreq = keys
  -- Start each thread at a different key so threads do not march in lockstep.
  sent = math.random(0, keys - 1)
end

function request()
  sent = sent + 1
  return reqs[(sent % nreq) + 1]
end

local done_count = 0
function response(status, headers, body)
  done_count = done_count + 1
  if done_count >= budget then wrk.thread:stop() end
end

function done(summary, latency, requests)
  local e = summary.errors
  local q = {}
  for _, p in ipairs({1, 5, 10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 95, 97, 98, 99, 99.5,
                      99.9, 99.99}) do
    q[#q + 1] = string.format('[%s,%d]', p, latency:percentile(p))
  end
  -- percentile(100) reads 0 in wrk 4.1: take the max instead.
  q[#q + 1] = string.format('[100,%d]', latency.max)
  io.write(string.format(
    'JSON {"duration_us":%d,"requests":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,'
      .. '"write":%d,"status":%d,"timeout":%d},"mean_us":%f,"quantiles_us":[%s]}\n',
    summary.duration, summary.requests, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency.mean, table.concat(q, ",")))
end

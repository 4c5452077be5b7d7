package redis

import goredis "github.com/redis/go-redis/v9"

// The scripts run on the server, each one atomically. They are plain EVAL
// scripts (no shebang), which Redis 6.2 and 7 run alike; every key they
// touch is in KEYS, so a cluster can route them.

// applyScript writes one group of records, all of one namespace (and, in a
// cluster, of one slot). KEYS holds, per record, its document key and its
// seq key; ARGV[1] and ARGV[2] are the document and tombstone TTLs in
// milliseconds (0: none), ARGV[3] the type the encoding writes ("string" or
// "hash"), then per record: its seq, a count n, and n's payload (n = -1: a
// tombstone, no payload; 0: a JSON string, one item; k > 0: a hash, k
// field/value pairs).
//
// Seqs are compared as decimal strings, by length and then byte by byte:
// Lua's numbers are doubles and would round seqs past 2^53.
//
// A record is written only when the stored seq is absent or lower, so an
// older record is a no-op (0); a key the application wrote itself with
// another type (its document key holds one while its seq key is absent, or
// its seq key is not a string) is left alone and answered with what it
// holds ("seq:<type>" or "doc:<type>"), which the sink rejects. The checks
// run before any write of the record, so a rejected record writes nothing.
// A string document is written with SET … GET (Redis 6.2 and later), which
// refuses another type itself: three commands for a fresh key, which is
// where the script's time goes (see BENCHMARKS.md).
var applyScript = goredis.NewScript(`
local ttl, tttl, want = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local out, a = {}, 4
local function foreign(d)
  local dt = redis.call('TYPE', d)['ok']
  if dt ~= 'none' and dt ~= want then return 'doc:' .. dt end
  return nil
end
for i = 1, #KEYS, 2 do
  local d, s = KEYS[i], KEYS[i + 1]
  local seq, n = ARGV[a], tonumber(ARGV[a + 1])
  local first = a + 2
  if n < 0 then a = first elseif n == 0 then a = first + 1 else a = first + 2 * n end
  local cur = redis.pcall('GET', s)
  local code = 1
  -- An error other than a type clash (OOM, READONLY, …) concerns the server,
  -- not the record: it ends the script as that error, so the sink reports it
  -- for what it is and the batch is retried.
  if type(cur) == 'table' and cur.err and string.sub(cur.err, 1, 9) ~= 'WRONGTYPE' then return cur end
  if type(cur) == 'table' then
    code = 'seq:' .. redis.call('TYPE', s)['ok']
  elseif cur and (#cur > #seq or (#cur == #seq and cur >= seq)) then
    code = 0
  elseif n == 0 then
    -- SET … GET refuses, writing nothing, a key that holds another type:
    -- the type check and the write in one call.
    local r
    if ttl > 0 then r = redis.pcall('SET', d, ARGV[first], 'PX', ttl, 'GET') else r = redis.pcall('SET', d, ARGV[first], 'GET') end
    if type(r) == 'table' and r.err and string.sub(r.err, 1, 9) ~= 'WRONGTYPE' then return r end
    if type(r) == 'table' and r.err then
      if cur then
        redis.call('UNLINK', d)
        if ttl > 0 then redis.call('SET', d, ARGV[first], 'PX', ttl) else redis.call('SET', d, ARGV[first]) end
      else
        code = foreign(d)
      end
    end
  else
    if not cur then code = foreign(d) or 1 end
    if code == 1 then
      redis.call('UNLINK', d)
      if n > 0 then
        local last = first + 2 * n - 1
        for j = first, last, 2000 do
          redis.call('HSET', d, unpack(ARGV, j, math.min(j + 1999, last)))
        end
        if ttl > 0 then redis.call('PEXPIRE', d, ttl) end
      end
    end
  end
  if code == 1 then
    local px = ttl
    if n < 0 then px = tttl end
    if px > 0 then redis.call('SET', s, seq, 'PX', px) else redis.call('SET', s, seq) end
  end
  out[#out + 1] = code
end
return out
`)

// nextID hands out the next namespace number from the meta hash's next
// field. A meta hash that has none (a new target, or one whose data was
// lost) starts it at the server's clock in microseconds, so a namespace
// opened after a loss never takes the number of one left from before it.
const nextID = `
local function nextid(meta)
  if redis.call('HEXISTS', meta, 'next') == 1 then
    return string.format('%.0f', redis.call('HINCRBY', meta, 'next', 1))
  end
  local t = redis.call('TIME')
  local n = t[1] .. string.format('%06d', tonumber(t[2]))
  redis.call('HSET', meta, 'next', n)
  return n
end
`

// initScript returns the live namespace and its floor (false when it has
// none), first making an empty one of generation 0 live when the meta hash
// (KEYS[1]) names none.
var initScript = goredis.NewScript(nextID + `
local live = redis.call('HGET', KEYS[1], 'live')
if live then return {live, redis.call('HGET', KEYS[1], 'floor')} end
live = '0.' .. nextid(KEYS[1])
redis.call('HSET', KEYS[1], 'live', live)
redis.call('HDEL', KEYS[1], 'floor')
return {live, false}
`)

// openScript opens a namespace of generation ARGV[1] for a resync and
// returns it. Every namespace an unfinished resync left filling is retired
// in the same step: one resync runs per sink at a time (the lease), so an
// older one can only be a crashed or superseded worker's, and a retired
// namespace can never be published.
var openScript = goredis.NewScript(nextID + `
local meta = KEYS[1]
local fields = redis.call('HKEYS', meta)
for _, f in ipairs(fields) do
  if string.sub(f, 1, 8) == 'filling:' then redis.call('HDEL', meta, f) end
end
local ns = ARGV[1] .. '.' .. nextid(meta)
redis.call('HSET', meta, 'filling:' .. ns, '1')
return ns
`)

// publishScript makes namespace ARGV[1] live, if it is still filling, with
// ARGV[2] as the live copy's floor ("0": none), and returns the namespace
// it replaced ("" when none). The live and floor fields change in one
// step, so whoever reads them together (HMGET) gets a namespace and its own
// floor. It returns false (nil) when the namespace is neither filling nor
// live: a later OpenResync or an Abort retired it. Publishing the live
// namespace again succeeds, so a Publish whose reply was lost can be
// repeated.
var publishScript = goredis.NewScript(`
local meta, ns, floor = KEYS[1], ARGV[1], ARGV[2]
local live = redis.call('HGET', meta, 'live')
if live == ns then return '' end
if redis.call('HDEL', meta, 'filling:' .. ns) == 0 then return false end
if floor == '0' then
  redis.call('HDEL', meta, 'floor')
  redis.call('HSET', meta, 'live', ns)
else
  redis.call('HSET', meta, 'live', ns, 'floor', floor)
end
return live or ''
`)

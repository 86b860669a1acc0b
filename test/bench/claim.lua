-- Redis baseline: one claim, atomically (a Lua script runs alone).
-- KEYS[1] the balance (integer minor units), KEYS[2] the set of users who
-- claimed; ARGV[1] the user, ARGV[2] the amount.  Returns 1 claimed,
-- 0 duplicate, -1 exhausted.
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
    return 0
end
local amount = tonumber(ARGV[2])
if tonumber(redis.call('GET', KEYS[1]) or '0') < amount then
    return -1
end
redis.call('DECRBY', KEYS[1], amount)
redis.call('SADD', KEYS[2], ARGV[1])
return 1

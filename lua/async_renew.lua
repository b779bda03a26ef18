-- Renews the lease of a reconciliation under way (lua/async_pause.lua), if
-- it is still this one's: a reconciliation that died (its process killed
-- or frozen) holds back the others' rebuild of the sale only until its
-- lease runs out, not for as long as a rebuild could take.
--
-- KEYS[1]  the reconciliation under way: its token
-- ARGV[1]  this reconciliation's token
-- ARGV[2]  the lease, in ms
--
-- Returns 1  renewed
--         0  the token is another's, or gone: this reconciliation is over
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('pexpire', KEYS[1], ARGV[2])
return 1

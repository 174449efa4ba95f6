"""The Lua of the design floors that more than one benchmark runs (no imports: the Celery
workers of ``celery_apps.py`` load it too, and must not load anything a variant does not)."""

# The raw floor's release (and the fenced floor's): delete the lease if it is still this token's.
COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# The fenced floor's take: the least a lock that hands out fencing tokens must run, SET NX PX and
# an INCR of a fence counter in one script. KEYS: the lease, the fence counter; ARGV: the token,
# the ttl in ms. Returns the fence, 0 when the lease is held.
SET_AND_FENCE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
"""

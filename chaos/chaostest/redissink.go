package chaostest

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// RedisSink is the side effect of a scenario whose handlers run in several
// processes, kept in Redis. Each key has a hash at <prefix>{<key>} with:
//
//	fence     the highest fence applied
//	applied   fenced writes applied
//	stale     fenced writes refused (fence not above the stored one)
//	unfenced  writes made without a fence check (a negative control)
//
// Apply is one script, so it is atomic as "UPDATE … WHERE fence < $1" is.
// Its methods are safe for concurrent use.
type RedisSink struct {
	c      redis.UniversalClient
	prefix string
}

// NewRedisSink returns a sink on c whose keys start with prefix.
func NewRedisSink(c redis.UniversalClient, prefix string) *RedisSink {
	return &RedisSink{c: c, prefix: prefix}
}

var applyFenced = redis.NewScript(`
-- KEYS[1]: the sink hash of a key; ARGV[1]: the writer's fence.
-- Returns 1 if the write was applied, 0 if the fence was stale.
local stored = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) > stored then
	redis.call('HSET', KEYS[1], 'fence', ARGV[1])
	redis.call('HINCRBY', KEYS[1], 'applied', 1)
	return 1
end
redis.call('HINCRBY', KEYS[1], 'stale', 1)
return 0
`)

func (s *RedisSink) key(key string) string { return s.prefix + "{" + key + "}" }

// Apply writes the effect for key if fence is above the highest applied
// one, and reports whether it did.
func (s *RedisSink) Apply(ctx context.Context, key string, fence int64) (bool, error) {
	n, err := applyFenced.Run(ctx, s.c, []string{s.key(key)}, strconv.FormatInt(fence, 10)).Int()
	return n == 1, err
}

// ApplyUnfenced writes the effect for key without a fence check and
// returns the number of such writes for key so far.
func (s *RedisSink) ApplyUnfenced(ctx context.Context, key string) (int64, error) {
	return s.c.HIncrBy(ctx, s.key(key), "unfenced", 1).Result()
}

// SinkState is what a RedisSink holds for a key.
type SinkState struct {
	Fence    int64 // the highest fence applied
	Applied  int64 // fenced writes applied
	Stale    int64 // fenced writes refused
	Unfenced int64 // unfenced writes
}

// State returns what the sink holds for key (zeros if nothing).
func (s *RedisSink) State(ctx context.Context, key string) (SinkState, error) {
	m, err := s.c.HGetAll(ctx, s.key(key)).Result()
	if err != nil {
		return SinkState{}, err
	}
	num := func(f string) int64 {
		n, _ := strconv.ParseInt(m[f], 10, 64)
		return n
	}
	return SinkState{Fence: num("fence"), Applied: num("applied"), Stale: num("stale"), Unfenced: num("unfenced")}, nil
}

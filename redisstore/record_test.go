package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestRecordCreated follows a record's creation time through its
// transitions, with acquire.lua and with the batch script: a record keeps
// it as an offset from its fence (see acquire.lua), rebased when a new
// acquisition raises the fence, and records written with the time itself
// (the layout before the offset) or without one (the relay's) still read
// right. It also bounds the completed record's length: the offset is what
// keeps memory per record within its target (BENCHMARKS.md).
func TestRecordCreated(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := goRedisClient(t, srv.Addr())
	s := newStore(t, c, redisstore.WithReplayCache(false))
	fp := strings.Repeat("f", 32) // idemhttp's SHA-256
	result := []byte(strings.Repeat("r", 100))
	acquirers := []struct {
		name    string
		acquire func(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error)
	}{
		{"acquire.lua", s.Acquire},
		{"acquire_many.lua", viaBatch{s}.Acquire},
	}
	for _, ac := range acquirers {
		t.Run(ac.name, func(t *testing.T) {
			ctx := t.Context()
			get := func(key string) storekit.Record {
				t.Helper()
				rec, err := s.Get(ctx, key)
				if err != nil {
					t.Fatalf("Get: %v", err)
				}
				return rec
			}
			take := func(key, owner string) storekit.Acquisition {
				t.Helper()
				a, err := ac.acquire(ctx, key, storekit.AcquireRequest{Fingerprint: fp, Owner: owner, Lease: time.Minute, Retention: time.Hour})
				if err != nil || a.Outcome != storekit.Acquired {
					t.Fatalf("Acquire by %s: got %+v, %v; want Acquired", owner, a, err)
				}
				return a
			}

			t.Run("new key", func(t *testing.T) {
				key := idem.Key{ID: ac.name + "/new"}.Digest()
				a := take(key, "o1")
				created := time.UnixMicro(a.Lease.Fence) // a new key's fence is its creation time
				if got := get(key).Created; !got.Equal(created) {
					t.Fatalf("created after the first acquire: got %v, want %v", got, created)
				}
				if err := s.Release(ctx, key, a.Lease, time.Hour); err != nil {
					t.Fatal(err)
				}
				b := take(key, "o2")
				if b.Lease.Fence <= a.Lease.Fence {
					t.Fatalf("fence after the second acquire: got %d, want more than %d", b.Lease.Fence, a.Lease.Fence)
				}
				if got := get(key).Created; !got.Equal(created) {
					t.Fatalf("created after a second acquire: got %v, want %v", got, created)
				}
				if err := s.Complete(ctx, key, b.Lease, result, time.Hour); err != nil {
					t.Fatal(err)
				}
				if got := get(key).Created; !got.Equal(created) {
					t.Fatalf("created after Complete: got %v, want %v", got, created)
				}
			})

			t.Run("length", func(t *testing.T) {
				key := idem.Key{ID: ac.name + "/length"}.Digest()
				a := take(key, "o")
				if err := s.Complete(ctx, key, a.Lease, result, time.Hour); err != nil {
					t.Fatal(err)
				}
				n, err := c.StrLen(ctx, s.Key(key)).Result()
				if err != nil {
					t.Fatal(err)
				}
				// Version 1, state 2, fingerprint's header 2, owner 1, fence
				// 9, lease end 1, attempts 1, created 1, result's header 2.
				const framing = 20
				if got := int(n) - len(fp) - len(result); got > framing {
					t.Fatalf("completed record: %d bytes beyond its fingerprint and result, want at most %d", got, framing)
				}
				// The replay cache's decoder reads the offset too.
				raw, err := c.Get(ctx, s.Key(key)).Result()
				if err != nil {
					t.Fatal(err)
				}
				if st, dfp, dres, datt, err := redisstore.DecodeRecord(raw); err != nil || st != "c" || dfp != fp || dres != string(result) || datt != 1 {
					t.Fatalf("DecodeRecord = %q %q %q %d, %v; want the completed record", st, dfp, dres, datt, err)
				}
			})

			for _, tc := range []struct {
				name    string
				created uint64 // as written in the record: the time itself, or 0
			}{
				{"time in µs", 1_700_000_000_000_000},
				{"unknown", 0},
			} {
				t.Run("written before: "+tc.name, func(t *testing.T) {
					key := idem.Key{ID: ac.name + "/before/" + tc.name}.Digest()
					old := fuzzRecord{state: "r", fp: fp, fence: 1_700_000_000_500_000, attempts: 1, created: tc.created}
					if err := c.Set(ctx, s.Key(key), old.encode(), time.Hour).Err(); err != nil {
						t.Fatal(err)
					}
					var want time.Time
					if tc.created != 0 {
						want = time.UnixMicro(int64(tc.created))
					}
					if got := get(key).Created; !got.Equal(want) {
						t.Fatalf("created as written: got %v, want %v", got, want)
					}
					a := take(key, "o")
					if got := get(key).Created; !got.Equal(want) {
						t.Fatalf("created after an acquire: got %v, want %v", got, want)
					}
					if err := s.Complete(ctx, key, a.Lease, result, time.Hour); err != nil {
						t.Fatal(err)
					}
					if got := get(key).Created; !got.Equal(want) {
						t.Fatalf("created after Complete: got %v, want %v", got, want)
					}
				})
			}
		})
	}
}

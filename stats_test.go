package idem_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/boltstore"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
)

// TestStats checks that memstore, boltstore and redisstore count their
// records by state and report the oldest IN_PROGRESS record, and that
// redisstore reports used_memory and maxmemory.
func TestStats(t *testing.T) {
	stores := map[string]func(t *testing.T) idem.Store{
		"memstore": func(t *testing.T) idem.Store {
			s, _ := memstore.New()
			return s
		},
		"boltstore": func(t *testing.T) idem.Store {
			s, err := boltstore.Open(filepath.Join(t.TempDir(), "idem.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		"redisstore": func(t *testing.T) idem.Store {
			return newRedisStore(t, "--maxmemory", "100mb")
		},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			store := newStore(t)
			ss, ok := storekit.StoreAs[storekit.StatsStore](store)
			if !ok {
				t.Fatalf("%T is not a storekit.StatsStore", store)
			}
			e, err := idem.New(store)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			ok2 := func(context.Context) ([]byte, error) { return []byte("v"), nil }
			for _, id := range []string{"c1", "c2"} {
				if _, err := e.Do(ctx, idem.Key{ID: id}, "", ok2); err != nil {
					t.Fatal(err)
				}
			}
			terminal := idem.Terminal(errors.New("declined"))
			if _, err := e.Do(ctx, idem.Key{ID: "f"}, "", func(context.Context) ([]byte, error) { return nil, terminal }); !errors.Is(err, terminal) {
				t.Fatal(err)
			}
			if _, err := e.Do(ctx, idem.Key{ID: "r"}, "", func(context.Context) ([]byte, error) { return nil, errors.New("again") }); err == nil {
				t.Fatal("retryable error: got nil")
			}
			_, a, err := e.Begin(ctx, idem.Key{ID: "p"}, "")
			if err != nil {
				t.Fatal(err)
			}
			defer a.Abandon(ctx, observe.Abandoned)

			st, err := ss.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := [...]int64{0, 1, 2, 1, 1}
			if st.Records != want || st.Sampled {
				t.Errorf("records: got %v sampled %v, want %v (none, in progress, completed, released, failed) not sampled", st.Records, st.Sampled, want)
			}
			if st.OldestInProgress <= 0 {
				t.Errorf("oldest in progress: got %v, want > 0", st.OldestInProgress)
			}
			switch name {
			case "redisstore":
				if st.MemoryUsed <= 0 || st.MemoryLimit != 100<<20 {
					t.Errorf("memory: got %d of %d, want > 0 of %d", st.MemoryUsed, st.MemoryLimit, 100<<20)
				}
			case "boltstore":
				if st.MemoryUsed <= 0 || st.MemoryLimit != 0 {
					t.Errorf("memory: got %d of %d, want the file size of no limit", st.MemoryUsed, st.MemoryLimit)
				}
			}
		})
	}
}

// TestStatsSampled checks that redisstore stops at StatsSample records and
// says so.
func TestStatsSampled(t *testing.T) {
	s := newRedisStore(t)
	e, _ := idem.New(s)
	ctx := t.Context()
	keys := make([]idem.Key, redisstore.StatsSample+1)
	fps := make([]string, len(keys))
	for i := range keys {
		keys[i] = idem.Key{ID: "k" + strconv.Itoa(i)}
	}
	began := adapterkit.BeginBatch(ctx, e, keys, fps)
	attempts := make([]*idem.Attempt, len(began))
	values := make([][]byte, len(began))
	for i, b := range began {
		if b.Err != nil {
			t.Fatal(b.Err)
		}
		attempts[i] = b.Attempt
	}
	for _, err := range adapterkit.CommitBatch(ctx, e, attempts, values) {
		if err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Sampled || st.Records[storekit.StateCompleted] != redisstore.StatsSample {
		t.Errorf("got %d completed, sampled %v, want %d, sampled", st.Records[storekit.StateCompleted], st.Sampled, redisstore.StatsSample)
	}
}

package idemgrpc_test

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestInterceptorAllocations holds the interceptor to its allocations per
// call on memstore, counted beyond those of the call itself (its context
// and the handler's): 15 with a new key, 11 for a replay
// (BenchmarkInterceptor counts 16 for a new key, memstore's table growing
// over its many more keys). About half of a new key's are the Executor's
// and memstore's (the attempt and its context, the store key, the record);
// the rest read the key, hash the request, capture the handler's metadata
// and write the record. A replay's decode the stored response and its
// header. The first version made 27 and 23: it copied the whole incoming
// metadata to read the key, and built the fingerprint, the record and the
// replay's header in several steps each.
func TestInterceptorAllocations(t *testing.T) {
	if raceEnabled {
		// sync.Pool drops a quarter of what it is given under the race
		// detector, on purpose: the buffers and the Executor's timers are
		// made again at random, 2 to 3 allocations more per call.
		t.Skip("allocations are counted without the race detector")
	}
	info := &grpc.UnaryServerInfo{Server: benchImpl{}, FullMethod: charge}
	handler := func(ctx context.Context, req any) (any, error) {
		return benchImpl{}.Charge(ctx, req.(*wrapperspb.StringValue))
	}
	req := wrapperspb.String("100")
	keys := make([]string, 1001) // AllocsPerRun runs the function once more
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	icpt := newServer(t, nil).UnaryServerInterceptor()
	if _, err := icpt(incoming("replayed"), req, info, handler); err != nil {
		t.Fatal(err)
	}
	i := 0
	bare := testing.AllocsPerRun(1000, func() {
		if _, err := handler(incoming(keys[i%len(keys)]), req); err != nil {
			t.Fatal(err)
		}
		i++
	})
	for _, c := range []struct {
		name   string
		key    func(i int) string
		budget float64
	}{
		{"new", func(i int) string { return keys[i] }, 15},
		{"replay", func(int) string { return "replayed" }, 11},
	} {
		i := 0
		all := testing.AllocsPerRun(1000, func() {
			if _, err := icpt(incoming(c.key(i)), req, info, handler); err != nil {
				t.Fatal(err)
			}
			i++
		})
		if got := all - bare; got > c.budget {
			t.Errorf("%s: the interceptor made %v allocations per call, want at most %v", c.name, got, c.budget)
		}
	}
}

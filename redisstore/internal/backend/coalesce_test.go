package backend

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// TestQueuedCallsReuseMemory: once the coalescer is warm, a queued call
// allocates nothing (its QueuedCall and wake-up channel, and the queue's
// backing array, are reused). The old coalescer made a QueuedCall and a
// channel per queued call, a new queue and a slice of the live calls per
// pipeline: at least 2 allocations a queued call.
func TestQueuedCallsReuseMemory(t *testing.T) {
	const queued = 8
	// The queue waits for the sender, however slow the machine: a late
	// send would take calls before all are queued.
	defer func(d time.Duration) { MaxQueueWait = d }(MaxQueueWait)
	MaxQueueWait = time.Hour
	// Replies boxed once: a string stored in an interface allocates.
	replies := map[string]any{}
	hold, entered := make(chan struct{}), make(chan struct{})
	q := &Coalescer{
		Senders: 1,
		One: func(context.Context, *Script, []string, []string, bool) (any, error) {
			entered <- struct{}{}
			<-hold
			return "one", nil
		},
		Many: func(_ context.Context, calls []*QueuedCall) {
			for _, c := range calls {
				c.Reply = replies[c.Args[0]]
			}
		},
	}
	s := &Script{Name: "test"}
	args := make([][]string, queued+1)
	args[0] = []string{"sender"}
	for i := 1; i <= queued; i++ {
		args[i] = []string{string(rune('a' + i - 1))}
		replies[args[i][0]] = args[i][0]
	}
	// Workers that make one call per round, started once: the goroutines
	// are not the round's allocations.
	start := make([]chan struct{}, queued+1)
	done := make(chan any, queued+1)
	for i := range start {
		start[i] = make(chan struct{})
		go func() {
			for range start[i] {
				v, err := q.Run(context.Background(), s, nil, args[i], false)
				if err != nil {
					v = err
				}
				done <- v
			}
		}()
	}
	t.Cleanup(func() {
		for _, c := range start {
			close(c)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	wrong := 0
	round := func() {
		start[0] <- struct{}{} // the sender: One blocks on hold
		<-entered
		for i := 1; i <= queued; i++ {
			start[i] <- struct{}{}
		}
		for q.Queued() < queued {
			if time.Now().After(deadline) {
				t.Fatalf("got %d calls queued, want %d", q.Queued(), queued)
			}
			runtime.Gosched()
		}
		hold <- struct{}{}
		for range queued + 1 {
			switch v := (<-done).(type) {
			case string:
				if v != "one" && (len(v) != 1 || v[0] < 'a' || v[0] >= 'a'+queued) {
					wrong++
				}
			default:
				wrong++
			}
		}
	}
	round() // warm: the pool, the timer, the backing array
	allocs := testing.AllocsPerRun(50, round)
	if wrong > 0 {
		t.Fatalf("got %d wrong replies, want none", wrong)
	}
	if raceEnabled {
		return // sync.Pool drops items at random under the race detector
	}
	if allocs >= queued {
		t.Fatalf("got %.1f allocations per round of %d queued calls, want fewer than one a call", allocs, queued)
	}
}

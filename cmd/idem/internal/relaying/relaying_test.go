package relaying

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/outboxroute"
)

// passer counts its passes; pass number fail returns an error, pass
// number stop cancels the context, and it and the later ones fail.
type passer struct {
	n, fail, stop int
	always        []bool
	cancel        context.CancelFunc
}

func (p *passer) Pass(ctx context.Context, w io.Writer, always bool) error {
	p.n++
	p.always = append(p.always, always)
	if p.stop > 0 && p.n >= p.stop {
		if p.n == p.stop {
			p.cancel()
		}
		return errors.New("interrupted") // after ctx is done: not reported
	}
	if p.n == p.fail {
		return errors.New("boom")
	}
	return nil
}

// TestLoopOnce: one pass, which always prints, and its error returned;
// nothing reported.
func TestLoopOnce(t *testing.T) {
	p := &passer{fail: 1}
	l := Loop{Once: true, Interval: time.Hour, Report: func(err error) { t.Errorf("reported %v", err) }}
	if err := l.Run(t.Context(), p); err == nil || err.Error() != "boom" {
		t.Errorf("Run: got %v, want boom", err)
	}
	if p.n != 1 || !p.always[0] {
		t.Errorf("got %d passes %v, want one that always prints", p.n, p.always)
	}
	p = &passer{fail: 1}
	finish := l.Start(t.Context(), p)
	if p.n != 1 {
		t.Errorf("Start with Once: got %d passes before finish, want 1", p.n)
	}
	if err := finish(); err == nil || err.Error() != "boom" {
		t.Errorf("finish: got %v, want boom", err)
	}
}

// TestLoopRun: passes until the context is done, each failed one reported
// unless the context was done, then nil. The control: a loop that printed
// only on change would have always false on every pass.
func TestLoopRun(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p := &passer{fail: 2, stop: 4, cancel: cancel}
	var reported []error
	l := Loop{Interval: time.Millisecond, Report: func(err error) { reported = append(reported, err) }}
	if err := l.Run(ctx, p); err != nil {
		t.Errorf("Run: got %v, want nil", err)
	}
	// A tick that came with the cancellation may make one more pass.
	if p.n < 4 {
		t.Errorf("got %d passes, want 4 or more", p.n)
	}
	for i, a := range p.always {
		if a {
			t.Errorf("pass %d: always is true in a loop", i+1)
		}
	}
	if len(reported) != 1 || reported[0].Error() != "boom" {
		t.Errorf("reported %v, want [boom]", reported)
	}
}

// blocker's second pass waits for the context to end, then marks that it
// returned.
type blocker struct {
	n        int
	second   chan struct{}
	returned atomic.Bool
}

func (b *blocker) Pass(ctx context.Context, w io.Writer, always bool) error {
	if b.n++; b.n == 2 {
		close(b.second)
		<-ctx.Done()
		b.returned.Store(true)
	}
	return nil
}

// TestLoopStart: the loop runs in the background until finish, which
// stops it and waits for the pass in flight to return.
func TestLoopStart(t *testing.T) {
	b := &blocker{second: make(chan struct{})}
	l := Loop{Interval: time.Millisecond, Report: func(err error) { t.Errorf("reported %v", err) }}
	finish := l.Start(t.Context(), b)
	<-b.second
	if err := finish(); err != nil {
		t.Errorf("finish: got %v, want nil", err)
	}
	if !b.returned.Load() {
		t.Error("finish returned before the pass in flight")
	}
}

// TestOpenOutboxErrors: a bad route and two routes of one destination are
// usage errors; the senders opened before are closed.
func TestOpenOutboxErrors(t *testing.T) {
	for _, tt := range []struct {
		name   string
		values []string
		want   string
	}{
		{"bad scheme", []string{"foo://h/t"}, "relay: --outbox foo://h/t: unknown scheme"},
		{"one destination twice", []string{"redis-stream://127.0.0.1:1/s", "s=redis-stream://:pw@127.0.0.1:1/t"}, `relay: two --outbox routes for destination "s"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := OpenOutbox(t.Context(), nil, "db", tt.values)
			var ue *cli.UsageError
			if !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("got %v, want a usage error %q", err, tt.want)
			}
		})
	}
}

// TestDescribe: the routes, named with their brokers without secrets.
func TestDescribe(t *testing.T) {
	o := &Outbox{}
	for _, v := range []string{"a=redis-stream://:pw@127.0.0.1:1/s", "kafka://k:9092/t"} {
		r, err := outboxroute.Parse(v)
		if err != nil {
			t.Fatal(err)
		}
		o.routes = append(o.routes, r)
	}
	want := "a → Redis stream s at 127.0.0.1:1, t → Kafka topic t at k:9092"
	if got := o.Describe(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/consumertest"
	"github.com/idemgo/idem/consumer/sidecar"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestConsumeConformance runs the consumer conformance suite against the
// idem binary (`idem consume`) on a Redis stream: the same sidecar as
// consumertest.RunSidecar runs in process on every broker, here through
// the command's flags, its broker wiring (package delivery) and its
// process. The suite's options become flags; its statistics are read
// from /metrics (idem_consume_messages_total) while the process runs and
// from its "idem consume stopped" log line once it exited.
func TestConsumeConformance(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	var n int
	consumertest.RunExternal(t, func(t *testing.T) consumertest.Harness {
		n++
		return &binaryHarness{addr: srv.Addr(), rdb: rdb, stream: fmt.Sprintf("conf-%d", n)}
	}, map[string]string{
		// idem consume takes no fingerprint of a payload (it has no such
		// flag): a long payload is no invalid message there. The keys'
		// invalid cases (none, too long) are the same code as the
		// adapter's, which TestSidecarConformance of package redisstream
		// runs through the sidecar.
		"InvalidDeadLetteredAtOnce": "idem consume has no payload fingerprint",
		// The suite acquires the key as another owner with the payload's
		// fingerprint; idem consume's acquisition, without one, is then a
		// key reused with another fingerprint (a dead letter), not a
		// duplicate in progress. The case runs in process on every broker
		// (TestSidecarConformance).
		"InProgressDuplicateNeverAcked": "idem consume has no payload fingerprint",
	})
}

// binaryHarness runs `idem consume` on a stream of its own.
type binaryHarness struct {
	addr   string
	rdb    *redis.Client
	stream string
	exec   *idem.Executor
}

func (h *binaryHarness) Executor(t *testing.T) *idem.Executor {
	if h.exec == nil {
		st, err := redisstore.New(h.rdb) // the binary's store: the stream's server, the default prefix
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if h.exec, err = idem.New(st, idem.WithLease(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	return h.exec
}

func (h *binaryHarness) Publish(t *testing.T, key string, payload []byte) {
	vals := []any{"payload", string(payload)}
	if key != "" {
		vals = append(vals, "key", key)
	}
	xadd(t, h.rdb, h.stream, vals...)
}

func (h *binaryHarness) DeadLetters(t *testing.T) int {
	n, err := h.rdb.XLen(t.Context(), h.stream+":dlq").Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// Start runs `idem consume` with the suite's options as flags.
func (h *binaryHarness) Start(t *testing.T, opts []consumer.Option, hd consumertest.Handler) (func() consumer.Stats, func()) {
	var cfg consumer.Config
	for _, o := range opts {
		o(&cfg)
	}
	admin := freeAddr(t)
	args := []string{"consume", "--from", "redis-stream://" + h.addr + "/" + h.stream + "?group=g",
		"--to", consumertest.SidecarServer(t, hd), "--name", "c1", "--lease", "1s",
		"--max-deliveries", strconv.Itoa(cfg.MaxDeliveries), "--retry-delay", cfg.RetryDelay.String(),
		"--admin-listen", admin, "--log-format", "json"}
	if cfg.Scope != "" {
		args = append(args, "--scope", cfg.Scope)
	}
	if cfg.ShutdownTimeout > 0 {
		args = append(args, "--shutdown-timeout", cfg.ShutdownTimeout.String())
	}
	if cfg.OnLeaseLost != nil {
		args = append(args, "--on-lease-lost", leaseLostServer(t, cfg.OnLeaseLost))
	}
	p := startIdem(t, args...)
	waitFor(t, "idem consume's /healthz", func() bool {
		res, err := http.Get("http://" + admin + "/healthz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	var mu sync.Mutex
	var last consumer.Stats
	var stopped bool
	stats := func() consumer.Stats {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			if s, err := scrapeConsumeStats(admin); err == nil {
				last = s
			}
		}
		return last
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			p.terminate()
			if code := p.wait(); code != 0 {
				t.Errorf("idem consume exited with %d after SIGTERM, want 0", code)
			}
			s, err := stoppedStats(p.stderr.String())
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			last, stopped = s, true
			mu.Unlock()
		})
	}
	t.Cleanup(stop)
	return stats, stop
}

// leaseLostServer serves --on-lease-lost: each POST becomes a call of f,
// its reason the error (wrapping idem.ErrLeaseLost when it names it).
func leaseLostServer(t *testing.T, f func(context.Context, idem.LeaseLost)) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var l sidecar.LeaseLost
		if err := json.NewDecoder(r.Body).Decode(&l); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var err error
		switch {
		case strings.Contains(l.Reason, idem.ErrLeaseLost.Error()):
			err = fmt.Errorf("%w (%s)", idem.ErrLeaseLost, l.Reason)
		case l.Reason != "":
			err = errors.New(l.Reason)
		}
		f(r.Context(), idem.LeaseLost{Key: idem.Key{Scope: l.Scope, ID: l.Key}, Fence: l.Fence, Err: err})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// consumeOutcomes maps the outcomes of idem_consume_messages_total (and
// the stopped log line's attributes) to the fields of consumer.Stats.
func consumeOutcomes(s *consumer.Stats) map[string]*int64 {
	return map[string]*int64{
		"processed": &s.Processed, "replayed": &s.Replayed, "retried": &s.Retried, "dead_lettered": &s.DeadLettered,
		"invalid": &s.Invalid, "panics": &s.Panics, "redelivered": &s.Redelivered, "abandoned": &s.Abandoned,
	}
}

// scrapeConsumeStats reads idem_consume_messages_total from /metrics.
func scrapeConsumeStats(admin string) (consumer.Stats, error) {
	var s consumer.Stats
	res, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return s, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return s, err
	}
	fields := consumeOutcomes(&s)
	found := 0
	for line := range strings.Lines(string(body)) {
		rest, ok := strings.CutPrefix(line, `idem_consume_messages_total{outcome="`)
		if !ok {
			continue
		}
		outcome, value, _ := strings.Cut(rest, `"} `)
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if p := fields[outcome]; p != nil && err == nil {
			*p = int64(v)
			found++
		}
	}
	if found != len(fields) {
		return s, fmt.Errorf("/metrics has %d of the %d outcomes of idem_consume_messages_total", found, len(fields))
	}
	return s, nil
}

// stoppedStats reads the statistics of the "idem consume stopped" log
// line (--log-format json).
func stoppedStats(stderr string) (consumer.Stats, error) {
	var s consumer.Stats
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil || line["msg"] != "idem consume stopped" {
			continue
		}
		for name, p := range consumeOutcomes(&s) {
			v, ok := line[name].(float64)
			if !ok && name != "redelivered" { // the log line leaves it out
				return s, fmt.Errorf("the stopped log line has no %s: %s", name, sc.Text())
			}
			*p = int64(v)
		}
		return s, nil
	}
	return s, fmt.Errorf("no \"idem consume stopped\" log line in:\n%s", stderr)
}

package failover

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestSentinelPartitionProxy is TestSentinelPartition through the idem
// proxy, without and with --wait-replicas 1: the proxy's Redis is the
// primary, which the test cuts off from its replicas and Sentinels while
// the proxy still reaches it. A key is lost when a 2xx was sent for it and
// a retry through a proxy on the promoted primary runs the upstream again.
// Without --wait-replicas the counters must see losses; with it, the
// requests during the partition must get 503 and no 2xx be lost.
func TestSentinelPartitionProxy(t *testing.T) {
	bin := chaostest.BuildIdem(t)
	for _, v := range []struct {
		name string
		args []string
	}{
		{"none", nil},
		{"wait1", []string{"--wait-replicas", "1", "--wait-replicas-timeout", waitTimeout.String()}},
	} {
		t.Run(v.name, func(t *testing.T) { runPartitionProxy(t, bin, v.name, v.args) })
	}
}

func runPartitionProxy(t *testing.T, bin, name string, args []string) {
	var cut *chaostest.NetProxy
	s := redistest.StartSentinelVia(t, 2, func(addr string) string {
		cut = chaostest.StartNetProxy(t, addr)
		return cut.Addr()
	})
	old := s.Data()[0]

	var mu sync.Mutex
	runs := make(map[string]int)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		runs[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	common := []string{"--upstream", up.URL, "--lease", lease.String(), "--wait", "0s"}
	_, addr := chaostest.StartProxy(t, bin, append(append(common, "--redis", "redis://"+old.Addr()), args...)...)

	var c chaostest.Counters
	httpClient := &http.Client{Timeout: callTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	t.Cleanup(httpClient.CloseIdleConnections)
	post := func(ctx context.Context, addr, key string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/orders", strings.NewReader("order "+key))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Idempotency-Key", key)
		res, err := httpClient.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode, nil
	}

	var (
		next      atomic.Int64
		faultAt   atomic.Int64
		acked     sync.Map // key -> true: a 2xx was sent
		status503 atomic.Int64
		during    atomic.Int64 // 2xx for requests sent after the cut
	)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				key := "k" + strconv.FormatInt(next.Add(1), 10)
				sent := time.Now().UnixNano()
				code, err := post(ctx, addr, key)
				if ctx.Err() != nil {
					return
				}
				c.Attempted.Add(1)
				switch {
				case err != nil:
				case code/100 == 2:
					c.Acknowledged.Add(1)
					acked.Store(key, true)
					if f := faultAt.Load(); f != 0 && sent > f {
						during.Add(1)
					}
				case code == http.StatusServiceUnavailable:
					status503.Add(1)
				}
			}
		})
	}
	halt := sync.OnceFunc(func() { stop(); wg.Wait() })
	t.Cleanup(halt)
	time.Sleep(time.Duration(chaostest.Size(1, 5)) * time.Second) // load before the partition
	cut.Disable()
	faultAt.Store(time.Now().UnixNano())
	promoted := s.WaitFailover(t, old)
	halt()
	cut.Enable(t)

	// Retry every acknowledged key through a proxy on the promoted primary:
	// a replay is kept, a new run of the upstream is a lost completion.
	mu.Lock()
	before := make(map[string]int, len(runs))
	for k, n := range runs {
		before[k] = n
	}
	mu.Unlock()
	_, addr2 := chaostest.StartProxy(t, bin, append(common, "--redis", "redis://"+promoted.Addr())...)
	var keys []string
	acked.Range(func(k, _ any) bool { keys = append(keys, k.(string)); return true })
	var rw sync.WaitGroup
	var retryErrs atomic.Int64
	for w := range workers {
		rw.Go(func() {
			for i := w; i < len(keys); i += workers {
				deadline := time.Now().Add(lease + 10*time.Second)
				for {
					rctx, cancel := context.WithTimeout(context.Background(), callTimeout)
					code, err := post(rctx, addr2, keys[i])
					cancel()
					if err == nil && code != http.StatusConflict {
						break
					}
					if time.Now().After(deadline) {
						retryErrs.Add(1)
						break
					}
					time.Sleep(50 * time.Millisecond) // poll until the lost attempt's lease ends
				}
			}
		})
	}
	rw.Wait()
	if n := retryErrs.Load(); n > 0 {
		t.Errorf("%d retries of acknowledged keys did not get an answer", n)
	}
	mu.Lock()
	lost := 0
	for _, k := range keys {
		if runs[k] > before[k] {
			lost++
		}
	}
	for _, n := range runs {
		c.Executed.Add(int64(n))
	}
	mu.Unlock()
	c.Effects.Store(c.Executed.Load())
	c.Lost.Store(int64(lost))
	c.Duplicated.Store(int64(lost))
	healed := waitReplica(t, old)
	chaostest.Report(t, "Sentinel partition of the primary, through the proxy, "+name, "make chaos-long RUN='TestSentinelPartitionProxy/"+name+"'", &c, map[string]string{
		"acked lost":                        fmt.Sprintf("%d of %d", lost, len(keys)),
		"2xx after the cut":                 strconv.FormatInt(during.Load(), 10),
		"503":                               strconv.FormatInt(status503.Load(), 10),
		"old primary rejoined as a replica": healed,
	})
	switch name {
	case "none":
		if during.Load() == 0 {
			t.Fatal("no 2xx from the cut-off primary: the scenario did not test a partition")
		}
		if lost == 0 {
			t.Errorf("no 2xx lost although %d were sent from the cut-off primary only: the counters cannot see a loss", during.Load())
		}
	default:
		if lost != 0 {
			t.Errorf("%d keys answered 2xx ran again after the failover with --wait-replicas 1", lost)
		}
		if status503.Load() == 0 {
			t.Error("no 503 while the primary was cut off from its replicas")
		}
	}
}

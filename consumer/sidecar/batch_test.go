package sidecar_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/sidecar"
	"github.com/idemgo/idem/memstore"
)

// batchServer answers each batch request with answer(the request's
// messages) and records the requests.
type batchServer struct {
	mu       sync.Mutex
	requests [][]sidecar.BatchMessage
}

func (s *batchServer) start(t *testing.T, answer func(w http.ResponseWriter, n int, msgs []sidecar.BatchMessage)) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msgs []sidecar.BatchMessage
		if err := json.NewDecoder(r.Body).Decode(&msgs); err != nil || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("batch request: %v (content type %q)", err, r.Header.Get("Content-Type"))
		}
		s.mu.Lock()
		s.requests = append(s.requests, msgs)
		n := len(s.requests)
		s.mu.Unlock()
		answer(w, n, msgs)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func (s *batchServer) got() [][]sidecar.BatchMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

func batchCall(h *sidecar.Handler, msgs []consumer.Message, bodies [][]byte) consumer.Handler {
	return func(ctx context.Context, i int) error {
		return h.Call(ctx, sidecar.Delivery{Key: msgs[i].Key, Body: bodies[i], Header: http.Header{sidecar.HeaderBroker: {"test"}}})
	}
}

// TestBatch: a batch is one request carrying every message (key, fence,
// headers, body as text or base64); each message is decided by its own
// outcome as by the answer to a request of its own, 2xx outcomes stored
// as results; duplicates passed on come in one request, replayed and
// without a fence, with their stored result.
func TestBatch(t *testing.T) {
	outcomes := []sidecar.BatchOutcome{
		{Status: 200, Headers: map[string]string{"X-A": "1"}, Body: "r0"},
		{Status: 400, Body: "bad"},
		{Status: 500},
		{Status: 409},
		{Status: 201, Body: base64.StdEncoding.EncodeToString([]byte{0xff, 0}), Encoding: "base64"},
		{Status: 204},
	}
	want := []consumer.Action{consumer.Ack, consumer.DeadLetter, consumer.Retry, consumer.Retry, consumer.Ack, consumer.Ack}
	var s batchServer
	srv := s.start(t, func(w http.ResponseWriter, n int, msgs []sidecar.BatchMessage) {
		if n == 1 {
			json.NewEncoder(w).Encode(outcomes)
			return
		}
		out := make([]sidecar.BatchOutcome, len(msgs))
		for k := range out {
			out[k].Status = 200
		}
		json.NewEncoder(w).Encode(out)
	})
	h := &sidecar.Handler{URL: srv.URL, Batch: true}
	p := newProcessor(t, consumer.WithGatheredHandlers(), consumer.WithPassDuplicates())
	var msgs []consumer.Message
	var bodies [][]byte
	for k := range outcomes {
		msgs = append(msgs, consumer.Message{Key: "k" + strconv.Itoa(k), Deliveries: 1})
		bodies = append(bodies, []byte(`{"n":`+strconv.Itoa(k)+`}`))
	}
	bodies[3] = []byte{0xfe, 0x01}
	fences := make([]int64, len(msgs))
	got := p.Process(t.Context(), msgs, func(ctx context.Context, i int) error {
		fences[i], _ = idem.FenceFrom(ctx)
		return batchCall(h, msgs, bodies)(ctx, i)
	})
	for i, r := range got {
		if r.Action != want[i] {
			t.Errorf("message %d: got %v (%v), want %v", i, r.Action, r.Err, want[i])
		}
	}
	var herr *sidecar.HandlerError
	if !errors.As(got[1].Err, &herr) || herr.Status != 400 || string(herr.Body) != "bad" || !idem.IsTerminal(got[1].Err) {
		t.Errorf("message 1's error: %v, want a terminal HandlerError 400 with its body", got[1].Err)
	}
	reqs := s.got()
	if len(reqs) != 1 || len(reqs[0]) != len(msgs) {
		t.Fatalf("got %d requests, want 1 with %d messages", len(reqs), len(msgs))
	}
	for i, m := range reqs[0] {
		body := m.Body
		if m.Encoding == "base64" {
			b, _ := base64.StdEncoding.DecodeString(m.Body)
			body = string(b)
		}
		if m.Key != msgs[i].Key || m.Fence != fences[i] || m.Fence == 0 || m.Replayed || body != string(bodies[i]) ||
			m.Headers[sidecar.HeaderKey] != msgs[i].Key || m.Headers[sidecar.HeaderFence] != strconv.FormatInt(fences[i], 10) ||
			m.Headers[sidecar.HeaderDigest] != p.Key(msgs[i].Key).Digest() || m.Headers[sidecar.HeaderBroker] != "test" || m.Headers[sidecar.HeaderDeliveries] != "1" {
			t.Errorf("message %d as sent: %+v, want its key, fence %d, body and headers", i, m, fences[i])
		}
		if wantEnc := map[bool]string{true: "base64", false: "text"}[i == 3]; m.Encoding != wantEnc {
			t.Errorf("message %d's encoding: %q, want %q", i, m.Encoding, wantEnc)
		}
	}

	// Again: the completed keys are duplicates passed on in one request;
	// the others run again.
	stored := make([][]byte, len(msgs))
	got = p.Process(t.Context(), msgs, func(ctx context.Context, i int) error {
		stored[i], _ = consumer.DuplicateFrom(ctx)
		return batchCall(h, msgs, bodies)(ctx, i)
	})
	reqs = s.got()
	if len(reqs) != 2 || len(reqs[1]) != 5 { // 1 was dead-lettered: FAILED, not run
		t.Fatalf("second round: %d requests, the last with %d messages, want 2 and 5", len(reqs), len(reqs[len(reqs)-1]))
	}
	for _, m := range reqs[1] {
		k, _ := strconv.Atoi(strings.TrimPrefix(m.Key, "k"))
		if dup := want[k] == consumer.Ack; m.Replayed != dup || (m.Fence == 0) != dup || (m.Headers[sidecar.HeaderReplayed] == "true") != dup {
			t.Errorf("second round, %s: %+v, want replayed %v", m.Key, m, dup)
		}
	}
	for i, r := range stored {
		if want[i] != consumer.Ack {
			continue
		}
		var res sidecar.Result
		if err := json.Unmarshal(r, &res); err != nil || res.Status != outcomes[i].Status {
			t.Errorf("message %d's stored result: %s (%v), want status %d", i, r, err, outcomes[i].Status)
		}
		if i == 0 && (string(res.Body) != "r0" || res.Header.Get("X-A") != "1") || i == 4 && string(res.Body) != "\xff\x00" {
			t.Errorf("message %d's stored result: %+v, want its outcome's body and headers", i, res)
		}
		if got[i].Action != consumer.Ack || !got[i].Replayed {
			t.Errorf("second round, message %d: %+v, want a replayed ack", i, got[i])
		}
	}
}

// TestBatchInvalidAnswer: an answer that is not one valid outcome per
// message fails every message of the batch (retried, keys released); an
// answer that is not a 2xx is every message's answer.
func TestBatchInvalidAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, status, body string
		want               consumer.Action
	}{
		{"count", "200", `[{"status":200}]`, consumer.Retry},
		{"json", "200", `[{"status":200},`, consumer.Retry},
		{"object", "200", `{"status":200}`, consumer.Retry},
		{"status", "200", `[{"status":200},{"status":0}]`, consumer.Retry},
		{"encoding", "200", `[{"status":200},{"status":200,"body":"x","encoding":"hex"}]`, consumer.Retry},
		{"base64", "200", `[{"status":200},{"status":200,"body":"!!","encoding":"base64"}]`, consumer.Retry},
		{"503", "503", `down`, consumer.Retry},
		{"400", "400", `refused`, consumer.DeadLetter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s batchServer
			srv := s.start(t, func(w http.ResponseWriter, n int, msgs []sidecar.BatchMessage) {
				code, _ := strconv.Atoi(tc.status)
				w.WriteHeader(code)
				io.WriteString(w, tc.body)
			})
			h := &sidecar.Handler{URL: srv.URL, Batch: true}
			p := newProcessor(t, consumer.WithGatheredHandlers())
			msgs := []consumer.Message{{Key: "a", Deliveries: 1}, {Key: "b", Deliveries: 1}}
			got := p.Process(t.Context(), msgs, batchCall(h, msgs, [][]byte{nil, nil}))
			for i, r := range got {
				if r.Action != tc.want {
					t.Errorf("message %d: got %v (%v), want %v", i, r.Action, r.Err, tc.want)
				}
			}
			if len(s.got()) != 1 {
				t.Errorf("got %d requests, want 1", len(s.got()))
			}
			if tc.want == consumer.Retry { // released: run again at once
				if again := p.Process(t.Context(), msgs[:1], func(context.Context, int) error { return nil }); again[0].Action != consumer.Ack || again[0].Replayed {
					t.Errorf("after the failed batch: %+v, want the key acquired again", again[0])
				}
			}
		})
	}
}

// TestBatchLeaseLost: a lease lost by one message of a batch cancels the
// batch's request (its connection closes): every message is retried, and
// the lease-lost URL gets the one whose lease was lost.
func TestBatchLeaseLost(t *testing.T) {
	cancelled := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // then the server sees the connection close
		<-r.Context().Done()
		close(cancelled)
	}))
	defer srv.Close()
	var mu sync.Mutex
	var lost []sidecar.LeaseLost
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var l sidecar.LeaseLost
		json.NewDecoder(r.Body).Decode(&l)
		mu.Lock()
		lost = append(lost, l)
		mu.Unlock()
	}))
	defer hook.Close()
	h := &sidecar.Handler{URL: srv.URL, LeaseLostURL: hook.URL, Batch: true}
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(s, idem.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p, err := consumer.New(exec, consumer.WithOnLeaseLost(h.OnLeaseLost), consumer.WithGatheredHandlers())
	if err != nil {
		t.Fatal(err)
	}
	msgs := []consumer.Message{{Key: "a", Deliveries: 1}, {Key: "b", Deliveries: 1}}
	got := p.Process(t.Context(), msgs, func(ctx context.Context, i int) error {
		if i == 1 { // another owner takes b over
			if err := s.Delete(context.Background(), p.Key("b").Digest()); err != nil {
				t.Error(err)
			}
			if _, _, err := exec.Begin(context.Background(), p.Key("b"), ""); err != nil {
				t.Error(err)
			}
		}
		return h.Call(ctx, sidecar.Delivery{Key: msgs[i].Key})
	})
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the batch's request was not cancelled")
	}
	for i, r := range got {
		if r.Action != consumer.Retry || !errors.Is(r.Err, idem.ErrLeaseLost) {
			t.Errorf("message %d: got %v (%v), want a retry for the lost lease", i, r.Action, r.Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lost) != 1 || lost[0].Key != "b" {
		t.Errorf("lease-lost calls: %+v, want one for b", lost)
	}
}

// TestBatchBrokenConnection: a batch whose connection broke before the
// answer is sent again with the same fences; with a gate, a message whose
// completion row committed meanwhile takes the row's result, whatever the
// second answer says of it.
func TestBatchBrokenConnection(t *testing.T) {
	for _, gated := range []bool{false, true} {
		t.Run(map[bool]string{false: "fence", true: "gate"}[gated], func(t *testing.T) {
			g := &fakeGate{}
			var s batchServer
			srv := s.start(t, func(w http.ResponseWriter, n int, msgs []sidecar.BatchMessage) {
				if n == 1 { // a's row committed, then killed before the answer
					g.commit(msgs[0].Headers[sidecar.HeaderDigest])
					conn, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Error(err)
						return
					}
					conn.Close()
					return
				}
				json.NewEncoder(w).Encode([]sidecar.BatchOutcome{{Status: 409}, {Status: 200, Body: "b"}})
			})
			h := &sidecar.Handler{URL: srv.URL, Batch: true}
			if gated {
				h.Gate = g
			}
			p := newProcessor(t, consumer.WithGatheredHandlers(), consumer.WithPassDuplicates())
			msgs := []consumer.Message{{Key: "a", Deliveries: 1}, {Key: "b", Deliveries: 1}}
			got := p.Process(t.Context(), msgs, batchCall(h, msgs, [][]byte{nil, nil}))
			want := []consumer.Action{consumer.Retry, consumer.Ack}
			if gated {
				want[0] = consumer.Ack
			}
			for i, r := range got {
				if r.Action != want[i] {
					t.Errorf("message %d: got %v (%v), want %v", i, r.Action, r.Err, want[i])
				}
			}
			reqs := s.got()
			if len(reqs) != 2 || reqs[0][0].Fence != reqs[1][0].Fence || reqs[0][1].Fence != reqs[1][1].Fence {
				t.Fatalf("requests: %+v, want two with the same fences", reqs)
			}
			if !gated {
				return
			}
			var stored []byte
			p.Process(t.Context(), msgs[:1], func(ctx context.Context, i int) error {
				stored, _ = consumer.DuplicateFrom(ctx)
				return nil
			})
			var res sidecar.Result
			if err := json.Unmarshal(stored, &res); err != nil || !res.Gate || string(res.Body) != "row" {
				t.Errorf("a's stored result: %s (%v), want the gate's row", stored, err)
			}
		})
	}
}

// TestResultLimits: one request per message or per batch, a 2xx answer's
// body over MaxResult is stored cut to MaxResult bytes (Truncated), and a
// failed answer's HandlerError keeps the first 1 KiB of its body.
func TestResultLimits(t *testing.T) {
	long := strings.Repeat("x", 3000)
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "call", true: "batch"}[batch], func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !batch {
					if r.Header.Get(sidecar.HeaderKey) == "fail" {
						w.WriteHeader(500)
					}
					io.WriteString(w, long)
					return
				}
				var msgs []sidecar.BatchMessage
				json.NewDecoder(r.Body).Decode(&msgs)
				out := make([]sidecar.BatchOutcome, len(msgs))
				for k, m := range msgs {
					out[k] = sidecar.BatchOutcome{Status: 200, Body: long}
					if m.Key == "fail" {
						out[k].Status = 500
					}
				}
				json.NewEncoder(w).Encode(out)
			}))
			t.Cleanup(srv.Close)
			h := &sidecar.Handler{URL: srv.URL, Batch: batch, MaxResult: 2000}
			opts := []consumer.Option{consumer.WithPassDuplicates()}
			if batch {
				opts = append(opts, consumer.WithGatheredHandlers())
			}
			p := newProcessor(t, opts...)
			msgs := []consumer.Message{{Key: "ok"}, {Key: "fail"}}
			got := p.Process(t.Context(), msgs, func(ctx context.Context, i int) error {
				return h.Call(ctx, sidecar.Delivery{Key: msgs[i].Key, Body: []byte("{}")})
			})
			var herr *sidecar.HandlerError
			if got[0].Action != consumer.Ack || !errors.As(got[1].Err, &herr) || herr.Status != 500 || string(herr.Body) != long[:1024] {
				t.Fatalf("got %+v, want an Ack and a HandlerError 500 with the first 1 KiB of the body", got)
			}
			var stored []byte
			p.Process(t.Context(), msgs[:1], func(ctx context.Context, i int) error {
				stored, _ = consumer.DuplicateFrom(ctx)
				return nil
			})
			var r sidecar.Result
			if err := json.Unmarshal(stored, &r); err != nil || r.Status != 200 || string(r.Body) != long[:2000] || !r.Truncated {
				t.Errorf("stored result: %d, %d bytes, truncated %v (%v); want 200, the first 2000 bytes, truncated", r.Status, len(r.Body), r.Truncated, err)
			}
		})
	}
}

package idemhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemhttp/httpkit"
)

// TestTrailers: a response's trailers, announced in the Trailer field or
// named with http.TrailerPrefix, are stored and replayed as trailers (a
// chunked body on HTTP/1.1, a trailer block on HTTP/2), never in the
// header, for a held response and for a stream. Before they were stored, a
// replay had no trailer and a Content-Length.
func TestTrailers(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		for _, tc := range []struct {
			name              string
			stream, announced bool
		}{
			{"held", false, true}, {"stream", true, true}, {"held, none announced", false, false},
		} {
			stream := tc.stream
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				h := newMiddleware(t, newMemExecutor(t)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					checksum := http.TrailerPrefix + "X-Checksum"
					if tc.announced {
						w.Header().Set("Trailer", "X-Checksum")
						checksum = "X-Checksum"
					}
					w.Header().Set("Content-Type", "text/plain")
					if stream {
						w.Header().Set("Content-Type", "text/event-stream")
					}
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, "body")
					w.Header().Set(checksum, "abc")
					w.Header().Set(http.TrailerPrefix+"X-Late", "late")
				}))
				srv := httptest.NewUnstartedServer(h)
				if proto == "HTTP/2" {
					srv.EnableHTTP2 = true
					srv.StartTLS()
				} else {
					srv.Start()
				}
				t.Cleanup(srv.Close)
				for i, what := range []string{"first", "replay"} {
					req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/orders", nil)
					req.Header.Set("Idempotency-Key", "k")
					res, err := srv.Client().Do(req)
					if err != nil {
						t.Fatal(err)
					}
					body, err := io.ReadAll(res.Body)
					res.Body.Close()
					if err != nil || res.StatusCode != 201 || string(body) != "body" {
						t.Fatalf("%s: got %d %q, %v, want 201 \"body\"", what, res.StatusCode, body, err)
					}
					if replayed := res.Header.Get(idemhttp.ReplayedHeader) == "true"; replayed != (i == 1) {
						t.Errorf("%s: Idempotent-Replayed %v", what, replayed)
					}
					if got := res.Trailer.Get("X-Checksum"); got != "abc" {
						t.Errorf("%s: trailer X-Checksum: got %q, want \"abc\" (trailers %v, header %v)", what, got, res.Trailer, res.Header)
					}
					if got := res.Trailer.Get("X-Late"); got != "late" {
						t.Errorf("%s: trailer X-Late: got %q, want \"late\"", what, got)
					}
					if v, ok := res.Header["X-Checksum"]; ok {
						t.Errorf("%s: X-Checksum in the header: %q", what, v)
					}
					if proto == "HTTP/1.1" && (res.ContentLength != -1 || len(res.TransferEncoding) == 0) {
						t.Errorf("%s: Content-Length %d, Transfer-Encoding %v, want a chunked body", what, res.ContentLength, res.TransferEncoding)
					}
					if ct := res.Header.Get("Content-Type"); ct != "text/plain" && !stream || ct != "text/event-stream" && stream {
						t.Errorf("%s: Content-Type %q", what, ct)
					}
				}
			})
		}
	}
}

// committer is a Recorder that stores value in place of the response.
type committer struct {
	a     *idem.Attempt
	value []byte
}

func (c committer) Record(ctx context.Context, _ []byte) ([]byte, error) {
	return nil, c.a.Commit(ctx, c.value)
}

func (committer) Discard(context.Context) {}

// TestReplayVersion1: a response stored before trailers were (encoding
// version 1, its bytes written down from that code) replays as it was.
func TestReplayVersion1(t *testing.T) {
	t.Parallel()
	old := []byte("\x01\xc9\x01\x03\fContent-Type\x01\ntext/plain\bLocation\x01\t/orders/1\nX-Checksum\x01\x03abccreated")
	got, err := httpkit.DecodeResponse(old)
	if err != nil || got.Status != 201 || got.Header.Get("Location") != "/orders/1" || got.Trailer != nil || string(got.Body) != "created" {
		t.Fatalf("httpkit.DecodeResponse: got %+v, %v", got, err)
	}
	var runs int
	h := newMiddleware(t, newMemExecutor(t)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		a, _ := idem.AttemptFrom(r.Context())
		if err := idemhttp.SetRecorder(r.Context(), committer{a, old}); err != nil {
			t.Error(err)
		}
	}))
	serve(h, request(http.MethodPost, "/orders", "old", "")) // stores old
	res := serve(h, request(http.MethodPost, "/orders", "old", ""))
	if res.status != 201 || res.body != "created" || res.header.Get("X-Checksum") != "abc" || res.header.Get("Content-Type") != "text/plain" ||
		res.header.Get(idemhttp.ReplayedHeader) != "true" || runs != 1 {
		t.Errorf("replay: got %d %q %v after %d runs, want the stored 201 replayed after 1", res.status, res.body, res.header, runs)
	}
	if _, ok := res.header["Trailer"]; ok {
		t.Errorf("replay announces trailers: %v", res.header)
	}
}

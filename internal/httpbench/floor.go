package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The floor rows bound what any idempotency middleware on Redis that
// records before success can reach on this machine, with each client: per
// request, the least such a middleware must do, and nothing else. One round
// trip before the handler claims the key (SET key p NX GET PX: no Lua, no
// record to build or decode); the handler's response is held back in a
// buffer; one round trip after it stores the body (SET key body PX), and
// the response goes out. A key that exists is answered with its stored
// body (one round trip), or 409 while it is claimed.
//
// It checks no fingerprint, keeps no owner, fence, lease or status code,
// and loses a claim to a crash until its TTL: it is not a middleware to
// use, only the cost of the two round trips and the held response that
// record before success needs. A target above floor / peer on the same
// cells is out of reach for any design that keeps that guarantee.

// floorStore is the two commands of the floor, on one client.
type floorStore interface {
	// claim sets key to a claim marker if it does not exist and returns
	// the value it had (found false: none, the key is claimed now).
	claim(ctx context.Context, key string) (old string, found bool, err error)
	// store sets key to body.
	store(ctx context.Context, key string, body []byte) error
}

const (
	floorClaim = "p"
	floorTTL   = time.Minute
	floorKeep  = 24 * time.Hour
)

type floorGoRedis struct{ c *redis.Client }

func (f floorGoRedis) claim(ctx context.Context, key string) (string, bool, error) {
	v, err := f.c.SetArgs(ctx, key, floorClaim, redis.SetArgs{Mode: "NX", Get: true, TTL: floorTTL}).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	return v, err == nil, err
}

func (f floorGoRedis) store(ctx context.Context, key string, body []byte) error {
	return f.c.Set(ctx, key, body, floorKeep).Err()
}

type floorRueidis struct{ c rueidis.Client }

func (f floorRueidis) claim(ctx context.Context, key string) (string, bool, error) {
	v, err := f.c.Do(ctx, f.c.B().Set().Key(key).Value(floorClaim).Nx().Get().Px(floorTTL).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false, nil
	}
	return v, err == nil, err
}

func (f floorRueidis) store(ctx context.Context, key string, body []byte) error {
	return f.c.Do(ctx, f.c.B().Set().Key(key).Value(rueidis.BinaryString(body)).Px(floorKeep).Build()).Error()
}

// floorMiddleware wraps next in the floor's two round trips on s; keys are
// the Idempotency-Key header under prefix.
func floorMiddleware(s floorStore, prefix string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := prefix + r.Header.Get("Idempotency-Key")
		old, found, err := s.claim(r.Context(), key)
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		case found && old == floorClaim:
			http.Error(w, "in progress", http.StatusConflict)
			return
		case found:
			w.Write([]byte(old))
			return
		}
		rec := &heldResponse{header: w.Header(), status: http.StatusOK}
		next.ServeHTTP(rec, r)
		if err := s.store(r.Context(), key, rec.body.Bytes()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(rec.status)
		w.Write(rec.body.Bytes())
	})
}

// heldResponse holds a handler's response back: its header is the real
// writer's, its status and body are kept.
type heldResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *heldResponse) Header() http.Header         { return h.header }
func (h *heldResponse) WriteHeader(code int)        { h.status = code }
func (h *heldResponse) Write(p []byte) (int, error) { return h.body.Write(p) }

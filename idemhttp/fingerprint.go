package idemhttp

import (
	"crypto/sha256"
	"errors"
	"hash"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/idemgo/idem/internal/canonjson"
)

// fpState is the reusable state of one fingerprint: the hash and buffers
// that would otherwise escape to the heap through the hash.Hash interface.
type fpState struct {
	h       hash.Hash
	scratch [256]byte
	sum     [sha256.Size]byte
}

var fpStates = sync.Pool{New: func() any { return &fpState{h: sha256.New()} }}

// errBodyTooLarge is returned by readBody for a body over the limit.
var errBodyTooLarge = errors.New("idemhttp: request body too large")

// fingerprint reads r's body (up to the limit) and returns it with the
// request's fingerprint: SHA-256 over the method, the escaped path, the raw
// query, the selected fields and the body, each length-prefixed so that no
// two requests share an encoding. The body is hashed as it is read, unless
// it is to be canonicalised as JSON first. The fingerprint is the raw 32-byte
// digest.
func (m *Middleware) fingerprint(r *http.Request) (body []byte, fp string, err error) {
	st := fpStates.Get().(*fpState)
	defer fpStates.Put(st)
	h := st.h
	h.Reset()
	b := st.scratch[:0]
	b = appendString(b, r.Method)
	b = appendString(b, r.URL.EscapedPath())
	b = appendString(b, r.URL.RawQuery)
	for _, name := range m.fpHeaders {
		vs := r.Header[name]
		b = appendUvarint(b, len(vs))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	h.Write(b)
	var sink io.Writer = h
	if m.canonicalJSON || !m.fp.IsBody() {
		sink = io.Discard
	}
	body, err = readBody(r.Body, r.ContentLength, m.maxBody, sink, m.bodies)
	if err != nil {
		return nil, "", err
	}
	switch {
	case !m.fp.IsBody():
		h.Write(m.fp.AppendBody(st.scratch[:0], body))
	case m.canonicalJSON:
		if c, ok := canonjson.Canonical(body); ok {
			h.Write(c)
		} else {
			h.Write(body)
		}
	}
	// 128 bits of SHA-256 tell payloads apart as well as 256 do for this
	// purpose (a collision needs about 2^64 requests under one key) and
	// save 16 bytes in every stored record.
	return body, string(h.Sum(st.sum[:0])[:fingerprintLen]), nil
}

// fingerprintLen is the length of a fingerprint in bytes.
const fingerprintLen = 16

// errServerBusy is returned by readBody when the body would take the
// bodies' memory over its bound (WithMaxBufferedBodies).
var errServerBusy = errors.New("idemhttp: request bodies use all the memory allowed")

// bodyAllowance is the part of each body that a bodyBudget does not count:
// small requests are never refused for memory, so that a server filled
// with slow uploads still answers them.
const bodyAllowance = 16 << 10

// bodyBudget bounds the memory of the request bodies that a middleware
// holds at once: what each body's buffer holds beyond bodyAllowance. A nil
// *bodyBudget bounds nothing. It is safe for concurrent use.
type bodyBudget struct {
	max  int64
	used atomic.Int64
}

func charge(capacity int) int64 { return max(0, int64(capacity)-bodyAllowance) }

// grow reserves what a buffer growing from oldCap to newCap bytes takes
// beyond its allowance, and reports whether it fits.
func (b *bodyBudget) grow(oldCap, newCap int) bool {
	if b == nil {
		return true
	}
	d := charge(newCap) - charge(oldCap)
	if d <= 0 {
		return true
	}
	if b.used.Add(d) > b.max {
		b.used.Add(-d)
		return false
	}
	return true
}

// release gives back the reservation of a buffer of capacity bytes.
func (b *bodyBudget) release(capacity int) {
	if b != nil {
		b.used.Add(-charge(capacity))
	}
}

// readBody reads body to its end, writing what it reads to w as it goes. It
// returns errBodyTooLarge as soon as more than limit bytes arrive (or at
// once, if contentLength says so), having read at most limit+1 bytes. The
// buffer grows with what arrives, not with what contentLength announces,
// so that a slow or stalled upload holds only what it sent; its capacity
// beyond bodyAllowance is reserved from budget, and readBody returns
// errServerBusy if budget has no room left. On success the caller releases
// the reservation (budget.release(cap(body))) once it is done with the
// body; on error readBody has released it.
func readBody(body io.Reader, contentLength, limit int64, w io.Writer, budget *bodyBudget) ([]byte, error) {
	if body == nil || body == http.NoBody {
		return nil, nil
	}
	if contentLength > limit {
		return nil, errBodyTooLarge
	}
	want := limit + 1 // the most ever needed: room to see the limit exceeded
	if contentLength >= 0 {
		want = contentLength + 1 // room to see io.EOF without growing
	}
	// A body announced small gets its buffer at once; a larger one starts
	// small and grows as its bytes come.
	initial := want
	if want > bodyAllowance {
		initial = 4 << 10
	}
	buf := make([]byte, 0, initial)
	for {
		if len(buf) == cap(buf) {
			// Double, up to what is wanted: a few copies for a large body,
			// and never memory for bytes that did not arrive.
			newCap := min(int64(2*cap(buf)), limit+1)
			if want > int64(cap(buf)) && want < newCap {
				newCap = want
			}
			if !budget.grow(cap(buf), int(newCap)) {
				budget.release(cap(buf))
				return nil, errServerBusy
			}
			nb := make([]byte, len(buf), newCap)
			copy(nb, buf)
			buf = nb
		}
		end := min(int64(cap(buf)), limit+1)
		n, err := body.Read(buf[len(buf):end])
		if n > 0 {
			w.Write(buf[len(buf) : len(buf)+n])
			buf = buf[:len(buf)+n]
		}
		if int64(len(buf)) > limit {
			budget.release(cap(buf))
			return nil, errBodyTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			budget.release(cap(buf))
			return nil, err
		}
	}
}

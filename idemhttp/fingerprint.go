package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"hash"
	"io"
	"net/http"
	"sync"
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
	if m.canonicalJSON {
		sink = io.Discard
	}
	body, err = readBody(r.Body, r.ContentLength, m.maxBody, sink)
	if err != nil {
		return nil, "", err
	}
	if m.canonicalJSON {
		if c, ok := canonicalJSON(body); ok {
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

// readBody reads body to its end, writing what it reads to w as it goes. It
// returns errBodyTooLarge as soon as more than limit bytes arrive (or at
// once, if contentLength says so), having read at most limit+1 bytes.
func readBody(body io.Reader, contentLength, limit int64, w io.Writer) ([]byte, error) {
	if body == nil || body == http.NoBody {
		return nil, nil
	}
	if contentLength > limit {
		return nil, errBodyTooLarge
	}
	size := int64(512)
	if contentLength >= 0 {
		size = contentLength + 1 // room to see io.EOF without growing
	}
	buf := make([]byte, 0, min(size, limit+1))
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // let append pick the growth
		}
		end := min(int64(cap(buf)), limit+1)
		n, err := body.Read(buf[len(buf):end])
		if n > 0 {
			w.Write(buf[len(buf) : len(buf)+n])
			buf = buf[:len(buf)+n]
		}
		if int64(len(buf)) > limit {
			return nil, errBodyTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// canonicalJSON returns body in a canonical JSON form: object members sorted
// by key, no insignificant whitespace, strings escaped one way. Numbers are
// kept as written (1.0 and 1 differ); of duplicate keys the last counts. ok
// is false if body is not one JSON value.
func canonicalJSON(body []byte) (c []byte, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data
	}
	c, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	return c, true
}

package idem

import (
	"bytes"
	"compress/flate"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"io"
	"sync"
)

// A stored result is one opaque blob: a flags byte, then the payload. The
// payload is deflated when it was larger than the compression threshold and
// deflating made it smaller, and sealed with the configured AEAD (nonce
// first, the store key as associated data) when one is set. Stores never
// look inside.
const (
	blobDeflate   = 1 << 0
	blobEncrypted = 1 << 1
	blobKnown     = blobDeflate | blobEncrypted
)

var flateWriters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestSpeed)
	return w
}}

type blobCodec struct {
	compressAbove int // payloads larger than this are deflated; < 0 never
	aead          cipher.AEAD
	maxSize       int // decoded payloads larger than this are rejected
}

// encode returns a fresh blob for value, stored under storeKey.
func (c *blobCodec) encode(storeKey string, value []byte) ([]byte, error) {
	flags := byte(0)
	payload := value
	if c.compressAbove >= 0 && len(value) > c.compressAbove {
		var buf bytes.Buffer
		buf.Grow(len(value)/2 + 16)
		buf.WriteByte(0) // room for the flags byte
		w := flateWriters.Get().(*flate.Writer)
		w.Reset(&buf)
		_, werr := w.Write(value)
		cerr := w.Close()
		flateWriters.Put(w)
		if werr == nil && cerr == nil && buf.Len()-1 < len(value) {
			flags |= blobDeflate
			payload = buf.Bytes()[1:]
		}
	}
	if c.aead == nil {
		out := make([]byte, 1+len(payload))
		out[0] = flags
		copy(out[1:], payload)
		return out, nil
	}
	flags |= blobEncrypted
	ns := c.aead.NonceSize()
	out := make([]byte, 1+ns, 1+ns+len(payload)+c.aead.Overhead())
	out[0] = flags
	if _, err := rand.Read(out[1 : 1+ns]); err != nil {
		return nil, fmt.Errorf("idem: reading nonce: %w", err)
	}
	return c.aead.Seal(out, out[1:1+ns], payload, []byte(storeKey)), nil
}

// decode returns the value stored in blob. For a plain blob the value shares
// blob's memory (capped so that append cannot write into it).
func (c *blobCodec) decode(storeKey string, blob []byte) ([]byte, error) {
	if len(blob) == 0 {
		return nil, fmt.Errorf("%w: empty blob", ErrCorruptResult)
	}
	flags := blob[0]
	if flags&^blobKnown != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrCorruptResult, flags)
	}
	payload := blob[1:len(blob):len(blob)]
	if c.aead != nil && flags&blobEncrypted == 0 {
		// Whoever can write to the store could plant a plain result; with
		// a key configured only sealed results are replayed.
		return nil, fmt.Errorf("%w: result is not encrypted and a key is configured", ErrCorruptResult)
	}
	if flags&blobEncrypted != 0 {
		if c.aead == nil {
			return nil, fmt.Errorf("%w: result is encrypted and no key is configured", ErrCorruptResult)
		}
		ns := c.aead.NonceSize()
		if len(payload) < ns {
			return nil, fmt.Errorf("%w: short encrypted result", ErrCorruptResult)
		}
		p, err := c.aead.Open(nil, payload[:ns], payload[ns:], []byte(storeKey))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorruptResult, err)
		}
		payload = p
	}
	if flags&blobDeflate != 0 {
		r := flate.NewReader(bytes.NewReader(payload))
		p, err := io.ReadAll(io.LimitReader(r, int64(c.maxSize)+1))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorruptResult, err)
		}
		if len(p) > c.maxSize {
			return nil, fmt.Errorf("%w: inflates beyond %d bytes", ErrCorruptResult, c.maxSize)
		}
		payload = p
	}
	return payload, nil
}

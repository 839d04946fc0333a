package idemhttp

import (
	"encoding/binary"
	"fmt"
	"net/http"

	"github.com/idemgo/idem"
)

// A stored response is one blob, which the Executor may compress and
// encrypt further:
//
//	version  byte    codecVersion, or codecTrailers when the response has
//	                 trailers
//	status   uvarint 200..999
//	fields   uvarint number of header names, then for each name:
//	  name   uvarint length, bytes
//	  values uvarint count, then for each value: uvarint length, bytes
//	trailers (codecTrailers only) as fields: the trailer's names and
//	         values; a name that starts with http.TrailerPrefix was not
//	         announced in the header (the Trailer field)
//	body     the remaining bytes
//
// Names are sorted, so that equal responses encode to equal bytes. A name
// with no values is kept: it tells net/http not to add the field (for
// example Content-Type: nil turns content sniffing off). A response without
// trailers is written as version 1, as before trailers were stored, so
// that both versions are read.
const (
	codecVersion  = 1
	codecTrailers = 2
)

func appendUvarint(b []byte, n int) []byte { return binary.AppendUvarint(b, uint64(n)) }

func appendString(b []byte, s string) []byte {
	return append(appendUvarint(b, len(s)), s...)
}

// storedResponse is a decoded stored response. Its body shares memory with
// the blob it was decoded from.
type storedResponse struct {
	status  int
	header  http.Header
	trailer http.Header // nil: none
	body    []byte
}

// decodeResponse decodes a blob written by appendHead (and appendTrailers)
// and the body after it, adding the fields to into (a new http.Header if
// into is nil) only if the whole blob is valid. Errors wrap
// idem.ErrCorruptResult.
func decodeResponse(b []byte, into http.Header) (storedResponse, error) {
	// The first pass checks the blob and counts; the second fills the
	// fields in, with one allocation for all their values.
	res, names, values, err := walkResponse(b, nil, nil, nil)
	if err != nil {
		return storedResponse{}, err
	}
	if into == nil {
		into = make(http.Header, names)
	}
	var backing []string
	if values > 0 {
		backing = make([]string, 0, values)
	}
	var trailer http.Header
	if b[0] == codecTrailers {
		trailer = make(http.Header)
	}
	res, _, _, _ = walkResponse(b, into, trailer, backing)
	res.header, res.trailer = into, trailer
	return res, nil
}

// walkResponse parses b. With into set, it adds the fields to it and the
// trailers to trailer, taking their values from backing, which must have
// room for all of them. It returns the number of names and of values.
func walkResponse(b []byte, into, trailer http.Header, backing []string) (res storedResponse, names, values int, err error) {
	if len(b) == 0 {
		return res, 0, 0, corrupt("empty stored response")
	}
	d := decoder{b: b}
	v := d.byte()
	if v != codecVersion && v != codecTrailers {
		return res, 0, 0, corrupt("unknown stored response version %d", v)
	}
	status := d.uvarint()
	if d.err == nil && (status < 200 || status > 999) {
		return res, 0, 0, corrupt("invalid status %d", status)
	}
	names, values, backing = d.fields(into, backing)
	if v == codecTrailers {
		n, nv, _ := d.fields(trailer, backing)
		if d.err == nil && n == 0 {
			return res, 0, 0, corrupt("version %d without trailers", v)
		}
		names, values = names+n, values+nv
	}
	if d.err != nil {
		return res, 0, 0, d.err
	}
	res.status = status
	res.body = b[d.off:len(b):len(b)]
	return res, names, values, nil
}

// fields parses a list of fields. With into set, it adds them to it,
// taking their values from backing, which it returns past them. It returns
// the number of names and of values.
func (d *decoder) fields(into http.Header, backing []string) (names, values int, rest []string) {
	n := d.uvarint()
	// Every name takes at least two bytes: this bounds the work.
	if d.err == nil && n > d.left()/2 {
		d.err = corrupt("%d header names in %d bytes", n, d.left())
	}
	var prev []byte
	for i := 0; i < n && d.err == nil; i++ {
		name := d.bytes()
		// Names are stored sorted: a name out of order or twice is
		// corruption.
		if d.err == nil && i > 0 && string(name) <= string(prev) {
			d.err = corrupt("header %q out of order", name)
		}
		prev = name
		nv := d.uvarint()
		if d.err == nil && nv > d.left() {
			d.err = corrupt("%d values in %d bytes", nv, d.left())
		}
		start := len(backing)
		for range nv {
			v := d.bytes()
			if into != nil {
				backing = append(backing, string(v))
			}
		}
		if into != nil && d.err == nil {
			var vs []string // a name without values is kept, with nil
			if nv > 0 {
				vs = backing[start:len(backing):len(backing)]
			}
			into[string(name)] = vs
		}
		values += nv
	}
	return n, values, backing
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: idemhttp: "+format, append([]any{idem.ErrCorruptResult}, args...)...)
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) left() int { return len(d.b) - d.off }

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.b) {
		d.err = corrupt("truncated stored response")
		return 0
	}
	c := d.b[d.off]
	d.off++
	return c
}

func (d *decoder) uvarint() int {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 || v > uint64(len(d.b)) && v > 999 {
		// Every length and count is bounded by the blob's size, and the
		// status by 999.
		d.err = corrupt("invalid number at offset %d", d.off)
		return 0
	}
	d.off += n
	return int(v)
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > d.left() {
		d.err = corrupt("string of %d bytes at offset %d, %d left", n, d.off, d.left())
		return nil
	}
	s := d.b[d.off : d.off+n]
	d.off += n
	return s
}

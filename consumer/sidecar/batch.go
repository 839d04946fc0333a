package sidecar

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"sort"
	"strconv"
	"unicode/utf8"
	"unsafe"

	"github.com/idemgo/idem/consumer"
)

// BatchMessage is one message of a batch request (Handler.Batch): the
// request's body is a JSON array of them, in the broker's order.
type BatchMessage struct {
	// Key is the message's idempotency key (HeaderKey).
	Key string `json:"key"`
	// Fence is the lease's fencing token (HeaderFence); absent for a
	// duplicate passed on (Replayed).
	Fence int64 `json:"fence,omitempty"`
	// Replayed is true for a duplicate of a completed key passed on.
	Replayed bool `json:"replayed,omitempty"`
	// Headers holds what a request of its own would carry as headers,
	// one value each: HeaderKey, HeaderFence, HeaderDigest,
	// HeaderRetention, the broker's metadata, traceparent, Idem-Header-….
	Headers map[string]string `json:"headers"`
	// Body is the message's body: as a string when Encoding is "text"
	// (valid UTF-8), in standard base64 when it is "base64".
	Body     string `json:"body"`
	Encoding string `json:"encoding"`
}

// BatchOutcome is the handler's answer for one message of a batch: the
// answer to a batch request is a JSON array of them, one per message, in
// the request's order. Status, Headers and Body mean what the status,
// headers and body of the answer to a request of its own would mean.
type BatchOutcome struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	// Body is a string, or standard base64 when Encoding is "base64".
	Body     string `json:"body,omitempty"`
	Encoding string `json:"encoding,omitempty"`
}

// batchItem is what each message's call contributes to its batch: its
// BatchMessage, encoded by appendJSON.
type batchItem struct {
	key      string
	fence    int64
	dup      bool
	header   batchHeader
	body     []byte
	encoding string // "text" or "base64"
}

// batchHeader is a batch message's headers (BatchMessage.Headers): one
// value per name, as name, value, name, value… in the order set.
type batchHeader struct{ kv []string }

func (b *batchHeader) from(src http.Header) {
	for k, vs := range src {
		if len(vs) > 0 {
			b.kv = append(b.kv, k, vs[0])
		}
	}
}

func (b *batchHeader) get(key string) string {
	for i := 0; i < len(b.kv); i += 2 {
		if b.kv[i] == key {
			return b.kv[i+1]
		}
	}
	return ""
}

func (b *batchHeader) set(key, value string) {
	key = textproto.CanonicalMIMEHeaderKey(key) // as http.Header.Set
	for i := 0; i < len(b.kv); i += 2 {
		if b.kv[i] == key {
			b.kv[i+1] = value
			return
		}
	}
	b.kv = append(b.kv, key, value)
}

// Len, Less and Swap sort the headers by name (sort.Interface), as
// encoding/json orders a map's keys.
func (b *batchHeader) Len() int           { return len(b.kv) / 2 }
func (b *batchHeader) Less(i, j int) bool { return b.kv[2*i] < b.kv[2*j] }
func (b *batchHeader) Swap(i, j int) {
	b.kv[2*i], b.kv[2*j] = b.kv[2*j], b.kv[2*i]
	b.kv[2*i+1], b.kv[2*j+1] = b.kv[2*j+1], b.kv[2*i+1]
}

// appendJSON appends the item as the JSON object of its BatchMessage,
// byte for byte what encoding/json.Marshal writes for it
// (TestBatchMessageJSON), without building the BatchMessage's map.
func (it *batchItem) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"key":`...)
	dst = appendJSONString(dst, it.key)
	if it.fence != 0 {
		dst = append(dst, `,"fence":`...)
		dst = strconv.AppendInt(dst, it.fence, 10)
	}
	if it.dup {
		dst = append(dst, `,"replayed":true`...)
	}
	dst = append(dst, `,"headers":{`...)
	sort.Sort(&it.header)
	for i := 0; i < len(it.header.kv); i += 2 {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, it.header.kv[i])
		dst = append(dst, ':')
		dst = appendJSONString(dst, it.header.kv[i+1])
	}
	dst = append(dst, `},"body":`...)
	if it.encoding == "base64" {
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, it.body)
		dst = append(dst, '"')
	} else {
		dst = appendJSONString(dst, unsafeString(it.body))
	}
	dst = append(dst, `,"encoding":`...)
	dst = appendJSONString(dst, it.encoding)
	return append(dst, '}')
}

// unsafeString is b as a string without a copy, for appendJSONString,
// which only reads it.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// appendJSONString appends s as a JSON string the way encoding/json
// writes one: <, > and & escaped as \u003c, \u003e, \u0026, invalid UTF-8
// as \ufffd, U+2028 and U+2029 escaped.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// batchAnswer is what the one request of a batch brought back to each
// message: its outcome, or err for all, or gated for those whose
// completion row committed meanwhile (their result is stored).
type batchAnswer struct {
	err      error
	outcomes []BatchOutcome
	gated    []bool
}

// callBatch is Call in batch mode: the message joins its batch's request
// (consumer.Gather) and is decided by its own outcome with decide, as a
// call of its own.
func (h *Handler) callBatch(ctx context.Context, d Delivery) error {
	it := &batchItem{body: d.Body, encoding: "text"}
	it.header.kv = make([]string, 0, 2*(len(d.Header)+8))
	dup, committed, err := h.header(ctx, d, &it.header)
	if committed || err != nil {
		return err
	}
	it.key, it.dup = it.header.get(HeaderKey), dup
	if f := it.header.get(HeaderFence); f != "" {
		it.fence, _ = strconv.ParseInt(f, 10, 64)
	}
	if !utf8.Valid(d.Body) {
		it.encoding = "base64"
	}
	v, me, err := consumer.Gather(ctx, it, func(shared context.Context, ctxs []context.Context, items []any) any {
		return h.sendBatch(shared, ctxs, items)
	})
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	a := v.(*batchAnswer)
	switch {
	case a.gated[me]:
		return nil
	case a.err != nil:
		return a.err
	}
	o := a.outcomes[me]
	var body []byte
	if o.Status >= 200 && o.Status <= 299 {
		// A 2xx body is only encoded into the stored result (decideBody
		// keeps it in no error): read in place, not copied.
		body = unsafe.Slice(unsafe.StringData(o.Body), len(o.Body))
	} else {
		body = []byte(o.Body)
	}
	return h.decideBody(ctx, o.Status, outcomeHeader(o.Headers), body)
}

// sendBatch POSTs the batch's messages in one request and returns the
// answer for each. The request runs with ctx, Gather's: cancelled when
// any message's context is (its lease lost: no message of it goes on past
// its lease; the consumer stopping), and after Timeout; a broken connection sends it again, as
// send does for one message. An answer that is not a 2xx is every
// message's answer; a 2xx whose body is not one valid outcome per message
// fails the whole batch (retried).
func (h *Handler) sendBatch(ctx context.Context, ctxs []context.Context, items []any) *batchAnswer {
	n := len(ctxs)
	a := &batchAnswer{gated: make([]bool, n)}
	size := 2
	for _, it := range items {
		it := it.(*batchItem)
		size += 128 + 2*len(it.body) + 64*len(it.header.kv)
	}
	payload := make([]byte, 0, size)
	payload = append(payload, '[')
	for k, it := range items {
		if k > 0 {
			payload = append(payload, ',')
		}
		payload = it.(*batchItem).appendJSON(payload)
	}
	payload = append(payload, ']')
	ctx, cancelT := context.WithTimeoutCause(ctx, h.timeout(), h.late)
	defer cancelT()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(payload))
	if err != nil {
		a.err = fmt.Errorf("sidecar: %w", err)
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	again := func() (bool, error) {
		all := true
		for k, c := range ctxs {
			if !a.gated[k] {
				committed, err := h.gateAgain(c, items[k].(*batchItem).dup)
				if err != nil {
					return true, err
				}
				a.gated[k] = committed
			}
			all = all && a.gated[k]
		}
		return all, nil
	}
	resp, err := h.send(ctx, req, again)
	if resp == nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		hdr := make(map[string]string, len(resp.Header))
		for k := range resp.Header {
			hdr[k] = resp.Header.Get(k)
		}
		a.outcomes = make([]BatchOutcome, n)
		for k := range a.outcomes {
			a.outcomes[k] = BatchOutcome{Status: resp.StatusCode, Headers: hdr, Body: string(body)}
		}
		return a
	}
	a.outcomes, a.err = readOutcomes(resp.Body, n, int64(n)*(2*int64(h.maxResult())+4<<10))
	if a.err != nil {
		h.logger().Error("sidecar: the handler's answer to a batch is invalid: every message of the batch is retried",
			"messages", n, "status", resp.StatusCode, "err", a.err)
	}
	return a
}

// readOutcomes reads the answer to a batch of n messages: a JSON array of
// n outcomes, each with a status in 100..599 and a body in its encoding,
// at most limit bytes. A base64 body is decoded in place.
func readOutcomes(r io.Reader, n int, limit int64) ([]BatchOutcome, error) {
	blob, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("sidecar: reading the batch's answer: %w", err)
	}
	if int64(len(blob)) > limit {
		return nil, fmt.Errorf("sidecar: the batch's answer is over %d bytes", limit)
	}
	outs, ok := parseOutcomes(blob, n)
	if !ok {
		outs = nil
		if err := json.Unmarshal(blob, &outs); err != nil {
			return nil, fmt.Errorf("sidecar: the batch's answer is not a JSON array of outcomes: %w", err)
		}
	}
	if len(outs) != n {
		return nil, fmt.Errorf("sidecar: the batch's answer has %d outcomes for %d messages", len(outs), n)
	}
	for k := range outs {
		o := &outs[k]
		if o.Status < 100 || o.Status > 599 {
			return nil, fmt.Errorf("sidecar: outcome %d of the batch's answer has status %d", k, o.Status)
		}
		switch o.Encoding {
		case "", "text":
		case "base64":
			b, err := base64.StdEncoding.DecodeString(o.Body)
			if err != nil {
				return nil, fmt.Errorf("sidecar: outcome %d of the batch's answer: %w", k, err)
			}
			o.Body, o.Encoding = string(b), ""
		default:
			return nil, fmt.Errorf("sidecar: outcome %d of the batch's answer has encoding %q (want text or base64)", k, o.Encoding)
		}
	}
	return outs, nil
}

// outcomeHeader is an outcome's headers as an http.Header.
func outcomeHeader(m map[string]string) http.Header {
	if len(m) == 0 {
		return nil
	}
	h := make(http.Header, len(m))
	for k, v := range m {
		h.Set(k, v)
	}
	return h
}

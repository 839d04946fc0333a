package sidecar

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"unicode/utf8"

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

// batchItem is what each message's call contributes to its batch.
type batchItem struct {
	msg BatchMessage
	dup bool
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
	hdr := make(http.Header, len(d.Header)+8)
	dup, committed, err := h.header(ctx, d, hdr)
	if committed || err != nil {
		return err
	}
	m := BatchMessage{Key: hdr.Get(HeaderKey), Replayed: dup, Headers: make(map[string]string, len(hdr)), Encoding: "text", Body: string(d.Body)}
	for k, vs := range hdr {
		if len(vs) > 0 {
			m.Headers[k] = vs[0]
		}
	}
	if f := hdr.Get(HeaderFence); f != "" {
		m.Fence, _ = strconv.ParseInt(f, 10, 64)
	}
	if !utf8.Valid(d.Body) {
		m.Encoding, m.Body = "base64", base64.StdEncoding.EncodeToString(d.Body)
	}
	v, me, err := consumer.Gather(ctx, batchItem{msg: m, dup: dup}, func(ctxs []context.Context, items []any) any {
		return h.sendBatch(ctxs, items)
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
	return h.decide(ctx, o.Status, outcomeHeader(o.Headers), bytes.NewReader([]byte(o.Body)))
}

// sendBatch POSTs the batch's messages in one request and returns the
// answer for each. The request is cancelled when any message's context is
// (its lease lost: no message of it goes on past its lease; the consumer
// stopping) or after Timeout; a broken connection sends it again, as
// send does for one message. An answer that is not a 2xx is every
// message's answer; a 2xx whose body is not one valid outcome per message
// fails the whole batch (retried).
func (h *Handler) sendBatch(ctxs []context.Context, items []any) *batchAnswer {
	n := len(ctxs)
	a := &batchAnswer{gated: make([]bool, n)}
	msgs := make([]BatchMessage, n)
	for k, it := range items {
		msgs[k] = it.(batchItem).msg
	}
	payload, err := json.Marshal(msgs)
	if err != nil {
		a.err = fmt.Errorf("sidecar: encoding the batch: %w", err)
		return a
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(ctxs[0]))
	defer cancel(nil)
	for _, c := range ctxs {
		stop := context.AfterFunc(c, func() { cancel(context.Cause(c)) })
		defer stop()
	}
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
				committed, err := h.gateAgain(c, items[k].(batchItem).dup)
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
	limit := h.MaxResult
	if limit == 0 {
		limit = DefaultMaxResult
	}
	a.outcomes, a.err = readOutcomes(resp.Body, n, int64(n)*(2*int64(limit)+4<<10))
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
	var outs []BatchOutcome
	if err := json.Unmarshal(blob, &outs); err != nil {
		return nil, fmt.Errorf("sidecar: the batch's answer is not a JSON array of outcomes: %w", err)
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

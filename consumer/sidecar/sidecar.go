package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/consumer"
)

// The headers of a request to the handler.
const (
	// HeaderKey carries the message's idempotency key.
	HeaderKey = "Idempotency-Key"
	// HeaderFence carries the lease's fencing token (absent for a
	// duplicate passed on with HeaderReplayed).
	HeaderFence = "Idempotency-Fence"
	// HeaderReplayed is "true" on a duplicate of a completed key passed to
	// the handler (consumer.WithPassDuplicates).
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBroker names the broker: redis-stream, kafka, amqp, nats, sqs.
	HeaderBroker = "Idem-Broker"
	// HeaderTopic names the stream, topic, queue or JetStream stream.
	HeaderTopic = "Idem-Topic"
	// HeaderMessageID is the broker's identifier of the message (a stream
	// entry ID, a JetStream sequence, an SQS message ID, an AMQP message
	// ID when the publisher set one).
	HeaderMessageID = "Idem-Message-Id"
	// HeaderPartition and HeaderOffset locate a Kafka record.
	HeaderPartition = "Idem-Partition"
	HeaderOffset    = "Idem-Offset"
	// HeaderDigest carries the digest of the message's scoped key
	// (idem.Key.Digest): the digest column of a completion row (Gate).
	HeaderDigest = "Idempotency-Digest"
	// HeaderRetention is, with a Gate, how long the key's completion is
	// kept, in seconds: the retention parameter of a completion row.
	HeaderRetention = "Idem-Retention"
	// HeaderDeliveries is how often the broker delivered the message, this
	// delivery included, when the broker says.
	HeaderDeliveries = "Idem-Deliveries"
)

// Defaults of a Handler's fields.
const (
	DefaultTimeout   = 30 * time.Second
	DefaultMaxResult = 64 << 10
	// errorBodyLimit bounds the part of a failed answer's body kept in its
	// HandlerError (and so in a dead letter's error).
	errorBodyLimit = 1 << 10
)

// Delivery is a message as the handler gets it.
type Delivery struct {
	// Key is the message's idempotency key (HeaderKey); empty means the
	// key of the handler's message (consumer.MessageFrom), as the
	// adapter's key function found it.
	Key string
	// Body is sent as the request's body, as received; Call only reads
	// it.
	Body []byte
	// Header holds the broker's metadata and the message's own headers to
	// send (HeaderBroker, HeaderTopic, traceparent, …); may be nil.
	Header http.Header
}

// Handler calls an HTTP handler once per delivery. Set its fields before
// the first call; it is safe for concurrent use then.
type Handler struct {
	// URL is where each message is POSTed (required).
	URL string
	// Client sends the requests. The default is a client that does not
	// follow redirects (a 3xx is retried) and keeps up to Conns idle
	// connections to the handler.
	Client *http.Client
	// Conns is how many keep-alive connections to the handler the default
	// Client keeps open between calls: size it to the calls that run at
	// once (batches at once times the handlers of a batch at once), so that
	// no call waits for a new connection. The default is 64.
	Conns int
	// Timeout bounds each call; the call is then cancelled and the
	// message retried. The default is DefaultTimeout (30s).
	Timeout time.Duration
	// MaxResult bounds the part of a 2xx response's body that is stored
	// as the key's result; the rest is read and dropped. The default is
	// DefaultMaxResult (64 KiB).
	MaxResult int
	// LeaseLostURL, if set, gets a POST from OnLeaseLost: a JSON object
	// with the key's scope and key, the fence and the reason.
	LeaseLostURL string
	// Logger logs the failures of the lease-lost calls. The default is
	// slog.Default().
	Logger *slog.Logger
	// Gate, if set, is checked before each call: a key whose digest has a
	// committed completion row (the handler inserted it in the transaction
	// of its effect, docs/consume.md) is not called again; the row's
	// result becomes the key's stored result and the message is acked.
	// The requests then carry HeaderRetention. The default is none.
	Gate Gate
	// Batch, with a Processor that gathers its handlers
	// (consumer.WithGatheredHandlers), POSTs the messages of a batch to
	// URL in one request (BatchRequest) and decides each message by its
	// outcome in the answer (BatchResponse) as a call of its own would be
	// decided. The default is one request per message.
	Batch bool

	once   sync.Once
	client *http.Client
	late   error // the cause of a call's timeout, built once
}

// Gate is a table of committed completions, looked up by the digest of a
// key: *pggate.Gate (module github.com/idemgo/idem/postgres). Committed
// returns the result of the digest's live row and ok true, or ok false
// when it has none; it is called from several goroutines at once.
type Gate interface {
	Committed(ctx context.Context, digest string) (result []byte, ok bool, err error)
}

// HandlerError is the error of a call whose answer was not a 2xx: its
// status, headers and the start of its body (1 KiB).
type HandlerError struct {
	Status int
	Header http.Header
	Body   []byte
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("sidecar: handler answered %d %s: %q", e.Status, http.StatusText(e.Status), e.Body)
}

// Terminal reports whether a status is a terminal failure: a 4xx other
// than 408 (request timeout), 409 (conflict) and 429 (too many requests).
func Terminal(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusRequestTimeout &&
		status != http.StatusConflict && status != http.StatusTooManyRequests
}

// Result is the stored result of a key: the handler's 2xx response.
type Result struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
	// Truncated is true when the body was longer than MaxResult.
	Truncated bool `json:"truncated,omitempty"`
	// Gate is true when the handler was not called: the key's completion
	// row had committed (Handler.Gate), and Body is the row's result.
	Gate bool `json:"gate,omitempty"`
}

func (h *Handler) init() {
	h.once.Do(func() {
		h.late = fmt.Errorf("sidecar: the handler did not answer within %v", h.timeout())
		h.client = h.Client
		if h.client == nil {
			t := http.DefaultTransport.(*http.Transport).Clone()
			conns := h.Conns
			if conns <= 0 {
				conns = 64
			}
			t.MaxIdleConns, t.MaxIdleConnsPerHost = conns, conns
			h.client = &http.Client{
				Transport:     t,
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			}
		}
	})
}

func (h *Handler) timeout() time.Duration {
	if h.Timeout > 0 {
		return h.Timeout
	}
	return DefaultTimeout
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}

// Check validates the fields without I/O. Errors wrap idem.ErrInvalid.
func (h *Handler) Check() error {
	for name, raw := range map[string]string{"URL": h.URL, "LeaseLostURL": h.LeaseLostURL} {
		if raw == "" && name == "LeaseLostURL" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: sidecar: %s %q is not an http:// or https:// URL", idem.ErrInvalid, name, raw)
		}
	}
	if h.Timeout < 0 || h.MaxResult < 0 || h.Conns < 0 {
		return fmt.Errorf("%w: sidecar: negative Timeout, MaxResult or Conns", idem.ErrInvalid)
	}
	return nil
}

// Call POSTs d to the handler and returns nil for a 2xx answer (after
// storing it as the key's result with consumer.SetResult), an error
// marked idem.Terminal wrapping a *HandlerError for a terminal 4xx, and
// another error for whatever is to be retried. ctx is the consumer
// handler's: the request carries its fence (idem.FenceFrom) and is
// cancelled with it (a lost lease closes the connection). A request whose
// connection failed is sent again with the same fence until the handler
// answers or Timeout passes.
func (h *Handler) Call(ctx context.Context, d Delivery) error {
	h.init()
	if h.Batch {
		return h.callBatch(ctx, d)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, h.timeout(), h.late)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(d.Body))
	if err != nil {
		return idem.Terminal(fmt.Errorf("sidecar: %w", err))
	}
	dup, committed, err := h.header(ctx, d, requestHeader(req.Header))
	if committed || err != nil {
		return err
	}
	resp, err := h.send(ctx, req, func() (bool, error) { return h.gateAgain(ctx, dup) })
	if resp == nil {
		return err
	}
	defer resp.Body.Close()
	return h.decide(ctx, resp.StatusCode, resp.Header, resp.Body)
}

// headerWriter is what header writes a message's headers into: the
// http.Header of a request of its own (requestHeader), or a batch
// message's headers (batchHeader, one value each).
type headerWriter interface {
	// from copies d's own headers (Delivery.Header).
	from(src http.Header)
	get(key string) string
	set(key, value string)
}

// requestHeader is the http.Header of a message's request of its own.
type requestHeader http.Header

func (h requestHeader) from(src http.Header) { maps.Copy(h, src) }
func (h requestHeader) get(key string) string {
	return http.Header(h).Get(key)
}
func (h requestHeader) set(key, value string) { http.Header(h).Set(key, value) }

// header writes into hdr the headers of d's request: d's own, the key, the
// fence (or HeaderReplayed for a duplicate passed on), the digest, the
// delivery count, the broker's message ID and, with a Gate, the
// retention. With a Gate, committed reports that the key's completion row
// committed: its result is stored and the handler is not to be called.
func (h *Handler) header(ctx context.Context, d Delivery, hdr headerWriter) (dup, committed bool, err error) {
	hdr.from(d.Header)
	if hdr.get("Content-Type") == "" {
		hdr.set("Content-Type", "application/octet-stream")
	}
	key := d.Key
	if m, ok := consumer.MessageFrom(ctx); ok {
		if key == "" {
			key = m.Key
		}
		if m.Deliveries > 0 {
			hdr.set(HeaderDeliveries, strconv.Itoa(m.Deliveries))
		}
		if m.ID != "" && hdr.get(HeaderMessageID) == "" {
			hdr.set(HeaderMessageID, m.ID)
		}
	}
	hdr.set(HeaderKey, key)
	_, dup = consumer.DuplicateFrom(ctx)
	if dup {
		hdr.set(HeaderReplayed, "true")
	} else if fence, ok := idem.FenceFrom(ctx); ok {
		hdr.set(HeaderFence, strconv.FormatInt(fence, 10))
	}
	if a, ok := idem.AttemptFrom(ctx); ok && !dup {
		hdr.set(HeaderDigest, a.Key())
		if h.Gate != nil {
			committed, err := h.gate(ctx, a.Key())
			if committed || err != nil {
				return dup, committed, err
			}
			hdr.set(HeaderRetention, strconv.FormatInt(int64(adapterkit.Retention(a.Executor()).Seconds()), 10))
		}
	}
	return dup, false, nil
}

// gateAgain is the check before a call is sent again (send): with a Gate,
// whether the key of the call with ctx has committed its completion row
// since (then its result is stored).
func (h *Handler) gateAgain(ctx context.Context, dup bool) (committed bool, err error) {
	if a, ok := idem.AttemptFrom(ctx); ok && h.Gate != nil && !dup {
		return h.gate(ctx, a.Key())
	}
	return false, nil
}

// decide turns the handler's answer for the message of ctx (its status,
// header and body) into Call's error, storing a 2xx answer as the key's
// result (consumer.SetResult): the one place both modes decide a message.
func (h *Handler) decide(ctx context.Context, status int, header http.Header, body io.Reader) error {
	ok := status >= 200 && status <= 299
	limit := errorBodyLimit
	if ok {
		limit = h.maxResult()
	}
	b, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	if err != nil && ok {
		// The handler said 2xx but its body broke off: its work is done
		// (retrying would run it again); store what was read.
		b = append(b, []byte(fmt.Sprintf("\n[idem: reading the response: %v]", err))...)
	}
	if !ok || len(b) > limit {
		_, _ = io.Copy(io.Discard, io.LimitReader(body, 1<<20)) // keep the connection
	}
	return h.decideBody(ctx, status, header, b)
}

// decideBody is decide with the answer's body read: b holds at least its
// first MaxResult+1 bytes (a 2xx) or errorBodyLimit+1 (another status).
// It keeps b in the error of an answer that is not a 2xx, and only reads
// it for a 2xx.
func (h *Handler) decideBody(ctx context.Context, status int, header http.Header, b []byte) error {
	if status < 200 || status > 299 {
		herr := &HandlerError{Status: status, Header: header, Body: b[:min(len(b), errorBodyLimit)]}
		if Terminal(status) {
			return idem.Terminal(herr)
		}
		return herr
	}
	limit := h.maxResult()
	// The response is this call's alone: its header's values are kept
	// as they are, without the hop-by-hop and per-answer ones (no copy).
	r := Result{Status: status, Body: b}
	for k, vs := range header {
		switch k {
		case "Date", "Content-Length", "Connection", "Keep-Alive":
			continue
		}
		if r.Header == nil {
			r.Header = make(http.Header, len(header))
		}
		r.Header[k] = vs
	}
	if len(b) > limit {
		r.Body, r.Truncated = b[:limit], true
	}
	setResult(ctx, &r)
	return nil
}

// maxResult is MaxResult or its default.
func (h *Handler) maxResult() int {
	if h.MaxResult == 0 {
		return DefaultMaxResult
	}
	return h.MaxResult
}

// Pauses between the tries of a call whose connection failed.
const (
	firstPause = 10 * time.Millisecond
	maxPause   = time.Second
)

// send sends req and returns the handler's answer. A call whose connection
// failed (refused, reset, closed before the answer: the handler's process
// died or restarts) is sent again with the same fence, after 10 ms, then
// twice as long each time up to 1 s, until the handler answers or ctx ends
// (the call's timeout, a lost lease): the handler may have applied it
// before it died, and its fence check (docs/consume.md) recognises its
// own fence, while a new acquisition's higher fence would pass it. Before
// each try again, again reports whether the call is still to be made (a
// Gate: the key's completion row has not committed); otherwise resp is nil
// and err what Call returns then (nil: the row's result is stored).
func (h *Handler) send(ctx context.Context, req *http.Request, again func() (done bool, err error)) (resp *http.Response, err error) {
	pause := firstPause
	for {
		resp, err = h.client.Do(req)
		if err == nil {
			return resp, nil
		}
		if cause := context.Cause(ctx); cause != nil {
			return nil, fmt.Errorf("sidecar: calling the handler: %w", cause)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("sidecar: calling the handler: %w (then: %w)", err, context.Cause(ctx))
		case <-t.C:
		}
		pause = min(2*pause, maxPause)
		if done, gerr := again(); done || gerr != nil {
			return nil, gerr
		}
		body, berr := req.GetBody()
		if berr != nil {
			return nil, fmt.Errorf("sidecar: calling the handler again: %w", berr)
		}
		req = req.Clone(ctx)
		req.Body = body
	}
}

// gate reports whether digest's completion row committed; then it stores
// the row's result as the key's (a Result with Gate set).
func (h *Handler) gate(ctx context.Context, digest string) (committed bool, err error) {
	result, ok, err := h.Gate.Committed(ctx, digest)
	if err != nil {
		return false, fmt.Errorf("sidecar: checking the gate: %w", err)
	}
	if !ok {
		return false, nil
	}
	setResult(ctx, &Result{Status: http.StatusOK, Body: result, Gate: true})
	return true, nil
}

// LeaseLost is the body of the POST to LeaseLostURL.
type LeaseLost struct {
	Scope string `json:"scope"`
	Key   string `json:"key"`
	Fence int64  `json:"fence"`
	// Reason is the handler's error, or "" if the handler succeeded (its
	// work was done, but the key could not be completed: another owner
	// runs the message again).
	Reason string `json:"reason"`
}

// OnLeaseLost is the compensation hook (consumer.WithOnLeaseLost): it
// POSTs l as a LeaseLost to LeaseLostURL, with the key and fence also in
// HeaderKey and HeaderFence, and logs a failure. It does nothing when
// LeaseLostURL is empty.
func (h *Handler) OnLeaseLost(ctx context.Context, l idem.LeaseLost) {
	if h.LeaseLostURL == "" {
		return
	}
	h.init()
	body := LeaseLost{Scope: l.Key.Scope, Key: l.Key.ID, Fence: l.Fence}
	if l.Err != nil {
		body.Reason = l.Err.Error()
	}
	blob, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, h.timeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.LeaseLostURL, bytes.NewReader(blob))
	if err != nil {
		h.logger().Error("sidecar: lease-lost call", "err", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderKey, l.Key.ID)
	req.Header.Set(HeaderFence, strconv.FormatInt(l.Fence, 10))
	resp, err := h.client.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode > 299 {
			err = fmt.Errorf("answered %d", resp.StatusCode)
		}
	}
	if err != nil {
		h.logger().Error("sidecar: lease-lost call failed", "key_digest", l.Key.Digest(), "fence", l.Fence, "err", err)
	}
}

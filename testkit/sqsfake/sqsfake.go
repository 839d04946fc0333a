// Package sqsfake is a small in-process Amazon SQS server for tests. It
// speaks the SQS JSON protocol (AWS JSON 1.0: POST /, X-Amz-Target:
// AmazonSQS.<Operation>) for exactly the operations the sqsconsumer package
// and its tests use:
//
//   - ReceiveMessage: MaxNumberOfMessages (1..10), VisibilityTimeout,
//     WaitTimeSeconds (long polling), AttributeNames /
//     MessageSystemAttributeNames (ApproximateReceiveCount,
//     ApproximateFirstReceiveTimestamp, SentTimestamp, MessageDeduplicationId
//     or All), MessageAttributeNames (names or All);
//   - DeleteMessage, DeleteMessageBatch;
//   - ChangeMessageVisibility, ChangeMessageVisibilityBatch;
//   - SendMessage (DelaySeconds, MessageAttributes,
//     MessageDeduplicationId), GetQueueUrl.
//
// Semantics follow SQS standard queues where it matters for at-least-once
// consumers: a received message is invisible for the visibility timeout and
// comes back when it ends; every receive counts in ApproximateReceiveCount
// and returns a new receipt handle; ChangeMessageVisibility needs the latest
// receipt handle of an in-flight message (ReceiptHandleIsInvalid or
// MessageNotInflight otherwise); DeleteMessage with an older receipt handle
// succeeds without deleting, as SQS documents; a queue with a redrive
// policy moves a message to its dead-letter queue when a receive would push
// its receive count over maxReceiveCount. Request signatures are not
// checked, FIFO ordering and message groups are not implemented, and
// batch-entry ids are not validated beyond presence.
//
// It lives in testkit, the packages that serve idem's own tests and those
// who write a store or a broker adapter for idem (docs/design.md#where-new-code-goes);
// its API is not covered by the modules' compatibility promise and may
// change in any release.
package sqsfake

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// QueueOptions configure a queue.
type QueueOptions struct {
	// VisibilityTimeout is the queue's default; the default is 30s.
	VisibilityTimeout time.Duration
	// DeadLetterQueue names the redrive target; empty means none.
	DeadLetterQueue string
	// MaxReceiveCount is the redrive policy's maxReceiveCount.
	MaxReceiveCount int
}

// Counts describe a queue.
type Counts struct {
	Visible, InFlight, Delayed int
	// Sent, Received, Deleted and Redriven count operations since creation.
	Sent, Received, Deleted, Redriven int
}

// Message is a stored message as the test sees it.
type Message struct {
	ID              string
	Body            string
	Attributes      map[string]MessageAttribute
	DeduplicationID string
	ReceiveCount    int
	visibleAt       time.Time
	receipt         string
	firstReceive    time.Time
	sent            time.Time
	inflight        bool
}

// MessageAttribute is an SQS message attribute.
type MessageAttribute struct {
	DataType    string `json:"DataType"`
	StringValue string `json:"StringValue,omitempty"`
	BinaryValue []byte `json:"BinaryValue,omitempty"`
}

type queue struct {
	name string
	opts QueueOptions
	msgs []*Message // in send order
	byID map[string]*Message
	c    Counts
}

// Server is the fake. It is safe for concurrent use; its zero value is not
// usable, call New.
type Server struct {
	mu     sync.Mutex
	wake   chan struct{} // closed and replaced on every state change
	base   string
	queues map[string]*queue
	seq    uint64
	now    func() time.Time
}

// New returns an empty Server whose queue URLs start with base (for
// example an httptest.Server's URL; it may be set later with SetBase).
func New(base string) *Server {
	return &Server{wake: make(chan struct{}), base: base, queues: map[string]*queue{}, now: time.Now}
}

// SetBase sets the prefix of queue URLs.
func (s *Server) SetBase(base string) { s.mu.Lock(); s.base = base; s.mu.Unlock() }

// CreateQueue creates queue name and returns its URL.
func (s *Server) CreateQueue(name string, o QueueOptions) string {
	if o.VisibilityTimeout <= 0 {
		o.VisibilityTimeout = 30 * time.Second
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queues[name] = &queue{name: name, opts: o, byID: map[string]*Message{}}
	return s.url(name)
}

func (s *Server) url(name string) string { return s.base + "/000000000000/" + name }

// Send enqueues a message directly, as a producer would with SendMessage.
func (s *Server) Send(queueName, body string, attrs map[string]MessageAttribute, dedupID string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[queueName]
	if q == nil {
		panic("sqsfake: no queue " + queueName) // test setup error
	}
	return s.send(q, body, attrs, dedupID, 0)
}

func (s *Server) send(q *queue, body string, attrs map[string]MessageAttribute, dedupID string, delay time.Duration) string {
	s.seq++
	now := s.now()
	m := &Message{
		ID:              fmt.Sprintf("m-%d", s.seq),
		Body:            body,
		Attributes:      attrs,
		DeduplicationID: dedupID,
		visibleAt:       now.Add(delay),
		sent:            now,
	}
	q.msgs = append(q.msgs, m)
	q.byID[m.ID] = m
	q.c.Sent++
	s.signal()
	return m.ID
}

func (s *Server) signal() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// Counts returns the counts of queue name.
func (s *Server) Counts(name string) Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[name]
	if q == nil {
		return Counts{}
	}
	c := q.c
	now := s.now()
	for _, m := range q.msgs {
		switch {
		case m.inflight && now.Before(m.visibleAt):
			c.InFlight++
		case !m.inflight && now.Before(m.visibleAt):
			c.Delayed++
		default:
			c.Visible++
		}
	}
	return c
}

// Ops returns the operation counts of queue name (Sent, Received,
// Deleted, Redriven), without scanning its messages.
func (s *Server) Ops(name string) Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.queues[name]; q != nil {
		return q.c
	}
	return Counts{}
}

// Messages returns copies of the messages held by queue name.
func (s *Server) Messages(name string) []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[name]
	if q == nil {
		return nil
	}
	out := make([]Message, 0, len(q.msgs))
	for _, m := range q.msgs {
		out = append(out, *m)
	}
	return out
}

type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.code + ": " + e.msg }

func errf(code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, msg: fmt.Sprintf(format, args...)}
}

// ServeHTTP implements the SQS JSON protocol.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	target := r.Header.Get("X-Amz-Target")
	op, ok := strings.CutPrefix(target, "AmazonSQS.")
	if r.Method != http.MethodPost || !ok {
		writeErr(w, errf("InvalidAction", "unsupported request %s %q", r.Method, target))
		return
	}
	var in map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeErr(w, errf("InvalidParameterValue", "bad JSON: %v", err))
		return
	}
	var out any
	var err *apiError
	switch op {
	case "ReceiveMessage":
		out, err = s.receive(r, in)
	case "DeleteMessage":
		out, err = s.deleteOne(in)
	case "DeleteMessageBatch":
		out, err = s.deleteBatch(in)
	case "ChangeMessageVisibility":
		out, err = s.changeOne(in)
	case "ChangeMessageVisibilityBatch":
		out, err = s.changeBatch(in)
	case "SendMessage":
		out, err = s.sendMessage(in)
	case "GetQueueUrl":
		out, err = s.getQueueURL(in)
	default:
		err = errf("InvalidAction", "operation %s is not implemented by sqsfake", op)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(out)
}

func writeErr(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-ErrorType", e.code)
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + e.code, "message": e.msg})
}

func str(in map[string]json.RawMessage, k string) string {
	var v string
	_ = json.Unmarshal(in[k], &v)
	return v
}

func num(in map[string]json.RawMessage, k string) (int, bool) {
	raw, ok := in[k]
	if !ok {
		return 0, false
	}
	var v int
	if json.Unmarshal(raw, &v) != nil {
		return 0, false
	}
	return v, true
}

func strs(in map[string]json.RawMessage, k string) []string {
	var v []string
	_ = json.Unmarshal(in[k], &v)
	return v
}

// queueFor resolves a QueueUrl; s.mu must be held.
func (s *Server) queueFor(u string) (*queue, *apiError) {
	i := strings.LastIndexByte(u, '/')
	if q := s.queues[u[i+1:]]; q != nil && u != "" {
		return q, nil
	}
	return nil, errf("AWS.SimpleQueueService.NonExistentQueue", "queue %q does not exist", u)
}

type outMessage struct {
	MessageID         string                      `json:"MessageId"`
	ReceiptHandle     string                      `json:"ReceiptHandle"`
	MD5OfBody         string                      `json:"MD5OfBody"`
	Body              string                      `json:"Body"`
	Attributes        map[string]string           `json:"Attributes,omitempty"`
	MessageAttributes map[string]MessageAttribute `json:"MessageAttributes,omitempty"`
}

func (s *Server) receive(r *http.Request, in map[string]json.RawMessage) (any, *apiError) {
	max, ok := num(in, "MaxNumberOfMessages")
	if !ok {
		max = 1
	}
	if max < 1 || max > 10 {
		return nil, errf("InvalidParameterValue", "MaxNumberOfMessages %d is not in 1..10", max)
	}
	wait, _ := num(in, "WaitTimeSeconds")
	if wait < 0 || wait > 20 {
		return nil, errf("InvalidParameterValue", "WaitTimeSeconds %d is not in 0..20", wait)
	}
	vis, hasVis := num(in, "VisibilityTimeout")
	if hasVis && (vis < 0 || vis > 43200) {
		return nil, errf("InvalidParameterValue", "VisibilityTimeout %d is not in 0..43200", vis)
	}
	sysNames := append(strs(in, "AttributeNames"), strs(in, "MessageSystemAttributeNames")...)
	attrNames := strs(in, "MessageAttributeNames")
	deadline := time.Now().Add(time.Duration(wait) * time.Second)
	for {
		s.mu.Lock()
		q, err := s.queueFor(str(in, "QueueUrl"))
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		visibility := q.opts.VisibilityTimeout
		if hasVis {
			visibility = time.Duration(vis) * time.Second
		}
		out := s.take(q, max, visibility, sysNames, attrNames)
		wake := s.wake
		next := s.nextVisible(q)
		s.mu.Unlock()
		left := time.Until(deadline)
		if len(out) > 0 || left <= 0 {
			return map[string]any{"Messages": out}, nil
		}
		if next > 0 && next < left {
			left = next
		}
		t := time.NewTimer(left)
		select {
		case <-wake:
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return map[string]any{"Messages": out}, nil
		}
		t.Stop()
	}
}

// nextVisible returns how long until the next invisible message of q
// becomes visible (0 if none); s.mu must be held.
func (s *Server) nextVisible(q *queue) time.Duration {
	now := s.now()
	var next time.Duration
	for _, m := range q.msgs {
		if d := m.visibleAt.Sub(now); d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	return next
}

// take receives up to max visible messages of q; s.mu must be held.
func (s *Server) take(q *queue, max int, visibility time.Duration, sysNames, attrNames []string) []outMessage {
	now := s.now()
	var out []outMessage
	kept := q.msgs[:0]
	for _, m := range q.msgs {
		if len(out) == max || now.Before(m.visibleAt) {
			kept = append(kept, m)
			continue
		}
		if q.opts.DeadLetterQueue != "" && q.opts.MaxReceiveCount > 0 && m.ReceiveCount >= q.opts.MaxReceiveCount {
			if dlq := s.queues[q.opts.DeadLetterQueue]; dlq != nil {
				// Redrive: the message moves with its attributes; its
				// receive count starts over.
				delete(q.byID, m.ID)
				q.c.Redriven++
				m.inflight, m.ReceiveCount, m.receipt, m.visibleAt = false, 0, "", now
				dlq.msgs = append(dlq.msgs, m)
				dlq.byID[m.ID] = m
				dlq.c.Sent++
				continue
			}
		}
		kept = append(kept, m)
		s.seq++
		m.ReceiveCount++
		if m.ReceiveCount == 1 {
			m.firstReceive = now
		}
		m.inflight = true
		m.receipt = m.ID + "#" + strconv.FormatUint(s.seq, 36)
		m.visibleAt = now.Add(visibility)
		q.c.Received++
		out = append(out, outMessage{
			MessageID:         m.ID,
			ReceiptHandle:     m.receipt,
			MD5OfBody:         md5hex(m.Body),
			Body:              m.Body,
			Attributes:        sysAttrs(m, sysNames),
			MessageAttributes: msgAttrs(m, attrNames),
		})
	}
	q.msgs = kept
	return out
}

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

func sysAttrs(m *Message, names []string) map[string]string {
	all := map[string]string{
		"ApproximateReceiveCount":          strconv.Itoa(m.ReceiveCount),
		"ApproximateFirstReceiveTimestamp": strconv.FormatInt(m.firstReceive.UnixMilli(), 10),
		"SentTimestamp":                    strconv.FormatInt(m.sent.UnixMilli(), 10),
	}
	if m.DeduplicationID != "" {
		all["MessageDeduplicationId"] = m.DeduplicationID
	}
	out := map[string]string{}
	for _, n := range names {
		if n == "All" {
			return all
		}
		if v, ok := all[n]; ok {
			out[n] = v
		}
	}
	return out
}

func msgAttrs(m *Message, names []string) map[string]MessageAttribute {
	out := map[string]MessageAttribute{}
	for _, n := range names {
		if n == "All" || n == ".*" {
			return m.Attributes
		}
		if v, ok := m.Attributes[n]; ok {
			out[n] = v
		}
	}
	return out
}

// lookup finds the in-flight message of a receipt handle; s.mu must be held.
// current is false for an older receipt handle of the message.
func lookup(q *queue, receipt string) (m *Message, current bool, err *apiError) {
	id, _, ok := strings.Cut(receipt, "#")
	if !ok || receipt == "" {
		return nil, false, errf("ReceiptHandleIsInvalid", "receipt handle %q is invalid", receipt)
	}
	m = q.byID[id]
	if m == nil {
		return nil, false, nil // deleted or moved: SQS accepts the delete
	}
	return m, m.receipt == receipt, nil
}

func (s *Server) deleteLocked(q *queue, receipt string) *apiError {
	m, current, err := lookup(q, receipt)
	if err != nil || m == nil || !current {
		return err // an older receipt handle: success, nothing deleted
	}
	delete(q.byID, m.ID)
	for i, x := range q.msgs {
		if x == m {
			q.msgs = append(q.msgs[:i], q.msgs[i+1:]...)
			break
		}
	}
	q.c.Deleted++
	s.signal()
	return nil
}

func (s *Server) changeLocked(q *queue, receipt string, seconds int) *apiError {
	if seconds < 0 || seconds > 43200 {
		return errf("InvalidParameterValue", "VisibilityTimeout %d is not in 0..43200", seconds)
	}
	m, current, err := lookup(q, receipt)
	if err != nil {
		return err
	}
	now := s.now()
	if m == nil || !current {
		return errf("ReceiptHandleIsInvalid", "receipt handle %q is not the latest", receipt)
	}
	if !m.inflight || !now.Before(m.visibleAt) {
		return errf("AWS.SimpleQueueService.MessageNotInflight", "message %s is not in flight", m.ID)
	}
	m.visibleAt = now.Add(time.Duration(seconds) * time.Second)
	if seconds == 0 {
		m.inflight = false
		s.signal()
	}
	return nil
}

func (s *Server) deleteOne(in map[string]json.RawMessage) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := s.queueFor(str(in, "QueueUrl"))
	if err != nil {
		return nil, err
	}
	return struct{}{}, s.deleteLocked(q, str(in, "ReceiptHandle"))
}

func (s *Server) changeOne(in map[string]json.RawMessage) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := s.queueFor(str(in, "QueueUrl"))
	if err != nil {
		return nil, err
	}
	v, _ := num(in, "VisibilityTimeout")
	return struct{}{}, s.changeLocked(q, str(in, "ReceiptHandle"), v)
}

type batchEntry struct {
	ID                string `json:"Id"`
	ReceiptHandle     string `json:"ReceiptHandle"`
	VisibilityTimeout int    `json:"VisibilityTimeout"`
}

type okEntry struct {
	ID string `json:"Id"`
}

type failEntry struct {
	ID          string `json:"Id"`
	Code        string `json:"Code"`
	Message     string `json:"Message"`
	SenderFault bool   `json:"SenderFault"`
}

func (s *Server) batch(in map[string]json.RawMessage, f func(*queue, batchEntry) *apiError) (any, *apiError) {
	var entries []batchEntry
	if json.Unmarshal(in["Entries"], &entries) != nil || len(entries) == 0 {
		return nil, errf("AWS.SimpleQueueService.EmptyBatchRequest", "no entries")
	}
	if len(entries) > 10 {
		return nil, errf("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", "%d entries, at most 10", len(entries))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := s.queueFor(str(in, "QueueUrl"))
	if err != nil {
		return nil, err
	}
	ok := []okEntry{}
	failed := []failEntry{}
	for _, e := range entries {
		if err := f(q, e); err != nil {
			failed = append(failed, failEntry{ID: e.ID, Code: err.code, Message: err.msg, SenderFault: true})
			continue
		}
		ok = append(ok, okEntry{ID: e.ID})
	}
	return map[string]any{"Successful": ok, "Failed": failed}, nil
}

func (s *Server) deleteBatch(in map[string]json.RawMessage) (any, *apiError) {
	return s.batch(in, func(q *queue, e batchEntry) *apiError { return s.deleteLocked(q, e.ReceiptHandle) })
}

func (s *Server) changeBatch(in map[string]json.RawMessage) (any, *apiError) {
	return s.batch(in, func(q *queue, e batchEntry) *apiError {
		return s.changeLocked(q, e.ReceiptHandle, e.VisibilityTimeout)
	})
}

func (s *Server) sendMessage(in map[string]json.RawMessage) (any, *apiError) {
	var attrs map[string]MessageAttribute
	_ = json.Unmarshal(in["MessageAttributes"], &attrs)
	delay, _ := num(in, "DelaySeconds")
	body := str(in, "MessageBody")
	if body == "" {
		return nil, errf("MissingParameter", "MessageBody is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := s.queueFor(str(in, "QueueUrl"))
	if err != nil {
		return nil, err
	}
	id := s.send(q, body, attrs, str(in, "MessageDeduplicationId"), time.Duration(delay)*time.Second)
	return map[string]string{"MessageId": id, "MD5OfMessageBody": md5hex(body)}, nil
}

func (s *Server) getQueueURL(in map[string]json.RawMessage) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := str(in, "QueueName")
	if s.queues[name] == nil {
		return nil, errf("AWS.SimpleQueueService.NonExistentQueue", "queue %q does not exist", name)
	}
	return map[string]string{"QueueUrl": s.url(name)}, nil
}

// Package otlp sends OpenTelemetry spans to an OTLP/HTTP collector as
// protobuf, for the idem binary's tracing (idem proxy --otel-endpoint).
//
// It exists rather than OpenTelemetry's own otlptracehttp exporter because
// that one pulls in gRPC and grpc-gateway (through the generated collector
// service), which the proxy never uses: they made the binary about twice
// as big and its first build much slower. It reads the standard
// variables: OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, _TIMEOUT (ms, default
// 10000), _COMPRESSION (gzip or none), _CERTIFICATE, _CLIENT_CERTIFICATE
// and _CLIENT_KEY. An export that fails with 429, 502, 503, 504 or a
// transport error is repeated with backoff (honouring Retry-After) until
// its timeout; spans that cannot be sent are dropped and reported through
// the SDK's error handler.
package otlp

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/slim/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/slim/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Exporter is an sdktrace.SpanExporter that posts spans to a collector
// (see the package documentation). It is safe for concurrent use.
type Exporter struct {
	url     string
	client  *http.Client
	headers http.Header
	gzip    bool
	timeout time.Duration
	stopped atomic.Bool
}

var _ sdktrace.SpanExporter = (*Exporter)(nil)

// otlpEnv returns the value of OTEL_EXPORTER_OTLP_TRACES_<name>, or else of
// OTEL_EXPORTER_OTLP_<name>.
func otlpEnv(getenv func(string) string, name string) (string, string) {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_" + name, "OTEL_EXPORTER_OTLP_" + name} {
		if s := getenv(v); s != "" {
			return s, v
		}
	}
	return "", ""
}

// New returns an exporter posting to u, configured from the environment
// that getenv reads; userAgent is its User-Agent. It returns an error
// naming the variable whose value it cannot use.
func New(u string, getenv func(string) string, userAgent string) (*Exporter, error) {
	e := &Exporter{url: u, headers: make(http.Header), timeout: 10 * time.Second}
	e.headers.Set("Content-Type", "application/x-protobuf")
	e.headers.Set("User-Agent", userAgent)
	if s, name := otlpEnv(getenv, "HEADERS"); s != "" {
		for kv := range strings.SplitSeq(s, ",") {
			k, v, ok := strings.Cut(kv, "=")
			k = strings.TrimSpace(k)
			if !ok || k == "" {
				return nil, fmt.Errorf("%s: want key=value,… got an entry without '='", name)
			}
			val, err := url.PathUnescape(strings.TrimSpace(v))
			if err != nil {
				return nil, fmt.Errorf("%s: %v", name, err)
			}
			e.headers.Set(k, val)
		}
	}
	if s, name := otlpEnv(getenv, "TIMEOUT"); s != "" {
		ms, err := strconv.Atoi(s)
		if err != nil || ms <= 0 {
			return nil, fmt.Errorf("%s=%q: want a positive number of milliseconds", name, s)
		}
		e.timeout = time.Duration(ms) * time.Millisecond
	}
	if s, name := otlpEnv(getenv, "COMPRESSION"); s != "" {
		switch s {
		case "gzip":
			e.gzip = true
			e.headers.Set("Content-Encoding", "gzip")
		case "none":
		default:
			return nil, fmt.Errorf("%s=%q: want gzip or none", name, s)
		}
	}
	tlsConf, err := otlpTLS(getenv)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if tlsConf != nil {
		tr.TLSClientConfig = tlsConf
	}
	e.client = &http.Client{Transport: tr}
	return e, nil
}

// otlpTLS returns the TLS configuration the environment asks for, nil for
// the default.
func otlpTLS(getenv func(string) string) (*tls.Config, error) {
	ca, caName := otlpEnv(getenv, "CERTIFICATE")
	cert, certName := otlpEnv(getenv, "CLIENT_CERTIFICATE")
	key, keyName := otlpEnv(getenv, "CLIENT_KEY")
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", caName, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate in %s", caName, ca)
		}
		conf.RootCAs = pool
	}
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY go together; got only %s", certName+keyName)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %v", certName, keyName, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}

// ExportSpans sends spans in one request, repeated while the collector
// asks for it or cannot be reached, until the export's timeout.
func (e *Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.stopped.Load() || len(spans) == 0 {
		return nil
	}
	body, err := proto.Marshal(&collectorpb.ExportTraceServiceRequest{ResourceSpans: resourceSpans(spans)})
	if err != nil {
		return fmt.Errorf("otlp: encoding %d spans: %w", len(spans), err)
	}
	if e.gzip {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write(body)
		if err := zw.Close(); err != nil {
			return err
		}
		body = b.Bytes()
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	backoff := 100 * time.Millisecond
	for {
		wait, err := e.post(ctx, body)
		if err == nil || wait < 0 {
			return err
		}
		wait = max(wait, backoff)
		backoff = min(2*backoff, 5*time.Second)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("otlp: %d spans not exported: %w (last error: %v)", len(spans), ctx.Err(), err)
		case <-t.C:
		}
	}
}

// post sends one request. A failure that may pass returns wait ≥ 0: the
// delay the collector asked for, or 0.
func (e *Exporter) post(ctx context.Context, body []byte) (wait time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return -1, err
	}
	req.Header = e.headers.Clone()
	resp, err := e.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return -1, fmt.Errorf("otlp: %w", err)
		}
		return 0, fmt.Errorf("otlp: %w", err)
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		// A partial success (some spans rejected) is not repeated: the
		// collector will not take them on a second try either.
		return 0, nil
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusBadGateway,
		resp.StatusCode == http.StatusServiceUnavailable, resp.StatusCode == http.StatusGatewayTimeout:
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		return wait, fmt.Errorf("otlp: collector answered %s", resp.Status)
	}
	return -1, fmt.Errorf("otlp: collector answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
}

// Shutdown stops the exporter; later exports do nothing.
func (e *Exporter) Shutdown(context.Context) error {
	e.stopped.Store(true)
	e.client.CloseIdleConnections()
	return nil
}

// resourceSpans groups spans by resource and instrumentation scope, in the
// order they come.
func resourceSpans(spans []sdktrace.ReadOnlySpan) []*tracepb.ResourceSpans {
	type scopeKey struct {
		res   attribute.Distinct
		scope instrumentation.Scope
	}
	var out []*tracepb.ResourceSpans
	byRes := make(map[attribute.Distinct]*tracepb.ResourceSpans)
	byScope := make(map[scopeKey]*tracepb.ScopeSpans)
	for _, s := range spans {
		res := s.Resource()
		rk := resourceKey(res)
		rs, ok := byRes[rk]
		if !ok {
			rs = &tracepb.ResourceSpans{Resource: &resourcepb.Resource{Attributes: keyValues(res.Attributes())}, SchemaUrl: res.SchemaURL()}
			byRes[rk] = rs
			out = append(out, rs)
		}
		sc := s.InstrumentationScope()
		sk := scopeKey{rk, instrumentation.Scope{Name: sc.Name, Version: sc.Version, SchemaURL: sc.SchemaURL}}
		ss, ok := byScope[sk]
		if !ok {
			ss = &tracepb.ScopeSpans{
				Scope:     &commonpb.InstrumentationScope{Name: sc.Name, Version: sc.Version, Attributes: keyValues(sc.Attributes.ToSlice())},
				SchemaUrl: sc.SchemaURL,
			}
			byScope[sk] = ss
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ss.Spans = append(ss.Spans, span(s))
	}
	return out
}

func resourceKey(r *resource.Resource) attribute.Distinct {
	if r == nil {
		return attribute.EmptySet().Equivalent()
	}
	return r.Equivalent()
}

// span converts one span to its OTLP form.
func span(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	p := &tracepb.Span{
		TraceId:                tid[:],
		SpanId:                 sid[:],
		TraceState:             sc.TraceState().String(),
		Flags:                  uint32(sc.TraceFlags()),
		Name:                   s.Name(),
		Kind:                   tracepb.Span_SpanKind(s.SpanKind()), // the same numbering
		StartTimeUnixNano:      unixNano(s.StartTime()),
		EndTimeUnixNano:        unixNano(s.EndTime()),
		Attributes:             keyValues(s.Attributes()),
		DroppedAttributesCount: uint32(s.DroppedAttributes()),
		DroppedEventsCount:     uint32(s.DroppedEvents()),
		DroppedLinksCount:      uint32(s.DroppedLinks()),
	}
	if parent := s.Parent(); parent.IsValid() {
		psid := parent.SpanID()
		p.ParentSpanId = psid[:]
		// SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, and IS_REMOTE when it is.
		p.Flags |= 0x100
		if parent.IsRemote() {
			p.Flags |= 0x200
		}
	}
	switch st := s.Status(); st.Code {
	case codes.Error:
		p.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: st.Description}
	case codes.Ok:
		p.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_OK}
	}
	for _, ev := range s.Events() {
		p.Events = append(p.Events, &tracepb.Span_Event{
			TimeUnixNano:           unixNano(ev.Time),
			Name:                   ev.Name,
			Attributes:             keyValues(ev.Attributes),
			DroppedAttributesCount: uint32(ev.DroppedAttributeCount),
		})
	}
	for _, l := range s.Links() {
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		p.Links = append(p.Links, &tracepb.Span_Link{
			TraceId:                ltid[:],
			SpanId:                 lsid[:],
			TraceState:             l.SpanContext.TraceState().String(),
			Attributes:             keyValues(l.Attributes),
			DroppedAttributesCount: uint32(l.DroppedAttributeCount),
			Flags:                  uint32(l.SpanContext.TraceFlags()),
		})
	}
	return p
}

func unixNano(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixNano())
}

func keyValues(attrs []attribute.KeyValue) []*commonpb.KeyValue {
	if len(attrs) == 0 {
		return nil
	}
	out := make([]*commonpb.KeyValue, 0, len(attrs))
	for _, kv := range attrs {
		out = append(out, &commonpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.BOOLSLICE:
		return arrayValue(v.AsBoolSlice(), func(b bool) *commonpb.AnyValue { return anyValue(attribute.BoolValue(b)) })
	case attribute.INT64SLICE:
		return arrayValue(v.AsInt64Slice(), func(i int64) *commonpb.AnyValue { return anyValue(attribute.Int64Value(i)) })
	case attribute.FLOAT64SLICE:
		return arrayValue(v.AsFloat64Slice(), func(f float64) *commonpb.AnyValue { return anyValue(attribute.Float64Value(f)) })
	case attribute.STRINGSLICE:
		return arrayValue(v.AsStringSlice(), func(s string) *commonpb.AnyValue { return anyValue(attribute.StringValue(s)) })
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.Emit()}}
}

func arrayValue[T any](vs []T, conv func(T) *commonpb.AnyValue) *commonpb.AnyValue {
	arr := &commonpb.ArrayValue{Values: make([]*commonpb.AnyValue, 0, len(vs))}
	for _, v := range vs {
		arr.Values = append(arr.Values, conv(v))
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: arr}}
}

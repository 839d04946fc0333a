package sqsconsumer_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemgo/idem/testkit/sqsfake"
)

// fakeSQS is an sqsfake.Server behind a real HTTP listener.
type fakeSQS struct {
	*sqsfake.Server
	URL string
}

func startFake(t testing.TB) *fakeSQS {
	t.Helper()
	f := sqsfake.New("")
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	f.SetBase(srv.URL)
	return &fakeSQS{Server: f, URL: srv.URL}
}

// killable is an http.RoundTripper that fails every request once killed,
// as a crashed process's connections would.
type killable struct {
	base   http.RoundTripper
	killed atomic.Bool
	// onRequest, if set, sees the X-Amz-Target of every request.
	onRequest func(target string)
}

var errKilled = errors.New("connection killed")

func (k *killable) RoundTrip(r *http.Request) (*http.Response, error) {
	if k.killed.Load() {
		return nil, errKilled
	}
	if k.onRequest != nil {
		k.onRequest(r.Header.Get("X-Amz-Target"))
	}
	return k.base.RoundTrip(r)
}

// client returns an SDK client of the fake; rt may be nil.
func (f *fakeSQS) client(rt http.RoundTripper) *sqs.Client {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(f.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "SECRETTEST", ""),
		HTTPClient:   &http.Client{Transport: rt},
		Retryer:      aws.NopRetryer{},
	})
}

func keyAttr(key string) map[string]sqsfake.MessageAttribute {
	if key == "" {
		return nil
	}
	return map[string]sqsfake.MessageAttribute{"idempotency-key": {DataType: "String", StringValue: key}}
}

// runConsumer runs c until the returned stop function is called.
func runConsumer(t testing.TB, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

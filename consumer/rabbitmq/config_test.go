package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	osexec "os/exec"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/testkit/prooftest"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestConfigurationErrorReturned: a refusal that reconnecting cannot heal
// (a configuration error) ends Run with that error, instead of being taken
// for a lost connection and retried every backoff, forever. Each case
// provokes one on the real RabbitMQ.
func TestConfigurationErrorReturned(t *testing.T) {
	for _, tc := range []struct {
		name string
		code int
		// setup prepares the broker for the queue q and returns the URL
		// and the options of the consumer, and what to publish to q.
		setup func(t *testing.T, q string) (url string, opts []Option, pub []amqp.Publishing)
	}{
		{"queue declared with other arguments", amqp.PreconditionFailed, func(t *testing.T, q string) (string, []Option, []amqp.Publishing) {
			declareQueue(t, q, amqp.Table{"x-max-length": int32(10)})
			return amqpURL(), nil, nil
		}},
		{"retry queue declared with other arguments", amqp.PreconditionFailed, func(t *testing.T, q string) (string, []Option, []amqp.Publishing) {
			declareQueue(t, q+".retry", nil)
			return amqpURL(), nil, nil
		}},
		{"invalid queue argument", amqp.PreconditionFailed, func(t *testing.T, q string) (string, []Option, []amqp.Publishing) {
			return amqpURL(), []Option{WithQueueArgs(amqp.Table{"x-max-length": "ten"})}, nil
		}},
		{"wrong password", amqp.AccessRefused, func(t *testing.T, q string) (string, []Option, []amqp.Publishing) {
			return withURI(t, func(u *amqp.URI) { u.Password += "-wrong" }), nil, nil
		}},
		{"user without permissions", amqp.AccessRefused, func(t *testing.T, q string) (string, []Option, []amqp.Publishing) {
			user, password := addUser(t)
			return withURI(t, func(u *amqp.URI) { u.Username, u.Password = user, password }), nil, nil
		}},
		{"missing vhost", amqp.NotAllowed, func(t *testing.T, q string) (string, []Option, []amqp.Publishing) {
			return withURI(t, func(u *amqp.URI) { u.Vhost = fmt.Sprintf("idem-missing-%08x", rand.Uint32()) }), nil, nil
		}},
		{"missing dead-letter exchange", amqp.NotFound, func(t *testing.T, q string) (string, []Option, []amqp.Publishing) {
			// Found while consuming: the first dead letter (a message
			// without a key) is published to an exchange that does not
			// exist.
			exchange := fmt.Sprintf("idem-missing-%08x", rand.Uint32())
			return amqpURL(), []Option{WithDeadLetterExchange(exchange, "dlq")}, []amqp.Publishing{msg("", "no key")}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := testQueue(t)
			url, opts, pub := tc.setup(t, q)
			exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
			c, err := New(url, q, exec, nopHandler,
				append([]Option{WithBackoff(10*time.Millisecond, 50*time.Millisecond), consumer.WithScope(q)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			if len(pub) > 0 {
				newPublisher(t, q).publish(q, pub...)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- c.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				select {
				case <-errc:
				case <-time.After(30 * time.Second):
					t.Error("Run did not return 30s after its context was cancelled")
				}
			})
			var runErr error
			waitFor(t, 20*time.Second, "Run's error (a consumer that takes it for a lost connection reconnects forever)", func() bool {
				select {
				case runErr = <-errc:
					errc <- runErr // for the cleanup
					return true
				default:
					return false
				}
			})
			var aerr *amqp.Error
			if !errors.As(runErr, &aerr) || aerr.Code != tc.code {
				t.Fatalf("Run: got %v, want an *amqp.Error with code %d", runErr, tc.code)
			}
			t.Logf("Run: %v (after %d reconnections)", runErr, c.Stats().Errors)
		})
	}
}

// TestConfigError classifies the errors that the broker cannot provoke on
// demand here.
func TestConfigError(t *testing.T) {
	server := func(code int) error { return &amqp.Error{Code: code, Server: true, Reason: "test"} }
	for _, tc := range []struct {
		name  string
		err   error
		setup bool
		want  bool
	}{
		{"PRECONDITION_FAILED while consuming (consumer_timeout)", server(amqp.PreconditionFailed), false, false},
		{"PRECONDITION_FAILED at setup", server(amqp.PreconditionFailed), true, true},
		{"CONNECTION_FORCED", server(amqp.ConnectionForced), false, false},
		{"INTERNAL_ERROR", server(amqp.InternalError), true, false},
		{"RESOURCE_LOCKED", server(amqp.ResourceLocked), true, false},
		{"NOT_FOUND while consuming", server(amqp.NotFound), false, true},
		{"channel closed by the client", fmt.Errorf("rabbitmq: ack: %w", amqp.ErrClosed), false, false},
		{"vhost closed without a reply", fmt.Errorf("rabbitmq: dial: %w", amqp.ErrVhost), true, false},
		{"credentials refused", fmt.Errorf("rabbitmq: dial: %w", amqp.ErrCredentials), true, true},
		{"no SASL mechanism", fmt.Errorf("rabbitmq: dial: %w", amqp.ErrSASL), true, true},
		{"a reason joined first", errors.Join(fmt.Errorf("x: %w", server(amqp.NotFound)), fmt.Errorf("y: %w", amqp.ErrClosed)), false, true},
		{"dial refused", errors.New("rabbitmq: dial: connection refused"), true, false},
	} {
		if got := configError(tc.err, tc.setup); got != tc.want {
			t.Errorf("%s: configError(%v, %t) = %t, want %t", tc.name, tc.err, tc.setup, got, tc.want)
		}
	}
}

// declareQueue declares queue, durable, with args, as another application
// would before the consumer starts.
func declareQueue(t *testing.T, queue string, args amqp.Table) {
	t.Helper()
	ch, err := dial(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
}

// withURI returns the tests' broker URL changed by f.
func withURI(t *testing.T, f func(*amqp.URI)) string {
	t.Helper()
	u, err := amqp.ParseURI(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	f(&u)
	return u.String()
}

// addUser creates a RabbitMQ user of the test's own, with no permission on
// the tests' vhost, deleted at cleanup.
func addUser(t *testing.T) (user, password string) {
	t.Helper()
	ctl, err := osexec.LookPath("rabbitmqctl")
	if err != nil {
		// The integration tests run against a local RabbitMQ, which ships
		// rabbitmqctl: its absence is a broken setup, not a reason to skip.
		t.Fatalf("rabbitmqctl not found (install rabbitmq-server): %v", err)
	}
	u, err := amqp.ParseURI(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	user, password = fmt.Sprintf("idem-test-%08x", rand.Uint32()), fmt.Sprintf("pw-%08x", rand.Uint32())
	run := func(args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		defer cancel()
		if out, err := osexec.CommandContext(ctx, ctl, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("rabbitmqctl %v: %w\n%s", args, err, out)
		}
		return nil
	}
	if err := run("add_user", user, password); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := run("delete_user", user); err != nil {
			t.Error(err)
		}
	})
	if err := run("set_permissions", "-p", u.Vhost, user, "^$", "^$", "^$"); err != nil {
		t.Fatal(err)
	}
	return user, password
}

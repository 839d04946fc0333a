package brokersource

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgo/idem/cmd/idem/internal/brokerurl"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/consumer"
)

// fake is a consumer whose Run returns err and whose Stats are stats.
type fake struct {
	err   error
	stats consumer.Stats
	ran   bool
}

func (f *fake) Run(context.Context) error { f.ran = true; return f.err }
func (f *fake) Stats() consumer.Stats     { return f.stats }

// ones returns Stats with every counter 1, found by reflection, so that a
// counter added to consumer.Stats and not to addStats fails the test.
func ones(t *testing.T) consumer.Stats {
	t.Helper()
	var s consumer.Stats
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Int, reflect.Int64, reflect.Uint64:
			f.Set(reflect.ValueOf(1).Convert(f.Type()))
		default:
			t.Fatalf("consumer.Stats.%s is a %s: teach addStats and this test", v.Type().Field(i).Name, f.Kind())
		}
	}
	return s
}

// TestSourceOf: every consumer runs; the stopped error is none, others
// are joined; the statistics are summed, every counter.
func TestSourceOf(t *testing.T) {
	stopped, boom := errors.New("stopped"), errors.New("boom")
	one := ones(t)
	cs := []*fake{{err: stopped, stats: one}, {err: boom, stats: one}, {stats: one}}
	closed := false
	src := sourceOf(cs, stopped, func() { closed = true })
	if err := src.Run(t.Context()); !errors.Is(err, boom) || errors.Is(err, stopped) {
		t.Errorf("Run: got %v, want boom alone", err)
	}
	for i, c := range cs {
		if !c.ran {
			t.Errorf("consumer %d did not run", i)
		}
	}
	got, want := reflect.ValueOf(src.Stats()), reflect.ValueOf(ones(t))
	for i := range got.NumField() {
		if g, w := got.Field(i).Convert(reflect.TypeFor[int64]()).Int(), 3*want.Field(i).Convert(reflect.TypeFor[int64]()).Int(); g != w {
			t.Errorf("Stats.%s: got %d, want %d", got.Type().Field(i).Name, g, w)
		}
	}
	if src.Close(); !closed {
		t.Error("Close did not call close")
	}
}

// TestOpenMissingName: a Kafka URL without its group and a NATS URL
// without its durable consumer are usage errors, before any connection.
func TestOpenMissingName(t *testing.T) {
	for _, tt := range []struct{ from, want string }{
		{"kafka://127.0.0.1:1/orders", "consume: --from Kafka topic orders at 127.0.0.1:1 has no group: add ?group=NAME"},
		{"nats://127.0.0.1:1/ORDERS", "has no consumer: add ?consumer=DURABLE"},
	} {
		b, err := brokerurl.Parse("--from", tt.from)
		if err != nil {
			t.Fatal(err)
		}
		_, err = (&Config{Broker: b, Concurrency: 1}).Open(t.Context(), nil)
		var ue *cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want a usage error %q", tt.from, err, tt.want)
		}
	}
}

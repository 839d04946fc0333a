package outboxroute

import (
	"strings"
	"testing"
)

// TestParse: the destination is NAME= or else the URL's target, and the
// description hides the secrets.
func TestParse(t *testing.T) {
	for _, tt := range []struct{ v, name, raw, where string }{
		{"redis-stream://:pw@localhost:6379/orders", "orders", "redis-stream://:pw@localhost:6379/orders", "Redis stream orders at localhost:6379"},
		{"billing=kafka://a:1,b:2/invoices", "billing", "kafka://a:1,b:2/invoices", "Kafka topic invoices at a:1,b:2"},
		{"nats://u:secret@h:4222/events.created", "events.created", "nats://u:secret@h:4222/events.created", "NATS subject events.created at nats://u:xxxxx@h:4222"},
		{"q=sqs://localhost:9324/000/jobs?insecure=true", "q", "sqs://localhost:9324/000/jobs?insecure=true", "SQS queue http://localhost:9324/000/jobs"},
	} {
		r, err := Parse(tt.v)
		if err != nil || r.Name != tt.name || r.Raw != tt.raw || r.Where != tt.where || r.Open == nil {
			t.Errorf("Parse(%q): got %+v, %v", tt.v, r, err)
		}
	}
	if _, err := Parse("x=foo://h/t"); err == nil || !strings.HasPrefix(err.Error(), "--outbox foo://h/t: unknown scheme") {
		t.Errorf("unknown scheme: got %v", err)
	}
}

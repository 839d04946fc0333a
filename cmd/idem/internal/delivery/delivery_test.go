package delivery

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/consumer/sidecar"
)

// TestDeliveries: a message's own headers pass as Idem-Header-NAME
// (traceparent as it is), the key's header is left out, and the broker's
// headers name the message.
func TestDeliveries(t *testing.T) {
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name string
		d    sidecar.Delivery
		want map[string]string
		body string
	}{
		{"redis-stream", RedisStream("orders", "key", redis.XMessage{ID: "1-0", Values: map[string]any{"key": "k1", "a": "1", "traceparent": "tp"}}),
			map[string]string{sidecar.HeaderBroker: "redis-stream", sidecar.HeaderTopic: "orders", sidecar.HeaderMessageID: "1-0",
				"Content-Type": "application/json", "Idem-Header-A": "1", "Traceparent": "tp", "Idem-Header-Key": ""},
			`{"a":"1","key":"k1","traceparent":"tp"}`},
		{"redis-stream payload", RedisStream("orders", "key", redis.XMessage{ID: "2-0", Values: map[string]any{"payload": "raw"}}),
			map[string]string{sidecar.HeaderMessageID: "2-0", "Content-Type": "", "Idem-Header-Payload": ""}, "raw"},
		{"kafka", Kafka("Idempotency-Key", &kgo.Record{Topic: "t", Partition: 2, Offset: 9, Value: []byte("v"),
			Headers: []kgo.RecordHeader{{Key: "Idempotency-Key", Value: []byte("k")}, {Key: "X", Value: []byte("x")}}}),
			map[string]string{sidecar.HeaderBroker: "kafka", sidecar.HeaderTopic: "t", sidecar.HeaderPartition: "2", sidecar.HeaderOffset: "9",
				sidecar.HeaderMessageID: "2-9", "Idem-Header-X": "x", "Idem-Header-Idempotency-Key": ""}, "v"},
		{"sqs", SQS("q", "Idempotency-Key", types.Message{MessageId: str("m1"), Body: str("b"), MessageAttributes: map[string]types.MessageAttributeValue{
			"Idempotency-Key": {StringValue: str("k")}, "Y": {StringValue: str("y")}}}),
			map[string]string{sidecar.HeaderBroker: "sqs", sidecar.HeaderTopic: "q", sidecar.HeaderMessageID: "m1", "Idem-Header-Y": "y", "Idem-Header-Idempotency-Key": ""}, "b"},
	} {
		for name, want := range tc.want {
			if got := tc.d.Header.Get(name); got != want {
				t.Errorf("%s: header %s: got %q, want %q", tc.name, name, got, want)
			}
		}
		if string(tc.d.Body) != tc.body {
			t.Errorf("%s: body %q, want %q", tc.name, tc.d.Body, tc.body)
		}
	}
	k, err := ParseKeySpec("header:X")
	if err != nil {
		t.Fatal(err)
	}
	r := &kgo.Record{Partition: 1, Offset: 3, Headers: []kgo.RecordHeader{{Key: "X", Value: []byte("kx")}}}
	if got := k.KafkaKey(r); got != "kx" || k.HeaderOr("D") != "X" {
		t.Errorf("header:X on a Kafka record: key %q, header %q", got, k.HeaderOr("D"))
	}
	if id, _ := ParseKeySpec("id"); id.KafkaKey(r) != "1-3" || id.HeaderOr("D") != "D" {
		t.Errorf("id on a Kafka record: key %q", id.KafkaKey(r))
	}
}

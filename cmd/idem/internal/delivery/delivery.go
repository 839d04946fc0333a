package delivery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unsafe"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/consumer/sidecar"
)

// Each broker's translation: its key function for --key (a KeySpec
// method), and its delivery. A message's own headers pass through
// addMessageHeader, but for the key's header, which is left out.

// RedisStreamKey is the key of a stream entry.
func (k KeySpec) RedisStreamKey(m redis.XMessage) string {
	var body []byte
	if p, ok := m.Values[redisstream.PayloadField].(string); ok {
		// Read only, by the key's source: no copy of the payload.
		body = unsafe.Slice(unsafe.StringData(p), len(p))
	} else {
		body, _ = streamBody(m)
	}
	return k.Key(func(name string) []string { return streamField(m, name) }, body, m.ID)
}

// RedisStream translates a stream entry: its body (streamBody); the
// key's field is left out of the headers, traceparent and tracestate
// pass as they are, the other fields as Idem-Header-NAME.
func RedisStream(stream, keyField string, m redis.XMessage) sidecar.Delivery {
	body, isJSON := streamBody(m)
	// The values of the headers every entry has share one allocation.
	vs := []string{"redis-stream", stream, m.ID, "application/json"}
	h := make(http.Header, len(m.Values)+2)
	h[sidecar.HeaderBroker], h[sidecar.HeaderTopic], h[sidecar.HeaderMessageID] = vs[0:1:1], vs[1:2:2], vs[2:3:3]
	if isJSON {
		h["Content-Type"] = vs[3:4:4]
	}
	for k, v := range m.Values {
		if k != redisstream.PayloadField && k != keyField {
			s, _ := v.(string)
			addMessageHeader(h, k, s)
		}
	}
	return sidecar.Delivery{Body: body, Header: h}
}

// streamBody returns an entry's body: the field "payload" (what idem relay
// --outbox writes), or else the entry's fields as a JSON object (isJSON).
// The payload is not copied: the body is only read (sidecar.Handler.Call
// sends it as it is).
func streamBody(m redis.XMessage) (body []byte, isJSON bool) {
	if p, ok := m.Values[redisstream.PayloadField].(string); ok {
		return unsafe.Slice(unsafe.StringData(p), len(p)), false
	}
	body, _ = json.Marshal(m.Values)
	return body, true
}

// streamField returns an entry's field name, for --key header:NAME.
func streamField(m redis.XMessage, name string) []string {
	if v, ok := m.Values[name].(string); ok {
		return []string{v}
	}
	return nil
}

// KafkaKey is the key of a Kafka record.
func (k KeySpec) KafkaKey(r *kgo.Record) string {
	return k.Key(func(name string) []string { return kafkaHeader(r, name) }, r.Value, kafkaID(r))
}

// Kafka translates a Kafka record.
func Kafka(keyHeader string, r *kgo.Record) sidecar.Delivery {
	h := header("kafka", r.Topic)
	h.Set(sidecar.HeaderPartition, strconv.Itoa(int(r.Partition)))
	h.Set(sidecar.HeaderOffset, strconv.FormatInt(r.Offset, 10))
	h.Set(sidecar.HeaderMessageID, kafkaID(r))
	for _, rh := range r.Headers {
		if rh.Key != keyHeader {
			addMessageHeader(h, rh.Key, string(rh.Value))
		}
	}
	return sidecar.Delivery{Body: r.Value, Header: h}
}

// kafkaID is a record's partition and offset: the same on every
// redelivery of the record, another for another send of the same message.
func kafkaID(r *kgo.Record) string {
	return strconv.Itoa(int(r.Partition)) + "-" + strconv.FormatInt(r.Offset, 10)
}

func kafkaHeader(r *kgo.Record, name string) []string {
	var out []string
	for _, h := range r.Headers {
		if h.Key == name {
			out = append(out, string(h.Value))
		}
	}
	return out
}

// AMQPKey is the key of a RabbitMQ delivery.
func (k KeySpec) AMQPKey(d *amqp.Delivery) string {
	return k.Key(func(name string) []string { return amqpHeader(d, name) }, d.Body, d.MessageId)
}

// AMQP translates a RabbitMQ delivery of queue.
func AMQP(queue string, d *amqp.Delivery) sidecar.Delivery {
	h := header("amqp", queue)
	if d.MessageId != "" {
		h.Set(sidecar.HeaderMessageID, d.MessageId)
	}
	if d.ContentType != "" {
		h.Set("Content-Type", d.ContentType)
	}
	for name := range d.Headers {
		if vs := amqpHeader(d, name); len(vs) == 1 {
			addMessageHeader(h, name, vs[0])
		}
	}
	return sidecar.Delivery{Body: d.Body, Header: h}
}

func amqpHeader(d *amqp.Delivery, name string) []string {
	switch v := d.Headers[name].(type) {
	case string:
		return []string{v}
	case []byte:
		return []string{string(v)}
	case int, int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		return []string{fmt.Sprint(v)}
	}
	return nil
}

// NATSKey is the key of a JetStream message.
func (k KeySpec) NATSKey(m jetstream.Msg) string {
	return k.Key(func(name string) []string { return m.Headers().Values(name) }, m.Data(), natsID(m))
}

// NATS translates a message of the JetStream stream.
func NATS(stream, keyHeader string, m jetstream.Msg) sidecar.Delivery {
	h := header("nats", stream)
	h.Set(sidecar.HeaderMessageID, natsID(m))
	h.Set("Idem-Subject", m.Subject())
	for name, vs := range m.Headers() {
		if name != keyHeader {
			for _, v := range vs {
				addMessageHeader(h, name, v)
			}
		}
	}
	return sidecar.Delivery{Body: m.Data(), Header: h}
}

// natsID is a message's sequence in its stream: the same on every
// redelivery.
func natsID(m jetstream.Msg) string {
	md, err := m.Metadata()
	if err != nil {
		return ""
	}
	return strconv.FormatUint(md.Sequence.Stream, 10)
}

// SQSKey is the key of an SQS message.
func (k KeySpec) SQSKey(m types.Message) string {
	return k.Key(func(name string) []string { return sqsAttribute(m, name) }, []byte(deref(m.Body)), deref(m.MessageId))
}

// SQS translates a message of the SQS queue.
func SQS(queue, keyAttr string, m types.Message) sidecar.Delivery {
	h := header("sqs", queue)
	h.Set(sidecar.HeaderMessageID, deref(m.MessageId))
	for name := range m.MessageAttributes {
		if vs := sqsAttribute(m, name); len(vs) == 1 && name != keyAttr {
			addMessageHeader(h, name, vs[0])
		}
	}
	return sidecar.Delivery{Body: []byte(deref(m.Body)), Header: h}
}

func sqsAttribute(m types.Message, name string) []string {
	if a, ok := m.MessageAttributes[name]; ok && a.StringValue != nil {
		return []string{*a.StringValue}
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// header returns the headers every delivery carries.
func header(broker, topic string) http.Header {
	h := http.Header{}
	h.Set(sidecar.HeaderBroker, broker)
	h.Set(sidecar.HeaderTopic, topic)
	return h
}

// addMessageHeader adds a message's own header to h: traceparent,
// tracestate and content-type as they are, the others as
// Idem-Header-NAME.
func addMessageHeader(h http.Header, name, value string) {
	switch strings.ToLower(name) {
	case "traceparent", "tracestate", "content-type":
		h.Set(name, value)
	default:
		h.Add("Idem-Header-"+name, value)
	}
}

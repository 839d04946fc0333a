package brokerurl

import (
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		raw                 string
		kind, target, where string
		check               func(*URL) bool
	}{
		{"redis-stream://:pw@localhost:6379/s?db=3&group=g", "redis-stream", "s", "Redis stream s at localhost:6379",
			func(b *URL) bool {
				return b.Redis.Addr == "localhost:6379" && b.Redis.Password == "pw" && b.Redis.DB == 3 && b.Redis.TLSConfig == nil && b.Query.Get("group") == "g"
			}},
		{"rediss-stream://u:p@redis.example:6380/s", "redis-stream", "s", "Redis stream s at redis.example:6380",
			func(b *URL) bool {
				return b.Scheme == "rediss-stream" && b.Redis.Username == "u" && b.Redis.TLSConfig != nil && b.Redis.TLSConfig.ServerName == "redis.example"
			}},
		{"kafka://a:1,b:2/t", "kafka", "t", "Kafka topic t at a:1,b:2",
			func(b *URL) bool { return slices.Equal(b.Brokers, []string{"a:1", "b:2"}) }},
		{"amqp://u:p@h:5672/q", "amqp", "q", "RabbitMQ queue q at amqp://u:xxxxx@h:5672/",
			func(b *URL) bool {
				return b.AMQPDial == "amqp://u:p@h:5672/" && b.Exchange == "" && b.RoutingKey == "q"
			}},
		{"amqps://u:p@h:5672/vh/ex?routing-key=k", "amqp", "ex", `RabbitMQ exchange ex (routing key "k") at amqps://u:xxxxx@h:5672/vh`,
			func(b *URL) bool {
				return b.AMQPDial == "amqps://u:p@h:5672/vh" && b.Exchange == "ex" && b.RoutingKey == "k"
			}},
		{"nats://u:p@h:4222/subj?consumer=c", "nats", "subj", "NATS subj at nats://u:xxxxx@h:4222",
			func(b *URL) bool { return b.NATSServer == "nats://u:p@h:4222" && b.Query.Get("consumer") == "c" }},
		{"sqs://sqs.eu-west-1.amazonaws.com/123/q", "sqs", "q", "SQS queue https://sqs.eu-west-1.amazonaws.com/123/q",
			func(b *URL) bool {
				return b.Endpoint == "https://sqs.eu-west-1.amazonaws.com" && b.QueueURL == "https://sqs.eu-west-1.amazonaws.com/123/q" && b.Region == "eu-west-1"
			}},
		{"sqs://localhost:9324/000/q?insecure=true&region=r", "sqs", "q", "SQS queue http://localhost:9324/000/q",
			func(b *URL) bool { return b.Endpoint == "http://localhost:9324" && b.Region == "r" }},
	} {
		b, err := Parse("--from", tt.raw)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.raw, err)
			continue
		}
		if b.Raw != tt.raw || b.Kind != tt.kind || b.Target != tt.target || b.Where != tt.where || !tt.check(b) {
			t.Errorf("Parse(%q): got %+v", tt.raw, b)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tt := range []struct{ raw, want string }{
		{"foo", "--from foo: not a URL: want redis-stream://, kafka://, amqp://, nats:// or sqs://"},
		{"x://a/b", `--from x://a/b: unknown scheme "x": want ` + Schemes},
		{"redis-stream://h:1/", "no stream: want redis-stream://HOST:PORT/STREAM"},
		{"redis-stream://h:1/s?db=x", "db=x is not a database number"},
		{"redis-stream://h:1/s?db=-1", "db=-1 is not a database number"},
		{"redis-stream://h:1/s?%zz", "invalid URL escape"},
		{"kafka:///t", "want kafka://HOST:PORT[,HOST:PORT...]/TOPIC"},
		{"amqp://h/vh/%zz", "invalid URL escape"},
		{"amqp://h/", "no queue or exchange"},
		{"nats://h/", "no subject or stream: want nats://HOST:PORT/NAME"},
		{"sqs://h/", "want sqs://HOST/ACCOUNT/QUEUE"},
		{"sqs:///a/q", "want sqs://HOST/ACCOUNT/QUEUE"},
		{"amqp://u:secret@h/", "amqp://u:xxxxx@h/"},
	} {
		_, err := Parse("--from", tt.raw)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("Parse(%q): got %v, want an error with %q", tt.raw, err, tt.want)
		}
	}
}

package main

import (
	"crypto/tls"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/cmd/idem/internal/redact"
)

// brokerURL is a parsed broker URL: relay's --outbox and consume's --from
// (one parser for both).
//
//	redis-stream://[:PASSWORD@]HOST:PORT/STREAM[?db=N]  (rediss-stream:// for TLS)
//	kafka://HOST:PORT[,HOST:PORT...]/TOPIC
//	amqp://USER:PASSWORD@HOST:PORT/[VHOST/]QUEUE        (amqps:// for TLS)
//	amqp://USER:PASSWORD@HOST:PORT/[VHOST/]EXCHANGE?routing-key=KEY
//	nats://[USER:PASSWORD@]HOST:PORT/NAME               (a subject, or consume's JetStream stream)
//	sqs://HOST/ACCOUNT/QUEUE[?region=R][&insecure=true]
//
// Other query parameters are kept in query, for the command to read
// (consume's group=, consumer=).
type brokerURL struct {
	raw    string
	scheme string // as written: redis-stream, rediss-stream, kafka, amqp, amqps, nats, sqs
	kind   string // redis-stream, kafka, amqp, nats, sqs
	target string // the stream, topic, queue (or exchange), subject or JetStream stream, SQS queue name
	query  url.Values
	where  string // the broker and target, without secrets

	redis      *redis.Options // redis-stream
	brokers    []string       // kafka
	amqpDial   string         // amqp: the server and vhost
	exchange   string         // amqp: set with ?routing-key=
	routingKey string         // amqp
	natsServer string         // nats
	endpoint   string         // sqs: https://HOST (http:// with insecure=true)
	queueURL   string         // sqs
	region     string         // sqs
}

// brokerSchemes is the list the errors give.
const brokerSchemes = "redis-stream, rediss-stream, kafka, amqp, amqps, nats or sqs"

// parseBrokerURL parses raw, a broker URL given to flag.
func parseBrokerURL(flag, raw string) (*brokerURL, error) {
	fail := func(format string, args ...any) (*brokerURL, error) {
		return nil, fmt.Errorf("%s %s: %s", flag, redact.URL(raw), fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return fail("not a URL: want redis-stream://, kafka://, amqp://, nats:// or sqs://")
	}
	authority, path, _ := strings.Cut(rest, "/")
	path, query, _ := strings.Cut(path, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return fail("%v", err)
	}
	target, err := url.PathUnescape(path)
	if err != nil {
		return fail("%v", err)
	}
	b := &brokerURL{raw: raw, scheme: scheme, kind: scheme, target: target, query: q}
	switch scheme {
	case "redis-stream", "rediss-stream":
		b.kind = "redis-stream"
		if target == "" {
			return fail("no stream: want redis-stream://HOST:PORT/STREAM")
		}
		u, err := url.Parse("redis://" + authority)
		if err != nil {
			return fail("%v", err)
		}
		db := 0
		if d := q.Get("db"); d != "" {
			if db, err = strconv.Atoi(d); err != nil || db < 0 {
				return fail("db=%s is not a database number", d)
			}
		}
		pw, _ := u.User.Password()
		b.redis = &redis.Options{Addr: u.Host, Username: u.User.Username(), Password: pw, DB: db}
		if scheme == "rediss-stream" {
			b.redis.TLSConfig = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
		}
		b.where = fmt.Sprintf("Redis stream %s at %s", target, u.Host)
	case "kafka":
		if target == "" || authority == "" {
			return fail("want kafka://HOST:PORT[,HOST:PORT...]/TOPIC")
		}
		b.brokers = strings.Split(authority, ",")
		b.where = fmt.Sprintf("Kafka topic %s at %s", target, authority)
	case "amqp", "amqps":
		b.kind = "amqp"
		segs := strings.Split(path, "/")
		last, err := url.PathUnescape(segs[len(segs)-1])
		if err != nil || last == "" {
			return fail("no queue or exchange: want amqp://HOST:PORT/[VHOST/]QUEUE or …/EXCHANGE?routing-key=KEY")
		}
		b.amqpDial = scheme + "://" + authority + "/" + strings.Join(segs[:len(segs)-1], "/")
		b.target, b.routingKey = last, last
		b.where = fmt.Sprintf("RabbitMQ queue %s at %s", last, redact.URL(b.amqpDial))
		if q.Has("routing-key") {
			b.exchange, b.routingKey = last, q.Get("routing-key")
			b.where = fmt.Sprintf("RabbitMQ exchange %s (routing key %q) at %s", last, b.routingKey, redact.URL(b.amqpDial))
		}
	case "nats":
		if target == "" {
			return fail("no subject or stream: want nats://HOST:PORT/NAME")
		}
		b.natsServer = "nats://" + authority
		b.where = fmt.Sprintf("NATS %s at %s", target, redact.URL(b.natsServer))
	case "sqs":
		segs := strings.Split(path, "/")
		queue := segs[len(segs)-1]
		if authority == "" || queue == "" {
			return fail("want sqs://HOST/ACCOUNT/QUEUE")
		}
		httpScheme := "https"
		if insecure, _ := strconv.ParseBool(q.Get("insecure")); insecure {
			httpScheme = "http"
		}
		b.endpoint = httpScheme + "://" + authority
		b.queueURL = b.endpoint + "/" + path
		b.region = q.Get("region")
		if b.region == "" {
			if parts := strings.Split(authority, "."); len(parts) == 4 && parts[0] == "sqs" && parts[2] == "amazonaws" {
				b.region = parts[1] // sqs.REGION.amazonaws.com
			}
		}
		b.target, b.where = queue, "SQS queue "+b.queueURL
	default:
		return fail("unknown scheme %q: want %s", scheme, brokerSchemes)
	}
	return b, nil
}

// Package brokerurl parses the broker URLs of the idem binary: relay's
// --outbox and consume's --from (one parser for both).
//
//	redis-stream://[:PASSWORD@]HOST:PORT/STREAM[?db=N]  (rediss-stream:// for TLS)
//	kafka://HOST:PORT[,HOST:PORT...]/TOPIC
//	amqp://USER:PASSWORD@HOST:PORT/[VHOST/]QUEUE        (amqps:// for TLS)
//	amqp://USER:PASSWORD@HOST:PORT/[VHOST/]EXCHANGE?routing-key=KEY
//	nats://[USER:PASSWORD@]HOST:PORT/NAME               (a subject, or consume's JetStream stream)
//	sqs://HOST/ACCOUNT/QUEUE[?region=R][&insecure=true]
//
// Other query parameters are kept in Query, for the command to read
// (consume's group=, consumer=).
package brokerurl

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/cmd/idem/internal/redact"
)

// URL is a parsed broker URL.
type URL struct {
	Raw    string
	Scheme string // as written: redis-stream, rediss-stream, kafka, amqp, amqps, nats, sqs
	Kind   string // redis-stream, kafka, amqp, nats, sqs
	Target string // the stream, topic, queue (or exchange), subject or JetStream stream, SQS queue name
	Query  url.Values
	Where  string // the broker and target, without secrets

	Redis      *redis.Options // redis-stream
	Brokers    []string       // kafka
	AMQPDial   string         // amqp: the server and vhost
	Exchange   string         // amqp: set with ?routing-key=
	RoutingKey string         // amqp
	NATSServer string         // nats
	Endpoint   string         // sqs: https://HOST (http:// with insecure=true)
	QueueURL   string         // sqs
	Region     string         // sqs
}

// Schemes is the list the errors give.
const Schemes = "redis-stream, rediss-stream, kafka, amqp, amqps, nats or sqs"

// parsed is a URL cut in parts, for the parser of its scheme.
type parsed struct {
	authority string
	path      string // still escaped
}

// schemes are the parsers of the schemes, by scheme as written: each
// fills in b (Target, Query and Scheme are set) or says what is wrong.
var schemes = map[string]func(b *URL, p parsed) error{
	"redis-stream":  parseRedisStream,
	"rediss-stream": parseRedisStream,
	"kafka":         parseKafka,
	"amqp":          parseAMQP,
	"amqps":         parseAMQP,
	"nats":          parseNATS,
	"sqs":           parseSQS,
}

// Parse parses raw, a broker URL given to flag.
func Parse(flag, raw string) (*URL, error) {
	b, err := parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %s", flag, redact.URL(raw), err)
	}
	return b, nil
}

func parse(raw string) (*URL, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, errors.New("not a URL: want redis-stream://, kafka://, amqp://, nats:// or sqs://")
	}
	authority, path, _ := strings.Cut(rest, "/")
	path, query, _ := strings.Cut(path, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, err
	}
	target, err := url.PathUnescape(path)
	if err != nil {
		return nil, err
	}
	parser, ok := schemes[scheme]
	if !ok {
		return nil, fmt.Errorf("unknown scheme %q: want %s", scheme, Schemes)
	}
	b := &URL{Raw: raw, Scheme: scheme, Kind: scheme, Target: target, Query: q}
	if err := parser(b, parsed{authority: authority, path: path}); err != nil {
		return nil, err
	}
	return b, nil
}

func parseRedisStream(b *URL, p parsed) error {
	b.Kind = "redis-stream"
	if b.Target == "" {
		return errors.New("no stream: want redis-stream://HOST:PORT/STREAM")
	}
	u, err := url.Parse("redis://" + p.authority)
	if err != nil {
		return err
	}
	db := 0
	if d := b.Query.Get("db"); d != "" {
		if db, err = strconv.Atoi(d); err != nil || db < 0 {
			return fmt.Errorf("db=%s is not a database number", d)
		}
	}
	pw, _ := u.User.Password()
	b.Redis = &redis.Options{Addr: u.Host, Username: u.User.Username(), Password: pw, DB: db}
	if b.Scheme == "rediss-stream" {
		b.Redis.TLSConfig = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	}
	b.Where = fmt.Sprintf("Redis stream %s at %s", b.Target, u.Host)
	return nil
}

func parseKafka(b *URL, p parsed) error {
	if b.Target == "" || p.authority == "" {
		return errors.New("want kafka://HOST:PORT[,HOST:PORT...]/TOPIC")
	}
	b.Brokers = strings.Split(p.authority, ",")
	b.Where = fmt.Sprintf("Kafka topic %s at %s", b.Target, p.authority)
	return nil
}

func parseAMQP(b *URL, p parsed) error {
	b.Kind = "amqp"
	segs := strings.Split(p.path, "/")
	last, err := url.PathUnescape(segs[len(segs)-1])
	if err != nil || last == "" {
		return errors.New("no queue or exchange: want amqp://HOST:PORT/[VHOST/]QUEUE or …/EXCHANGE?routing-key=KEY")
	}
	b.AMQPDial = b.Scheme + "://" + p.authority + "/" + strings.Join(segs[:len(segs)-1], "/")
	b.Target, b.RoutingKey = last, last
	b.Where = fmt.Sprintf("RabbitMQ queue %s at %s", last, redact.URL(b.AMQPDial))
	if b.Query.Has("routing-key") {
		b.Exchange, b.RoutingKey = last, b.Query.Get("routing-key")
		b.Where = fmt.Sprintf("RabbitMQ exchange %s (routing key %q) at %s", last, b.RoutingKey, redact.URL(b.AMQPDial))
	}
	return nil
}

func parseNATS(b *URL, p parsed) error {
	if b.Target == "" {
		return errors.New("no subject or stream: want nats://HOST:PORT/NAME")
	}
	b.NATSServer = "nats://" + p.authority
	b.Where = fmt.Sprintf("NATS %s at %s", b.Target, redact.URL(b.NATSServer))
	return nil
}

func parseSQS(b *URL, p parsed) error {
	segs := strings.Split(p.path, "/")
	queue := segs[len(segs)-1]
	if p.authority == "" || queue == "" {
		return errors.New("want sqs://HOST/ACCOUNT/QUEUE")
	}
	httpScheme := "https"
	if insecure, _ := strconv.ParseBool(b.Query.Get("insecure")); insecure {
		httpScheme = "http"
	}
	b.Endpoint = httpScheme + "://" + p.authority
	b.QueueURL = b.Endpoint + "/" + p.path
	b.Region = b.Query.Get("region")
	if b.Region == "" {
		if parts := strings.Split(p.authority, "."); len(parts) == 4 && parts[0] == "sqs" && parts[2] == "amazonaws" {
			b.Region = parts[1] // sqs.REGION.amazonaws.com
		}
	}
	b.Target, b.Where = queue, "SQS queue "+b.QueueURL
	return nil
}

// SQSClient returns an SQS client of b's endpoint, with the AWS SDK's
// default credential chain.
func (b *URL) SQSClient(ctx context.Context) (*sqs.Client, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if b.Region != "" {
		opts = append(opts, awsconfig.WithRegion(b.Region))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, err
	}
	endpoint := b.Endpoint
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(endpoint) }), nil
}

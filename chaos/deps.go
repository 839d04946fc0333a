//go:build deps

// This file keeps the scenarios' dependencies in go.mod while they are
// written; it is removed once every one of them is imported by a scenario.
package chaos

import (
	_ "github.com/Shopify/toxiproxy/v2"
	_ "github.com/anishathalye/porcupine"
	_ "github.com/aws/aws-sdk-go-v2/service/sqs"
	_ "github.com/idemgo/idem/consumer/kafka"
	_ "github.com/idemgo/idem/consumer/nats"
	_ "github.com/idemgo/idem/consumer/rabbitmq"
	_ "github.com/idemgo/idem/consumer/sqs"
	_ "github.com/nats-io/nats.go/jetstream"
	_ "github.com/rabbitmq/amqp091-go"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/redis/rueidis"
	_ "github.com/twmb/franz-go/pkg/kfake"
	_ "github.com/twmb/franz-go/pkg/kgo"
)

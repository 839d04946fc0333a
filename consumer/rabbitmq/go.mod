module github.com/idemgo/idem/consumer/rabbitmq

go 1.26.0

require (
	github.com/idemgo/idem v0.1.0
	github.com/rabbitmq/amqp091-go v1.16.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	github.com/redis/rueidis v1.0.79 // indirect
	github.com/valkey-io/valkey-go v1.0.79 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

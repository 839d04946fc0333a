//go:build tools

package idem

import (
	_ "github.com/redis/go-redis/v9"
	_ "github.com/redis/rueidis"
	_ "go.etcd.io/bbolt"
)

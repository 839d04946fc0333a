package storeopen

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
)

// TestRedisTargetCheck: each flag's value parses or gives the usage error
// that names the flag, without secrets; the flags exclude each other.
func TestRedisTargetCheck(t *testing.T) {
	for _, tt := range []struct {
		name string
		t    RedisTarget
		want string // "" for none
	}{
		{"none", RedisTarget{}, ""},
		{"url", RedisTarget{URL: "redis://:pw@127.0.0.1:6379/2"}, ""},
		{"cluster list", RedisTarget{Cluster: "a:1, b:2,"}, ""},
		{"cluster url", RedisTarget{Cluster: "redis://a:1?addr=b:2"}, ""},
		{"sentinel", RedisTarget{Sentinel: "m@a:1,b:2", SentinelPassword: "s"}, ""},
		{"two", RedisTarget{URL: "redis://x:1", Cluster: "x:1"}, "--redis, --redis-cluster and --redis-sentinel exclude each other; give one"},
		{"user with url", RedisTarget{URL: "redis://x:1", Password: "pw"}, "--redis-username and --redis-password go with --redis-sentinel or --redis-cluster"},
		{"sentinel password alone", RedisTarget{URL: "redis://x:1", SentinelPassword: "s"}, "--redis-sentinel-password needs --redis-sentinel"},
		{"url without scheme", RedisTarget{URL: "localhost:6379"}, "invalid --redis URL \"localhost:6379\""},
		{"url secret", RedisTarget{URL: "redis://:hunter2@x:1/notadb"}, "invalid --redis URL \"redis://:xxxxx@x:1/notadb\""},
		{"cluster address", RedisTarget{Cluster: "x"}, `invalid --redis-cluster address "x": want host:port`},
		{"cluster empty", RedisTarget{Cluster: " , "}, "--redis-cluster has no address"},
		{"sentinel no name", RedisTarget{Sentinel: "127.0.0.1:26379"}, "invalid --redis-sentinel \"127.0.0.1:26379\": want NAME@HOST:PORT"},
		{"sentinel no address", RedisTarget{Sentinel: "m@"}, "--redis-sentinel has no address"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.t.Check()
			if tt.want == "" {
				if err != nil {
					t.Errorf("got %v, want nil", err)
				}
				return
			}
			var ue *cli.UsageError
			if !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), tt.want) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("got %v, want a usage error %q", err, tt.want)
			}
		})
	}
}

// TestRedisTargetClient: the client of each kind, its description without
// secrets, and the servers a failed ping probes.
func TestRedisTargetClient(t *testing.T) {
	for _, tt := range []struct {
		name     string
		t        RedisTarget
		cluster  bool
		describe string
		probe    []string
	}{
		{"url", RedisTarget{URL: "redis://:pw@127.0.0.1:6379/2"}, false, "redis 127.0.0.1:6379 db 2", []string{"127.0.0.1:6379"}},
		{"cluster", RedisTarget{Cluster: "a:1, b:2", Password: "pw"}, true, "redis cluster a:1,b:2", []string{"a:1", "b:2"}},
		{"sentinel", RedisTarget{Sentinel: " m @a:1,b:2"}, false, "redis sentinel m@a:1,b:2", []string{"a:1", "b:2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, describe, err := tt.t.Client()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, isCluster := c.(*redis.ClusterClient)
			if _, isClient := c.(*redis.Client); isCluster == isClient || isCluster != tt.cluster {
				t.Errorf("got a %T", c)
			}
			if describe != tt.describe {
				t.Errorf("got %q, want %q", describe, tt.describe)
			}
			if p := tt.t.Probe(); !reflect.DeepEqual(p.Addrs, tt.probe) {
				t.Errorf("probe: got %v, want %v", p.Addrs, tt.probe)
			}
		})
	}
	if _, _, err := (&RedisTarget{}).Client(); err == nil {
		t.Error("Client of no Redis: got nil error")
	}
	if p := (&RedisTarget{Cluster: "x"}).Probe(); p.Addrs != nil {
		t.Errorf("probe of a bad target: got %v, want none", p.Addrs)
	}
}

package doctor

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/boltstore"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
)

// Run runs the Redis checks on c and its servers nodes (the one server,
// or each primary of a Cluster, see Primaries): each server's, the
// cluster's slots, the user's rights, and the rights of the replay cache
// where the proxy keeps one.
func (o *Redis) Run(ctx context.Context, r *Report, c redis.UniversalClient, nodes []*redis.Client) {
	_, cluster := c.(*redis.ClusterClient)
	for _, n := range nodes {
		label := ""
		if cluster {
			label = n.Options().Addr + " "
		}
		if !o.Node(ctx, r, n, label) {
			return // the rights cannot be tried either
		}
	}
	if cluster {
		ClusterSlots(ctx, r, nodes[0])
	}
	Rights(ctx, r, c, o.Prefix)
	// The proxy's store keeps a replay cache on a go-redis client that is
	// not a Cluster's, unless it waits for replicas or the AOF.
	if rc, ok := c.(*redis.Client); ok && o.WaitReplicas == 0 && !o.WaitAOF {
		ReplayCache(ctx, r, rc, o.Prefix)
	}
}

// Primaries returns the clients of the primaries of cc, in the order of
// their addresses.
func Primaries(ctx context.Context, cc *redis.ClusterClient) ([]*redis.Client, error) {
	var mu sync.Mutex
	var nodes []*redis.Client
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := cc.ForEachMaster(cctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, n)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(nodes, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	return nodes, nil
}

// Bolt checks that the embedded store at path opens, or is held by a
// running proxy, or does not exist yet (a warning: the proxy creates it).
func Bolt(r *Report, path string) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		r.Add(Warn, "embedded store", "%s does not exist yet; the proxy creates it (Redis checks do not apply)", path)
		return
	}
	st, err := boltstore.Open(path, boltstore.WithSweepInterval(0))
	switch {
	case errors.Is(err, boltstore.ErrLocked):
		r.Add(OK, "embedded store", "%s is in use by a running proxy (Redis checks do not apply)", path)
	case err != nil:
		r.Add(Fail, "embedded store", "%v", storeopen.BoltError(path, err))
	default:
		st.Close()
		r.Add(OK, "embedded store", "%s opens (Redis checks do not apply)", path)
	}
}

package redisstore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/idemgo/idem/redisstore/redisinfo"
	"github.com/idemgo/idem/storekit"
)

// StatsSample is the most records Stats counts.
const StatsSample = 1000

var _ storekit.StatsStore = (*Store)(nil)

// Stats implements storekit.StatsStore. It counts a sample of the records, the
// first StatsSample that SCAN finds (as List does: SCAN with MATCH and TYPE,
// never KEYS, then one read per record), so Sampled is set when there are
// more, and reads INFO on every node for used_memory and maxmemory,
// reporting the node closest to its limit. A server that refuses INFO
// (ACLs, managed services) leaves the memory at zero.
func (s *Store) Stats(ctx context.Context) (storekit.Stats, error) {
	var st storekit.Stats
	entries, err := s.List(ctx, StatsSample)
	if err != nil {
		return st, err
	}
	st.Sampled = len(entries) >= StatsSample
	for _, e := range entries {
		st.Count(e.Record.State, e.Record.Created, e.Record.Now)
	}
	nodes, err := s.b.Nodes(ctx)
	if err != nil {
		return st, fmt.Errorf("redisstore: stats: %w", err)
	}
	best := -1.0
	for _, n := range nodes {
		info, err := n.Info(ctx)
		if err != nil {
			if isReplyError(err) {
				continue
			}
			return st, fmt.Errorf("redisstore: stats: INFO on %s: %w", n.Addr(), err)
		}
		f := redisinfo.Parse(info)
		used, _ := strconv.ParseInt(f["used_memory"], 10, 64)
		limit, _ := strconv.ParseInt(f["maxmemory"], 10, 64)
		ratio := 0.0
		if limit > 0 {
			ratio = float64(used) / float64(limit)
		}
		if ratio > best || (ratio == best && used > st.MemoryUsed) {
			best, st.MemoryUsed, st.MemoryLimit = ratio, used, limit
		}
	}
	return st, nil
}

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// Entry is a record listed by List.
type Entry struct {
	// Key is the store key (a digest made by idem.Key.Digest).
	Key    string
	Record storekit.Record
}

// List returns up to limit records, for admin tools. It walks the key space
// with SCAN MATCH <prefix>{*} TYPE string, never KEYS, so it does not block
// the server; on a Cluster it scans every primary in turn. Each record is
// then read with the same script as Get (one round trip per record). The
// order is SCAN's, which is unspecified; a record that expires or is
// deleted while List runs is skipped, and one created meanwhile may or may
// not be listed. limit must be positive. SCAN's TYPE option needs Redis 6.0
// or later.
func (s *Store) List(ctx context.Context, limit int) ([]Entry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: list limit %d is not positive", idem.ErrInvalid, limit)
	}
	open := s.prefix + "{"
	match := globEscape(s.prefix) + "{*}"
	var keys []string
	seen := make(map[string]bool)
	err := s.b.Scan(ctx, match, func(name string) bool {
		// The pattern also matches names with braces inside; only
		// <prefix>{<digest>} is a record.
		key, ok := strings.CutPrefix(name, open)
		if !ok || !strings.HasSuffix(key, "}") {
			return true
		}
		key = key[:len(key)-1]
		if key == "" || strings.ContainsAny(key, "{}") || seen[key] {
			return true
		}
		seen[key] = true
		keys = append(keys, key)
		return len(keys) < limit
	})
	if err != nil {
		return nil, fmt.Errorf("redisstore: scan: %w", err)
	}
	// The records are read in pipelines of listPipeline get calls: one
	// round trip per pipeline, not per record (a metrics scrape reads up
	// to StatsSample of them).
	out := make([]Entry, 0, len(keys))
	for lo := 0; lo < len(keys); lo += listPipeline {
		part := keys[lo:min(lo+listPipeline, len(keys))]
		calls := make([]evalCall, len(part))
		for i, k := range part {
			calls[i] = evalCall{Keys: []string{s.Key(k)}}
		}
		replies, errs := s.runMulti(ctx, getScript, calls)
		for i, k := range part {
			if errs[i] != nil {
				return nil, errs[i]
			}
			rec, err := parseGet(replies[i])
			if errors.Is(err, storekit.ErrNotFound) {
				continue // deleted or expired since the scan
			}
			if err != nil {
				return nil, err
			}
			out = append(out, Entry{Key: k, Record: rec})
		}
	}
	return out, nil
}

// listPipeline is how many records List reads in one pipeline.
const listPipeline = 256

// globEscape escapes the characters that SCAN's MATCH pattern treats as
// special.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

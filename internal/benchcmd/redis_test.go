package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem/testkit/redistest"
)

// TestFlushFreesMemoryAtOnce checks that flush has freed the keys' memory
// when it returns, on a server whose plain FLUSHALL is asynchronous
// (lazyfree-lazy-user-flush yes, the default of Valkey 8): the
// memory-per-record figure reads used_memory right after it.
func TestFlushFreesMemoryAtOnce(t *testing.T) {
	srv := redistest.Start(t, "--lazyfree-lazy-user-flush", "yes", "--enable-debug-command", "yes")
	c := srv.GoRedis(t)
	a := admin{c: c}
	ctx := t.Context()
	base, err := a.usedMemory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "DEBUG", "POPULATE", "500000", "k", "64")
	if err := a.flush(ctx); err != nil {
		t.Fatal(err)
	}
	info := srv.Do(t, "INFO", "memory")
	if got := memoryField(info, "lazyfree_pending_objects"); got != "0" {
		t.Errorf("lazyfree_pending_objects after flush: got %s, want 0", got)
	}
	used, err := strconv.ParseInt(memoryField(info, "used_memory"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if used > base+4<<20 {
		t.Errorf("used_memory after flush: got %d, want at most %d (the empty server's %d + 4 MiB)", used, base+4<<20, base)
	}
}

func memoryField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

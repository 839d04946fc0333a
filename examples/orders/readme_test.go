package main

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/testkit/readmetest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestReadmeCommands runs the README's redis-cli commands against a
// running consumer, each once the consumer has handled every entry before
// it (nothing pending, the last entry delivered), and checks the answer
// its comment names.
func TestReadmeCommands(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	ctx := t.Context()
	c, err := newConsumer(rdb, "orders-1", redisstream.WithBlock(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(runCtx); err != nil {
			t.Error(err)
		}
	})
	defer wg.Wait()
	defer cancel()

	// settled waits until the consumer has handled every entry of the
	// stream: its group delivered the last one and nothing is pending.
	settled := func() {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			info, err := rdb.XInfoStream(ctx, stream).Result()
			groups, gerr := rdb.XInfoGroups(ctx, stream).Result()
			if err == nil && gerr == nil && len(groups) == 1 &&
				groups[0].LastDeliveredID == info.LastGeneratedID && groups[0].Pending == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the consumer did not handle the stream in time: %+v %v %+v %v", info, err, groups, gerr)
			}
			time.Sleep(10 * time.Millisecond) // poll the group until it caught up
		}
	}
	// The consumer creates its group when it starts.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n, err := rdb.XInfoGroups(ctx, stream).Result(); err == nil && len(n) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the consumer created no group")
		}
		time.Sleep(10 * time.Millisecond) // poll until the group exists
	}

	answer := regexp.MustCompile(`^\d+\b`)
	for _, cmd := range readmetest.Commands(t, "README.md", "<!-- commands: TestReadmeCommands") {
		if len(cmd.Words) < 2 || cmd.Words[0] != "redis-cli" {
			t.Fatalf("%q is not a redis-cli command", cmd.Line)
		}
		args := make([]any, 0, len(cmd.Words)-1)
		for _, w := range cmd.Words[1:] {
			args = append(args, w)
		}
		want := answer.FindString(cmd.Comment)
		if want != "" && cmd.Words[1] != "HSET" {
			settled()
		}
		got, err := rdb.Do(ctx, args...).Result()
		if err != nil {
			t.Fatalf("%s: %v", cmd.Line, err)
		}
		if want != "" && fmt.Sprint(got) != want {
			t.Errorf("%s: got %v, want %s", cmd.Line, got, want)
		}
	}
}

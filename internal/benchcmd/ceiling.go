package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// Ceiling settings: redis-benchmark with as many connections as the
// stores' widest run, each pipelining 16 commands.
const (
	ceilingClients  = 64
	ceilingPipeline = 16
	// freshKeyspace is -r for the acquire ceiling: keys practically never
	// repeat, so every call creates a record.
	freshKeyspace = 1_000_000_000
	// minRequests and maxRequests bound -n.
	minRequests = 20_000
	maxRequests = 2_000_000
)

// The ceiling's calls carry arguments as long as the store's, because the
// scripts' cost grows with them (BENCHMARKS.md, "The ceiling's arguments"):
// with redis-benchmark's short ones ("owner", fence 1, a 12-digit key)
// complete.lua ran 0.35–1.0 µs a call faster than with the store's.
const (
	// ceilingKey is the record key that redis-benchmark fills in with a
	// 12-digit number per occurrence of __rand_int__: as long as the
	// store's, a digest of storekit.DigestLen characters in braces.
	ceilingKey = "idem:{" + ceilingKeyPad + "__rand_int__}"
	// ceilingKeyPad fills the key's 12 digits up to storekit.DigestLen.
	ceilingKeyPad = "0123456789"
	// ceilingOwner is an owner token of the Executor's form: 12 random
	// characters, a dot and its sequence number in base 36, which has 4
	// digits from the 46,656th attempt to the 1,679,615th.
	ceilingOwner = "AbCdEfGhIjKl.2x7q"
	// ceilingFence is a fence as acquire.lua seeds it, the server's clock
	// in µs (16 digits until 2286).
	ceilingFence uint64 = 1_764_460_800_000_000
)

// benchmark runs redis-benchmark with the command args and returns its
// requests per second.
func benchmark(ctx context.Context, addr string, n, keyspace int, args ...string) (float64, error) {
	host, port, _ := strings.Cut(addr, ":")
	argv := []string{"-h", host, "-p", port,
		"-c", strconv.Itoa(ceilingClients), "-P", strconv.Itoa(ceilingPipeline),
		"-n", strconv.Itoa(n), "--csv"}
	if keyspace > 0 {
		argv = append(argv, "-r", strconv.Itoa(keyspace))
	}
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, "redis-benchmark", argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("redis-benchmark %s: %w: %s", args[0], err, tail(stderr.Bytes(), 5))
	}
	// The last line is "<command>","rps","avg",…,"max" with 7 numbers;
	// the command is not CSV-escaped, so read the numbers from the right.
	out := strings.TrimSpace(stdout.String())
	fields := strings.Split(out[strings.LastIndexByte(out, '\n')+1:], ",")
	if len(fields) < 8 {
		return 0, fmt.Errorf("redis-benchmark %s: unexpected output %q", args[0], out)
	}
	rps, err := strconv.ParseFloat(strings.Trim(fields[len(fields)-7], `"`), 64)
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark %s: unexpected output %q: %w", args[0], out, err)
	}
	if rps <= 0 {
		return 0, fmt.Errorf("redis-benchmark %s: %v requests per second", args[0], rps)
	}
	return rps, nil
}

// requestsFor returns the -n that keeps a run at rate requests per second
// busy for about d.
func requestsFor(rate float64, d time.Duration) int {
	return min(max(int(rate*d.Seconds()), minRequests), maxRequests)
}

// preload writes n IN_PROGRESS records, owner ceilingOwner, fence
// ceilingFence, at the keys redis-benchmark produces for -r n from
// ceilingKey (idem:{0123456789000000000000} …), so that every
// key the complete ceiling picks holds a record it may complete. Writing
// each key once covers the whole range, where random SETs would need about
// five times as many commands to cover 99% of it.
func preload(ctx context.Context, c rueidis.Client, n int) error {
	const batch = 1000
	const workers = 4
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			cmds := make(rueidis.Commands, 0, batch)
			for start := w * batch; start < n; start += workers * batch {
				cmds = cmds[:0]
				for i := start; i < min(start+batch, n); i++ {
					cmds = append(cmds, c.B().Set().Key(fmt.Sprintf("idem:{"+ceilingKeyPad+"%012d}", i)).Value(inProgressRecord).
						PxMilliseconds(3600_000).Build())
				}
				for _, r := range c.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						errs[w] = err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("preload: %w", err)
		}
	}
	return nil
}

// inProgressRecord is a record in redisstore's format (see acquire.lua):
// the MessagePack values 1, "p", "fp", ceilingOwner, ceilingFence, a lease
// end far in the future, 1 attempt, created 1, "".
var inProgressRecord = func() string {
	b := []byte{1}
	str := func(s string) { b = append(b, 0xa0|byte(len(s))); b = append(b, s...) }
	str("p")
	str("fp")
	str(ceilingOwner)
	b = append(b, 0xcf) // fence, a uint 64
	b = binary.BigEndian.AppendUint64(b, ceilingFence)
	b = append(b, 0xcf, 0, 0, 0x5a, 0xf3, 0x10, 0x7a, 0x3f, 0xff) // lease end, 99999999999999 µs
	b = append(b, 1, 1)                                           // attempts, created
	str("")
	return string(b)
}()

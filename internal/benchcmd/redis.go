package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/idemgo/idem/redisstore/redisinfo"
	"github.com/redis/go-redis/v9"
)

// admin wraps the client used for INFO, CONFIG RESETSTAT and FLUSHALL.
type admin struct{ c *redis.Client }

// flush empties the server and returns once the memory is freed: FLUSHALL
// SYNC, since a plain FLUSHALL frees in the background where the server
// makes it asynchronous by default (lazyfree-lazy-user-flush yes, as Valkey
// 8 ships), and the memory-per-record figure read right after it would be
// wrong, even negative.
func (a admin) flush(ctx context.Context) error { return a.c.Do(ctx, "FLUSHALL", "SYNC").Err() }

func (a admin) resetStats(ctx context.Context) error { return a.c.ConfigResetStat(ctx).Err() }

// cmdstat is one line of INFO commandstats.
type cmdstat struct {
	calls, usec float64
}

func (s cmdstat) perCall() float64 {
	if s.calls == 0 {
		return 0
	}
	return s.usec / s.calls
}

// commandStats returns INFO commandstats by command name ("evalsha",
// "set", …).
func (a admin) commandStats(ctx context.Context) (map[string]cmdstat, error) {
	info, err := a.c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]cmdstat)
	for line := range strings.Lines(info) {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdstat
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				st.calls = n
			case "usec":
				st.usec = n
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out, nil
}

// usedMemory returns INFO memory's used_memory.
func (a admin) usedMemory(ctx context.Context) (int64, error) {
	info, err := a.c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory in INFO memory")
}

// cpu returns the CPU time, in seconds, of the server's main thread, the
// one that runs commands and scripts (INFO cpu; the whole process where
// the server does not report its main thread), and the reads the server
// has made from its clients' connections so far (INFO stats'
// total_reads_processed; 0 where the server does not report it). Calls
// over reads is how deep the pipelines were that the server read.
func (a admin) cpu(ctx context.Context) (cpu, reads float64, err error) {
	info, err := a.c.Info(ctx, "cpu", "stats").Result()
	if err != nil {
		return 0, 0, err
	}
	if cpu, err = redisinfo.CPU(info); err != nil {
		return 0, 0, err
	}
	reads, _ = strconv.ParseFloat(redisinfo.Parse(info)["total_reads_processed"], 64)
	return cpu, reads, nil
}

// version returns the server's redis_version.
func (a admin) version(ctx context.Context) string {
	info, err := a.c.Info(ctx, "server").Result()
	if err != nil {
		return "?"
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "?"
}

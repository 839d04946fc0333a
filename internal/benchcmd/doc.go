// Command benchcmd measures idem's stores and prints one table:
//
//   - lifecycles (acquire, run, complete on a new key) and replays (Do on a
//     completed key) per second through Executor.Do, on memstore and on
//     Redis through go-redis and rueidis, at concurrency 1 and 64 (or
//     -callers), with a 50-byte result;
//   - the ceiling redis-benchmark reaches with the same scripts, and
//     arguments as long as the store's, pipelined (-c 64 -P 16), and each
//     client's ratio to it;
//   - the Redis time per script call (usec_per_call in INFO commandstats),
//     the CPU of the server's main thread and of this process per call, the
//     share of the time the server's main thread was runnable but waited
//     for a core (a busy machine), and this process's heap allocations per
//     call;
//   - the Redis memory per completed record, with a 2-byte fingerprint and
//     with a 32-byte one as idemhttp makes;
//   - Do on memstore under testing.Benchmark (ns/op, allocs/op).
//
// It ends with the project's performance targets, each marked PASS or MISS.
// It is a report, not a test: it exits 0 whether the targets are met or
// not, and non-zero only when it could not measure.
//
// It starts its own redis-server (without persistence, on a free loopback
// port) and kills it when it ends, also on error or interrupt. It needs
// redis-server and redis-benchmark on PATH. Progress goes to stderr, the
// report to stdout.
//
//	go run ./internal/benchcmd [-duration 2s] [-runs 3] [-callers 1,64] [-lifecycle] [-json]
//
// -lifecycle measures only the lifecycle rows of go-redis and rueidis and
// the lifecycle ceiling (acquire and complete), what the lifecycle
// targets need, in about a third of the time; -callers 64 leaves out the
// lone caller's rows too.
//
// -cpuprofile DIR writes a CPU profile of this process for each Redis row's
// measured window, one file per row and run (go-redis-lifecycle-c64-r1.pprof
// …); go tool pprof merges several:
//
//	go run ./internal/benchcmd -lifecycle -callers 64 -cpuprofile /tmp/prof
//	go tool pprof -top /tmp/prof/rueidis-lifecycle-c64-r*.pprof
//
// -callers sets the concurrencies of the Do rows (the targets are at 64):
// -callers 64,256 shows how the ratio to the ceiling grows with more calls
// in flight, with Redis busier.
//
// With -callgrind it prints instead the instructions redis-server executes
// per new key, counted under valgrind's callgrind, for Executor.Do with each
// client against the floor's two plain SETs, and the same two SETs each
// sent as a one-call script, the least a Lua transition can cost (see
// callgrind.go); counts do
// not depend on the machine's load as times do:
//
//	go run ./internal/benchcmd -callgrind [-keys 2000] [-runs 3] [-profiles DIR]
//
// Every figure is the median of -runs runs; the runs are interleaved (run 1
// of everything, then run 2, …) so that a burst of load from other processes
// does not land on a single figure.
package main

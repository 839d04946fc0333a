// Package boltstore is a durable idem.Store on local disk: one bbolt file,
// for a single process. It is the default store of the idem binary when no
// Redis is given, and fits any single-node service that must not run an
// operation twice across restarts.
//
//	store, err := boltstore.Open("/var/lib/idem/idem.db")
//	if err != nil {
//		return err
//	}
//	defer store.Close()
//	exec, err := idem.New(store)
//
// # Semantics
//
// The state machine is memstore's: both make every transition with the
// same pure functions (an internal package) and keep only their storage,
// and a test runs random operations on both with one fake clock and
// requires identical replies: the same outcomes, the same ErrLeaseLost rules and repeated-call
// rules, the same validation of input before anything is read or written,
// the same expiry (an IN_PROGRESS record two leases plus
// storekit.InProgressGrace after it was acquired or extended, a finished one
// after its retention) and the same fences:
// max(previous + 1, clock in µs, last fence issued + 1). The last fence
// issued is kept in the file, so fences keep growing across restarts, even
// when the record was deleted or expired and the clock went back. Time is
// the store's clock (WithClock; time.Now by default), as the Redis server's
// is for redisstore.
//
// # Durability
//
// Every method that changes a record (Acquire when it acquires or moves a
// record to FAILED, Complete, Fail, Extend, Release, Delete) returns only
// after the change was written to the log and fdatasynced: a process killed
// with SIGKILL, or a machine that loses power, loses no acknowledged
// transition (as far as the disk honours fdatasync). Acquire outcomes that
// change nothing (Replay, InProgress, Mismatch) and Get are answered from
// memory or a read transaction, without a write.
//
// Writes are committed in groups, to a log: all writes go to one writer
// goroutine, which applies every write that queued while the previous
// group was syncing, appends the group's records to a log file as one frame
// and fdatasyncs it: one write and one sync per group, where a bbolt commit
// writes every B+tree page the group changes and syncs twice. A lone caller
// waits for one sync and no more; under load the groups grow by
// themselves. If a context ends before its write was taken into a group,
// the call returns the context's error and nothing was written; once taken,
// the call waits for the sync.
//
// The records of the log are also kept in memory, where reads find them
// first. Once the log holds 16 MiB, a checkpoint applies them to the bbolt
// file in one transaction, in the background, while new writes go to a
// second log file; then the first is written again from its start. Many
// records share each page a checkpoint writes: a new-key request writes 0.3
// pages of 4 KiB where a bbolt commit per group wrote 4.2 (BenchmarkLifecycle
// at 64 callers). Open applies what a crash left in the log before it
// returns. A write of the log that fails (a full disk) fails the writes of
// its group, and the next group tries again. After a sync of the log
// fails, every later write fails with that error (what the disk holds is
// unknown) until the store is opened again; reads go on.
//
// # Damage
//
// Each frame of the log carries a sequence number and checksums (of its
// header, keyed with a secret kept in the file, and of its payload), and a
// frame is written only after the one before it is synced. So a crash can
// tear only the last frame, which was never acknowledged: Open drops it.
// Bytes damaged anywhere else (a disk, a program, an operator) leave a
// later frame's header behind them, which a torn write never does; Open
// then refuses the store with a *CorruptLogError, which wraps ErrCorrupt
// and names the log file, the offset of the damage and the number of
// frames missing, rather than drop every acknowledged write after the
// damage (and let their requests run again). Damage that leaves no later
// frame's header (the last frame, or everything from some frame to the
// end of the log) cannot be told from a torn write, and is dropped as one.
// A frame whose checksums hold but that cannot be read is reported the
// same way. To look for such headers, Open reads both log files to their
// end: about 25 ms for a full file of 20 MiB on the project's machine.
//
// Recover repairs such a store (the idem binary: idem recover --data DIR):
// it reads every whole frame, past the damage, copies both log files aside
// (the evidence is never deleted), applies what it read to the file, and
// reports what was lost (Recovery: the damage, the frames missing, the
// records kept). The records of the missing frames are lost: a key whose
// last write was in them reads as the frames before left it.
//
// Reads never hold up checkpoints or writes, and checkpoints never hold up
// reads. bbolt maps the file into memory; a file that outgrows its map is
// mapped again, which waits for every read transaction to end, while every
// read transaction begun meanwhile, the writer's among them, waits for it:
// a long List or Stats would stop every write until it ended. So the store
// maps 10 GiB of address space when it opens the file, as etcd does (on
// 64-bit platforms other than Windows; where a limit of the address space
// refuses that, what the file needs), and the file is mapped again only
// once it passes 10 GiB, then once per 1 GiB it grows. The map reserves
// addresses, not memory. The file grows 16 MiB ahead of its pages.
//
// The store is the three files: path, path.log.0 and path.log.1; copy them
// together, with the store closed (Close leaves the bbolt file complete on
// its own). The file records its format: 3 since the log's frames are
// numbered. Open turns a file from before the log (format 1) into format
// 3, and one of format 2 too, once it has applied its log, which it reads
// as format 2 wrote it (up to the first frame that is not whole: format 2
// has no sequence numbers to tell damage from a torn end). Versions of
// this package that would misread the log refuse a file of a later format
// rather than miss what a crash left in the log.
//
// Records are encoded in a small versioned binary format (about 40 bytes
// plus fingerprint, owner and result); a record or file that cannot be
// decoded yields an error wrapping ErrCorrupt, never a panic. Delete removes
// even a record that cannot be decoded.
//
// # Expiry
//
// An expired record reads as absent at once. The file holds an index by
// expiry time; every checkpoint deletes expired records (twice as many as
// the records it applies, so deletion keeps up with insertion), and a
// background goroutine (WithSweepInterval, every minute by default) makes a
// checkpoint when the log holds records or expired ones are left. bbolt reuses the freed pages;
// the file does not shrink (compact it offline with the bbolt command if it
// must).
//
// # One process
//
// The file is locked while open: a second Open of the same file, from this
// process or another, fails with ErrLocked after WithLockTimeout (1s by
// default) instead of hanging. Several processes that must share keys need
// redisstore. The Watcher is in-process, like memstore's.
//
// # Why bbolt
//
// The engine was picked by measurement on the project's machine (2 cores,
// a virtual disk shared with other machines: fdatasync of 4 KiB takes 0.2ms
// at the median and up to seconds at worst, so figures swing by 2-3x from
// minute to minute). One request is the Executor's lifecycle for a new key:
// read + write IN_PROGRESS, read + write COMPLETED with a 200-byte result,
// each write synced before the request goes on. Median of 5 interleaved
// rounds of 4s, keys spread like digests (cmd: enginebench -d 4s -rounds 5,
// a scratch program outside this module):
//
//	engine, empty file                       conc 1     conc 64
//	bbolt, one Update per write               245/s       251/s
//	bbolt, DB.Batch                            35/s     1,836/s
//	bbolt, group commit (defaults)            222/s     3,378/s
//	bbolt, group commit, NoFreelistSync       377/s     3,496/s
//	Pebble v1.1.5, Sync writes (WAL group)    496/s     7,997/s
//
//	engine, 200,000 records stored first     conc 1     conc 64
//	bbolt, group commit, NoFreelistSync       733/s     4,360/s   p99 26ms
//	Pebble v1.1.5                           1,703/s     4,976/s   p99 124ms
//
// At quieter moments the same programs reached 11,000-14,000/s (bbolt,
// group commit) and 20,000-31,000/s (Pebble) at concurrency 64. Pebble
// writes one WAL record per write and syncs once per group, where bbolt
// writes every touched B+tree page and syncs twice per commit, so Pebble is
// about 2x faster on an empty file; with a realistic number of records its
// compactions take the disk and the CPU (two cores here) and its lead at
// concurrency 64 mostly goes, with a worse tail. That is not dramatic, and
// Pebble is not light: it adds 25 modules (among them a Prometheus client,
// Sentry, protobuf and a cgo zstd binding) and turns a 2.0 MB program into a
// 14.3 MB one, where bbolt adds one small module. bbolt also gives
// transactions, so each checkpoint is atomic and a crash leaves the
// previous one intact. So: bbolt, with group commit and NoFreelistSync (as
// etcd runs it: commits do not rewrite the free list, which is rebuilt by a
// scan on Open). Since 2026-11-27 the groups go to a log of the store's own
// and bbolt takes them in checkpoints (above), which took the idem proxy's
// new keys on this store from 0.5 to 0.7 of a plain reverse proxy, at the
// rate of its floor (two synced log writes per request): what Pebble's
// WAL would have given, without its weight.
//
// BenchmarkLifecycle measures this package the same way
// (go test -bench Lifecycle ./boltstore).
package boltstore

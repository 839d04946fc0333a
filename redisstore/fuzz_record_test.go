package redisstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// msgpackStr appends s as a MessagePack string, in the format Redis's
// cmsgpack.pack writes (fixstr, str8, str16 or str32).
func msgpackStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 1<<8:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// msgpackUint appends n as a MessagePack unsigned integer in its shortest
// form, as cmsgpack.pack writes it.
func msgpackUint(b []byte, n uint64) []byte {
	switch {
	case n < 128:
		return append(b, byte(n))
	case n < 1<<8:
		return append(b, 0xcc, byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(n))
	case n < 1<<32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), n)
}

// fuzzRecord is a record as the scripts write it (see acquire.lua).
type fuzzRecord struct {
	state                     string
	fp, owner                 string
	fence, leaseEnd, attempts uint64
	created                   uint64
	result                    string
}

func (r fuzzRecord) encode() []byte {
	b := msgpackUint(nil, 1) // format version
	b = msgpackStr(b, r.state)
	b = msgpackStr(b, r.fp)
	b = msgpackStr(b, r.owner)
	b = msgpackUint(b, r.fence)
	b = msgpackUint(b, r.leaseEnd)
	b = msgpackUint(b, r.attempts)
	b = msgpackUint(b, r.created)
	return msgpackStr(b, r.result)
}

// firstIsOne reports whether b starts with a MessagePack value equal to 1
// (the format version of a record), in any integer or float encoding.
func firstIsOne(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	be := binary.BigEndian
	rest := b[1:]
	switch c := b[0]; {
	case c == 0x01:
		return true
	case c == 0xcc || c == 0xd0:
		return len(rest) >= 1 && rest[0] == 1
	case c == 0xcd || c == 0xd1:
		return len(rest) >= 2 && be.Uint16(rest) == 1
	case c == 0xce || c == 0xd2:
		return len(rest) >= 4 && be.Uint32(rest) == 1
	case c == 0xcf || c == 0xd3:
		return len(rest) >= 8 && be.Uint64(rest) == 1
	case c == 0xca:
		return len(rest) >= 4 && math.Float32frombits(be.Uint32(rest)) == 1
	case c == 0xcb:
		return len(rest) >= 8 && math.Float64frombits(be.Uint64(rest)) == 1
	}
	return false
}

// FuzzRecordDecode checks the decoding of the Redis record (the MessagePack
// string that the scripts unpack with cmsgpack, read back through Get and
// Acquire's reply parsers) against a real redis-server:
//
//   - a record built from the fuzz input and written as the scripts write it
//     reads back through Get field for field (decode(encode(r)) == r), and a
//     COMPLETED or FAILED one replays its result byte for byte through
//     Acquire with its fingerprint, and is a Mismatch with another;
//   - every strict prefix of a valid record (a torn write) is refused with an
//     error by Get, never misread;
//   - arbitrary bytes in place of a record never panic, and are refused
//     with an error unless they start with the format version 1;
//   - the replay cache's decoder (DecodeRecord) reads the same fields from
//     a valid record and refuses every torn one.
//
// The store runs without its replay cache: the test overwrites records with
// raw writes, which a cache sees when the server's invalidation arrives, a
// moment later (as designed: a COMPLETED record changes only by a delete or
// an expiry), so an Acquire right after could replay the record the test
// just replaced. The cache's decoder is fuzzed directly instead.
func FuzzRecordDecode(f *testing.F) {
	f.Add(byte('c'), "fp", "owner-1", uint64(1700000000000000), uint64(1700000030000000), uint64(1), uint64(1700000000000000), []byte(`{"ok":true}`), []byte{0x01, 0xa1, 'c'}, uint16(3))
	f.Add(byte('p'), "", "", uint64(0), uint64(0), uint64(0), uint64(0), []byte{}, []byte{}, uint16(0))
	f.Add(byte('f'), strings.Repeat("f", 128), strings.Repeat("o", 64), uint64(1)<<53-1, uint64(1)<<40, uint64(1)<<32, uint64(0), bytes.Repeat([]byte{0xff, 0x00}, 150), []byte{0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0xa1, 'c', 0xa0}, uint16(77))
	f.Add(byte('r'), "caf\xc3\xa9\x00\"'\\", "\r\n", uint64(127), uint64(128), uint64(255), uint64(65536), []byte("\x00\xc1\xd9"), []byte{0x02}, uint16(1))
	f.Add(byte('c'), `"quoted"`, "o", uint64(3), uint64(4), uint64(5), uint64(6), []byte("result"), []byte{0x01, 0x91, 0x01}, uint16(9))
	f.Add(byte('c'), "fp", "o", uint64(3), uint64(4), uint64(5), uint64(6), []byte("r"), []byte{0x01, 0xa1, 'c', 0xa2, 'f', 'p', 0xc0}, uint16(9))

	srv := redistest.Start(f)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	f.Cleanup(func() { rdb.Close() })
	store, err := redisstore.New(rdb, redisstore.WithReplayCache(false))
	if err != nil {
		f.Fatal(err)
	}
	var n int
	f.Fuzz(func(t *testing.T, state byte, fp, owner string, fence, leaseEnd, attempts, created uint64, result, garbage []byte, cut uint16) {
		ctx := t.Context()
		const max53 = 1<<53 - 1 // Lua numbers are doubles
		rec := fuzzRecord{
			state: string("pcrf"[state%4]), fp: fp, owner: owner,
			fence: fence & max53, leaseEnd: leaseEnd & max53, attempts: attempts & max53, created: created & max53,
			result: string(result),
		}
		n++
		digest := idem.Key{ID: strconv.Itoa(n)}.Digest()
		name := store.Key(digest)
		raw := rec.encode()
		if err := rdb.Set(ctx, name, raw, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := store.Get(ctx, digest)
		if err != nil {
			t.Fatalf("Get of a valid record %+v: %v", rec, err)
		}
		want := storekit.Record{State: map[string]storekit.State{"p": storekit.StateInProgress, "c": storekit.StateCompleted, "r": storekit.StateReleased, "f": storekit.StateFailed}[rec.state],
			Fingerprint: rec.fp, Owner: rec.owner, Fence: int64(rec.fence), Attempts: int(rec.attempts)}
		if got.State != want.State || got.Fingerprint != want.Fingerprint || got.Owner != want.Owner || got.Fence != want.Fence || got.Attempts != want.Attempts {
			t.Fatalf("Get = state %v fp %q owner %q fence %d attempts %d, want %v %q %q %d %d",
				got.State, got.Fingerprint, got.Owner, got.Fence, got.Attempts, want.State, want.Fingerprint, want.Owner, want.Fence, want.Attempts)
		}
		if !bytes.Equal(got.Result, []byte(rec.result)) || (rec.result == "") != (got.Result == nil) {
			t.Fatalf("Get result = %q, want %q", got.Result, rec.result)
		}
		if rec.created != 0 && got.Created.UnixMicro() != int64(rec.created) {
			t.Fatalf("Get created = %d µs, want %d", got.Created.UnixMicro(), rec.created)
		}
		if rec.state == "p" && got.LeaseUntil.UnixMicro() != int64(rec.leaseEnd) {
			t.Fatalf("Get lease end = %d µs, want %d", got.LeaseUntil.UnixMicro(), rec.leaseEnd)
		}
		if (rec.state == "c" || rec.state == "f") && len(rec.fp) <= storekit.MaxFingerprintLen {
			req := storekit.AcquireRequest{Fingerprint: rec.fp, Owner: "fuzz-owner", Lease: time.Second, Retention: time.Minute}
			a, err := store.Acquire(ctx, digest, req)
			if err != nil || a.Outcome != storekit.Replay || a.State != want.State || !bytes.Equal(a.Result, []byte(rec.result)) {
				t.Fatalf("Acquire of a %v record = %v %v result %q, %v; want a replay of %q", want.State, a.Outcome, a.State, a.Result, err, rec.result)
			}
			req.Fingerprint = rec.fp + "x"
			if len(req.Fingerprint) <= storekit.MaxFingerprintLen {
				if a, err := store.Acquire(ctx, digest, req); err != nil || a.Outcome != storekit.Mismatch {
					t.Fatalf("Acquire with another fingerprint = %v, %v; want Mismatch", a.Outcome, err)
				}
			}
		}

		// The replay cache's decoder reads what Get read.
		st, dfp, dres, datt, err := redisstore.DecodeRecord(string(raw))
		if err != nil || st != rec.state || dfp != rec.fp || dres != rec.result || datt != int64(rec.attempts) {
			t.Fatalf("DecodeRecord = %q %q %q %d, %v; want %q %q %q %d", st, dfp, dres, datt, err, rec.state, rec.fp, rec.result, rec.attempts)
		}

		// A torn record: every strict prefix is refused.
		torn := raw[:int(cut)%len(raw)]
		if _, _, _, _, err := redisstore.DecodeRecord(string(torn)); err == nil {
			t.Fatalf("DecodeRecord of the first %d of %d bytes of a record succeeded, want an error", len(torn), len(raw))
		}
		if err := rdb.Set(ctx, name, torn, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if r, err := store.Get(ctx, digest); err == nil {
			t.Fatalf("Get of the first %d of %d bytes of a record = %+v, want an error", len(torn), len(raw), r)
		} else if errors.Is(err, storekit.ErrNotFound) && len(torn) > 0 {
			t.Fatalf("Get of a torn record: %v, want a decoding error", err)
		}

		// Garbage.
		if err := rdb.Set(ctx, name, garbage, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Get(ctx, digest); err == nil && !firstIsOne(garbage) {
			t.Fatalf("Get of %q (not a record) succeeded, want an error", garbage)
		}
		req := storekit.AcquireRequest{Fingerprint: "fp", Owner: "fuzz-owner", Lease: time.Second, Retention: time.Minute}
		if a, err := store.Acquire(ctx, digest, req); err == nil && !firstIsOne(garbage) {
			t.Fatalf("Acquire over %q (not a record) = %v, want an error", garbage, a.Outcome)
		}
	})
}

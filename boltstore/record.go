package boltstore

import (
	"encoding/binary"
	"fmt"

	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/statemachine"
)

// recordVersion is the first byte of every encoded record. A change of the
// layout below gets a new version; decode rejects versions it does not know.
const recordVersion = 1

// record is a key's record as kept on disk. Times are Unix microseconds of
// the store's clock.
type record = statemachine.Record

// Encoding, version 1:
//
//	byte     version (1)
//	byte     state (storekit.State)
//	uvarint  fence
//	uvarint  attempts
//	varint   created
//	varint   leaseUntil
//	varint   expiresAt
//	uvarint  len(fingerprint), fingerprint
//	uvarint  len(owner), owner
//	uvarint  len(result), result
//
// Varints are in their shortest form and nothing may follow the result, so
// that a record has exactly one encoding.

// encode returns r's encoding in a new slice (bolt keeps a reference to the
// value until the transaction ends).
func encode(r *record) []byte {
	n := 2 + 5*binary.MaxVarintLen64 + 3*binary.MaxVarintLen32 + len(r.Fingerprint) + len(r.Owner) + len(r.Result)
	b := make([]byte, 0, n)
	b = append(b, recordVersion, byte(r.State))
	b = binary.AppendUvarint(b, uint64(r.Fence))
	b = binary.AppendUvarint(b, uint64(r.Attempts))
	b = binary.AppendVarint(b, r.Created)
	b = binary.AppendVarint(b, r.LeaseUntil)
	b = binary.AppendVarint(b, r.ExpiresAt)
	b = binary.AppendUvarint(b, uint64(len(r.Fingerprint)))
	b = append(b, r.Fingerprint...)
	b = binary.AppendUvarint(b, uint64(len(r.Owner)))
	b = append(b, r.Owner...)
	b = binary.AppendUvarint(b, uint64(len(r.Result)))
	b = append(b, r.Result...)
	return b
}

// decoder reads the fields of an encoded record; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: record: bad %s", ErrCorrupt, what)
	}
}

func (d *decoder) uvarint(what string, limit uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > limit || (n > 1 && d.b[n-1] == 0) { // only the shortest encoding
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 || (n > 1 && d.b[n-1] == 0) {
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(what string, limit uint64) []byte {
	n := d.uvarint(what+" length", limit)
	if d.err != nil {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.fail(what)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// decode parses an encoded record. With copyResult false the result aliases
// b, which bolt only keeps valid until the end of the transaction.
func decode(b []byte, copyResult bool) (*record, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: record of %d bytes is truncated", ErrCorrupt, len(b))
	}
	if b[0] != recordVersion {
		return nil, fmt.Errorf("%w: record version %d, want %d (written by another version of boltstore?)", ErrCorrupt, b[0], recordVersion)
	}
	r := &record{State: storekit.State(b[1])}
	if r.State < storekit.StateInProgress || r.State > storekit.StateFailed {
		return nil, fmt.Errorf("%w: record: unknown state %d", ErrCorrupt, b[1])
	}
	d := decoder{b: b[2:]}
	r.Fence = int64(d.uvarint("fence", 1<<63-1))
	r.Attempts = int(d.uvarint("attempts", 1<<31-1))
	r.Created = d.varint("created")
	r.LeaseUntil = d.varint("lease end")
	r.ExpiresAt = d.varint("expiry")
	r.Fingerprint = string(d.bytes("fingerprint", storekit.MaxFingerprintLen))
	r.Owner = string(d.bytes("owner", storekit.MaxOwnerLen))
	res := d.bytes("result", 1<<32)
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: record: %d bytes after the result", ErrCorrupt, len(d.b))
	}
	if len(res) > 0 {
		if copyResult {
			res = append([]byte(nil), res...)
		}
		r.Result = res
	}
	return r, nil
}

// expiryKey is the key of r's entry in the expiry index: the expiry time,
// big-endian with the sign bit flipped so that byte order is time order,
// then the store key.
func expiryKey(expiresAt int64, key string) []byte {
	b := make([]byte, 8, 8+len(key))
	binary.BigEndian.PutUint64(b, uint64(expiresAt)^(1<<63))
	return append(b, key...)
}

// parseExpiryKey is the inverse of expiryKey.
func parseExpiryKey(k []byte) (expiresAt int64, key []byte, err error) {
	if len(k) <= 8 {
		return 0, nil, fmt.Errorf("%w: expiry index entry of %d bytes", ErrCorrupt, len(k))
	}
	return int64(binary.BigEndian.Uint64(k) ^ (1 << 63)), k[8:], nil
}

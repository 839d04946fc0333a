package idem

import (
	"fmt"
)

// encodeResult returns the stored form of value under the store key
// storeKey, as Commit would store it (adapterkit.EncodeResult).
func (e *Executor) encodeResult(storeKey string, value []byte) ([]byte, error) {
	if len(value) > e.codec.maxSize {
		return nil, resultTooLarge(len(value), e.codec.maxSize)
	}
	return e.codec.encode(storeKey, value)
}

// resultTooLarge is the error for a result of n bytes over the limit max.
func resultTooLarge(n, max int) error {
	return fmt.Errorf("%w: result of %d bytes is over the limit of %d", ErrResultTooLarge, n, max)
}

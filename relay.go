package idem

import (
	"fmt"
)

// EncodeResult returns the stored form of value under the store key
// storeKey, as Commit would store it: compressed and sealed per the
// Executor's options. It returns an error wrapping ErrResultTooLarge when
// value is over the size limit. It is for completions written outside the
// store (the commit gate), read back with DecodeResult. It is safe for
// concurrent use.
func (e *Executor) EncodeResult(storeKey string, value []byte) ([]byte, error) {
	if len(value) > e.codec.maxSize {
		return nil, resultTooLarge(len(value), e.codec.maxSize)
	}
	return e.codec.encode(storeKey, value)
}

// resultTooLarge is the error for a result of n bytes over the limit max.
func resultTooLarge(n, max int) error {
	return fmt.Errorf("%w: result of %d bytes is over the limit of %d", ErrResultTooLarge, n, max)
}

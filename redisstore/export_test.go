package redisstore

// AcquireSource returns the source of acquire.lua, for tests that call it
// with input the store would refuse.
func AcquireSource() string { return acquireScript.src }

// ReplayCacheHits returns the number of acquires answered from rueidis's
// client-side cache so far, in every store of the process.
func ReplayCacheHits() int64 { return replayCacheHits.Load() }

// DecodeRecord decodes a record as the replay cache does.
func DecodeRecord(v string) (state, fingerprint, result string, attempts int64, err error) {
	var r packedRecord
	err = r.decode(v)
	return r.state, r.fingerprint, r.result, r.attempts, err
}

package redisstore

// AcquireSource returns the source of acquire.lua, for tests that call it
// with input the store would refuse.
func AcquireSource() string { return acquireScript.src }

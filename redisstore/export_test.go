package redisstore

import "context"

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

// FakeNode is a server for CheckServer that answers INFO with info (or
// infoErr).
type FakeNode struct {
	Addr    string
	Info    string
	InfoErr error
}

func (n FakeNode) addr() string                                      { return n.Addr }
func (n FakeNode) info(context.Context) (string, error)              { return n.Info, n.InfoErr }
func (n FakeNode) configGet(context.Context, string) (string, error) { return "", n.InfoErr }

// CheckServer runs the start check of New on nodes with opts.
func CheckServer(ctx context.Context, nodes []FakeNode, opts ...Option) error {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if err := c.validate(); err != nil {
		return err
	}
	ns := make([]node, len(nodes))
	for i, n := range nodes {
		ns[i] = n
	}
	return checkServer(ctx, ns, &c)
}

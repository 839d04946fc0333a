package pgoutbox

// WithAnyOrder makes the relay claim rows without the per-key rule: the
// negative control of the order tests.
func WithAnyOrder() Option { return func(c *config) { c.anyOrder = true } }

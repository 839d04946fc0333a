package sqsconsumer

// SetPlain makes c skip idempotency: the same receive, handle and delete
// loop without the Processor, as the benchmark's baseline.
func SetPlain(c *Consumer) { c.plain = true }

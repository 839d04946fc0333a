package kafka

// Crash simulates a process crash of the consumer: from now on nothing is
// marked or committed, every handler context is cancelled, and Run closes
// the client without a final commit.
func (c *Consumer) Crash() {
	c.crashed.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pt := range c.parts {
		pt.cancel()
	}
}

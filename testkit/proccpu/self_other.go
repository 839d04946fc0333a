//go:build !unix

package proccpu

// Self returns 0 where getrusage is not available: CPU columns stay empty.
func Self() float64 { return 0 }

//go:build !race

package idemgrpc_test

const raceEnabled = false

package chaostest

import (
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p ≤ 100, nearest rank) of ds,
// or 0 for none.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return s[i]
}

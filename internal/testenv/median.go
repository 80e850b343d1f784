package testenv

import "slices"

// Median is the middle of v (the mean of the two middle values for an even
// count; 0 for none), for benchmarks that report a ratio of medians.
func Median[T ~int64 | ~float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

package cowfs

import "testing"

// TestBoundOptionsMustBePositive: a bound of zero or less is refused by
// Open (it would refuse everything, not mean "unbounded"); one is taken.
func TestBoundOptionsMustBePositive(t *testing.T) {
	bounds := map[string]func(int) Option{
		"WithMaxFileBytes":        func(n int) Option { return WithMaxFileBytes(int64(n)) },
		"WithMaxStagedBytes":      func(n int) Option { return WithMaxStagedBytes(int64(n)) },
		"WithMaxOpenTransactions": WithMaxOpenTransactions,
		"WithMaxChanges":          WithMaxChanges,
	}
	for name, opt := range bounds {
		t.Run(name, func(t *testing.T) {
			for _, n := range []int{0, -1} {
				if f, err := Open(t.Context(), t.TempDir(), opt(n)); err == nil {
					f.Close()
					t.Errorf("%s(%d) was accepted", name, n)
				}
			}
			f, err := Open(t.Context(), t.TempDir(), opt(1))
			if err != nil {
				t.Fatalf("%s(1): %v", name, err)
			}
			f.Close()
		})
	}
}

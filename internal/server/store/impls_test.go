package store

import "testing"

// implementations lists what the conformance suite runs on.
func implementations(t *testing.T) []impl {
	return []impl{sqliteImpl()}
}

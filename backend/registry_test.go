package backend_test

import (
	"slices"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	_ "github.com/pulse-agent/pulse/backend/all"
)

// The product's backends register in DESIGN's selection order, whatever
// order their packages initialise in; a second driver of a taken name,
// or one without Open, is a program error found at start.
func TestDriversInSelectionOrder(t *testing.T) {
	var names []string
	for _, d := range backend.Drivers() {
		names = append(names, d.Name)
	}
	if want := []string{"remote", "docker", "namespace", "host", "gvisor"}; !slices.Equal(names, want) {
		t.Errorf("drivers %v, want %v", names, want)
	}
	for _, d := range []backend.Driver{
		{Name: "docker", Open: func(*backend.Config) (backend.Backend, error) { return nil, nil }},
		{Name: "no-open"},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", d.Name)
				}
			}()
			backend.Register(d)
		}()
	}
}

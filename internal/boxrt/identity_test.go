package boxrt

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestIdentityHashesEveryLinkedPackage: every package of this module the
// runtime links is in hashed, so that a change to any code the runtime
// runs changes its identity (and a runtime left from another build is
// never taken for this one's). srchash computes the identity and does
// nothing in a box.
func TestIdentityHashesEveryLinkedPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/pulse-agent/pulse/"
	var want []string
	for _, p := range strings.Fields(string(out)) {
		if rel, ok := strings.CutPrefix(p, mod); ok && rel != "internal/srchash" {
			want = append(want, rel)
		}
	}
	var got []string
	for _, h := range hashed {
		got = append(got, h.name)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("hashed into Identity: %q\nlinked by the runtime: %q", got, want)
	}
}

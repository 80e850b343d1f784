package nsinit

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend/internal/cabundle"
	"github.com/pulse-agent/pulse/backend/internal/denylist"
)

func TestInitIdentity(t *testing.T) {
	id := Identity()
	if !regexp.MustCompile(`^[0-9a-f]{32} (-|v[^ ]+)$`).MatchString(id) {
		t.Fatalf("Identity() = %q, want 32 hex digits and x/sys's version", id)
	}
	if Identity() != id {
		t.Error("Identity changes between calls")
	}
	// Another list of refused ioctls or of CA bundles is another init.
	ioctls := append([]uint32{0x5412}, denylist.TerminalIoctls...)
	if identity(ioctls, cabundle.System) == id {
		t.Error("the identity does not depend on the refused terminal ioctls")
	}
	if identity(denylist.TerminalIoctls, append([]string{"/x/ca.pem"}, cabundle.System...)) == id {
		t.Error("the identity does not depend on the CA bundles")
	}
	if identity(denylist.TerminalIoctls, cabundle.System) != id {
		t.Error("identity of the same lists differs from Identity")
	}
	if err := checkIdentity(""); err != nil {
		t.Errorf("no identity (the parent runs itself): %v", err)
	}
	if err := checkIdentity(id); err != nil {
		t.Errorf("own identity refused: %v", err)
	}
	src, _, _ := strings.Cut(id, " ")
	for _, other := range []string{strings.Repeat("0", 32) + " -", strings.Repeat("0", 32), " -"} {
		if err := checkIdentity(other); err == nil {
			t.Errorf("identity %q accepted", other)
		}
	}
	// x/sys's version is compared when both sides record it.
	if err := checkIdentity(src + " -"); err != nil {
		t.Errorf("a parent that records no dependencies refused: %v", err)
	}
	if err := checkIdentity(src + " v0.0.1/h1:other"); err == nil && !strings.HasSuffix(id, " -") {
		t.Error("a parent with another x/sys accepted")
	}
	// A test binary records no dependencies (its identity ends in "-"),
	// so the comparison of x/sys's versions is checked on identities
	// that both record one.
	own := src + " v0.1.0/h1:own"
	if err := matchIdentity(own, src+" v0.0.1/h1:other"); err == nil {
		t.Error("a parent with another x/sys accepted by an init that records its own")
	}
	if err := matchIdentity(own, own); err != nil {
		t.Errorf("the same x/sys refused: %v", err)
	}
	if err := matchIdentity(own, src+" -"); err != nil {
		t.Errorf("a parent that records no dependencies refused: %v", err)
	}
	if err := matchIdentity(own, strings.Repeat("0", 32)+" v0.1.0/h1:own"); err == nil {
		t.Error("another source with the same x/sys accepted")
	}
	// Every non-test source file of the package is in the hash.
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			if _, err := sources.ReadFile(n); err != nil {
				t.Errorf("%s is not embedded for Identity: %v", n, err)
			}
		}
	}
}

// TestSeccompProgramRequired: an init given no filter program refuses to
// go on rather than run the command unfiltered.
func TestSeccompProgramRequired(t *testing.T) {
	if err := loadSeccomp(nil); err == nil {
		t.Fatal("loadSeccomp accepted an empty program")
	}
	if err := loadSeccomp(make([]unix.SockFilter, 4097)); err == nil {
		t.Fatal("loadSeccomp accepted an oversized program")
	}
}

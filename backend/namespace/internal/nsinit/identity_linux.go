package nsinit

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/pulse-agent/pulse/backend/internal/cabundle"
	"github.com/pulse-agent/pulse/backend/internal/denylist"
	"github.com/pulse-agent/pulse/internal/bridge"
	"github.com/pulse-agent/pulse/internal/pty"
	"github.com/pulse-agent/pulse/internal/srchash"
)

// ProgFd is where the init program's descriptor sits in the init before
// its exec: passed as an extra file (after ConfigFd, StatusFd and
// DialFd), it is exec'd as /proc/self/fd/6, so that the file checked is
// the file run even if the path is replaced meanwhile. The init marks it
// close-on-exec with everything else above stderr, so the command never
// sees it.
const ProgFd = 6

// sources is this package's own source, hashed into Identity. The
// test files are embedded too (a pattern cannot leave them out) but not
// hashed.
//
//go:embed *.go
var sources embed.FS

// Identity names the code of the sandbox init (this package) as built
// into this binary: the Go version and a SHA-256 of the package's source files,
// then golang.org/x/sys's version where the binary records its
// dependencies ("-" where it does not, as test binaries). A separate init
// program checks that the identity its parent sends is its own, and
// refuses to set up a sandbox otherwise (checkIdentity), so that an
// init program left from an older (or newer, or differently patched) build
// beside a new binary never runs a command: its isolation code might not
// be the code the parent was built with.
var Identity = sync.OnceValue(func() string {
	return identity(denylist.TerminalIoctls, cabundle.System)
})

// identity is Identity's hash, over this package's source, the source
// of the packages it runs (the terminal relay and the egress bridge),
// and the data of the leaf packages that the init acts on: the terminal ioctls its
// seccomp filter refuses and the CA bundles it shows, so that an init
// program built with another list is not trusted either.
func identity(ioctls []uint32, bundles []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "go %s\n", runtime.Version())
	fmt.Fprintf(h, "ioctls %x\nbundles %q\n", ioctls, bundles)
	srchash.Write(h, "nsinit", sources)
	srchash.Write(h, "pty", pty.Source)
	srchash.Write(h, "bridge", bridge.Source)
	sys := "-"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "golang.org/x/sys" {
				sys = d.Version + "/" + d.Sum
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16]) + " " + sys
}

// checkIdentity is the init's side: the identity its parent sent
// (empty when the parent runs itself as the init: the same binary, or
// when the parent already trusts this very file) must be its own. With
// nothing to compare, its own is not computed: hashing the embedded
// sources was a few per cent of every init's CPU.
func checkIdentity(parent string) error {
	if parent == "" {
		return nil
	}
	return matchIdentity(Identity(), parent)
}

// matchIdentity is checkIdentity against own. The dependency part is
// compared when both sides know it.
func matchIdentity(own, parent string) error {
	if parent == "" {
		return nil
	}
	src, sys, _ := strings.Cut(own, " ")
	psrc, psys, _ := strings.Cut(parent, " ")
	if psrc == src && (psys == sys || psys == "-" || sys == "-") {
		return nil
	}
	return fmt.Errorf("the init program is not the build of the binary that started it (identity %q, the parent's %q); reinstall both from one build", own, parent)
}

// Package boxrt is the in-box runtime: the code that runs inside a box
// the backend made (a Docker container today) to tell what a command
// changed and to keep the box's own records of its workspace copies, in
// place of the shell, awk, find and md5sum pipelines the backend ran
// there before. It is built into cmd/pulse-runtime, a static program
// (the standard library and golang.org/x/sys, no cgo) that the Docker
// backend injects into each container beside its other tools and runs
// for each step.
//
// The runtime keeps manifests: one line per entry of a tree (the
// workspace's base, a command's copy of it), with what changes when the
// entry does (its raw mode, an MD5 of a file's contents, a symlink's
// target), after a generation line G<n> that every change makes greater,
// so that a copy equal to base at generation n knows it still is while
// the line reads G<n>.
package boxrt

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"runtime"
	"sync"

	"github.com/pulse-agent/pulse/internal/bridge"
	tree "github.com/pulse-agent/pulse/internal/capture"
	"github.com/pulse-agent/pulse/internal/dirent"
	"github.com/pulse-agent/pulse/internal/fsmode"
	"github.com/pulse-agent/pulse/internal/pty"
	"github.com/pulse-agent/pulse/internal/srchash"
)

// Name is the runtime program's name: the file the backend injects, and
// the argv[0] its main answers to.
const Name = "pulse-runtime"

// sources is this package's own source, hashed into Identity.
//
//go:embed *.go
var sources embed.FS

// hashed is every package of this module the runtime links, by its
// import path below the module's.
var hashed = []struct {
	name string
	src  embed.FS
}{
	{"internal/boxrt", sources},
	{"internal/pty", pty.Source},
	{"internal/bridge", bridge.Source},
	{"internal/capture", tree.Source},
	{"internal/dirent", dirent.Source},
	{"internal/fsmode", fsmode.Source},
}

// Identity names the runtime's code as built into this binary: the Go
// version and a SHA-256 of the source files of every package of this
// module it links (hashed; a test holds the list to what go list says).
// The backend injects a runtime program only when the program reports
// the identity of the code the backend was built with (`pulse-runtime
// identity`), so that a program left from another build beside a new
// binary never writes a report the backend would read by other rules.
var Identity = sync.OnceValue(func() string {
	h := sha256.New()
	fmt.Fprintf(h, "go %s\n", runtime.Version())
	for _, p := range hashed {
		srchash.Write(h, p.name, p.src)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
})

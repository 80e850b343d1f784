package namespace

import (
	"os"
	"sync"

	"github.com/pulse-agent/pulse/backend/internal/denylist"
	"github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"
)

// Init turns this process into a sandbox init when the backend started it,
// and returns at once otherwise. Call it first thing in main (and in
// TestMain for test binaries that use this backend). In a sandbox init it
// never returns: it sets the sandbox up, runs the command as its child,
// reports how the command ended to the backend and exits.
//
// It also turns this process into the namespace keeper when a backend with
// WithKeeper started it (keeper_linux.go); then too it never returns.
//
// The init's code is package nsinit, which links nothing of the parent's
// side; cmd/pulse-runtime, the in-box runtime, runs it first (through
// package initprog), and every other program that re-executes itself as
// the init gets it here.
func Init() {
	initCalled.Store(true)
	nsinit.Init()
	if spec, ok := os.LookupEnv(keeperEnv); ok {
		runKeeper(spec) // a keeper started by WithKeeper: never returns
	}
}

// hostLastCap is nsinit.LastCap read once: every init of this process
// gets it in its static config instead of reading /proc itself.
var hostLastCap = sync.OnceValue(nsinit.LastCap)

// deniedSyscalls and namespaceCloneFlags are the list every isolating
// backend shares (see package denylist for why each is there).
var (
	deniedSyscalls      = denylist.Syscalls
	namespaceCloneFlags = denylist.CloneNamespaceFlags
)

package namespace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// InitProgramName is the program the backend runs as each sandbox init
// when it is installed beside the running binary (`go build -o bin/
// ./cmd/...` and `go install ./cmd/...` put it there): cmd/pulse-runtime,
// the one in-box runtime, which links the init's code (package
// internal/nsinit) and the runtime's steps, and nothing of the backend's
// side. Every init is a Go process start, and re-running a large binary
// (the pulse CLI links the Docker client, the MCP SDK and OpenTelemetry)
// pays all of its package initialisation and page faults again before
// Init runs; the small program starts in well under half the time.
//
// It is used only when it can be trusted as much as the running binary,
// and only when it is the same code: see findInitProgram and
// nsinit.Identity. The code is checked by a Probe (selection's, the
// caller's, or the one a backend that found the program and was never
// probed runs before its first Exec: probeForInitProg). Until a probe has
// passed with it, and for any program that embeds the backend without
// installing it, the init is this binary, through /proc/self/exe.
const InitProgramName = "pulse-runtime"

// initArgs is every init's argument list, whichever program it is: what
// a process listing shows for a sandbox's pid 1. The init is chosen by
// its environment (nsinit.Env), not by these.
var initArgs = []string{InitProgramName, "ns-init"}

// initProgram is a separate init program that passed findInitProgram.
type initProgram struct {
	file *os.File // open for reading; run through /proc/self/fd
	path string   // where it was found, for messages
	// key identifies the file for the probe cache: a replaced or
	// rebuilt program probes again.
	key string
}

// The states of a found init program: found (not run yet), on trial (the
// probe runs with it, and each init checks its identity), trusted (a
// probe passed with this very file: this backend's, or the one the probe
// cache records for its key; its inits need not hash their source again,
// the file being the one that was checked, held open).
const (
	progFound = iota
	progTrial
	progTrusted
)

// errNoInitProgram: there is no separate init program to use (none
// installed, or one that is not trusted); the init is this binary.
var errNoInitProgram = errors.New("no separate init program")

// findInitProgram looks for InitProgramName beside the running binary and
// opens it when it is as trustworthy as that binary: a regular file (not
// a symlink), executable, owned by root or by the binary's owner and
// writable by nobody else, in a directory writable by nobody else.
// Whoever could replace such a file could replace the binary itself.
// Whether it is the same code is checked by the init itself (nsinit.Identity).
func findInitProgram() (*initProgram, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoInitProgram, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(exe, &st); err != nil {
		return nil, fmt.Errorf("%w: %v", errNoInitProgram, err)
	}
	return openInitProgram(filepath.Join(filepath.Dir(exe), InitProgramName), st.Uid)
}

// openInitProgram opens path as the init program when it passes the
// checks of findInitProgram, owner being the running binary's owner.
func openInitProgram(path string, owner uint32) (*initProgram, error) {
	trusted := func(what string, st *unix.Stat_t) error {
		if st.Uid != 0 && st.Uid != owner {
			return fmt.Errorf("%w: %s %s is owned by uid %d, neither root nor the binary's owner", errNoInitProgram, what, path, st.Uid)
		}
		if st.Mode&0o022 != 0 {
			return fmt.Errorf("%w: %s %s is writable by group or others (mode %o)", errNoInitProgram, what, path, st.Mode&0o7777)
		}
		return nil
	}
	var dst unix.Stat_t
	if err := unix.Stat(filepath.Dir(path), &dst); err != nil {
		return nil, fmt.Errorf("%w: %v", errNoInitProgram, err)
	}
	if err := trusted("the directory of", &dst); err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoInitProgram, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %v", errNoInitProgram, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 != 0o111 {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s is not an executable regular file", errNoInitProgram, path)
	}
	if err := trusted("", &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// The change time too: it cannot be set back, so a file rewritten in
	// place with its old size and modification time still differs.
	key := fmt.Sprintf("%q %d %d %d %d.%09d %d.%09d", path, st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	return &initProgram{file: os.NewFile(uintptr(fd), path), path: path, key: key}, nil
}

// foundInitProg returns the separate init program found beside the
// binary, nil when there is none or it was dropped. It is looked for once.
func (b *Backend) foundInitProg() *initProgram {
	b.progMu.Lock()
	defer b.progMu.Unlock()
	b.lookInitProgLocked()
	if b.progOff {
		return nil
	}
	return b.prog
}

func (b *Backend) lookInitProgLocked() {
	if b.progLooked {
		return
	}
	b.progLooked = true
	p, err := findInitProgram()
	if err != nil {
		b.o.logger.Debug("namespace: the init is this binary", "why", err.Error())
		return
	}
	b.prog = p
}

// initProg returns the separate init program inits are started from, nil
// when the init is this binary, and whether the init must check that it is
// this build: the program is run only during a probe (checked) and once a
// probe passed with it.
func (b *Backend) initProg() (prog *initProgram, check bool) {
	b.progMu.Lock()
	defer b.progMu.Unlock()
	b.lookInitProgLocked()
	if b.prog == nil || b.progOff || b.progState == progFound {
		return nil, false
	}
	return b.prog, b.progState == progTrial
}

// probeForInitProg probes a backend that found an init program and was
// never probed, before its first Exec: trust in the program comes only
// from a probe that passed with it, and without one every init would be
// this binary, a start that costs several times the program's (a backend
// made by hand and given to sandbox.WithBackend, say, which New does not
// probe). Without a program found there is nothing to gain, and nothing
// is run; after a probe, passed or failed, the program is trusted or
// dropped and this does nothing.
func (b *Backend) probeForInitProg(ctx context.Context) error {
	b.progMu.Lock()
	b.lookInitProgLocked()
	need := b.prog != nil && !b.progOff && b.progState == progFound
	b.progMu.Unlock()
	if !need {
		return nil
	}
	return b.Probe(ctx)
}

// setInitProg moves a found init program to state (progTrial, progTrusted).
func (b *Backend) setInitProg(state int) {
	b.progMu.Lock()
	defer b.progMu.Unlock()
	if b.prog != nil && !b.progOff {
		b.progState = state
	}
}

// dropInitProg stops using the separate init program (it failed the
// probe: another build, or it cannot run here); this binary is the init
// from then on.
func (b *Backend) dropInitProg(why error) {
	b.progMu.Lock()
	defer b.progMu.Unlock()
	if b.prog == nil || b.progOff {
		return
	}
	b.progOff = true
	if why != nil {
		b.o.logger.Warn("namespace: not using the separate init program; the init is this binary", "path", b.prog.path, "err", why)
	} else {
		b.o.logger.Debug("namespace: the separate init program failed an earlier probe; the init is this binary", "path", b.prog.path)
	}
}

// closeInitProg closes the init program's descriptor, once no init can
// be started any more.
func (b *Backend) closeInitProg() {
	b.progMu.Lock()
	defer b.progMu.Unlock()
	if b.prog != nil {
		b.prog.file.Close()
		b.progOff = true
	}
}

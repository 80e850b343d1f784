// Package rtprog finds the in-box runtime program (cmd/pulse-runtime,
// package internal/boxrt) a backend puts into its boxes: the Docker
// backend injects it into every container, the gVisor backend makes it
// its warm sandbox's init. One set of rules, so that a box of either
// backend never runs a program the other would refuse.
//
// Where it comes from, first found:
//   - the backend's WithRuntime path;
//   - pulse-runtime beside the running binary (`make build`, `go build -o
//     bin/ ./cmd/...` and `go install ./cmd/...` put it there), trusted as
//     much as that binary: a regular file, not a symlink, owned by root or
//     by the binary's owner and writable by nobody else, in a directory
//     writable by nobody else;
//   - where the binary was built from a checkout that is still at hand
//     (`go run ./cmd/pulse`, the README's first command, and every test
//     binary: neither has anything beside it), the program built from
//     that checkout with the go command, once per process; the go
//     command's build cache makes every build after the first a link.
//
// Whichever it is, it must be a static ELF program and report the
// identity of the runtime code this binary was built with (boxrt.Identity),
// so that a program left from another build never writes a report a
// backend reads by other rules.
package rtprog

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/internal/boxrt"
)

// ErrNoRuntime: no usable runtime program was found.
var ErrNoRuntime = errors.New("no in-box runtime program")

type runtimeProgram struct {
	once sync.Once
	data []byte
	err  error
}

var runtimePrograms sync.Map // WithRuntime's path ("" for the default) → *runtimeProgram

// Bytes is the runtime program: choice (a backend's WithRuntime path)
// when set, else the program found by the rules of the package comment,
// read and checked once per choice and process. The error wraps
// ErrNoRuntime and says what to install.
func Bytes(choice string) ([]byte, error) {
	v, _ := runtimePrograms.LoadOrStore(choice, &runtimeProgram{})
	rp := v.(*runtimeProgram)
	rp.once.Do(func() { rp.data, rp.err = loadRuntime(choice) })
	return rp.data, rp.err
}

func loadRuntime(choice string) ([]byte, error) {
	if choice != "" {
		return checkRuntime(choice)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoRuntime, err)
	}
	beside := filepath.Join(filepath.Dir(exe), boxrt.Name)
	trustErr := trustedBeside(exe, beside)
	if trustErr == nil {
		return checkRuntime(beside)
	}
	if _, ok := sourceRoot(); ok {
		return buildRuntime()
	}
	return nil, fmt.Errorf("%w: %v (install cmd/pulse-runtime from the same source beside %s: `go install ./cmd/...` or `make build`; or give WithRuntime)", ErrNoRuntime, trustErr, filepath.Base(exe))
}

// trustedBeside checks that prog, beside the binary exe, may be trusted
// as much as exe (see the package comment).
func trustedBeside(exe, prog string) error {
	var est, dst, pst syscall.Stat_t
	if err := syscall.Stat(exe, &est); err != nil {
		return err
	}
	if err := syscall.Stat(filepath.Dir(prog), &dst); err != nil {
		return err
	}
	if err := syscall.Lstat(prog, &pst); err != nil {
		return err
	}
	for _, c := range []struct {
		what string
		st   *syscall.Stat_t
	}{{"the directory of " + prog, &dst}, {prog, &pst}} {
		if c.st.Uid != 0 && c.st.Uid != est.Uid {
			return fmt.Errorf("%s is owned by uid %d, neither root nor the binary's owner", c.what, c.st.Uid)
		}
		if c.st.Mode&0o022 != 0 {
			return fmt.Errorf("%s is writable by group or others", c.what)
		}
	}
	if pst.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return fmt.Errorf("%s is not a regular file", prog)
	}
	return nil
}

// checkRuntime reads the program at p once it is a static ELF program
// reporting this build's runtime identity.
func checkRuntime(p string) ([]byte, error) {
	if !staticELF(p) {
		return nil, fmt.Errorf("%w: %s is not a static ELF program", ErrNoRuntime, p)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoRuntime, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "identity").Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s identity: %v", ErrNoRuntime, p, err)
	}
	if got := strings.TrimSpace(string(out)); got != boxrt.Identity() {
		return nil, fmt.Errorf("%w: %s is another build (runtime identity %q, this binary's %q); install it from the same source", ErrNoRuntime, p, got, boxrt.Identity())
	}
	return data, nil
}

// modulePath is this module's path, as its go.mod names it.
const modulePath = "github.com/pulse-agent/pulse"

// sourceRoot is the checkout this binary was built from, when it is still
// there: the compiler recorded this file's absolute path (builds with
// -trimpath record none), and four directories up is a go.mod naming
// this module, owned by root or by the binary's owner like the program
// beside it would be. The runtime built from it must still report this
// build's identity (checkRuntime), so a checkout edited since is refused.
func sourceRoot() (string, bool) {
	_, file, _, ok := goruntime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", false
	}
	root := filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(file))))
	gomod := filepath.Join(root, "go.mod")
	var st syscall.Stat_t
	if err := syscall.Stat(gomod, &st); err != nil {
		return "", false
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return "", false
	}
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return root, strings.Trim(f[1], `"`) == modulePath
		}
	}
	return "", false
}

// buildRuntime builds cmd/pulse-runtime from the checkout this binary was
// built from, into a directory it removes once the program is read.
func buildRuntime() ([]byte, error) {
	root, ok := sourceRoot()
	if !ok {
		return nil, fmt.Errorf("%w: the source this binary was built from is not at hand", ErrNoRuntime)
	}
	dir, err := os.MkdirTemp("", "pulse-runtime-")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoRuntime, err)
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, boxrt.Name)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", p, modulePath+"/cmd/pulse-runtime")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%w: building cmd/pulse-runtime from %s: %v: %s", ErrNoRuntime, root, err, strings.TrimSpace(errb.String()))
	}
	return checkRuntime(p)
}

// staticELF is whether p is an ELF executable with no program
// interpreter (no dynamic loader to trust inside a box).
func staticELF(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, ph := range f.Progs {
		if ph.Type == elf.PT_INTERP {
			return false
		}
	}
	return f.Type == elf.ET_EXEC || f.Type == elf.ET_DYN
}

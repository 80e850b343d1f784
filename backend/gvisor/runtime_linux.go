//go:build linux

package gvisor

import (
	"bytes"
	"context"
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

// The warm sandbox's init is pulse's in-box runtime (cmd/pulse-runtime,
// its gvserve step). It is found as the Docker backend finds it (see
// backend/docker/runtime.go, whose rules these repeat): WithRuntime's
// path; else pulse-runtime beside the running binary, trusted as much as
// that binary; else, where the binary was built from a checkout still at
// hand (go run, test binaries), built from it once per process. Whichever
// it is must report this build's runtime identity. Without one, commands
// run cold (a sandbox each).

// errNoRuntime: no usable runtime program was found.
var errNoRuntime = errors.New("no in-box runtime program")

var runtimeOnce = struct {
	sync.Mutex
	m map[string]*runtimeProgram
}{m: map[string]*runtimeProgram{}}

type runtimeProgram struct {
	once sync.Once
	data []byte
	err  error
}

// runtimeBytes is the runtime program, read once per choice.
func runtimeBytes(choice string) ([]byte, error) {
	runtimeOnce.Lock()
	rp, ok := runtimeOnce.m[choice]
	if !ok {
		rp = &runtimeProgram{}
		runtimeOnce.m[choice] = rp
	}
	runtimeOnce.Unlock()
	rp.once.Do(func() { rp.data, rp.err = loadRuntime(choice) })
	return rp.data, rp.err
}

func loadRuntime(choice string) ([]byte, error) {
	if choice != "" {
		return checkRuntime(choice)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoRuntime, err)
	}
	beside := filepath.Join(filepath.Dir(exe), boxrt.Name)
	trustErr := trustedBeside(exe, beside)
	if trustErr == nil {
		return checkRuntime(beside)
	}
	if _, ok := sourceRoot(); ok {
		return buildRuntime()
	}
	return nil, fmt.Errorf("%w: %w (install cmd/pulse-runtime from the same source beside %s: `make build`; or give WithRuntime)", errNoRuntime, trustErr, filepath.Base(exe))
}

// trustedBeside: prog and its directory are owned by root or exe's owner
// and writable by nobody else; prog is a regular file.
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
	for _, st := range []*syscall.Stat_t{&dst, &pst} {
		if st.Uid != 0 && st.Uid != est.Uid || st.Mode&0o022 != 0 {
			return fmt.Errorf("%s or its directory is owned by another user or writable by others", prog)
		}
	}
	if pst.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return fmt.Errorf("%s is not a regular file", prog)
	}
	return nil
}

// checkRuntime reads the program at p once it reports this build's
// runtime identity.
func checkRuntime(p string) ([]byte, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoRuntime, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "identity").Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s identity: %w", errNoRuntime, p, err)
	}
	if got := strings.TrimSpace(string(out)); got != boxrt.Identity() {
		return nil, fmt.Errorf("%w: %s is another build (runtime identity %q, this binary's %q)", errNoRuntime, p, got, boxrt.Identity())
	}
	return data, nil
}

const modulePath = "github.com/pulse-agent/pulse"

// sourceRoot is the checkout this binary was built from, when it is still
// there (three directories above this file, a go.mod of this module owned
// by root or this user).
func sourceRoot() (string, bool) {
	_, file, _, ok := goruntime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", false
	}
	root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
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

// buildRuntime builds cmd/pulse-runtime from the checkout.
func buildRuntime() ([]byte, error) {
	root, ok := sourceRoot()
	if !ok {
		return nil, fmt.Errorf("%w: the source this binary was built from is not at hand", errNoRuntime)
	}
	dir, err := os.MkdirTemp("", "pulse-runtime-")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoRuntime, err)
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
		return nil, fmt.Errorf("%w: building cmd/pulse-runtime from %s: %w: %s", errNoRuntime, root, err, strings.TrimSpace(errb.String()))
	}
	return checkRuntime(p)
}

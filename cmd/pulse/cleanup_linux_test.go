package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// `pulse exec` says so when the sandbox could not remove what it set up
// (here the namespace backend's run directory, whose state dir became
// immutable while the command ran): the audit log records it,
// and the person who ran the command is told on stderr, naming what is
// left, instead of a clean-looking exit. Needs root (the immutable flag).
func TestExecWarnsOfWhatCleanupLeftNamespaceRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test makes the state dir immutable")
	}
	nb, err := namespace.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := nb.Probe(t.Context()); err != nil {
		nb.Close()
		testenv.Missing(t, testenv.Namespace, fmt.Sprintf("namespace backend unavailable here: %v", err))
	}
	nb.Close()
	rt := t.TempDir()
	state := filepath.Join(rt, "pulse-namespace")
	must(t, os.Mkdir(state, 0o700))
	t.Setenv("XDG_RUNTIME_DIR", rt)
	// The state dir is made immutable once the run directory is in it, so
	// that the run directory cannot be removed. (A read-only remount is
	// refused while the backend holds a file there open for writing.)
	immutable := func(on bool) error {
		f, err := os.Open(state)
		if err != nil {
			return err
		}
		defer f.Close()
		flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
		if err != nil {
			return err
		}
		const immutableFL = 0x10 // FS_IMMUTABLE_FL of linux/fs.h, which x/sys/unix does not name
		if on {
			flags |= immutableFL
		} else {
			flags &^= immutableFL
		}
		return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags)
	}
	if err := immutable(false); err != nil {
		t.Skipf("the filesystem of %s has no immutable flag: %v", rt, err)
	}
	t.Cleanup(func() {
		if err := immutable(false); err != nil {
			t.Errorf("clearing the immutable flag of %s: %v", state, err)
		}
	})

	const naptime = "3.217"
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stdout, stderr := runCLIEnv(t, map[string]string{"PULSE_KEEP_WARM": "0"},
			"exec", "--backend", "namespace", "--workspace", t.TempDir(), "--", "sleep", naptime)
		done <- result{code, stdout, stderr}
	}()
	// Every run directory exists once the command runs: it is seen
	// running by its arguments, which nothing else on the machine has.
	running := func() bool {
		m, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range m {
			if b, _ := os.ReadFile(p); string(b) == "sleep\x00"+naptime+"\x00" {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(time.Minute); !running() && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	runs, _ := filepath.Glob(filepath.Join(state, "*-*"))
	if len(runs) == 0 {
		r := <-done
		t.Fatalf("no run directory under %s while the command runs: exit %d\n%s", state, r.code, r.stderr)
	}
	if err := immutable(true); err != nil {
		t.Fatalf("making %s immutable: %v", state, err)
	}
	r := <-done
	if r.code != 0 {
		t.Fatalf("exit %d, want the command's 0:\n%s", r.code, r.stderr)
	}
	for _, run := range runs {
		if !strings.Contains(r.stderr, "left behind") || !strings.Contains(r.stderr, filepath.Base(run)) {
			t.Fatalf("stderr does not say that %s was left behind:\n%s", run, r.stderr)
		}
	}
}

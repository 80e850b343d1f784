package namespace

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

// crashHelper runs, outside any sandbox, as a stand-in for a program using
// the backend: it starts a command that beats into args[0]/beat and then
// waits to be killed.
func crashHelper(args []string) error {
	beat, state := args[0], args[1]
	b, err := New(WithStateDir(state), WithReadWriteBind(beat))
	if err != nil {
		return err
	}
	_, err = b.Exec(context.Background(), &backend.Request{Workspace: args[2],
		Shell:  "echo x > inws; while :; do echo x >> " + beat + "/beat; sleep 0.05; done",
		Limits: policyTimeout(time.Minute)})
	return fmt.Errorf("exec returned: %v", err)
}

func init() { helpers["crash"] = crashHelper }

// TestParentCrash: when the process using the backend dies (SIGKILL, no
// cleanup at all), its sandboxed command dies too, and Reconcile in another
// process removes what the crashed run left.
func TestParentCrash(t *testing.T) {
	newBackend(t)
	beat, state, ws := t.TempDir(), filepath.Join(t.TempDir(), "state"), t.TempDir()
	cmd, out, size := startBeatHelper(t, "crash", beat, state, ws)
	waitFor(t, func() bool { return size() > 0 })
	cmd.Process.Kill()
	cmd.Wait()
	// The init notices within a moment; give it one, then the beat must stop.
	var last int64 = -1
	waitFor(t, func() bool {
		s := size()
		same := s == last
		last = s
		time.Sleep(150 * time.Millisecond)
		return same
	})
	s1 := size()
	time.Sleep(300 * time.Millisecond)
	if s2 := size(); s2 != s1 {
		t.Fatalf("the command outlived its crashed parent: beat %d -> %d (helper said %q)", s1, s2, out.String())
	}
	entries, _ := os.ReadDir(state)
	if len(entries) == 0 {
		t.Fatal("the crashed run left no run directory: the test proves nothing about Reconcile")
	}
	b, err := New(WithStateDir(state))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Fatalf("Reconcile left %d run directories of a dead process", len(entries))
	}
}

// startBeatHelper starts helper in a process of its own, with the beat
// directory, state dir and workspace as its arguments; size reads how
// much its command has written to the beat file so far.
func startBeatHelper(t *testing.T, helper, beat, state, ws string) (cmd *exec.Cmd, out *strings.Builder, size func() int64) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(exe, beat, state, ws)
	cmd.Env = []string{helperEnv + "=" + helper, "PATH=/usr/bin:/bin", "GORACE=atexit_sleep_ms=0", "HOME=" + os.Getenv("HOME")}
	out = &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	size = func() int64 {
		st, err := os.Stat(filepath.Join(beat, "beat"))
		if err != nil {
			return 0
		}
		return st.Size()
	}
	return cmd, out, size
}

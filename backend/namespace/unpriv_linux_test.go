package namespace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// unprivHelper runs inside a copy of this test binary started as an
// unprivileged user: it builds a backend, runs a command that writes a
// file, and prints what came back.
func unprivHelper(args []string) error {
	b, err := New()
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.Probe(context.Background()); err != nil {
		fmt.Println("PROBE", err)
		return nil
	}
	var out strings.Builder
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: args[0], Shell: "echo made > f; chmod 000 f; mkdir d; echo x > d/g; chmod 000 d; cat /proc/self/uid_map",
		Stdout: &out, Stderr: &out, Limits: policyTimeout(30 * time.Second)})
	if err != nil {
		return err
	}
	modes := ""
	for _, f := range res.Overlay.Files {
		modes += fmt.Sprintf("%s:%v:%q ", f.Path, f.Mode, f.Data)
	}
	fmt.Printf("EXIT %d FILES %d %sOUT %s", res.ExitCode, len(res.Overlay.Files), modes, out.String())
	return errors.New("done") // runHelper prints "refused: done"; the line above is what counts
}

func init() { helpers["unpriv"] = unprivHelper }

// TestUnprivilegedUser runs the backend as uid 65534, the way an ordinary
// user gets it: only its own uid mapped, no cgroup, no capabilities.
func TestUnprivilegedUser(t *testing.T) {
	s := runUnprivileged(t, "unpriv")
	// Inside, uid 0 is the unprivileged caller: "0 65534 1".
	// Files the command made unreadable (chmod 000) still come back,
	// with the mode it set.
	if !strings.Contains(s, `EXIT 0 FILES 3 d:d---------:"" d/g:-rw-r--r--:"x\n" f:----------:"made\n"`) || !strings.Contains(strings.Join(strings.Fields(s), " "), "0 65534 1") {
		t.Fatalf("unprivileged run: %q", s)
	}
}

// runUnprivileged runs helper in a copy of this test binary as uid 65534,
// the way an ordinary user gets the backend: only its own uid mapped, no
// cgroup, no capabilities. The helper gets a workspace of that user's as
// its argument; its output is returned. It skips where unprivileged user
// namespaces are not allowed (the helper prints PROBE).
func runUnprivileged(t *testing.T, helper string) string {
	t.Helper()
	testenv.MustHaveRoot(t, "starts a process as another user; the other tests already run unprivileged")
	newBackend(t) // skips when namespaces do not work here at all
	const nobody = 65534
	dir, err := os.MkdirTemp("", "pulse-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	bin := filepath.Join(dir, "namespace.test")
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	ws := filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "tmp")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{ws, state} {
		if err := os.Chown(p, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{helperEnv + "=" + helper, "TMPDIR=" + state, "HOME=/nonexistent", "PATH=/usr/bin:/bin", "GORACE=atexit_sleep_ms=0"}
	attr := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	cmd := exec.Command(bin, ws)
	cmd.Env, cmd.SysProcAttr = env, attr
	out, err := cmd.CombinedOutput()
	for i := 0; i < 100 && errors.Is(err, syscall.ETXTBSY); i++ {
		// A process forked elsewhere in this test binary (a prestarted
		// init) can hold the fd we wrote the copy with until it execs.
		time.Sleep(10 * time.Millisecond)
		cmd = exec.Command(bin, ws)
		cmd.Env, cmd.SysProcAttr = env, attr
		out, err = cmd.CombinedOutput()
	}
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	s := string(out)
	if strings.HasPrefix(s, "PROBE") {
		t.Skipf("unprivileged user namespaces are not allowed here: %s", s)
	}
	return s
}

package namespace

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// newBackend returns a probed backend, or skips the test when this machine
// cannot run it, naming why (a failure with PULSE_REQUIRE_NAMESPACE=1).
func newBackend(t testing.TB, opts ...Option) *Backend {
	t.Helper()
	opts = append([]Option{WithStateDir(filepath.Join(t.TempDir(), "state"))}, opts...)
	b, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	testenv.MustHaveNamespace(t, b.Probe)
	return b
}

func runCmd(t *testing.T, b *Backend, req *backend.Request) (*backend.Result, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	req.Stdout, req.Stderr = &out, &errb
	if req.Limits.Timeout == 0 {
		req.Limits.Timeout = 30 * time.Second
	}
	res, err := b.Exec(context.Background(), req)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	return res, out.String(), errb.String()
}

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestExecOutputAndExitCode(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	res, out, errs := runCmd(t, b, &backend.Request{Workspace: ws, Shell: "echo out; echo err >&2; exit 7"})
	if res.ExitCode != 7 || res.Termination != backend.Exited {
		t.Fatalf("exit %d %s, want 7 exited", res.ExitCode, res.Termination)
	}
	if out != "out\n" || errs != "err\n" {
		t.Fatalf("stdout %q stderr %q", out, errs)
	}
	// Pid 1 is the sandbox's init; the command is its child, numbered in
	// the namespace after the init's threads.
	if res.PID <= 1 || res.PID > 64 {
		t.Fatalf("pid %d, want a small pid of the sandbox's own pid namespace", res.PID)
	}
}

func TestExecArgsAndNotFound(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: ws, Args: []string{"printf", "%s|", "a b", "c"}})
	if res.ExitCode != 0 || out != "a b|c|" {
		t.Fatalf("exit %d out %q", res.ExitCode, out)
	}
	res, _, errs := runCmd(t, b, &backend.Request{Workspace: ws, Args: []string{"no-such-command-pulse"}})
	if res.ExitCode != 127 || !strings.Contains(errs, "not found") {
		t.Fatalf("exit %d stderr %q, want 127 not found", res.ExitCode, errs)
	}
}

func TestOverlayCapturesWritesAndWorkspaceUntouched(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "keep.txt"), "keep\n")
	writeFile(t, filepath.Join(ws, "change.txt"), "old\n")
	writeFile(t, filepath.Join(ws, "gone.txt"), "bye\n")
	writeFile(t, filepath.Join(ws, "dir/a"), "a\n")
	writeFile(t, filepath.Join(ws, "dir/b"), "b\n")
	writeFile(t, filepath.Join(ws, "touched"), "same\n")
	writeFile(t, filepath.Join(ws, ".pulse/secret"), "staged\n")
	script := `set -e
echo new > change.txt
printf 'created\n' > new.txt
rm gone.txt
printf '\000\001\377binary' > bin.dat
chmod 755 bin.dat
mkdir -p sub/deep && echo x > sub/deep/x
ln -s keep.txt link
rm -rf dir && mkdir dir && echo c > dir/c
touch touched
ls -A .pulse | wc -l
`
	res, out, errs := runCmd(t, b, &backend.Request{Workspace: ws, Shell: script})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, errs)
	}
	if strings.TrimSpace(out) != "0" {
		t.Fatalf(".pulse visible inside: %q entries", out)
	}
	got := map[string]backend.File{}
	for _, f := range res.Overlay.Files {
		got[f.Path] = f
	}
	want := map[string]struct {
		mode fs.FileMode
		data string
	}{
		"change.txt": {0o644, "new\n"},
		"new.txt":    {0o644, "created\n"},
		"bin.dat":    {0o755, "\x00\x01\xffbinary"},
		"sub":        {fs.ModeDir | 0o755, ""},
		"sub/deep":   {fs.ModeDir | 0o755, ""},
		"sub/deep/x": {0o644, "x\n"},
		"link":       {fs.ModeSymlink, "keep.txt"},
		"dir/c":      {0o644, "c\n"},
	}
	for p, w := range want {
		f, ok := got[p]
		if !ok {
			t.Errorf("overlay lacks %s", p)
			continue
		}
		if f.Mode != w.mode || string(f.Data) != w.data {
			t.Errorf("%s: mode %v data %q, want %v %q", p, f.Mode, f.Data, w.mode, w.data)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected overlay entry %s", p)
		}
	}
	wantDel := []string{"dir/a", "dir/b", "gone.txt"}
	if strings.Join(res.Overlay.Deleted, ",") != strings.Join(wantDel, ",") {
		t.Errorf("deleted %v, want %v", res.Overlay.Deleted, wantDel)
	}
	// The real workspace is exactly as before.
	for p, data := range map[string]string{"change.txt": "old\n", "gone.txt": "bye\n", "dir/a": "a\n", ".pulse/secret": "staged\n"} {
		b, err := os.ReadFile(filepath.Join(ws, p))
		if err != nil || string(b) != data {
			t.Errorf("workspace %s changed: %q %v", p, b, err)
		}
	}
	for _, p := range []string{"new.txt", "bin.dat", "sub", "link", "dir/c"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("workspace gained %s (%v)", p, err)
		}
	}
}

func TestNetworkDenyAllHidesHostLoopback(t *testing.T) {
	b := newBackend(t)
	addr := listen(t)
	ws := t.TempDir()
	// bash's /dev/tcp needs no extra binary.
	probe := "exec 3<>/dev/tcp/" + strings.Replace(addr, ":", "/", 1) + " && echo CONNECTED"
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: ws, Shell: probe, Network: policy.DenyAllNetwork()})
	if strings.Contains(out, "CONNECTED") || res.ExitCode == 0 {
		t.Fatalf("deny-all reached the host listener %s: exit %d out %q", addr, res.ExitCode, out)
	}
	// Loopback inside is up and private.
	res, out, errs := runCmd(t, b, &backend.Request{Workspace: ws, Shell: "cat /sys/class/net/lo/operstate 2>/dev/null; grep -c . /proc/net/dev"})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, errs)
	}
	if n := strings.Fields(out); len(n) == 0 || n[len(n)-1] != "3" {
		t.Fatalf("/proc/net/dev shows more than lo: %q", out)
	}
	// Allow-all shares the host network: the same probe connects.
	res, out, _ = runCmd(t, b, &backend.Request{Workspace: ws, Shell: probe, Network: policy.NetworkPolicy{Mode: policy.NetworkAllowAll}})
	if !strings.Contains(out, "CONNECTED") {
		t.Fatalf("allow-all could not reach %s: exit %d out %q", addr, res.ExitCode, out)
	}
}

// An allowlist is enforced through the egress proxy; without one it is
// refused, never run with the empty network silently standing in.
func TestNetworkAllowlistWithoutEgressRefused(t *testing.T) {
	b := newBackend(t)
	_, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "true",
		Network: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Hosts: []string{"example.com"}}})
	if !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("err %v, want ErrUnsupported", err)
	}
}

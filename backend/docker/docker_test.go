package docker

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// newDocker returns a backend on the engine the environment names, or
// skips the test when none answers or the image is missing — unless
// PULSE_REQUIRE_DOCKER=1, where that is a failure (testenv.MustHaveDocker).
func newDocker(t testing.TB, opts ...Option) *Backend {
	t.Helper()
	b, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	testenv.MustHaveDocker(t, b.Probe)
	return b
}

func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type run struct {
	res            *backend.Result
	stdout, stderr string
}

func execShell(t testing.TB, b *Backend, ws, script string, mod ...func(*backend.Request)) run {
	t.Helper()
	var out, errb bytes.Buffer
	req := &backend.Request{
		ExecutionID: "test",
		Workspace:   ws,
		Shell:       script,
		Stdout:      &out,
		Stderr:      &errb,
		Network:     policy.DenyAllNetwork(),
	}
	for _, m := range mod {
		m(req)
	}
	res, err := b.Exec(context.Background(), req)
	if err != nil {
		t.Fatalf("Exec(%q): %v", script, err)
	}
	return run{res, out.String(), errb.String()}
}

func TestDockerExecOutputAndExitCode(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	r := execShell(t, b, ws, `echo out; echo err >&2; id -u; exit 7`)
	if r.res.ExitCode != 7 || r.res.Termination != backend.Exited {
		t.Fatalf("exit = %d (%s), want 7 exited; stderr %q", r.res.ExitCode, r.res.Termination, r.stderr)
	}
	out, uid, _ := strings.Cut(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if out != "out" || !commandUID(uid) || r.stderr != "err\n" {
		t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
	}
	if !r.res.Overlay.Empty() {
		t.Fatalf("a command that writes nothing has overlay %+v", r.res.Overlay)
	}
}

func TestDockerOverlayIsExactAndHostUntouched(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{
		"keep.txt":       "same\n",
		"change.txt":     "old\n",
		"gone.txt":       "bye\n",
		"dir/inner.txt":  "inner\n",
		"mode.sh":        "#!/bin/sh\n",
		".pulse/state":   "private\n",
		"olddir/a/b.txt": "b\n",
	})
	before := snapshot(t, ws)

	r := execShell(t, b, ws, `set -e
printf 'new\0bin\n' > change.txt
rm gone.txt
mkdir -p newdir/sub && printf x > newdir/sub/f
chmod 755 mode.sh
ln -s keep.txt link
rm -r olddir
mkdir .pulse && echo leak > .pulse/state
touch keep.txt`)
	if r.res.ExitCode != 0 {
		t.Fatalf("exit %d, stderr %q", r.res.ExitCode, r.stderr)
	}
	got := map[string]backend.File{}
	for _, f := range r.res.Overlay.Files {
		got[f.Path] = f
	}
	want := map[string]backend.File{
		"change.txt":   {Path: "change.txt", Mode: 0o644, Data: []byte("new\x00bin\n")},
		"newdir":       {Path: "newdir", Mode: fs.ModeDir | 0o755},
		"newdir/sub":   {Path: "newdir/sub", Mode: fs.ModeDir | 0o755},
		"newdir/sub/f": {Path: "newdir/sub/f", Mode: 0o644, Data: []byte("x")},
		"mode.sh":      {Path: "mode.sh", Mode: 0o755, Data: []byte("#!/bin/sh\n")},
		"link":         {Path: "link", Mode: fs.ModeSymlink | 0o777, Data: []byte("keep.txt")},
	}
	if len(got) != len(want) {
		t.Errorf("overlay files %v, want %v", keys(got), keys(want))
	}
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			t.Errorf("overlay misses %s", p)
			continue
		}
		if g.Mode != w.Mode || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("%s: got mode %v data %q, want mode %v data %q", p, g.Mode, g.Data, w.Mode, w.Data)
		}
	}
	wantDeleted := []string{"gone.txt", "olddir", "olddir/a", "olddir/a/b.txt"}
	if strings.Join(r.res.Overlay.Deleted, ",") != strings.Join(wantDeleted, ",") {
		t.Errorf("deleted %v, want %v", r.res.Overlay.Deleted, wantDeleted)
	}
	if after := snapshot(t, ws); after != before {
		t.Fatalf("host workspace changed:\nbefore %s\nafter  %s", before, after)
	}

	// The next command sees the workspace plus the pending stack it is
	// given (none here), and nothing else: the first command's writes,
	// kept nowhere, are not in its view, and its own overlay holds only
	// what it changed.
	r2 := execShell(t, b, ws, `cat change.txt; test -e gone.txt && echo back; test ! -e newdir && echo clean; echo more >> change.txt`)
	if r2.stdout != "old\nback\nclean\n" {
		t.Fatalf("second command saw %q", r2.stdout)
	}
	if len(r2.res.Overlay.Files) != 1 || r2.res.Overlay.Files[0].Path != "change.txt" || string(r2.res.Overlay.Files[0].Data) != "old\nmore\n" || len(r2.res.Overlay.Deleted) != 0 {
		t.Fatalf("second overlay %+v", r2.res.Overlay)
	}
}

func keys(m map[string]backend.File) []string {
	var k []string
	for p := range m {
		k = append(k, p)
	}
	return k
}

// snapshot is a byte-exact description of a directory tree.
func snapshot(t testing.TB, dir string) string {
	t.Helper()
	var sb strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		sb.WriteString(rel + " " + info.Mode().String() + " " + info.ModTime().String())
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sb.WriteString(" " + string(data))
		}
		sb.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

// An allowlist without the egress proxy is refused: the empty network
// never stands in for it silently.
func TestDockerAllowlistWithoutEgressIsRefused(t *testing.T) {
	b, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Args: []string{"true"},
		Network: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Hosts: []string{"example.com"}}})
	if !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("allowlist: err = %v, want ErrUnsupported", err)
	}
	want := policy.Unsupported
	if os.Geteuid() == 0 {
		want = policy.Strong
	}
	if lvl := b.Capabilities().NetworkLevel(policy.NetworkAllowlist); lvl != want {
		t.Fatalf("allowlist capability %q, want %q", lvl, want)
	}
}

func TestDockerOverlayOddNames(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"has space.txt": "1", "-dash": "2", "quote'd": "3"})
	r := execShell(t, b, ws, `set -e
echo x >> 'has space.txt'; echo y >> ./-dash; rm "quote'd"
printf u > 'ünï cödé'; ln -s 'has space.txt' 'link -> arrow'; mkdir 'd i r'`)
	if r.res.ExitCode != 0 {
		t.Fatalf("exit %d, stderr %q", r.res.ExitCode, r.stderr)
	}
	got := map[string]string{}
	for _, f := range r.res.Overlay.Files {
		got[f.Path] = f.Mode.String() + " " + string(f.Data)
	}
	want := map[string]string{
		"has space.txt": "-rw-r--r-- 1x\n",
		"-dash":         "-rw-r--r-- 2y\n",
		"ünï cödé":      "-rw-r--r-- u",
		"link -> arrow": "Lrwxrwxrwx has space.txt",
		"d i r":         "drwxr-xr-x ",
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%q: got %q, want %q", p, got[p], w)
		}
	}
	if len(got) != len(want) || len(r.res.Overlay.Deleted) != 1 || r.res.Overlay.Deleted[0] != "quote'd" {
		t.Errorf("overlay %v deleted %v", got, r.res.Overlay.Deleted)
	}
}

// A command whose changes the wrapper cannot list (here a directory whose
// name holds a newline, with a file in it) ran: Exec says its writes were
// lost, with its exit status, and hands on none of them — not an empty
// overlay that reads as a command that wrote nothing, which lost ok.txt.
func TestDockerUnlistableChangesAreLostNotEmpty(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"a.txt": "a\n"})
	var errb bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{
		ExecutionID: "test",
		Workspace:   ws,
		Shell:       `d="$(printf 'x\ny')"; mkdir "$d" && echo f > "$d/f" && echo kept > ok.txt; exit 3`,
		Stderr:      &errb,
		Network:     policy.DenyAllNetwork(),
	})
	if !errors.Is(err, backend.ErrOverlayLost) {
		t.Fatalf("Exec: err = %v, want ErrOverlayLost; stderr %q", err, errb.String())
	}
	if res == nil {
		t.Fatal("Exec returned no Result with ErrOverlayLost")
	}
	if res.Overlay != nil {
		t.Errorf("a lost overlay is handed on: %+v", res.Overlay)
	}
	if res.ExitCode != 3 {
		t.Errorf("exit code %d, want the command's 3", res.ExitCode)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "a.txt")); err != nil || string(b) != "a\n" {
		t.Errorf("workspace touched: a.txt %q, %v", b, err)
	}
	// The next command starts from the workspace, not from the lost writes.
	r := execShell(t, b, ws, `ls -A`)
	if r.stdout != "a.txt\n" {
		t.Errorf("the next command sees %q, want only a.txt", r.stdout)
	}
}

// A file or directory whose name holds a newline, which the wrapper's
// line-based listings cannot carry, is reported (mode fs.ModeIrregular,
// which the facade lists as not staged), not dropped from the overlay as
// though the command had never written it; what else it wrote is staged.
// A later command, which does not touch such a name, reports none.
func TestDockerNewlineNameReportedNotDropped(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"a.txt": "a\n"})
	r := execShell(t, b, ws, `echo x > "$(printf 'a\nb')"; mkdir "$(printf 'e\nd')"; mkdir sub; echo z > "sub/$(printf 'f\ng')"; echo y > ok.txt`)
	if r.res.ExitCode != 0 || r.res.Overlay == nil {
		t.Fatalf("exit %d, overlay %v; stderr %q", r.res.ExitCode, r.res.Overlay, r.stderr)
	}
	got := map[string]fs.FileMode{}
	for _, f := range r.res.Overlay.Files {
		got[f.Path] = f.Mode
	}
	want := map[string]fs.FileMode{
		"a\nb":     fs.ModeIrregular,
		"e\nd":     fs.ModeIrregular,
		"sub":      fs.ModeDir | 0o755,
		"sub/f\ng": fs.ModeIrregular,
		"ok.txt":   0o644,
	}
	for p, m := range want {
		if g, ok := got[p]; !ok || g&(fs.ModeType|fs.ModePerm) != m {
			t.Errorf("%q: mode %v (listed %v), want %v", p, g, ok, m)
		}
	}
	if len(got) != len(want) || len(r.res.Overlay.Deleted) != 0 {
		t.Errorf("overlay %v, deleted %v; want %v", got, r.res.Overlay.Deleted, want)
	}
	next := execShell(t, b, ws, `ls -A; echo w > ok2.txt`)
	if next.stdout != "a.txt\n" {
		t.Errorf("the next command sees %q, want only a.txt", next.stdout)
	}
	if o := next.res.Overlay; o == nil || len(o.Files) != 1 || o.Files[0].Path != "ok2.txt" || len(o.Deleted) != 0 {
		t.Errorf("the next command's overlay %+v, want ok2.txt alone", o)
	}
}

// A workspace entry whose name holds a newline, there before any command
// ran, is never reported as deleted or changed by a command that does not
// touch it: the line-based manifests split "p\nq" into "./p" and "q", and
// the wrapper took "./p" for an entry the command had removed, so every
// command staged the deletion of p (with p a real file too, its commit
// lost it). Such entries are left out of the container (they read as
// absent, like a hidden path), so no listing ever holds a part of one;
// nor is anything warned.
func TestDockerNewlineNameInWorkspaceNotStaged(t *testing.T) {
	b := newDocker(t)
	for _, withP := range []bool{false, true} {
		ws := t.TempDir()
		files := map[string]string{
			"a.txt":                             "a\n",
			"p\nq":                              "x",
			"d\ne/f":                            "f",
			"sub/r\nS81a4|regular file|./a.txt": "s",
		}
		if withP {
			files["p"] = "keep"
		}
		writeFiles(t, ws, files)
		for i, script := range []string{`true`, `echo y > other`, `echo z >> a.txt`, `true`} {
			r := execShell(t, b, ws, script)
			if r.res.ExitCode != 0 || r.res.Overlay == nil {
				t.Fatalf("p %v, %q: exit %d, overlay %v; stderr %q", withP, script, r.res.ExitCode, r.res.Overlay, r.stderr)
			}
			var got []string
			for _, f := range r.res.Overlay.Files {
				got = append(got, f.Path)
			}
			want := [][]string{nil, {"other"}, {"a.txt"}, nil}[i]
			if len(r.res.Overlay.Deleted) != 0 || strings.Join(got, "\x00") != strings.Join(want, "\x00") {
				t.Errorf("p %v, %q: overlay files %q deleted %q, want only %q", withP, script, got, r.res.Overlay.Deleted, want)
			}
			if strings.Contains(r.stderr, "pulse: docker:") {
				t.Errorf("p %v, %q: warned %q", withP, script, r.stderr)
			}
		}
	}
}

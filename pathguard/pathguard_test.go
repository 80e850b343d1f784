//go:build unix

package pathguard

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// workspace builds a root with some files, and a sibling "outside"
// directory holding a secret, so that escapes have something to find.
func workspace(t *testing.T) (root, outside string) {
	t.Helper()
	top := t.TempDir()
	root = filepath.Join(top, "root")
	outside = filepath.Join(top, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "sub", "deep")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(outside, "secret"), "SECRET")
	write(t, filepath.Join(root, "a.txt"), "alpha")
	write(t, filepath.Join(root, "sub", "deep", "b.txt"), "beta")
	return root, outside
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func newGuard(t *testing.T, root string, opts ...Option) *Guard {
	t.Helper()
	g, err := New(root, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestResolveAccepts(t *testing.T) {
	root, _ := workspace(t)
	symlink(t, "sub/deep/b.txt", filepath.Join(root, "inlink"))
	symlink(t, "deep", filepath.Join(root, "sub", "dlink"))
	symlink(t, filepath.Join(root, "a.txt"), filepath.Join(root, "abslink"))
	symlink(t, "../a.txt", filepath.Join(root, "sub", "up"))
	g := newGuard(t, root)
	real := g.Root()
	tests := []struct{ in, want string }{
		{"a.txt", "a.txt"},
		{"./a.txt", "a.txt"},
		{".", ""},
		{"sub/../a.txt", "a.txt"},
		{"new/file.txt", "new/file.txt"},
		{filepath.Join(root, "a.txt"), "a.txt"},
		{"inlink", "sub/deep/b.txt"},
		{"sub/dlink/b.txt", "sub/deep/b.txt"},
		{"abslink", "a.txt"},
		{"sub/up", "a.txt"},
		{"a.txt/x", "a.txt/x"}, // not a directory: cannot exist, stays inside
	}
	for _, tt := range tests {
		got, err := g.Resolve(tt.in)
		if err != nil {
			t.Errorf("Resolve(%q): %v", tt.in, err)
			continue
		}
		if want := filepath.Join(real, tt.want); got != want {
			t.Errorf("Resolve(%q) = %q, want %q", tt.in, got, want)
		}
	}
}

func TestResolveRefuses(t *testing.T) {
	root, outside := workspace(t)
	symlink(t, filepath.Join(outside, "secret"), filepath.Join(root, "abs-out"))
	symlink(t, "../outside/secret", filepath.Join(root, "rel-out"))
	symlink(t, outside, filepath.Join(root, "dir-out"))
	symlink(t, "/proc/self/root"+outside+"/secret", filepath.Join(root, "proc"))
	symlink(t, "../../root/a.txt", filepath.Join(root, "sub", "out-and-back"))
	symlink(t, "loop2", filepath.Join(root, "loop1"))
	symlink(t, "loop1", filepath.Join(root, "loop2"))
	symlink(t, "/", filepath.Join(root, "slash"))
	g := newGuard(t, root)
	tests := []struct{ name, in string }{
		{"dotdot", "../outside/secret"},
		{"deep dotdot", "sub/deep/../../../outside/secret"},
		{"absolute elsewhere", filepath.Join(outside, "secret")},
		{"etc", "/etc/passwd"},
		{"proc self", "/proc/self/root" + root + "/a.txt"},
		{"final symlink absolute", "abs-out"},
		{"final symlink relative", "rel-out"},
		{"intermediate symlink", "dir-out/secret"},
		{"proc indirection", "proc"},
		{"relative target leaving and re-entering", "sub/out-and-back"},
		{"symlink loop", "loop1"},
		{"symlink to slash", "slash/etc/passwd"},
		{"NUL", "a.txt\x00/../../etc"},
		{"empty", ""},
		{"long name", strings.Repeat("n", MaxNameLen+1)},
		{"long path", strings.Repeat("d/", MaxPathLen/2+1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := g.Resolve(tt.in)
			if !errors.Is(err, ErrOutside) {
				t.Fatalf("Resolve(%q) = %q, %v; want ErrOutside", tt.in, got, err)
			}
			if strings.Contains(err.Error(), outside) && !strings.Contains(tt.in, outside) {
				t.Errorf("error leaks host path outside the root: %v", err)
			}
			var pe *PathError
			if !errors.As(err, &pe) || pe.Path != tt.in {
				t.Errorf("error does not name the path: %v", err)
			}
		})
	}
}

func TestRelAndRoot(t *testing.T) {
	root, _ := workspace(t)
	g := newGuard(t, root)
	for in, want := range map[string]string{".": ".", "sub/deep/b.txt": "sub/deep/b.txt", filepath.Join(root, "a.txt"): "a.txt"} {
		got, err := g.Rel(in)
		if err != nil || got != want {
			t.Errorf("Rel(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := g.Rel("../x"); !errors.Is(err, ErrOutside) {
		t.Errorf("Rel(../x) err = %v, want ErrOutside", err)
	}
	if !filepath.IsAbs(g.Root()) {
		t.Errorf("Root() = %q, not absolute", g.Root())
	}
}

func TestRootThroughSymlink(t *testing.T) {
	root, _ := workspace(t)
	alias := filepath.Join(t.TempDir(), "alias")
	symlink(t, root, alias)
	g := newGuard(t, alias)
	got, err := g.Resolve(filepath.Join(alias, "a.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(g.Root(), "a.txt"); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	data, err := g.ReadFile(filepath.Join(alias, "a.txt"))
	if err != nil || string(data) != "alpha" {
		t.Errorf("ReadFile = %q, %v", data, err)
	}
}

func TestNewRefuses(t *testing.T) {
	root, _ := workspace(t)
	for name, dir := range map[string]string{
		"missing": filepath.Join(root, "nope"),
		"file":    filepath.Join(root, "a.txt"),
		"proc":    "/proc/self",
		"empty":   "",
	} {
		if _, err := New(dir); err == nil {
			t.Errorf("New(%s) succeeded", name)
		}
	}
	if _, err := New(root, WithMaxFileSize(0)); err == nil {
		t.Error("WithMaxFileSize(0) accepted")
	}
	if _, err := New(root, WithExternalReads(filepath.Join(root, "nope"))); err == nil {
		t.Error("missing external directory accepted")
	}
	if _, err := New(root, WithLogger(nil)); err == nil {
		t.Error("nil logger accepted")
	}
}

func TestIsReserved(t *testing.T) {
	for in, want := range map[string]bool{
		".pulse": true, ".pulse/tx/1": true, "./.pulse/x": true, "/.pulse": true,
		".PULSE/x": true, "a/../.pulse/x": true,
		".pulsex": false, "a/.pulse": false, "pulse": false, ".": false, "": false,
	} {
		if got := IsReserved(in); got != want {
			t.Errorf("IsReserved(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestReadFile(t *testing.T) {
	root, outside := workspace(t)
	symlink(t, "sub/deep/b.txt", filepath.Join(root, "inlink"))
	symlink(t, filepath.Join(outside, "secret"), filepath.Join(root, "out"))
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	write(t, filepath.Join(root, "big"), strings.Repeat("x", 101))
	write(t, filepath.Join(root, "limit"), strings.Repeat("x", 100))
	g := newGuard(t, root, WithMaxFileSize(100))

	tests := []struct {
		in   string
		want string
		err  error
	}{
		{"a.txt", "alpha", nil},
		{"inlink", "beta", nil},
		{"limit", strings.Repeat("x", 100), nil},
		{"big", "", ErrTooLarge},
		{"fifo", "", ErrNotRegular},
		{"sock", "", ErrNotRegular},
		{"sub", "", ErrNotRegular},
		{".", "", ErrNotRegular},
		{"/dev/null", "", ErrOutside},
		{"out", "", ErrOutside},
		{"../outside/secret", "", ErrOutside},
		{"missing", "", os.ErrNotExist},
	}
	for _, tt := range tests {
		data, err := g.ReadFile(tt.in)
		if tt.err == nil {
			if err != nil || string(data) != tt.want {
				t.Errorf("ReadFile(%q) = %q, %v; want %q", tt.in, data, err, tt.want)
			}
			continue
		}
		if !errors.Is(err, tt.err) {
			t.Errorf("ReadFile(%q) err = %v, want %v", tt.in, err, tt.err)
		}
		if data != nil {
			t.Errorf("ReadFile(%q) returned data with an error", tt.in)
		}
	}
}

func TestReadDevice(t *testing.T) {
	// A device node inside the root needs mknod; /dev itself works as an
	// external read directory and holds real devices.
	root, _ := workspace(t)
	g := newGuard(t, root, WithExternalReads("/dev"))
	if _, err := g.ReadFile("/dev/null"); !errors.Is(err, ErrNotRegular) {
		t.Errorf("ReadFile(/dev/null) err = %v, want ErrNotRegular", err)
	}
	if _, err := g.ReadFile("/dev/zero"); !errors.Is(err, ErrNotRegular) {
		t.Errorf("ReadFile(/dev/zero) err = %v, want ErrNotRegular", err)
	}
}

func TestExternalReads(t *testing.T) {
	root, outside := workspace(t)
	symlink(t, "../root/a.txt", filepath.Join(outside, "back-into-root"))
	g := newGuard(t, root, WithExternalReads(outside))
	data, err := g.ReadFile(filepath.Join(outside, "secret"))
	if err != nil || string(data) != "SECRET" {
		t.Fatalf("external read = %q, %v", data, err)
	}
	if _, err := g.Resolve(filepath.Join(outside, "secret")); !errors.Is(err, ErrOutside) {
		t.Errorf("Resolve allowed an external path: %v", err)
	}
	if err := g.WriteFile(filepath.Join(outside, "new"), []byte("x"), 0o644); !errors.Is(err, ErrOutside) {
		t.Errorf("WriteFile allowed an external path: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Error("file written under an external read directory")
	}
	// A symlink in an external directory may not hop to another base.
	if _, err := g.ReadFile(filepath.Join(outside, "back-into-root")); !errors.Is(err, ErrOutside) {
		t.Errorf("cross-base symlink err = %v, want ErrOutside", err)
	}
}

func TestOpenFIFODoesNotBlock(t *testing.T) {
	// Opening a FIFO for reading without O_NONBLOCK waits for a writer
	// forever. Open runs in a goroutine; the test fails (by the suite
	// timeout, not a wall-clock assertion) if it never returns.
	root, _ := workspace(t)
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := newGuard(t, root)
	done := make(chan error, 1)
	go func() {
		f, err := g.Open("fifo")
		if f != nil {
			f.Close()
		}
		done <- err
	}()
	if err := <-done; !errors.Is(err, ErrNotRegular) {
		t.Fatalf("Open(fifo) err = %v, want ErrNotRegular", err)
	}
}

func TestWriteFile(t *testing.T) {
	root, outside := workspace(t)
	symlink(t, filepath.Join(outside, "secret"), filepath.Join(root, "out"))
	symlink(t, "a.txt", filepath.Join(root, "inlink"))
	symlink(t, outside, filepath.Join(root, "dir-out"))
	g := newGuard(t, root)

	if err := g.WriteFile("a.txt", []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "a.txt")); string(got) != "new" {
		t.Errorf("a.txt = %q", got)
	}
	fi, err := os.Stat(filepath.Join(root, "a.txt"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, %v; want 0600", fi.Mode(), err)
	}
	if err := g.WriteFile("x/y/z.bin", []byte{0, 1, 2, 0xff}, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "x/y/z.bin")); !bytes.Equal(got, []byte{0, 1, 2, 0xff}) {
		t.Errorf("z.bin = %v", got)
	}
	// No temporary files are left behind.
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}

	refusals := []struct {
		in  string
		err error
	}{
		{"out", ErrNotRegular},
		{"inlink", ErrNotRegular},
		{"sub", ErrNotRegular},
		{".", ErrNotRegular},
		{"dir-out/new", ErrOutside},
		{"../outside/new", ErrOutside},
		{filepath.Join(outside, "new"), ErrOutside},
		{"a\x00b", ErrOutside},
	}
	for _, tt := range refusals {
		if err := g.WriteFile(tt.in, []byte("pwned"), 0o644); !errors.Is(err, tt.err) {
			t.Errorf("WriteFile(%q) err = %v, want %v", tt.in, err, tt.err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(outside, "secret")); string(got) != "SECRET" {
		t.Errorf("outside file changed: %q", got)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a file was created outside the root")
	}
	if got, _ := os.ReadFile(filepath.Join(root, "a.txt")); string(got) != "new" {
		t.Errorf("write through in-root symlink changed its target: %q", got)
	}
}

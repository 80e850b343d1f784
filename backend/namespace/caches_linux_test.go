package namespace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// TestCacheMountedReadWrite: a command writes into a cache at its Path,
// the write lands in the host directory and not in the overlay, and the
// next command (another sandbox) reads it.
func TestCacheMountedReadWrite(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	host := t.TempDir()
	caches := []backend.Cache{{Name: "go-build", HostDir: host, Path: "/cache/go-build", Env: "GOCACHE"}}
	res, _, stderr := runCmd(t, b, &backend.Request{Workspace: ws, Caches: caches,
		Shell: "echo built > /cache/go-build/obj && mkdir -p /cache/go-build/d/e && echo x > /cache/go-build/d/e/f && echo ws > w.txt"})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(host, "obj")); err != nil || string(b) != "built\n" {
		t.Fatalf("host cache file = %q, %v", b, err)
	}
	for _, f := range res.Overlay.Files {
		if strings.Contains(f.Path, "cache") || strings.Contains(f.Path, "obj") {
			t.Errorf("a cache write is in the overlay: %s", f.Path)
		}
	}
	if len(res.Overlay.Files) != 1 || res.Overlay.Files[0].Path != "w.txt" {
		t.Errorf("overlay = %+v, want w.txt alone", res.Overlay.Files)
	}
	res, stdout, stderr := runCmd(t, b, &backend.Request{Workspace: ws, Caches: caches, Shell: "cat /cache/go-build/obj /cache/go-build/d/e/f"})
	if res.ExitCode != 0 || stdout != "built\nx\n" {
		t.Fatalf("second command: exit %d, stdout %q, stderr %s", res.ExitCode, stdout, stderr)
	}
	// Without the cache the path does not exist, and writing beside a
	// cache is still refused.
	res, _, _ = runCmd(t, b, &backend.Request{Workspace: ws, Shell: "test -e /cache/go-build/obj"})
	if res.ExitCode == 0 {
		t.Error("the cache is visible to a command that did not mount it")
	}
	res, _, _ = runCmd(t, b, &backend.Request{Workspace: ws, Caches: caches, Shell: "echo x > /cache/other"})
	if res.ExitCode == 0 {
		t.Error("a command wrote beside its cache")
	}
}

func TestCacheRefusesBadRequests(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	host := t.TempDir()
	bad := map[string][]backend.Cache{
		"in workspace view":  {{Name: "a", HostDir: host, Path: ws + "/c"}},
		"around workspace":   {{Name: "a", HostDir: host, Path: filepath.Dir(ws)}},
		"system dir":         {{Name: "a", HostDir: host, Path: "/usr/lib/x"}},
		"relative host dir":  {{Name: "a", HostDir: "rel", Path: "/cache/a"}},
		"missing host dir":   {{Name: "a", HostDir: filepath.Join(host, "nope"), Path: "/cache/a"}},
		"host dir in ws":     {{Name: "a", HostDir: ws, Path: "/cache/a"}},
		"overlapping caches": {{Name: "a", HostDir: host, Path: "/cache/a"}, {Name: "b", HostDir: host, Path: "/cache/a/b"}},
		"bad name":           {{Name: "A/B", HostDir: host, Path: "/cache/a"}},
		"comma in path":      {{Name: "a", HostDir: host, Path: "/cache/a,b"}},
	}
	for name, cs := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Caches: cs, Shell: "true"})
			if !errors.Is(err, backend.ErrInvalidRequest) {
				t.Fatalf("Exec = %v, want ErrInvalidRequest", err)
			}
		})
	}
}

package main

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// testGoModulesFromMirror: a Go module mirror served on this machine's
// 127.0.0.1 (a GOPROXY directory behind a test HTTP server) reaches `go
// mod download` in the sandbox through the allowlist (--allow-host
// 127.0.0.1:PORT: nothing else, and nothing leaves the machine); the
// module cache, a `caches:` entry of the policy, keeps what it fetched,
// so a later command builds its package list offline, with the network
// denied and GOPROXY=off.
func testGoModulesFromMirror(t *testing.T, goBin string, flags ...string) {
	dir, gosum := testenv.GoMirror(t)
	var hits atomic.Int64
	files := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		files.ServeHTTP(w, r)
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()

	ws := t.TempDir()
	for name, data := range testenv.GoMirrorApp(gosum) {
		must(t, os.WriteFile(filepath.Join(ws, name), []byte(data), 0o644))
	}
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	must(t, os.WriteFile(pol, []byte("version: 1\ncaches:\n  - {name: go-mod, env: GOMODCACHE}\n  - {name: go-build, env: GOCACHE}\n"), 0o644))
	root := t.TempDir()
	t.Cleanup(func() { makeWritable(root) }) // Go leaves its module cache read-only
	t.Setenv("PULSE_CACHE_DIR", root)
	env := []string{"--env", "HOME=/tmp", "--env", "GOTOOLCHAIN=local", "--env", "GOTELEMETRY=off", "--env", "GOFLAGS=-mod=readonly"}
	args := append(append(append([]string{"exec", "--workspace", ws, "--policy", pol}, flags...), env...),
		"--allow-host", addr, "--env", "GOPROXY=http://"+addr, "--", goBin, "mod", "download", "-x")
	code, stdout, stderr := runCLI(t, args...)
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != 0 || hits.Load() == 0 {
		t.Fatalf("go mod download through the allowlist: exit %d, %d requests to the mirror\nstdout %q\nstderr %q", code, hits.Load(), stdout, stderr)
	}
	before := hits.Load()
	srv.Close() // offline from here on: only the cache has the module

	args = append(append(append([]string{"exec", "--workspace", ws, "--policy", pol}, flags...), env...),
		"--env", "GOPROXY=off", "--", goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}} {{.Module.Path}}{{end}}", ".")
	code, stdout, stderr = runCLI(t, args...)
	if code != 0 || stdout != "example.com/greet example.com/greet\nexample.com/app example.com/app\n" || hits.Load() != before {
		t.Fatalf("go list from the cache: exit %d, stdout %q, %d more requests\nstderr %q", code, stdout, hits.Load()-before, stderr)
	}
	if n := countFiles(t, root, "greet.go"); n != 1 {
		t.Errorf("the module cache %s holds %d greet.go, want 1", root, n)
	}
}

func TestGoModulesFromALocalMirrorNamespace(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("needs go on this host: %v", err)
	}
	goBin, _ = filepath.Abs(goBin)
	testGoModulesFromMirror(t, goBin, "--backend", "namespace")
}

func TestDockerGoModulesFromALocalMirror(t *testing.T) {
	buildToolchainImage(t)
	testGoModulesFromMirror(t, "go", "--backend", "docker", "--image", toolchainTag)
}

func countFiles(t *testing.T, root, name string) int {
	t.Helper()
	n := 0
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == name {
			n++
		}
		return nil
	})
	return n
}

func makeWritable(root string) {
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
}

package sandbox

import (
	"context"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// Dependencies through the allowlist from a registry: GOPROXY names the
// registry by host name, the allowlist lists that name (and the address
// it resolves to, a loopback one here), and go mod download reaches it
// through the egress proxy (Go uses the proxy for a name; the proxy
// resolves it — with the resolver override, to a test server on
// 127.0.0.1, so nothing leaves the machine). The module cache, a cache of
// the sandbox, keeps the module for a later command without the network.
func TestGoModulesThroughTheAllowlistFromARegistry(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("needs go on this host: %v", err)
	}
	goBin, _ = filepath.Abs(goBin)
	dir, gosum := testenv.GoMirror(t)
	var hits atomic.Int64
	files := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		files.ServeHTTP(w, r)
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	registry := "proxy.golang.test:" + strconv.Itoa(port)

	ws := t.TempDir()
	for name, data := range testenv.GoMirrorApp(gosum) {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	t.Cleanup(func() {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chmod(p, 0o755) // Go leaves its module cache read-only
			}
			return nil
		})
	})
	env := map[string]string{"HOME": "/tmp", "GOTOOLCHAIN": "local", "GOTELEMETRY": "off", "GOFLAGS": "-mod=readonly"}
	run := func(sb *Sandbox, args ...string) string {
		t.Helper()
		res, err := sb.Execute(context.Background(), Command{Args: append([]string{goBin}, args...), Env: env})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("go %s: %v, %+v\nstderr %s", strings.Join(args, " "), err, res, res.Stderr)
		}
		return string(res.Stdout)
	}
	mod := WithCache(policy.Cache{Name: "go-mod", Env: "GOMODCACHE"})
	build := WithCache(policy.Cache{Name: "go-build", Env: "GOCACHE"})

	env["GOPROXY"] = "http://" + registry
	sb := newIsolated(t, ws, cacheEnv(root), mod, build,
		WithAllowHosts(registry, "127.0.0.1:"+strconv.Itoa(port)),
		WithEgressResolver(fixedResolver{"proxy.golang.test": "127.0.0.1"}))
	run(sb, "mod", "download")
	if hits.Load() == 0 {
		t.Fatal("the registry was never asked")
	}
	srv.Close()

	env["GOPROXY"] = "off"
	sb2 := newIsolated(t, ws, cacheEnv(root), mod, build)
	if out := run(sb2, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "."); out != "example.com/greet\nexample.com/app\n" {
		t.Errorf("go list from the cache, offline: %q", out)
	}
}

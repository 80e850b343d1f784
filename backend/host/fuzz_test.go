package host

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// FuzzPrepare feeds untrusted request fields (working directory, one
// environment variable, argv[0], script, policy modes) to the request
// checks. Whatever the input, a request is either refused with a contract
// error class or yields a plan whose directory is inside the workspace and
// whose environment is well formed.
func FuzzPrepare(f *testing.F) {
	f.Add("", "A", "b", "", "true", "", "")
	f.Add("sub", "PATH", "/bin", "ls", "", "allow-all", "deny-all")
	f.Add("../x", "A=B", "v", "", "echo hi", "deny-all", "bogus")
	f.Add("link", "", "\x00", "./prog", "", "", "allowlist")
	f.Add("sub/../../etc", "HOME", "/root", "/bin/sh", "x\x00y", "allowlist", "")
	ws := f.TempDir()
	outside := f.TempDir()
	if err := os.MkdirAll(filepath.Join(ws, "sub", "deep"), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(ws, "link")); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("..", filepath.Join(ws, "sub", "up")); err != nil {
		f.Fatal(err)
	}
	b, err := New()
	if err != nil {
		f.Fatal(err)
	}
	root, err := filepath.EvalSymlinks(ws)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, dir, key, val, arg0, script, net, sec string) {
		req := &backend.Request{
			Workspace: ws,
			Dir:       dir,
			Env:       map[string]string{key: val},
			Shell:     script,
			Network:   policy.NetworkPolicy{Mode: policy.NetworkMode(net)},
			Secrets:   secrets.Policy{Mode: secrets.Mode(sec)},
		}
		if arg0 != "" {
			req.Args = []string{arg0, "x"}
		}
		p, err := b.prepare(req)
		if err != nil {
			if !errors.Is(err, backend.ErrInvalidRequest) && !errors.Is(err, backend.ErrUnsupported) {
				t.Fatalf("error outside the contract classes: %v", err)
			}
			return
		}
		rel, err := filepath.Rel(root, p.dir)
		if err != nil || !(rel == "." || filepath.IsLocal(rel)) {
			t.Fatalf("dir %q resolved to %q outside the workspace %q", dir, p.dir, root)
		}
		if real, err := filepath.EvalSymlinks(p.dir); err != nil || real != p.dir {
			t.Fatalf("dir %q resolved to %q, which is not its real path %q (%v)", dir, p.dir, real, err)
		}
		seen := map[string]bool{}
		for _, kv := range p.env {
			k, _, ok := strings.Cut(kv, "=")
			if !ok || k == "" || seen[k] || strings.IndexByte(kv, 0) >= 0 {
				t.Fatalf("malformed environment entry %q in %q", kv, p.env)
			}
			seen[k] = true
		}
		if (req.Shell == "") == (len(req.Args) == 0) {
			t.Fatal("a request with neither or both of Args and Shell was accepted")
		}
		if !filepath.IsAbs(p.path) {
			t.Fatalf("program path %q is not absolute", p.path)
		}
	})
}

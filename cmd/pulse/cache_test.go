package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/caches"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// runCLIEnv runs the command line with getenv answering from vars.
func runCLIEnv(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }, prog: "pulse"}
	code := run(context.Background(), env, args)
	return code, out.String(), errb.String()
}

// A command of `pulse exec` fills a cache the policy declares; `pulse
// cache list` shows it, `prune` removes it, an unknown name fails.
func TestCacheListAndPrune(t *testing.T) {
	nb, err := namespace.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := nb.Probe(context.Background()); err != nil {
		nb.Close()
		testenv.Missing(t, testenv.Namespace, fmt.Sprintf("namespace backend unavailable here: %v", err))
	}
	nb.Close()
	root := t.TempDir()
	// The sandbox reads the process environment for the cache root.
	t.Setenv(caches.DirEnv, root)
	vars := map[string]string{caches.DirEnv: root}
	ws := t.TempDir()
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("caches:\n  - {name: go-build, env: GOCACHE}\n  - {name: go-mod, env: GOMODCACHE}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLIEnv(t, vars, "exec", "--backend", "namespace", "--policy", pol, "--workspace", ws, "--",
		"sh", "-c", `printf 12345 > "$GOCACHE/obj"`)
	if code != exitOK {
		t.Fatalf("exec: exit %d\n%s\n%s", code, stdout, stderr)
	}
	code, stdout, stderr = runCLIEnv(t, vars, "cache", "list", "--json")
	if code != exitOK {
		t.Fatalf("list: exit %d %s", code, stderr)
	}
	var list []caches.Info
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if len(list) != 2 || list[0].Name != "go-build" || list[0].Bytes != 5 || list[0].Files != 1 || list[1].Name != "go-mod" || list[1].Files != 0 {
		t.Fatalf("list = %+v", list)
	}
	if code, stdout, _ = runCLIEnv(t, vars, "cache", "list"); code != exitOK || !strings.Contains(stdout, "go-build") || !strings.Contains(stdout, "5B") {
		t.Errorf("list: exit %d\n%s", code, stdout)
	}
	if code, stdout, stderr = runCLIEnv(t, vars, "cache", "prune", "--json", "go-build"); code != exitOK || !strings.Contains(stdout, `"go-build"`) {
		t.Fatalf("prune: exit %d %s %s", code, stdout, stderr)
	}
	if _, err := os.Lstat(filepath.Join(root, "go-build")); !os.IsNotExist(err) {
		t.Errorf("go-build still there: %v", err)
	}
	if code, _, stderr = runCLIEnv(t, vars, "cache", "prune", "no-such"); code != exitFailure || !strings.Contains(stderr, "no-such") {
		t.Errorf("prune of an unknown cache: exit %d %s", code, stderr)
	}
	if code, _, _ = runCLIEnv(t, vars, "cache", "prune", "--all", "go-mod"); code != exitUsage {
		t.Errorf("prune --all NAME: exit %d", code)
	}
	if code, stdout, _ = runCLIEnv(t, vars, "cache", "prune", "--all"); code != exitOK || !strings.Contains(stdout, "pruned go-mod") {
		t.Errorf("prune --all: exit %d %s", code, stdout)
	}
	if code, stdout, _ = runCLIEnv(t, vars, "cache", "list", "--json"); code != exitOK || strings.TrimSpace(stdout) != "[]" {
		t.Errorf("list after prune --all: %d %q", code, stdout)
	}
}

package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/caches"
	"github.com/pulse-agent/pulse/policy"
)

// cacheEnv points caches.Root at dir and nothing else.
func cacheEnv(dir string) Option {
	return withGetenv(func(k string) string {
		if k == caches.DirEnv {
			return dir
		}
		return ""
	})
}

func cachePolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte("version: 1\ndefaults: {shell: allow}\ncaches:\n  - {name: go-build, env: GOCACHE}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkCacheShared: command 1 writes into $GOCACHE, command 2 in a new
// sandbox on another workspace reads it; the write is in no transaction,
// and the audit log names the cache as written unreviewed.
func checkCacheShared(t *testing.T, open func(ws string, opts ...Option) *Sandbox) {
	ctx := context.Background()
	root := t.TempDir()
	sb1 := open(t.TempDir(), cacheEnv(root), WithPolicy(cachePolicy(t)),
		WithCache(policy.Cache{Name: "npm", Env: "npm_config_cache", Path: "/opt/npm-cache"}))
	res, err := sb1.Execute(ctx, Command{Shell: `echo obj > "$GOCACHE/o1" && echo n > "$npm_config_cache/n1" && echo "$GOCACHE $npm_config_cache"`})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Stdout != "/cache/go-build /opt/npm-cache\n" {
		t.Fatalf("exit %d stdout %q stderr %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res.Transaction != "" || len(res.Staged) != 0 {
		t.Errorf("a cache write was staged: tx %q staged %v", res.Transaction, res.Staged)
	}
	if st, err := sb1.Stack(ctx); err != nil || len(st) != 0 {
		t.Errorf("stack after a cache-only command: %v %v", st, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "go-build", "o1")); err != nil || string(b) != "obj\n" {
		t.Fatalf("host cache: %q %v", b, err)
	}
	evs := verifyAudit(t, sb1)
	found := false
	for _, e := range evs {
		if e.Action == "cache" && e.Decision == "allow" && e.Reason == "not_reviewed" {
			found = e.Target == "go-build,npm" && strings.Contains(e.Detail, "not reviewed") && e.ExecutionID == res.ExecutionID
		}
	}
	if !found {
		t.Errorf("no audit event names the caches as unreviewed: %+v", evs)
	}

	sb2 := open(t.TempDir(), cacheEnv(root), WithPolicy(cachePolicy(t)))
	res, err = sb2.Execute(ctx, Command{Shell: `cat "$GOCACHE/o1"`})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Stdout != "obj\n" {
		t.Fatalf("another sandbox does not see the cache: exit %d %q %s", res.ExitCode, res.Stdout, res.Stderr)
	}
}

func TestCacheSharedNamespace(t *testing.T) {
	checkCacheShared(t, func(ws string, opts ...Option) *Sandbox { return newIsolated(t, ws, opts...) })
}

// A backend that cannot mount caches refuses the command; it never runs
// it without them.
func TestCacheRefusedWhereNotMountable(t *testing.T) {
	ws := t.TempDir()
	sb := newHost(t, ws, cacheEnv(t.TempDir()), WithPolicy(cachePolicy(t)))
	_, err := sb.Execute(context.Background(), Command{Shell: "echo ran > ran.txt"})
	if !errors.Is(err, ErrUnsupportedPolicy) {
		t.Fatalf("Execute = %v, want ErrUnsupportedPolicy", err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "ran.txt")); !os.IsNotExist(err) {
		t.Fatal("the command ran without its caches")
	}
	evs := verifyAudit(t, sb)
	denied := false
	for _, e := range evs {
		denied = denied || e.Action == "cache" && e.Decision == "deny" && e.Target == "go-build"
	}
	if !denied {
		t.Error("the refusal is not audited")
	}
}

// A capped cache is trimmed after the command that went over, oldest
// files first, and the trim is audited.
func TestCacheTrimmedToItsCap(t *testing.T) {
	root := t.TempDir()
	sb := newIsolated(t, t.TempDir(), cacheEnv(root), WithCache(policy.Cache{Name: "capped", Env: "C", MaxBytes: 3000}))
	ctx := context.Background()
	old := filepath.Join(root, "capped", "old")
	res, err := sb.Execute(ctx, Command{Shell: `head -c 2000 /dev/zero > "$C/old"`})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v %+v", err, res)
	}
	// Older by mtime, whatever the clock's resolution.
	if err := os.Chtimes(old, unixTime(1), unixTime(1)); err != nil {
		t.Fatal(err)
	}
	if res, err = sb.Execute(ctx, Command{Shell: `head -c 2000 /dev/zero > "$C/new"`}); err != nil || res.ExitCode != 0 {
		t.Fatalf("%v %+v", err, res)
	}
	if _, err := os.Lstat(old); !os.IsNotExist(err) {
		t.Errorf("the oldest file survived the trim: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "capped", "new")); err != nil {
		t.Errorf("the newest file was trimmed: %v", err)
	}
	var trimmed []audit.Event
	for _, e := range verifyAudit(t, sb) {
		if e.Action == "cache" && e.Reason == "trimmed" {
			trimmed = append(trimmed, e)
		}
	}
	if len(trimmed) != 1 || trimmed[0].Target != "capped" {
		t.Errorf("trim events: %+v", trimmed)
	}
}

func TestWithCacheRefusesClashes(t *testing.T) {
	for name, opts := range map[string][]Option{
		"same name as the policy": {WithPolicy(cachePolicy(t)), WithCache(policy.Cache{Name: "go-build"})},
		"same env as the policy":  {WithPolicy(cachePolicy(t)), WithCache(policy.Cache{Name: "x", Env: "GOCACHE"})},
		"bad name":                {WithCache(policy.Cache{Name: "../x"})},
		"path in /work":           {WithCache(policy.Cache{Name: "x", Path: "/work/x"})},
	} {
		t.Run(name, func(t *testing.T) {
			opts = append([]Option{withGetenv(noEnv), WithBackendName("host"), WithUnsafeHostExecution(UnsafeNetwork, UnsafeSecrets)}, opts...)
			if sb, err := New(context.Background(), t.TempDir(), opts...); !errors.Is(err, policy.ErrInvalid) {
				if sb != nil {
					sb.Close()
				}
				t.Fatalf("New = %v, want ErrInvalid", err)
			}
		})
	}
}

func unixTime(s int64) time.Time { return time.Unix(s, 0) }

func TestCacheSharedDocker(t *testing.T) {
	db := newDockerBackend(t)
	checkCacheShared(t, func(ws string, opts ...Option) *Sandbox {
		sb, err := New(context.Background(), ws, append([]Option{WithBackend(db)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Close() })
		return sb
	})
}

// TestCacheSharedAcrossBackends: one cache, used on namespace, then
// Docker, then namespace again, as an agent whose backend is picked for
// it would. Each backend's command runs as another uid (namespace: the
// caller's; Docker: 20000 and up, group 19999), so each must be able to
// read, change and remove what the other made: files and directories,
// made with the command's own umask.
func TestCacheSharedAcrossBackends(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	db := newDockerBackend(t)
	onDocker := func(ws string, opts ...Option) *Sandbox {
		sb, err := New(ctx, ws, append([]Option{withGetenv(noEnv), WithBackend(db)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Close() })
		return sb
	}
	onNamespace := func(ws string, opts ...Option) *Sandbox { return newIsolated(t, ws, opts...) }
	steps := []struct {
		name   string
		open   func(string, ...Option) *Sandbox
		script string
		want   string
	}{
		{"namespace", onNamespace, `umask 022; mkdir -p "$GOCACHE/d/e" && echo ns1 > "$GOCACHE/d/f" && echo keep > "$GOCACHE/top" && cat "$GOCACHE/d/f"`, "ns1\n"},
		{"docker", onDocker, `umask 022; echo dk >> "$GOCACHE/d/f" && echo dk > "$GOCACHE/d/e/g" && mkdir "$GOCACHE/d/h" && echo dk > "$GOCACHE/d/h/i" && rm "$GOCACHE/top" && cat "$GOCACHE/d/f"`, "ns1\ndk\n"},
		{"namespace-again", onNamespace, `umask 022; echo ns2 >> "$GOCACHE/d/f" && echo ns2 >> "$GOCACHE/d/e/g" && echo ns2 > "$GOCACHE/d/h/j" && rm "$GOCACHE/d/h/i" && cat "$GOCACHE/d/f" "$GOCACHE/d/e/g"`, "ns1\ndk\nns2\ndk\nns2\n"},
		{"docker-again", onDocker, `echo dk2 >> "$GOCACHE/d/h/j" && rm -r "$GOCACHE/d/e" && cat "$GOCACHE/d/h/j"`, "ns2\ndk2\n"},
	}
	for _, s := range steps {
		sb := s.open(t.TempDir(), cacheEnv(root), WithPolicy(cachePolicy(t)))
		res, err := sb.Execute(ctx, Command{Shell: s.script})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if res.ExitCode != 0 || res.Stdout != s.want {
			t.Fatalf("%s: exit %d, stdout %q, want %q; stderr %s", s.name, res.ExitCode, res.Stdout, s.want, res.Stderr)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "go-build", "d", "e")); !os.IsNotExist(err) {
		t.Errorf("d/e is still in the host cache: %v", err)
	}
}

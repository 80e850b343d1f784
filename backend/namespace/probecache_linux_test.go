package namespace

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestProbeCache: a successful Probe is remembered in the cache file; a
// backend with the same record probes without starting a sandbox; a torn,
// foreign or stale record is not trusted: the full Probe runs and
// rewrites it.
func TestProbeCache(t *testing.T) {
	newBackend(t) // skips where namespaces do not work
	cache := filepath.Join(t.TempDir(), "cache", "probe-namespace")
	state := filepath.Join(t.TempDir(), "state")
	probe := func() (sandboxes int64) {
		t.Helper()
		b, err := New(WithStateDir(state), WithProbeCache(cache), WithoutPrestart())
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		var n atomic.Int64
		b.o.phaseHook = func(name string, _ int64) {
			if name == "clone-exec" {
				n.Add(1)
			}
		}
		if err := b.Probe(context.Background()); err != nil {
			t.Fatal(err)
		}
		return n.Load()
	}
	if n := probe(); n != 1 {
		t.Fatalf("first Probe started %d sandboxes, want 1", n)
	}
	rec, err := os.ReadFile(cache)
	if err != nil {
		t.Fatalf("no record after a successful Probe: %v", err)
	}
	if n := probe(); n != 0 {
		t.Fatalf("Probe with a matching record started %d sandboxes, want 0", n)
	}
	for name, bad := range map[string]string{
		"torn":    string(rec[:len(rec)/2]),
		"empty":   "",
		"garbage": "\x00\xff not a record\n",
		"stale":   strings.Replace(string(rec), "kernel ", "kernel \"0.0\" ", 1),
		"no ok":   strings.TrimSuffix(string(rec), "ok\n"),
	} {
		if err := os.WriteFile(cache, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if n := probe(); n != 1 {
			t.Errorf("%s record: Probe started %d sandboxes, want 1 (a full probe)", name, n)
		}
		if got, _ := os.ReadFile(cache); string(got) != string(rec) {
			t.Errorf("%s record: not rewritten after the full probe:\n%q", name, got)
		}
	}
	// Another configuration is another key.
	b, err := New(WithStateDir(state), WithProbeCache(cache), WithHostname("other"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	key, err := b.probeKey(false)
	if err != nil {
		t.Fatal(err)
	}
	if key+"ok\n" == string(rec) {
		t.Error("a different hostname gives the same probe key")
	}
	if _, err := New(WithProbeCache("relative/file")); err == nil {
		t.Error("WithProbeCache accepted a relative path")
	}
}

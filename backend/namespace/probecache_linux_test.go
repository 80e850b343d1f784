package namespace

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// probeSandboxes probes a new backend made with opts (and
// WithoutPrestart) and returns how many sandboxes the probe started: 1
// for a full probe, 0 for one answered from the cache.
func probeSandboxes(t *testing.T, opts ...Option) int64 {
	t.Helper()
	b, err := New(append(opts, WithoutPrestart())...)
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

// TestProbeCache: a successful Probe is remembered in the cache file; a
// backend with the same record probes without starting a sandbox; a torn,
// foreign or stale record is not trusted: the full Probe runs and
// rewrites it.
func TestProbeCache(t *testing.T) {
	newBackend(t) // skips where namespaces do not work
	cache := filepath.Join(t.TempDir(), "cache", "probe-namespace")
	state := filepath.Join(t.TempDir(), "state")
	probe := func() int64 {
		t.Helper()
		return probeSandboxes(t, WithStateDir(state), WithProbeCache(cache))
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
		// The stale record is another configuration's, kept behind.
		if got, _ := os.ReadFile(cache); !strings.HasPrefix(string(got), string(rec)) {
			t.Errorf("%s record: not rewritten after the full probe:\n%q", name, got)
		}
	}
	stale := strings.Replace(string(rec), "kernel ", "kernel \"0.0\" ", 1)
	if err := os.WriteFile(cache, []byte(stale), 0o600); err != nil {
		t.Fatal(err)
	}
	probe()
	if got, _ := os.ReadFile(cache); string(got) != string(rec)+stale {
		t.Errorf("after the stale record's probe, want the new record and then the stale one:\n%s", got)
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

// TestProbeCacheKeepsConfigurations: configurations that take turns (here
// hostnames) each keep their record, so that going back to one does not
// run the full probe; the oldest goes once there are more than
// probeCacheRecords.
func TestProbeCacheKeepsConfigurations(t *testing.T) {
	newBackend(t) // skips where namespaces do not work
	cache := filepath.Join(t.TempDir(), "probe-namespace")
	state := filepath.Join(t.TempDir(), "state")
	probe := func(host string) int64 {
		t.Helper()
		return probeSandboxes(t, WithStateDir(state), WithProbeCache(cache), WithHostname(host))
	}
	host := func(i int) string { return "host-" + strconv.Itoa(i) }
	for i := range probeCacheRecords {
		if n := probe(host(i)); n != 1 {
			t.Fatalf("first probe of %s started %d sandboxes, want 1", host(i), n)
		}
	}
	for i := range probeCacheRecords {
		if n := probe(host(i)); n != 0 {
			t.Errorf("back to %s: the probe started %d sandboxes, want 0 (its record kept)", host(i), n)
		}
	}
	// One more configuration pushes out the least recently probed one,
	// host-0 (the loop above probed them in order, cached, without
	// rewriting the file).
	if n := probe(host(probeCacheRecords)); n != 1 {
		t.Fatalf("a new configuration started %d sandboxes, want 1", n)
	}
	if n := probe(host(0)); n != 1 {
		t.Errorf("the oldest configuration's record was kept beyond %d records: %d sandboxes", probeCacheRecords, n)
	}
	if n := probe(host(probeCacheRecords)); n != 0 {
		t.Errorf("the newest configuration's record is gone: %d sandboxes", n)
	}
	got, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	if recs := splitProbeRecords(got); len(recs) != probeCacheRecords {
		t.Errorf("the cache holds %d records, want %d", len(recs), probeCacheRecords)
	}
}

// FuzzSplitProbeRecords: whatever the cache file holds, its records are
// the file's start, in order, each ending with its "ok" line.
func FuzzSplitProbeRecords(f *testing.F) {
	f.Add([]byte("pulse namespace probe 1\nkernel \"x\"\nok\n"))
	f.Add([]byte("a\nok\nb\nok\ntorn"))
	f.Add([]byte("ok\nok"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs := splitProbeRecords(data)
		joined := strings.Join(recs, "")
		if !strings.HasPrefix(string(data), joined) {
			t.Fatalf("records %q are not the start of %q", recs, data)
		}
		for _, r := range recs {
			if r != "ok\n" && !strings.HasSuffix(r, "\nok\n") {
				t.Fatalf("record %q does not end with an ok line", r)
			}
		}
	})
}

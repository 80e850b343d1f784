package namespace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

func TestStdinRoundTripAndClosed(t *testing.T) {
	b := newBackend(t)
	payload := bytes.Repeat([]byte("\x00\xffpulse\n"), 50000)
	stdin := &closeRecorder{Reader: bytes.NewReader(payload)}
	res, out, errs := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: "cat > got; wc -c < got", Stdin: stdin})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, errs)
	}
	if strings.TrimSpace(out) != "400000" {
		t.Fatalf("wc says %q", out)
	}
	if len(res.Overlay.Files) != 1 || !bytes.Equal(res.Overlay.Files[0].Data, payload) {
		t.Fatalf("stdin did not round-trip byte-exact")
	}
	if !stdin.closed {
		t.Fatal("Stdin was not closed")
	}
	// No stdin: readers see EOF at once.
	res, out, _ = runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: "cat; echo done"})
	if res.ExitCode != 0 || out != "done\n" {
		t.Fatalf("exit %d out %q", res.ExitCode, out)
	}
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

func TestEnvFromScratchAndDir(t *testing.T) {
	t.Setenv("PULSE_NS_LEAK", "host-secret")
	b := newBackend(t)
	ws := t.TempDir()
	if err := os.MkdirAll(filepath.Join(ws, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	res, out, errs := runCmd(t, b, &backend.Request{Workspace: ws, Dir: "a/b", Args: []string{"sh", "-c", "env; pwd"},
		Env: map[string]string{"FOO": "bar=baz"}})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	pwd := lines[len(lines)-1]
	var names []string
	for _, l := range lines[:len(lines)-1] {
		k, _, _ := strings.Cut(l, "=")
		names = append(names, k)
	}
	sort.Strings(names)
	// sh adds PWD (and some add SHLVL or _); everything else must be ours.
	allowed := map[string]bool{"FOO": true, "HOME": true, "LANG": true, "PATH": true, "TERM": true, "USER": true, "PWD": true, "SHLVL": true, "_": true, "OLDPWD": true}
	for _, n := range names {
		if !allowed[n] {
			t.Errorf("unexpected variable %s in the sandbox", n)
		}
	}
	if !strings.Contains(out, "FOO=bar=baz\n") || strings.Contains(out, "host-secret") {
		t.Fatalf("env: %q", out)
	}
	if pwd != filepath.Join(ws, "a/b") {
		t.Fatalf("pwd %q", pwd)
	}
}

func TestInvalidRequests(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "file"), "x")
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	linkedPulse := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(linkedPulse, ".pulse")); err != nil {
		t.Fatal(err)
	}
	cases := map[string]*backend.Request{
		"no command":     {Workspace: ws},
		"both":           {Workspace: ws, Shell: "true", Args: []string{"true"}},
		"relative ws":    {Workspace: "rel", Shell: "true"},
		"missing ws":     {Workspace: filepath.Join(ws, "nope"), Shell: "true"},
		"dir escapes":    {Workspace: ws, Dir: "../x", Shell: "true"},
		"dir absolute":   {Workspace: ws, Dir: "/tmp", Shell: "true"},
		"dir is a file":  {Workspace: ws, Dir: "file", Shell: "true"},
		"dir via link":   {Workspace: ws, Dir: "out", Shell: "true"},
		"dir .pulse":     {Workspace: ws, Dir: ".pulse", Shell: "true"},
		"bad env":        {Workspace: ws, Shell: "true", Env: map[string]string{"A=B": "c"}},
		"NUL arg":        {Workspace: ws, Args: []string{"echo", "a\x00b"}},
		"negative limit": {Workspace: ws, Shell: "true", Limits: policy.ResourceLimits{Timeout: -1}},
		".pulse symlink": {Workspace: linkedPulse, Shell: "true"},
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			res, err := b.Exec(context.Background(), req)
			if !errors.Is(err, backend.ErrInvalidRequest) || res != nil {
				t.Fatalf("got %v %v, want ErrInvalidRequest and no result", res, err)
			}
		})
	}
}

func TestOutputCapTruncatesAndKills(t *testing.T) {
	b := newBackend(t)
	var out bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "yes pulse",
		Stdout: &out, Limits: policy.ResourceLimits{OutputBytes: 1000, Timeout: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Truncated || res.Termination != backend.OutputLimit || out.Len() != 1000 {
		t.Fatalf("truncated %v termination %s len %d", res.Truncated, res.Termination, out.Len())
	}
}

// chunkRecorder counts writes, to show output streams while the command runs.
type chunkRecorder struct {
	mu     sync.Mutex
	n      int
	chunks int
	first  chan struct{}
}

func (c *chunkRecorder) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chunks == 0 {
		close(c.first)
	}
	c.n += len(p)
	c.chunks++
	return len(p), nil
}

func TestOutputStreamsWhileRunning(t *testing.T) {
	b := newBackend(t)
	rec := &chunkRecorder{first: make(chan struct{})}
	done := make(chan *backend.Result, 1)
	go func() {
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(),
			Shell: "head -c 1048576 /dev/zero; sleep 30", Stdout: rec, Limits: policyTimeout(20 * time.Second)})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case <-rec.first:
	case <-time.After(15 * time.Second):
		t.Fatal("no output arrived while the command ran")
	}
	for {
		rec.mu.Lock()
		n, chunks := rec.n, rec.chunks
		rec.mu.Unlock()
		if n == 1<<20 {
			if chunks < 2 {
				t.Fatalf("1 MiB arrived in %d chunk(s)", chunks)
			}
			break
		}
		select {
		case <-done:
			t.Fatal("command ended before its output was seen")
		case <-time.After(10 * time.Millisecond):
		}
	}
	b.Close() // ends the sleeping command
	res := <-done
	if res == nil || res.Termination != backend.Cancelled {
		t.Fatalf("after Close: %+v", res)
	}
}

func TestClosedBackend(t *testing.T) {
	b := newBackend(t)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "true"}); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("Exec after Close: %v", err)
	}
}

func TestReconcileRemovesOnlyDeadRuns(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	gate := t.TempDir()
	// No init started ahead: its run directory would be a second live one.
	b := newBackend(t, WithStateDir(state), WithReadWriteBind(gate), WithoutPrestart())
	// The probe's run, once emptied for reuse, is what the live run below
	// takes: no third, half-recycled run is there when Reconcile looks.
	waitFreeRuns(t, b, 1)
	// A run of a crashed process: no one holds its lock.
	dead := filepath.Join(state, "999999-dead")
	writeFile(t, filepath.Join(dead, "upper/file"), "x")
	writeFile(t, filepath.Join(dead, "lock"), "")
	if err := os.Chmod(filepath.Join(dead, "upper"), 0o500); err != nil {
		t.Fatal(err)
	}
	// A run that crashed before it made its lock file.
	half := filepath.Join(state, "999998-half")
	if err := os.MkdirAll(filepath.Join(half, "upper"), 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * halfRunAge)
	if err := os.Chtimes(half, old, old); err != nil {
		t.Fatal(err)
	}
	// One being created at this moment: no lock file yet, but young.
	young := filepath.Join(state, "999997-young")
	if err := os.MkdirAll(young, 0o700); err != nil {
		t.Fatal(err)
	}
	// A live run, in this process: Reconcile must leave it alone.
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(),
			Shell:  "touch " + gate + "/started; while [ ! -e " + gate + "/stop ]; do sleep 0.02; done",
			Limits: policyTimeout(20 * time.Second)})
		if err != nil {
			t.Error(err)
		}
	}()
	b2, err := New(WithStateDir(state)) // another backend sharing the state dir
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := os.Stat(filepath.Join(gate, "started")); return err == nil })
	if err := b2.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Runs b keeps emptied for reuse are locked by b, and stay too.
	kept := func() map[string]bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		m := map[string]bool{}
		for _, r := range b.freeRuns {
			m[filepath.Base(r.dir)] = true
		}
		return m
	}
	var names []string
	others := func() []string {
		entries, _ := os.ReadDir(state)
		k := kept()
		names = names[:0]
		for _, e := range entries {
			if !k[e.Name()] {
				names = append(names, e.Name())
			}
		}
		return names
	}
	if others(); len(names) != 2 || strings.Contains(strings.Join(names, " "), "dead") || strings.Contains(strings.Join(names, " "), "half") {
		t.Fatalf("after Reconcile: %v, want the live run and the young one", names)
	}
	os.Remove(young)
	writeFile(t, filepath.Join(gate, "stop"), "")
	<-done
	// The run directory goes in the background once Exec has returned,
	// or is kept, emptied, for reuse until Close.
	waitFor(t, func() bool { return len(others()) == 0 })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Fatalf("run directories left after Close: %v", entries)
	}
}

// waitFor polls cond; its bound is a failure's, not a timing check: a
// sandbox's start or a helper process's can take many seconds on a
// loaded machine under -race.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition never became true")
		}
	}
}

func TestConcurrentExecs(t *testing.T) {
	b := newBackend(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws := t.TempDir()
			var out bytes.Buffer
			res, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Shell: "echo $$ > pid; cat pid",
				Stdout: &out, Limits: policyTimeout(30 * time.Second)})
			if err != nil {
				t.Error(err)
				return
			}
			if res.ExitCode != 0 || out.String() != fmt.Sprintf("%d\n", res.PID) || len(res.Overlay.Files) != 1 {
				t.Errorf("exit %d out %q overlay %+v", res.ExitCode, out.String(), res.Overlay)
			}
		}()
	}
	wg.Wait()
}

func TestCapabilities(t *testing.T) {
	b, err := New()
	if err != nil {
		t.Fatal(err)
	}
	c := b.Capabilities()
	if c.Isolation != backend.IsolationNamespace || !c.CapturesWrites {
		t.Fatalf("%+v", c)
	}
	if c.NetworkLevel(policy.NetworkDenyAll) != "strong" || c.NetworkLevel(policy.NetworkAllowlist) != "strong" {
		t.Fatalf("network levels %v", c.Network)
	}
	for _, m := range []string{"deny-all", "allowlist", "allow-all"} {
		if c.Secrets[secretsMode(m)] != "strong" {
			t.Fatalf("secret mode %s: %v", m, c.Secrets)
		}
	}
}

func TestProbeNamesMissingInit(t *testing.T) {
	initCalled.Store(false)
	defer initCalled.Store(true)
	b, err := New()
	if err != nil {
		t.Fatal(err)
	}
	err = b.Probe(context.Background())
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "namespace.Init") {
		t.Fatalf("Probe: %v", err)
	}
	if _, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "true"}); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("Exec: %v", err)
	}
}

// TestPrestartedInitGone: an init started ahead that died while waiting is
// replaced, and the Exec does not notice.
func TestPrestartedInitGone(t *testing.T) {
	b := newBackend(t)
	b.waitWarm()
	b.mu.Lock()
	var p *initProc
	if ps := b.warm[true]; len(ps) > 0 {
		p = ps[0]
	}
	b.mu.Unlock()
	if p == nil {
		t.Fatal("no init was started ahead after Probe")
	}
	p.cmd.Process.Kill()
	p.cmd.Wait()
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: "echo fine"})
	if res.ExitCode != 0 || out != "fine\n" {
		t.Fatalf("exit %d out %q", res.ExitCode, out)
	}
}

// TestProbeSaysWhy: a state directory overlayfs cannot use makes Probe
// fail with a reason that names the fix, not a generic error.
func TestProbeSaysWhy(t *testing.T) {
	b, err := New(WithStateDir(filepath.Join(t.TempDir(), "a,b")))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = b.Probe(context.Background())
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "WithStateDir") {
		t.Fatalf("Probe: %v", err)
	}
}

// TestSetupErrorReported: a sandbox that cannot be built (a bind of a
// missing path) starts nothing, and the error carries the init's reason.
func TestSetupErrorReported(t *testing.T) {
	newBackend(t)
	missing := filepath.Join(t.TempDir(), "missing")
	b, err := New(WithStateDir(filepath.Join(t.TempDir(), "state")), WithReadOnlyBind(missing))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "true"})
	if res != nil || !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("got %+v, %v; want ErrUnavailable naming %s", res, err, missing)
	}
}

// TestSpawnWorksUnderSeccomp: refusing clone3 with ENOSYS must leave
// libc's posix_spawn (behind system() and popen()) working, through its
// fallback to clone.
func TestSpawnWorksUnderSeccomp(t *testing.T) {
	b := newBackend(t)
	res, out, errs := runCmd(t, b, &backend.Request{Workspace: t.TempDir(),
		Shell: `awk 'BEGIN { r = system("exit 3"); "echo piped" | getline l; print r, l }'`})
	if res.ExitCode != 0 || out != "3 piped\n" {
		t.Fatalf("exit %d out %q err %q", res.ExitCode, out, errs)
	}
}

func TestOverlayTooLarge(t *testing.T) {
	b := newBackend(t)
	defer func(old int64) { maxOverlayTotal = old }(maxOverlayTotal)
	maxOverlayTotal = 1000
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(),
		Shell: "head -c 600 /dev/zero > a; head -c 600 /dev/zero > b", Limits: policyTimeout(30 * time.Second)})
	if !errors.Is(err, ErrOverlayTooLarge) || res == nil || res.ExitCode != 0 || res.Overlay != nil {
		t.Fatalf("got %+v, %v; want the result, no overlay and ErrOverlayTooLarge", res, err)
	}
}

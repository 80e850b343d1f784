package backendtest

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

func testIdentity(t *testing.T, s *suite) {
	e := s.setup(t)
	if e.b.Name() == "" {
		t.Error("Name is empty")
	}
	switch e.caps.Isolation {
	case backend.IsolationHostUnsafe, backend.IsolationNamespace, backend.IsolationContainer, backend.IsolationRemote, backend.IsolationGVisor:
	default:
		t.Errorf("Capabilities().Isolation = %q, not a known level", e.caps.Isolation)
	}
	known := func(l policy.EnforcementLevel) bool {
		return l == policy.Strong || l == policy.BestEffort || l == policy.Unsupported
	}
	for m, l := range e.caps.Network {
		if !known(l) {
			t.Errorf("network mode %q has unknown level %q", m, l)
		}
	}
	for m, l := range e.caps.Secrets {
		if !known(l) {
			t.Errorf("secret mode %q has unknown level %q", m, l)
		}
	}
	for k, l := range e.caps.Limits {
		if !known(l) {
			t.Errorf("limit %q has unknown level %q", k, l)
		}
	}
	if e.caps.Isolation == backend.IsolationHostUnsafe && e.caps.CapturesWrites {
		t.Error("a host_unsafe backend claims to capture writes")
	}
}

func testExitCodes(t *testing.T, s *suite) {
	e := s.setup(t)
	for _, code := range []int{0, 3, 42} {
		res, _, _ := e.sh(fmt.Sprintf("exit %d", code))
		if res.ExitCode != code || res.Termination != backend.Exited || res.TimedOut {
			t.Errorf("shell exit %d: got exit %d, termination %q, timed out %v", code, res.ExitCode, res.Termination, res.TimedOut)
		}
		res = e.exec(context.Background(), &backend.Request{Args: []string{"sh", "-c", fmt.Sprintf("exit %d", code)}})
		if res.ExitCode != code || res.Termination != backend.Exited {
			t.Errorf("args exit %d: got exit %d, termination %q", code, res.ExitCode, res.Termination)
		}
	}
	res, _, _ := e.sh("kill -TERM $$; sleep 1")
	if res.ExitCode != -1 || res.Termination != backend.Signaled {
		t.Errorf("self-signalled command: got exit %d, termination %q; want -1, %q "+
			"(a command run as PID 1 of a pid namespace ignores its own signals: run it under an init)",
			res.ExitCode, res.Termination, backend.Signaled)
	}
}

func testStdoutStderrSplit(t *testing.T, s *suite) {
	e := s.setup(t)
	res, out, errOut := e.sh("echo to-out; echo to-err >&2; printf 'no newline'; printf 'tail' >&2")
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if out != "to-out\nno newline" {
		t.Errorf("stdout = %q", out)
	}
	if errOut != "to-err\ntail" {
		t.Errorf("stderr = %q", errOut)
	}
}

// allBytes returns n bytes cycling through every byte value, so that a
// text-decoding step anywhere on the path shows up as corruption.
func allBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/256)
	}
	return b
}

// wrapped base64-encodes data in 76-column lines, the form every base64 -d
// accepts.
func wrapped(data []byte) string {
	enc := base64.StdEncoding.EncodeToString(data)
	var sb strings.Builder
	for len(enc) > 76 {
		sb.WriteString(enc[:76])
		sb.WriteByte('\n')
		enc = enc[76:]
	}
	sb.WriteString(enc)
	sb.WriteByte('\n')
	return sb.String()
}

// written returns the content the command left at rel: from the overlay
// for capturing backends, from the workspace otherwise.
func (e *env) written(res *backend.Result, rel string) ([]byte, bool) {
	e.t.Helper()
	if e.captures() {
		if res.Overlay == nil {
			return nil, false
		}
		for _, f := range res.Overlay.Files {
			if f.Path == rel {
				return f.Data, true
			}
		}
		return nil, false
	}
	data, err := os.ReadFile(filepath.Join(e.ws, filepath.FromSlash(rel)))
	if err != nil {
		return nil, false
	}
	return data, true
}

func testStdinRoundTrip(t *testing.T, s *suite) {
	e := s.setup(t)
	want := allBytes(96 << 10)
	in := &closingReader{r: strings.NewReader(wrapped(want))}
	res := e.exec(context.Background(), &backend.Request{Shell: "base64 -d > f.bin && echo done", Stdin: in})
	if res.ExitCode != 0 || res.Termination != backend.Exited {
		t.Fatalf("exit %d, termination %q", res.ExitCode, res.Termination)
	}
	if !in.closed.Load() {
		t.Error("Stdin was not closed")
	}
	got, ok := e.written(res, "f.bin")
	if !ok {
		t.Fatal("f.bin was not written")
	}
	if !bytes.Equal(got, want) {
		t.Errorf("f.bin differs: %d bytes, want %d", len(got), len(want))
	}
}

func testNoStdin(t *testing.T, s *suite) {
	e := s.setup(t)
	var out recorder
	res := e.exec(context.Background(), &backend.Request{Shell: "cat; echo end", Stdout: &out})
	if res.ExitCode != 0 || out.String() != "end\n" {
		t.Errorf("exit %d, stdout %q; want 0, %q", res.ExitCode, out.String(), "end\n")
	}
}

func testStdinNotRead(t *testing.T, s *suite) {
	e := s.setup(t)
	in := &endless{}
	var out recorder
	res := e.exec(context.Background(), &backend.Request{Shell: "echo ignored", Stdin: in, Stdout: &out})
	if res.ExitCode != 0 || out.String() != "ignored\n" {
		t.Errorf("exit %d, stdout %q", res.ExitCode, out.String())
	}
	if !in.closed.Load() {
		t.Error("an abandoned Stdin was not closed")
	}
}

func testStreamingOutput(t *testing.T, s *suite) {
	e := s.setup(t)
	const line = "0123456789abcde\n"
	want := strings.Repeat(line, (1<<20)/len(line))
	// The command prints 1 MiB and then waits for its stdin to end; the
	// test ends stdin only once all of the output has reached the writer.
	// A backend that holds output back until the command ends never gets
	// there; the fallback timer then ends stdin and the case fails.
	pr, pw := io.Pipe()
	var once sync.Once
	arrived := make(chan struct{})
	out := &recorder{}
	out.watch = func(total []byte) {
		if len(total) >= len(want) {
			once.Do(func() { close(arrived) })
		}
	}
	fallback := time.AfterFunc(s.d(20*time.Second), func() { pw.Close() })
	defer fallback.Stop()
	go func() {
		<-arrived
		pw.Close()
	}()
	res := e.exec(context.Background(), &backend.Request{
		Shell:  "yes 0123456789abcde | head -c 1048576; cat > /dev/null; echo end >&2",
		Stdin:  pr,
		Stdout: out,
	})
	select {
	case <-arrived:
	default:
		t.Fatalf("the output had not arrived while the command ran (%d of %d bytes before its stdin was closed by the fallback)", len(out.Bytes()), len(want))
	}
	if res.ExitCode != 0 {
		t.Errorf("exit %d", res.ExitCode)
	}
	if got := out.String(); got != want {
		t.Errorf("stdout is %d bytes and differs from the %d expected", len(got), len(want))
	}
	if n := out.Writes(); n < 2 {
		t.Errorf("1 MiB arrived in %d Write call(s); want several chunks", n)
	}
}

// groupScript starts a background subshell that appends to the sentinel
// and prints ticks, says it started, and waits.
const groupScript = `( while :; do echo x >> sentinel; echo tick; sleep 0.1; done ) &
sleep 0.2; echo started; wait`

func testTimeoutKillsGroup(t *testing.T, s *suite) {
	e := s.setup(t)
	// The case proves something only when the background subshell ran
	// before the limit struck, and how soon it runs depends on the
	// machine's load: a run in which it never ticked is repeated with
	// twice the limit (up to half a minute), not failed by luck. Every
	// run's outcome is checked all the same.
	limit := s.d(700 * time.Millisecond)
	for {
		out := &recorder{}
		res := e.exec(context.Background(), &backend.Request{
			Shell:  groupScript,
			Stdout: out,
			Limits: policy.ResourceLimits{Timeout: limit},
		})
		out.closed.Store(true)
		if res.Termination != backend.Timeout || !res.TimedOut || res.ExitCode != -1 {
			t.Errorf("termination %q, timed out %v, exit %d; want %q, true, -1", res.Termination, res.TimedOut, res.ExitCode, backend.Timeout)
		}
		if !strings.Contains(out.String(), "tick") && limit < 30*time.Second {
			t.Logf("the background subshell did not start within the %v limit; again with %v", limit, 2*limit)
			limit *= 2
			continue
		}
		e.checkGroupDead(res, out)
		return
	}
}

func testCancelKillsGroup(t *testing.T, s *suite) {
	e := s.setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &recorder{}
	out.watch = func(total []byte) {
		if bytes.Contains(total, []byte("started\n")) {
			cancel()
		}
	}
	res := e.exec(ctx, &backend.Request{Shell: groupScript, Stdout: out})
	out.closed.Store(true)
	if res.Termination != backend.Cancelled || res.TimedOut || res.ExitCode != -1 {
		t.Errorf("termination %q, timed out %v, exit %d; want %q, false, -1", res.Termination, res.TimedOut, res.ExitCode, backend.Cancelled)
	}
	e.checkGroupDead(res, out)
}

// checkGroupDead watches, after Exec returned, that the background
// subshell of groupScript no longer writes anywhere.
func (e *env) checkGroupDead(res *backend.Result, out *recorder) {
	e.t.Helper()
	if !strings.Contains(out.String(), "tick") {
		e.t.Fatalf("the background subshell never ran (stdout %q); the case proves nothing", out.String())
	}
	if e.captures() {
		time.Sleep(e.s.d(400 * time.Millisecond))
	} else {
		sentinel := filepath.Join(e.ws, "sentinel")
		before, err := os.ReadFile(sentinel)
		if err != nil || len(before) == 0 {
			e.t.Fatalf("sentinel not written in place: %v", err)
		}
		time.Sleep(e.s.d(400 * time.Millisecond))
		after, _ := os.ReadFile(sentinel)
		if len(after) != len(before) {
			e.t.Errorf("sentinel grew from %d to %d bytes after Exec returned: a grandchild survived", len(before), len(after))
		}
	}
	if n := out.late.Load(); n != 0 {
		e.t.Errorf("%d bytes reached Stdout after Exec returned: a process or copier survived", n)
	}
}

func testBackgroundEndsWithCommand(t *testing.T, s *suite) {
	e := s.setup(t)
	if e.captures() {
		t.Skip("a capturing backend's later writes are not observable after Exec returns; TimeoutKillsGroup covers its grandchildren")
	}
	res, out, _ := e.sh("( sleep 0.3; echo late > late.txt ) > /dev/null 2>&1 & echo started")
	if res.ExitCode != 0 || out != "started\n" {
		t.Fatalf("exit %d, stdout %q", res.ExitCode, out)
	}
	time.Sleep(e.s.d(700 * time.Millisecond))
	if _, err := os.Stat(filepath.Join(e.ws, "late.txt")); err == nil {
		t.Error("a background process outlived Exec and wrote late.txt")
	}
}

func testOutputCap(t *testing.T, s *suite) {
	e := s.setup(t)
	const limit = 1000
	full := strings.Repeat("x\n", 5000)
	// Each stream separately: a backend that kills on the first overflow
	// would never let a second over-long stream start.
	for _, stream := range []string{"stdout", "stderr"} {
		var out, errOut recorder
		script := "yes x | head -c 10000"
		capped, other := &out, &errOut
		if stream == "stderr" {
			script += " >&2"
			capped, other = &errOut, &out
		}
		res := e.exec(context.Background(), &backend.Request{
			Shell:  script,
			Stdout: &out, Stderr: &errOut,
			Limits: policy.ResourceLimits{OutputBytes: limit},
		})
		if !res.Truncated {
			t.Errorf("%s: Truncated is false for 10000 bytes over a %d-byte cap", stream, limit)
		}
		if res.Termination != backend.Exited && res.Termination != backend.OutputLimit {
			t.Errorf("%s: termination %q; want %q or %q", stream, res.Termination, backend.Exited, backend.OutputLimit)
		}
		got := capped.String()
		if len(got) == 0 || len(got) > limit || !strings.HasPrefix(full, got) {
			t.Errorf("%s: %d bytes delivered, prefix of the output: %v; want 1..%d bytes of its prefix", stream, len(got), strings.HasPrefix(full, got), limit)
		}
		if o := other.String(); o != "" {
			t.Errorf("%s: the other stream received %q", stream, o)
		}
	}

	// An endless writer must be stopped by the cap, not by its timeout.
	var out2 recorder
	res := e.exec(context.Background(), &backend.Request{
		Shell:  "yes",
		Stdout: &out2,
		Limits: policy.ResourceLimits{OutputBytes: 4096, Timeout: s.d(60 * time.Second)},
	})
	if !res.Truncated || res.Termination != backend.OutputLimit || res.ExitCode != -1 {
		t.Errorf("endless writer: truncated %v, termination %q, exit %d; want true, %q, -1", res.Truncated, res.Termination, res.ExitCode, backend.OutputLimit)
	}
	if n := len(out2.String()); n > 4096 || n == 0 {
		t.Errorf("endless writer: %d bytes delivered; want 1..4096", n)
	}
}

// canary is a variable set in the test process so that the Env case can
// see that the caller's environment is not inherited even when the process
// has nothing else unusual in it. It is set once and never removed: no
// other code reads it.
const canary = "PULSE_BACKENDTEST_CANARY"

func testEnv(t *testing.T, s *suite) {
	e := s.setup(t)
	if _, ok := os.LookupEnv(canary); !ok {
		os.Setenv(canary, "leaked")
	}
	want := map[string]string{
		"PULSE_A": "plain",
		"PULSE_B": "with spaces = and 'quotes' \"too\" $HOME",
		"TERM":    "pulse-term",
	}
	var out recorder
	res := e.exec(context.Background(), &backend.Request{Args: []string{"env"}, Env: want, Stdout: &out})
	if res.ExitCode != 0 {
		t.Fatalf("env exited %d", res.ExitCode)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("env printed a line without '=': %q", line)
		}
		got[k] = v
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q; want %q", k, got[k], v)
		}
	}
	if got["PATH"] == "" {
		t.Error("PATH is missing from the base environment")
	}
	allowed := map[string]bool{"PATH": true, "HOME": true, "LANG": true, "TERM": true, "USER": true,
		// Set by shells, loaders or engines whatever the caller asks.
		"PWD": true, "SHLVL": true, "_": true, "OLDPWD": true, "HOSTNAME": true}
	for k := range s.opts.allowEnv {
		allowed[k] = true
	}
	for k, v := range got {
		if _, asked := want[k]; asked || allowed[k] {
			continue
		}
		t.Errorf("unexpected variable %s=%q in the environment", k, v)
	}
}

func testCwd(t *testing.T, s *suite) {
	e := s.setup(t)
	e.writeFile("marker", []byte("root\n"))
	e.writeFile("sub/dir/marker", []byte("nested\n"))
	for dir, want := range map[string]string{"": "root\n", ".": "root\n", "sub/dir": "nested\n", "sub/../sub/dir": "nested\n"} {
		var out recorder
		res := e.exec(context.Background(), &backend.Request{Shell: "cat marker; pwd", Dir: dir, Stdout: &out})
		lines := strings.SplitN(out.String(), "\n", 2)
		if res.ExitCode != 0 || lines[0]+"\n" != want {
			t.Errorf("Dir %q: exit %d, stdout %q; want marker %q", dir, res.ExitCode, out.String(), want)
		}
		if dir == "sub/dir" && !strings.HasSuffix(strings.TrimSpace(out.String()), "/sub/dir") {
			t.Errorf("Dir %q: pwd printed %q", dir, out.String())
		}
	}
	for _, dir := range []string{"..", "../outside", "sub/../../x"} {
		res, err := e.b.Exec(context.Background(), e.request(&backend.Request{Shell: "touch escaped", Dir: dir}))
		if !errors.Is(err, backend.ErrInvalidRequest) || res != nil {
			t.Errorf("Dir %q: got result %v, error %v; want ErrInvalidRequest and no result", dir, res != nil, err)
		}
	}
}

func testInvalidRequest(t *testing.T, s *suite) {
	e := s.setup(t)
	for name, req := range map[string]*backend.Request{
		"neither":    {},
		"both":       {Args: []string{"true"}, Shell: "true"},
		"empty argv": {Args: []string{""}},
	} {
		res, err := e.b.Exec(context.Background(), e.request(req))
		if !errors.Is(err, backend.ErrInvalidRequest) || res != nil {
			t.Errorf("%s: got result %v, error %v; want ErrInvalidRequest and no result", name, res != nil, err)
		}
	}
}

func testUnsupportedNetwork(t *testing.T, s *suite) {
	e := s.setup(t)
	tried := 0
	for _, m := range []policy.NetworkMode{policy.NetworkDenyAll, policy.NetworkAllowlist, policy.NetworkAllowAll} {
		if e.caps.NetworkLevel(m) != policy.Unsupported {
			continue
		}
		tried++
		np := policy.NetworkPolicy{Mode: m}
		if m == policy.NetworkAllowlist {
			np.Hosts = []string{"example.com"}
		}
		res, err := e.b.Exec(context.Background(), e.request(&backend.Request{Shell: "touch started", Network: np}))
		if !errors.Is(err, backend.ErrUnsupported) || res != nil {
			t.Errorf("network %q is Unsupported but Exec gave result %v, error %v; want ErrUnsupported", m, res != nil, err)
		}
		if _, err := os.Stat(filepath.Join(e.ws, "started")); err == nil {
			t.Errorf("network %q: the command ran although it was refused", m)
		}
	}
	if tried == 0 {
		t.Skip("the backend supports every network mode; nothing to refuse")
	}
}

func testConcurrent(t *testing.T, s *suite) {
	e := s.setup(t)
	const n = 4
	var wg sync.WaitGroup
	outs := make([]recorder, n)
	results := make([]*backend.Result, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = e.b.Exec(context.Background(), e.request(&backend.Request{
				Shell:       `sleep 0.1; echo "$WHO"`,
				Env:         map[string]string{"WHO": fmt.Sprintf("caller-%d", i)},
				Stdout:      &outs[i],
				ExecutionID: fmt.Sprintf("concurrent-%d", i),
			}))
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("caller %d: %v", i, errs[i])
			continue
		}
		if want := fmt.Sprintf("caller-%d\n", i); results[i].ExitCode != 0 || outs[i].String() != want {
			t.Errorf("caller %d: exit %d, stdout %q; want %q", i, results[i].ExitCode, outs[i].String(), want)
		}
	}
}

// treeDigest maps every path under root to its type and content, to show
// that a capturing backend left the workspace untouched.
func treeDigest(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		v := info.Mode().String()
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += ":" + string(data)
		}
		m[rel] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testOverlayLost: a command that ran but whose writes the backend lost
// (provoked as WithOverlayLoss says) comes back as the contract of
// backend.ErrOverlayLost has it: a Result with the exit code and the
// output, no overlay, and an error wrapping ErrOverlayLost.
func testOverlayLost(t *testing.T, s *suite) {
	probe := s.setup(t)
	if !probe.captures() {
		t.Skip("the backend writes in place: it has no overlay to lose")
	}
	if s.opts.loss == nil {
		t.Fatal("a backend that captures writes must say with WithOverlayLoss how its overlay can be lost (or Skip the case with the reason)")
	}
	t.Logf("trigger: %s", s.opts.loss.how)
	lossy := *s
	lossy.factory = s.opts.loss.factory
	e := lossy.setup(t)
	var out, errb recorder
	req := e.request(&backend.Request{Shell: fmt.Sprintf("echo ran; head -c %d /dev/zero > lost.bin; exit 3", LostFileBytes),
		Stdout: &out, Stderr: &errb})
	res, err := e.b.Exec(context.Background(), req)
	if !errors.Is(err, backend.ErrOverlayLost) {
		t.Fatalf("Exec: error %v, result %+v; want an error wrapping backend.ErrOverlayLost", err, res)
	}
	if res == nil {
		t.Fatalf("Exec: %v without a Result; the command ran, so its Result must come with the error", err)
	}
	if res.ExitCode != 3 || res.Termination != backend.Exited {
		t.Errorf("exit %d termination %q; want 3, exited (stderr %q)", res.ExitCode, res.Termination, errb.String())
	}
	if !strings.Contains(out.String(), "ran\n") {
		t.Errorf("stdout %q; want the command's output", out.String())
	}
	if !res.Overlay.Empty() {
		t.Errorf("a lost overlay came back with %d files, %d deletions", len(res.Overlay.Files), len(res.Overlay.Deleted))
	}
}

func testWrites(t *testing.T, s *suite) {
	e := s.setup(t)
	e.writeFile("keep.txt", []byte("keep\n"))
	e.writeFile("change.txt", []byte("before\n"))
	e.writeFile("delete.txt", []byte("gone soon\n"))
	e.writeFile("dir/old.txt", []byte("old\n"))
	before := treeDigest(t, e.ws)
	bin := allBytes(4096)
	in := strings.NewReader(wrapped(bin))
	var errOut recorder
	res := e.exec(context.Background(), &backend.Request{
		Shell: `set -e
echo new > new.txt
printf 'after' > change.txt
rm delete.txt
mkdir -p deep/er
echo nested > deep/er/file.txt
base64 -d > bin.dat
# A backend may refuse writes under .pulse/; it must not report them.
{ mkdir -p .pulse && echo internal > .pulse/scratch; } 2>/dev/null || true`,
		Stdin:  in,
		Stderr: &errOut,
	})
	if res.ExitCode != 0 {
		t.Fatalf("script exited %d; stderr %q", res.ExitCode, errOut.String())
	}
	want := map[string][]byte{
		"new.txt":          []byte("new\n"),
		"change.txt":       []byte("after"),
		"deep/er/file.txt": []byte("nested\n"),
		"bin.dat":          bin,
		"keep.txt":         nil, // must not be reported as changed
		"dir/old.txt":      nil,
		".pulse/scratch":   nil,
		"delete.txt":       nil,
	}
	if !e.captures() {
		if res.Overlay != nil {
			t.Errorf("a backend that writes in place returned an overlay of %d files", len(res.Overlay.Files))
		}
		for p, data := range want {
			if data == nil {
				continue
			}
			got, err := os.ReadFile(filepath.Join(e.ws, filepath.FromSlash(p)))
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("%s in place: %d bytes, %v; want %d bytes", p, len(got), err, len(data))
			}
		}
		if _, err := os.Stat(filepath.Join(e.ws, "delete.txt")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("delete.txt still exists in place: %v", err)
		}
		return
	}

	if after := treeDigest(t, e.ws); !equalMaps(before, after) {
		t.Errorf("the real workspace changed:\nbefore %v\nafter  %v", before, after)
	}
	if res.Overlay == nil {
		t.Fatal("a capturing backend returned no overlay")
	}
	files := map[string]backend.File{}
	for _, f := range res.Overlay.Files {
		if f.Path != filepath.ToSlash(filepath.Clean(f.Path)) || strings.HasPrefix(f.Path, "/") || strings.HasPrefix(f.Path, "../") || f.Path == ".." || f.Path == "." {
			t.Errorf("overlay path %q is not clean and relative", f.Path)
		}
		if pathguard.IsReserved(f.Path) {
			t.Errorf("overlay holds %q under .pulse/", f.Path)
		}
		if _, dup := files[f.Path]; dup {
			t.Errorf("overlay lists %q twice", f.Path)
		}
		files[f.Path] = f
	}
	for p, data := range want {
		f, ok := files[p]
		if data == nil {
			if ok && f.Mode.IsRegular() {
				t.Errorf("overlay reports unchanged or foreign path %q", p)
			}
			continue
		}
		if !ok {
			t.Errorf("overlay misses %q", p)
			continue
		}
		if !f.Mode.IsRegular() || !bytes.Equal(f.Data, data) {
			t.Errorf("overlay %q: mode %v, %d bytes; want a regular file of %d bytes, byte-exact", p, f.Mode, len(f.Data), len(data))
		}
	}
	if f, ok := files["deep"]; ok && !f.Mode.IsDir() {
		t.Errorf("overlay entry deep has mode %v; want a directory", f.Mode)
	}
	deleted := map[string]bool{}
	for _, p := range res.Overlay.Deleted {
		deleted[p] = true
	}
	if !deleted["delete.txt"] {
		t.Errorf("overlay deletions %v miss delete.txt", res.Overlay.Deleted)
	}
	for p := range deleted {
		if p != "delete.txt" {
			t.Errorf("overlay reports %q deleted; only delete.txt was", p)
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func testReconcileSparesLive(t *testing.T, s *suite) {
	e := s.setup(t)
	ctx := context.Background()
	if err := e.b.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile on a fresh backend: %v", err)
	}
	// The command holds on its stdin while Reconcile runs, then finishes
	// its work: Reconcile must not have removed what it was using.
	pr, pw := io.Pipe()
	out := &recorder{}
	done := e.execUntilStarted(ctx, &backend.Request{
		Shell: "echo started; cat > /dev/null; echo kept > after.txt; echo finished",
		Stdin: pr,
	}, out)
	rerr := e.b.Reconcile(ctx)
	pw.Close()
	o := testenv.Recv(t, done, s.d(2*time.Minute), "Exec's return")
	if rerr != nil {
		t.Errorf("Reconcile during a live execution: %v", rerr)
	}
	if o.err != nil {
		t.Fatalf("Exec: %v", o.err)
	}
	if o.res.ExitCode != 0 || out.String() != "started\nfinished\n" {
		t.Errorf("the live execution was disturbed: exit %d, termination %q, stdout %q", o.res.ExitCode, o.res.Termination, out.String())
	}
	if got, ok := e.written(o.res, "after.txt"); !ok || string(got) != "kept\n" {
		t.Errorf("after.txt written after Reconcile: %q, %v", got, ok)
	}
}

func testClose(t *testing.T, s *suite) {
	e := s.setup(t)
	out := &recorder{}
	done := e.execUntilStarted(context.Background(), &backend.Request{Shell: "echo started; sleep 30"}, out)
	if err := e.b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	o := testenv.Recv(t, done, s.d(2*time.Minute), "Exec's return")
	// Close may take the command's writes with it (a removed container):
	// the contract's Result with ErrOverlayLost says so, and is a Result.
	if o.err != nil && (o.res == nil || !errors.Is(o.err, backend.ErrOverlayLost)) {
		t.Errorf("the running Exec returned an error after Close: %v (a started process must give a Result)", o.err)
	} else if o.res == nil {
		t.Errorf("the running Exec returned no Result after Close")
	} else if o.res.Termination == backend.Exited {
		t.Errorf("the running command was not ended by Close: %+v", o.res)
	}
	res, err := e.b.Exec(context.Background(), e.request(&backend.Request{Shell: "true"}))
	if !errors.Is(err, backend.ErrClosed) || res != nil {
		t.Errorf("Exec after Close: result %v, error %v; want ErrClosed", res != nil, err)
	}
	if err := e.b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// execOutcome is what an Exec run in the background returned.
type execOutcome struct {
	res *backend.Result
	err error
}

// execUntilStarted runs req in the background with its stdout going to
// out and returns, with the channel its outcome will arrive on, once the
// command has printed "started"; it fails the case if Exec ends first.
func (e *env) execUntilStarted(ctx context.Context, req *backend.Request, out *recorder) <-chan execOutcome {
	e.t.Helper()
	started := make(chan struct{})
	var once sync.Once
	out.watch = func(total []byte) {
		if bytes.Contains(total, []byte("started\n")) {
			once.Do(func() { close(started) })
		}
	}
	req.Stdout = out
	done := make(chan execOutcome, 1)
	go func() {
		res, err := e.b.Exec(ctx, e.request(req))
		done <- execOutcome{res, err}
	}()
	select {
	case <-started:
	case o := <-done:
		e.t.Fatalf("the command ended before it said it started: %+v, %v", o.res, o.err)
	case <-time.After(e.s.d(2 * time.Minute)):
		e.t.Fatalf("the command did not say it started (stdout %q)", out.String())
	}
	return done
}

// testHiddenPaths: on a backend that honours Request.Hidden, the command
// cannot read a hidden file or list a hidden directory, sees the rest,
// and hiding reports no deletion; what it then writes at a hidden path is
// captured as any write.
func testHiddenPaths(t *testing.T, s *suite) {
	e := s.setup(t)
	if !e.caps.HidesPaths {
		t.Skip("the backend does not honour Request.Hidden (Capabilities.HidesPaths is false); the facade refuses hidden paths on it")
	}
	e.writeFile(".env", []byte("TOKEN=hidden-secret-1\n"))
	e.writeFile("secrets/a.pem", []byte("hidden-secret-2\n"))
	e.writeFile("conf/key.pem", []byte("hidden-secret-3\n"))
	e.writeFile("conf/app.yaml", []byte("visible-conf\n"))
	e.writeFile("keep.txt", []byte("visible-keep\n"))
	before := treeDigest(t, e.ws)
	var out, errOut recorder
	res := e.exec(context.Background(), &backend.Request{
		Shell:  `cat .env secrets/a.pem conf/key.pem 2>/dev/null; ls secrets 2>/dev/null; cat keep.txt conf/app.yaml; grep -r hidden-secret . 2>/dev/null; true`,
		Hidden: []string{".env", "conf/key.pem", "secrets"},
		Stdout: &out, Stderr: &errOut,
	})
	if strings.Contains(out.String(), "hidden-secret") || strings.Contains(out.String(), "a.pem") {
		t.Errorf("the command read a hidden path: %q", out.String())
	}
	if !strings.Contains(out.String(), "visible-keep") || !strings.Contains(out.String(), "visible-conf") {
		t.Errorf("the command lost sight of what is not hidden: %q (stderr %q)", out.String(), errOut.String())
	}
	if e.captures() && !res.Overlay.Empty() {
		t.Errorf("hiding was reported as a change: files %v, deleted %v", overlayPaths(res.Overlay), res.Overlay.Deleted)
	}
	if after := treeDigest(t, e.ws); !equalMaps(before, after) {
		t.Errorf("the real workspace changed:\nbefore %v\nafter  %v", before, after)
	}

	res = e.exec(context.Background(), &backend.Request{
		Shell:  `echo TOKEN=new > .env && mkdir -p secrets && echo mine > secrets/b.pem`,
		Hidden: []string{".env", "conf/key.pem", "secrets"},
		Stderr: &errOut,
	})
	if res.ExitCode != 0 {
		t.Fatalf("writing at hidden paths: exit %d, stderr %q", res.ExitCode, errOut.String())
	}
	if !e.captures() {
		return
	}
	got := map[string]string{}
	for _, f := range res.Overlay.Files {
		got[f.Path] = string(f.Data)
	}
	if got[".env"] != "TOKEN=new\n" || got["secrets/b.pem"] != "mine\n" {
		t.Errorf("writes at hidden paths not captured: %v", got)
	}
	for _, d := range res.Overlay.Deleted {
		t.Errorf("a write at a hidden path reported %s deleted", d)
	}
}

func overlayPaths(o *backend.Overlay) []string {
	if o == nil {
		return nil
	}
	var ps []string
	for _, f := range o.Files {
		ps = append(ps, f.Path)
	}
	return ps
}

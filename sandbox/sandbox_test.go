package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/docker"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

func noEnv(string) string { return "" }

func writeFile(t *testing.T, dir, rel, data string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, dir, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// newHost opens a sandbox on the real host backend (unsafe opt-in).
func newHost(t *testing.T, ws string, opts ...Option) *Sandbox {
	t.Helper()
	opts = append([]Option{withGetenv(noEnv), WithBackendName("host"), WithUnsafeHostExecution(UnsafeNetwork, UnsafeSecrets)}, opts...)
	sb, err := New(context.Background(), ws, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb
}

// newIsolated opens a sandbox on the namespace backend, the capturing
// backend that needs nothing installed; it skips where the kernel lacks
// what the backend needs.
func newIsolated(t *testing.T, ws string, opts ...Option) *Sandbox {
	t.Helper()
	nb, err := namespace.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nb.Close() })
	testenv.MustHaveNamespace(t, nb.Probe)
	opts = append([]Option{withGetenv(noEnv), WithBackend(nb)}, opts...)
	sb, err := New(context.Background(), ws, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb
}

// newDockerBackend is a Docker backend closed when the test ends; it
// skips where no engine answers (fails with PULSE_REQUIRE_DOCKER=1).
func newDockerBackend(t *testing.T) *docker.Backend {
	t.Helper()
	db, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	testenv.MustHaveDocker(t, db.Probe)
	return db
}

// newDocker opens a sandbox of ws on a new Docker backend (see
// newDockerBackend).
func newDocker(t *testing.T, ws string, opts ...Option) *Sandbox {
	t.Helper()
	db := newDockerBackend(t)
	sb, err := New(context.Background(), ws, append([]Option{withGetenv(noEnv), WithBackend(db)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb
}

func verifyAudit(t *testing.T, sb *Sandbox) []audit.Event {
	t.Helper()
	path := sb.AuditPath()
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := audit.Verify(t.Context(), path); err != nil {
		t.Fatalf("audit log does not verify: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []audit.Event
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		e, err := audit.ParseLine(line)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
	return evs
}

func hasEvent(evs []audit.Event, match func(audit.Event) bool) bool {
	for _, e := range evs {
		if match(e) {
			return true
		}
	}
	return false
}

func TestNoBackendRefusesAndSaysHowToOptIn(t *testing.T) {
	ws := t.TempDir()
	_, err := New(context.Background(), ws, withGetenv(noEnv), WithBackendName("host"))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	var ue *UnavailableError
	if !errors.As(err, &ue) || len(ue.Tried) != 1 || !strings.Contains(err.Error(), "--unsafe-host") {
		t.Fatalf("error does not say how to opt in: %v", err)
	}
	evs, rerr := os.ReadFile(filepath.Join(ws, ".pulse", "audit.jsonl"))
	if rerr != nil || !bytes.Contains(evs, []byte(`"sandbox-init"`)) || !bytes.Contains(evs, []byte(`"deny"`)) {
		t.Fatalf("refusal not audited: %v %s", rerr, evs)
	}
}

func TestHostWritesInPlaceAndSaysWhat(t *testing.T) {
	ws := t.TempDir()
	writeFile(t, ws, "old.txt", "old\n")
	writeFile(t, ws, "gone.txt", "bye\n")
	sb := newHost(t, ws)
	res, err := sb.Execute(context.Background(), Command{Shell: "echo hi > hi.txt; echo more >> old.txt; rm gone.txt; echo out; echo err >&2"})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Stdout != "out\n" || res.Stderr != "err\n" {
		t.Fatalf("result = %+v", res)
	}
	if !res.InPlace || res.Transaction != "" {
		t.Fatalf("host backend must report in-place writes: %+v", res)
	}
	if got := strings.Join(res.Changed, ","); got != "hi.txt,old.txt" {
		t.Fatalf("Changed = %q", got)
	}
	if got := strings.Join(res.Deleted, ","); got != "gone.txt" {
		t.Fatalf("Deleted = %q", got)
	}
	if readFile(t, ws, "hi.txt") != "hi\n" {
		t.Fatal("host backend did not write in place")
	}
	evs := verifyAudit(t, sb)
	if !hasEvent(evs, func(e audit.Event) bool { return e.Action == "write-in-place" && e.Target == "hi.txt" }) {
		t.Fatal("in-place write not audited")
	}
	if !hasEvent(evs, func(e audit.Event) bool { return e.Action == "sandbox-init" && e.Reason == "UNSAFE_HOST" }) {
		t.Fatal("UNSAFE_HOST not audited")
	}
}

func TestShellDeniedStartsNoProcess(t *testing.T) {
	ws := t.TempDir()
	pol := policy.Default()
	pol.Rules = append(pol.Rules, policy.Rule{Action: policy.Shell, Target: "*marker*", Decision: policy.Deny})
	sb := newHost(t, ws, WithPolicy(pol))
	_, err := sb.Execute(context.Background(), Command{Shell: "touch marker"})
	if !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("err = %v, want ErrPolicyDenied", err)
	}
	if _, err := os.Stat(filepath.Join(ws, "marker")); !os.IsNotExist(err) {
		t.Fatal("a denied command ran")
	}
	evs := verifyAudit(t, sb)
	if !hasEvent(evs, func(e audit.Event) bool { return e.Action == "shell" && e.Decision == "deny" }) {
		t.Fatal("denial not audited")
	}
}

func TestSecretsScrubbedFromStreamedOutput(t *testing.T) {
	ws := t.TempDir()
	const token = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
	pol := policy.Default()
	pol.Defaults[policy.Secrets] = policy.Allow
	sb := newHost(t, ws, WithPolicy(pol), WithSecrets([]secrets.Secret{{Name: "GITHUB_TOKEN", Value: token}}),
		WithSecretPolicy(secrets.AllowSecrets("GITHUB_TOKEN")))
	var out bytes.Buffer
	// printf of the halves in separate writes splits the secret across
	// chunks: the streaming scrubber must still catch it.
	res, err := sb.Execute(context.Background(), Command{
		Shell:  `printf '%s' "${GITHUB_TOKEN%????????????????????}"; sleep 0.05; printf '%s\n' "${GITHUB_TOKEN#????????????????????}"`,
		Stdout: &out,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("res=%+v err=%v", res, err)
	}
	if strings.Contains(out.String(), token) || strings.Contains(out.String(), token[:20]+token[20:]) {
		t.Fatalf("secret leaked: %q", out.String())
	}
	if !strings.Contains(out.String(), "[REDACTED:GITHUB_TOKEN]") {
		t.Fatalf("secret not redacted by name: %q", out.String())
	}
	evs := verifyAudit(t, sb)
	raw, _ := os.ReadFile(filepath.Join(ws, ".pulse", "audit.jsonl"))
	if bytes.Contains(raw, []byte(token)) {
		t.Fatal("secret in the audit log")
	}
	_ = evs
}

func TestSecretNotPassedWhenPolicyDeniesIt(t *testing.T) {
	ws := t.TempDir()
	sb := newHost(t, ws, WithSecrets([]secrets.Secret{{Name: "API_KEY", Value: "supersecretvalue"}}))
	res, err := sb.Execute(context.Background(), Command{Shell: `echo "key=${API_KEY:-unset}"`})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "key=unset\n" {
		t.Fatalf("default policy passed a secret: %q", res.Stdout)
	}
}

func TestIsolatedWritesArePendingAndWorkspaceUntouched(t *testing.T) {
	ws := t.TempDir()
	writeFile(t, ws, "a.txt", "one\n")
	writeFile(t, ws, "del.txt", "x\n")
	sb := newIsolated(t, ws)
	res, err := sb.Execute(context.Background(), Command{Shell: "echo two >> a.txt; echo new > b.txt; rm del.txt; printf '\\000\\377' > bin.dat"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("res=%+v err=%v", res, err)
	}
	if res.Transaction == "" || res.InPlace {
		t.Fatalf("no pending transaction: %+v", res)
	}
	if readFile(t, ws, "a.txt") != "one\n" {
		t.Fatal("workspace changed before commit")
	}
	if _, err := os.Stat(filepath.Join(ws, "b.txt")); !os.IsNotExist(err) {
		t.Fatal("new file landed before commit")
	}
	tx, err := sb.OpenTx(t.Context(), res.Transaction)
	if err != nil {
		t.Fatal(err)
	}
	diff, err := tx.Diff(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"+two", "b/b.txt", "deleted file mode", "Binary files"} {
		if !strings.Contains(diff, want) {
			t.Fatalf("diff lacks %q:\n%s", want, diff)
		}
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if readFile(t, ws, "a.txt") != "one\ntwo\n" || readFile(t, ws, "bin.dat") != "\x00\xff" {
		t.Fatal("commit did not apply byte-exact")
	}
	if _, err := os.Stat(filepath.Join(ws, "del.txt")); !os.IsNotExist(err) {
		t.Fatal("deletion not applied")
	}
}

func TestAutoCommitReportsConflictInsteadOfOverwriting(t *testing.T) {
	ws := t.TempDir()
	writeFile(t, ws, "f.txt", "base\n")
	sb := newIsolated(t, ws, WithAutoCommit())
	res, err := sb.Execute(context.Background(), Command{Shell: "echo mine > f.txt"})
	if err != nil || res.CommitErr != nil || len(res.Committed) != 1 {
		t.Fatalf("auto-commit failed: res=%+v err=%v", res, err)
	}
	if readFile(t, ws, "f.txt") != "mine\n" {
		t.Fatal("auto-commit did not apply")
	}

	// Someone else changes the file after the command staged it: the
	// commit must refuse rather than overwrite theirs.
	sb2 := newIsolated(t, ws)
	res, err = sb2.Execute(context.Background(), Command{Shell: "echo staged > f.txt"})
	if err != nil || res.Transaction == "" {
		t.Fatalf("res=%+v err=%v", res, err)
	}
	writeFile(t, ws, "f.txt", "theirs\n")
	tx, err := sb2.OpenTx(t.Context(), res.Transaction)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(context.Background()); !errors.Is(err, ErrConflict) {
		t.Fatalf("commit over a changed file: err = %v, want ErrConflict", err)
	}
	if readFile(t, ws, "f.txt") != "theirs\n" {
		t.Fatal("a conflicting commit overwrote the file")
	}
}

// A backend that cannot enforce an allowlist (this one lists only
// deny-all) is never asked to run a command under one.
func TestUnenforceableNetworkPolicyIsRefusedBeforeStart(t *testing.T) {
	ws := t.TempDir()
	pol := policy.Default()
	pol.Defaults[policy.Network] = policy.Allow
	wb := &weakBackend{}
	sb, err := New(context.Background(), ws, WithBackend(wb), WithPolicy(pol),
		WithNetworkPolicy(policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Hosts: []string{"example.com"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	_, err = sb.Execute(context.Background(), Command{Shell: "touch ran"})
	if !errors.Is(err, ErrUnsupportedPolicy) || !strings.Contains(err.Error(), "network") {
		t.Fatalf("err = %v, want ErrUnsupportedPolicy about the network", err)
	}
	if wb.execs != 0 {
		t.Fatal("the backend was asked to run a refused command")
	}
	evs := verifyAudit(t, sb)
	if !hasEvent(evs, func(e audit.Event) bool { return e.Reason == "unsupported_policy" && e.Decision == "deny" }) {
		t.Fatal("refusal not audited")
	}
}

// weakBackend claims best-effort enforcement of everything. No real
// backend is that weak on secrets deny-all, so a fake is the only way to
// show the facade refusing on the secrets side.
type weakBackend struct {
	backend.Backend
	mu    sync.Mutex
	execs int
}

func (w *weakBackend) Name() string { return "weak" }
func (w *weakBackend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Isolation: backend.IsolationContainer,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{policy.NetworkDenyAll: policy.Strong},
		Secrets: map[secrets.Mode]policy.EnforcementLevel{secrets.DenyAll: policy.BestEffort}}
}
func (w *weakBackend) Reconcile(context.Context) error { return nil }
func (w *weakBackend) Close() error                    { return nil }
func (w *weakBackend) Exec(context.Context, *backend.Request) (*backend.Result, error) {
	w.mu.Lock()
	w.execs++
	w.mu.Unlock()
	return &backend.Result{Termination: backend.Exited}, nil
}

func TestWeakSecretEnforcementIsRefused(t *testing.T) {
	wb := &weakBackend{}
	sb, err := New(context.Background(), t.TempDir(), WithBackend(wb))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	_, err = sb.Execute(context.Background(), Command{Args: []string{"true"}})
	if !errors.Is(err, ErrUnsupportedPolicy) || !strings.Contains(err.Error(), "secrets") {
		t.Fatalf("err = %v, want ErrUnsupportedPolicy about secrets", err)
	}
	if wb.execs != 0 {
		t.Fatal("the backend was asked to run a refused command")
	}
}

func TestOverlayPathsDeniedByPolicyAreNotStaged(t *testing.T) {
	ws := t.TempDir()
	pol := policy.Default()
	pol.Rules = append(pol.Rules, policy.Rule{Action: policy.Write, Target: "locked/*", Decision: policy.Deny})
	const key = "AKIAverysecretkeyvalue"
	sb := newIsolated(t, ws, WithPolicy(pol), WithSecrets([]secrets.Secret{{Value: key}}))
	res, err := sb.Execute(context.Background(), Command{Shell: "mkdir -p locked; echo x > locked/f; echo ok > fine.txt; echo " + key + " > leak.txt"})
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]bool{}
	for _, r := range res.Refused {
		refused[r.Path] = true
	}
	if !refused["locked/f"] || !refused["leak.txt"] {
		t.Fatalf("Refused = %+v", res.Refused)
	}
	staged := strings.Join(res.Staged, ",")
	if !strings.Contains(staged, "fine.txt") || strings.Contains(staged, "locked/f") || strings.Contains(staged, "leak.txt") {
		t.Fatalf("Staged = %q", staged)
	}
}

func TestConcurrentExecutesGetTheirOwnResults(t *testing.T) {
	ws := t.TempDir()
	sb := newIsolated(t, ws)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := sb.Execute(context.Background(), Command{Args: []string{"sh", "-c", "echo $0 > out-$0.txt; echo $0", string(rune('a' + i))}})
			if err != nil {
				errs <- err
				return
			}
			want := string(rune('a'+i)) + "\n"
			if res.Stdout != want || len(res.Staged) != 1 || res.Staged[0] != "out-"+string(rune('a'+i))+".txt" {
				errs <- errors.New("mixed results: " + res.Stdout + " " + strings.Join(res.Staged, ","))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestReadFileChecksPolicyAndRedacts(t *testing.T) {
	ws := t.TempDir()
	writeFile(t, ws, "cfg.txt", "token=s3cr3t-value\n")
	writeFile(t, ws, "private/key", "k")
	pol := policy.Default()
	pol.Rules = append(pol.Rules, policy.Rule{Action: policy.Read, Target: "private/*", Decision: policy.Deny})
	sb := newHost(t, ws, WithPolicy(pol), WithSecrets([]secrets.Secret{{Value: "s3cr3t-value"}}))
	b, err := sb.ReadFile(context.Background(), "cfg.txt")
	if err != nil || string(b) != "token=[REDACTED]\n" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	if _, err := sb.ReadFile(context.Background(), "private/key"); !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("err = %v, want ErrPolicyDenied", err)
	}
	if _, err := sb.ReadFile(context.Background(), "../outside"); err == nil {
		t.Fatal("read outside the workspace allowed")
	}
}

func TestStageRefusesSecretsAndDeniedPaths(t *testing.T) {
	ws := t.TempDir()
	pol := policy.Default()
	pol.Rules = append(pol.Rules, policy.Rule{Action: policy.Delete, Target: "keep.txt", Decision: policy.Deny})
	sb := newHost(t, ws, WithPolicy(pol), WithSecrets([]secrets.Secret{{Value: "hunter2hunter2"}}))
	ctx := context.Background()
	tx, err := sb.BeginTx(ctx, "manual edit")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, "a.txt", []byte("pw=hunter2hunter2"), 0o644); !errors.Is(err, ErrSecretInContent) {
		t.Fatalf("err = %v, want ErrSecretInContent", err)
	}
	if err := tx.Delete(ctx, "keep.txt"); !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("err = %v, want ErrPolicyDenied", err)
	}
	if err := tx.Write(ctx, "a.txt", []byte("fine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if readFile(t, ws, "a.txt") != "fine\n" {
		t.Fatal("commit did not apply")
	}
}

func TestSafeGitRefusesOptionInjectionAndRuns(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	ws := t.TempDir()
	if out, err := exec.Command("git", "-C", ws, "init", "-q").CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	writeFile(t, ws, "x.txt", "x")
	pol := policy.Default()
	pol.Defaults[policy.Git] = policy.Allow
	sb := newHost(t, ws, WithPolicy(pol))
	if _, err := sb.Git().Checkout(context.Background(), "--orphan=evil"); !errors.Is(err, ErrInvalidCommand) {
		t.Fatalf("err = %v, want ErrInvalidCommand", err)
	}
	res, err := sb.Git().Status(context.Background())
	if err != nil || res.ExitCode != 0 || !strings.Contains(res.Stdout, "?? x.txt") {
		t.Fatalf("git status: %+v %v", res, err)
	}
	pol2 := policy.Default()
	pol2.Rules = append(pol2.Rules, policy.Rule{Action: policy.Git, Target: "commit *", Decision: policy.Deny})
	sb2 := newHost(t, ws, WithPolicy(pol2))
	if _, err := sb2.Git().Commit(context.Background(), "msg"); !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("err = %v, want ErrPolicyDenied", err)
	}
}

func TestClosedSandboxRefuses(t *testing.T) {
	sb := newHost(t, t.TempDir())
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"true"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
}

func TestCancelReturnsContextError(t *testing.T) {
	sb := newHost(t, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		cancel()
	}()
	res, err := sb.Execute(ctx, Command{Shell: "sleep 5"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if res != nil && res.Termination != backend.Cancelled {
		t.Fatalf("termination = %v", res.Termination)
	}
}

// signalWriter closes ready at its first write.
type signalWriter struct {
	once  sync.Once
	ready chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.ready) })
	return len(p), nil
}

// TestCancelKeepsPartialResult: a command that prints and then sleeps is
// cancelled once it has printed; Execute returns ctx's error together
// with the Result — the output printed so far, Termination Cancelled, an
// execution id — as a timeout does, on the namespace and Docker backends.
func TestCancelKeepsPartialResult(t *testing.T) {
	for _, bk := range []struct {
		name string
		open func(*testing.T, string, ...Option) *Sandbox
	}{{"namespace", newIsolated}, {"docker", newDockerSandbox}} {
		t.Run(bk.name, func(t *testing.T) {
			sb := bk.open(t, t.TempDir())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// Stderr signals that stdout, printed before it, is written.
			sig := &signalWriter{ready: make(chan struct{})}
			go func() {
				select {
				case <-sig.ready:
				case <-time.After(2 * time.Minute): // a bound on a hung start, not a speed check
				}
				cancel()
			}()
			res, err := sb.Execute(ctx, Command{Shell: "echo partial; echo ready >&2; sleep 600", Stderr: sig})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if res == nil {
				t.Fatal("no Result with the cancellation")
			}
			if res.Termination != backend.Cancelled || res.ExecutionID == "" {
				t.Errorf("termination %q, id %q; want cancelled and an id", res.Termination, res.ExecutionID)
			}
			if string(res.Stdout) != "partial\n" {
				t.Errorf("stdout %q, want %q", res.Stdout, "partial\n")
			}
			// Cancelled before the call: nothing starts, and still a
			// Result names the execution.
			res, err = sb.Execute(ctx, Command{Shell: "echo never"})
			if !errors.Is(err, context.Canceled) || res == nil {
				t.Fatalf("already cancelled: res %v, err %v; want a Result and context.Canceled", res, err)
			}
			if res.Termination != backend.Cancelled || res.ExecutionID == "" || res.Stdout != "" || res.ExitCode != -1 {
				t.Errorf("already cancelled: %+v", res)
			}
		})
	}
}

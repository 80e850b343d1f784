package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/sandbox"
)

func TestExecUnsafeHostSaysItWroteInPlace(t *testing.T) {
	ws := t.TempDir()
	code, _, stderr := runCLI(t, "exec", "--workspace", ws, "--backend", "host", "--unsafe-host=network,secrets", "--", "sh", "-c", "echo hi > hi.txt")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"UNSAFE_HOST", "IN PLACE", "changed  hi.txt"} {
		if !strings.Contains(stderr, want) {
			t.Fatalf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "hi.txt")); string(b) != "hi\n" {
		t.Fatalf("hi.txt = %q", b)
	}
}

func TestExecWithoutIsolationRefusesAndSaysHowToOptIn(t *testing.T) {
	code, _, stderr := runCLI(t, "exec", "--workspace", t.TempDir(), "--backend", "host", "--", "true")
	if code != exitSandbox {
		t.Fatalf("exit %d, want %d", code, exitSandbox)
	}
	if !strings.Contains(stderr, "--unsafe-host") || !strings.Contains(stderr, "host:") {
		t.Fatalf("refusal does not say what was tried and how to opt in:\n%s", stderr)
	}
}

func TestExecPassesTheCommandsExitCode(t *testing.T) {
	code, _, _ := runCLI(t, "exec", "--workspace", t.TempDir(), "--backend", "host", "--unsafe-host=network,secrets", "--", "sh", "-c", "exit 7")
	if code != 7 {
		t.Fatalf("exit %d, want 7", code)
	}
	code, _, _ = runCLI(t, "exec", "--workspace", t.TempDir(), "--backend", "host", "--unsafe-host=network,secrets", "--timeout", "100ms", "--", "sleep", "5")
	if code != exitTimeout {
		t.Fatalf("timeout exit %d, want %d", code, exitTimeout)
	}
}

func TestExecIsolatedShowsPendingDiffAsJSON(t *testing.T) {
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "exec", "--workspace", ws, "--backend", "namespace", "--json", "--", "sh", "-c", "echo two >> a.txt; echo out")
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Stdout      string   `json:"stdout"`
		Transaction string   `json:"transaction"`
		Staged      []string `json:"staged"`
		Diff        string   `json:"diff"`
		InPlace     bool     `json:"in_place"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout)
	}
	if res.Stdout != "out\n" || res.Transaction == "" || res.InPlace || !strings.Contains(res.Diff, "+two") {
		t.Fatalf("result = %+v", res)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "one\n" {
		t.Fatal("the workspace changed before review")
	}
	// The pending transaction is what `pulse cow commit` applies.
	if code, _, stderr := runCLI(t, "cow", "commit", "--workspace", ws, res.Transaction); code != 0 {
		t.Fatalf("cow commit: exit %d: %s", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "one\ntwo\n" {
		t.Fatalf("after commit a.txt = %q", b)
	}
}

func TestExecUsageErrors(t *testing.T) {
	if code, _, _ := runCLI(t, "exec"); code != exitUsage {
		t.Fatalf("no command: exit %d", code)
	}
	if code, _, _ := runCLI(t, "exec", "--backend", "nope", "--", "true"); code != exitUsage {
		t.Fatalf("bad backend: exit %d", code)
	}
	if code, _, _ := runCLI(t, "exec", "--policy", "/nonexistent/policy.yaml", "--", "true"); code != exitUsage {
		t.Fatalf("missing policy: exit %d", code)
	}
}

func TestDoctorListsEveryBackendWithEnforcement(t *testing.T) {
	code, stdout, stderr := runCLI(t, "doctor")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"remote:", "docker:", "namespace:", "host:", "deny-all", "not allowed"} {
		if !strings.Contains(stdout, want) {
			t.Fatalf("doctor output lacks %q:\n%s", want, stdout)
		}
	}
}

func TestExecWarnsWhenTheConfiguredRemoteIsUnreachable(t *testing.T) {
	var out, errb strings.Builder
	env := &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string {
		switch k {
		case "PULSE_REMOTE_URL":
			return "ws://127.0.0.1:1"
		case "PULSE_REMOTE_TOKEN":
			return "dev"
		}
		return ""
	}}
	code := run(context.Background(), env, []string{"exec", "--workspace", t.TempDir(), "--unsafe-host=network,secrets", "--", "true"})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "PULSE_REMOTE_URL is set but the remote backend is unavailable") {
		t.Fatalf("no warning about the unreachable remote:\n%s", errb.String())
	}
}

func TestExecReviewHintNamesTheWorkspace(t *testing.T) {
	ws := t.TempDir()
	code, _, stderr := runCLI(t, "exec", "--workspace", ws, "--backend", "namespace", "--", "sh", "-c", "echo x > f")
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != 0 || !strings.Contains(stderr, "pulse cow commit --workspace "+ws+" ") {
		t.Fatalf("exit %d; hint does not name the workspace:\n%s", code, stderr)
	}
}

func TestExecJSONScrubsTheCommandLine(t *testing.T) {
	const secret = "zq7-plain-configured-value-0042"
	var out, errb strings.Builder
	env := &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "API_KEY" {
			return secret
		}
		return ""
	}}
	code := run(context.Background(), env, []string{"exec", "--workspace", t.TempDir(), "--backend", "host", "--unsafe-host=network,secrets",
		"--secret-env", "API_KEY", "--json", "--", "echo", "key=" + secret})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res struct {
		Command string `json:"command"`
		Stdout  string `json:"stdout"`
	}
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), secret) || !strings.Contains(res.Command, "[REDACTED:API_KEY]") {
		t.Fatalf("the JSON result leaks the secret or does not say it was redacted:\n%s", out.String())
	}
}

// `--timeout` used to replace the policy's limits, dropping its pids cap:
// 100 processes ran under `pids: 32`.
func TestExecTimeoutKeepsThePolicysPidsLimit(t *testing.T) {
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("version: 1\nlimits: {pids: 32, timeout: 5m}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Only shell builtins besides sleep, so that the count is of the
	// processes the loop starts.
	script := `i=0; while [ $i -lt 100 ]; do sleep 5 & i=$((i+1)); done; echo started $i; kill $(jobs -p) 2>/dev/null`
	code, stdout, stderr := runCLI(t, "exec", "--workspace", t.TempDir(), "--backend", "namespace", "--policy", pol,
		"--timeout", "60s", "--json", "--", "sh", "-c", script)
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code == exitSandbox {
		t.Fatalf("refused: %s", stderr)
	}
	if strings.Contains(stdout, "started 100") {
		t.Fatalf("100 processes started under pids: 32 (exit %d):\n%s", code, stdout)
	}

	// Asking for more than the policy allows is refused and says so.
	code, _, stderr = runCLI(t, "exec", "--workspace", t.TempDir(), "--backend", "namespace", "--policy", pol,
		"--timeout", "1h", "--", "true")
	if code != exitSandbox || !strings.Contains(stderr, "timeout") || !strings.Contains(stderr, "at most 5m0s") {
		t.Fatalf("exit %d, want %d and a message naming the policy's timeout:\n%s", code, exitSandbox, stderr)
	}
}

// docs/policy.md's example: a read-deny rule keeps `cat .env` from
// printing it.
func TestExecCatOfADeniedFileDoesNotPrintIt(t *testing.T) {
	ws := t.TempDir()
	const secret = "cli-dotenv-secret-3390"
	if err := os.WriteFile(filepath.Join(ws, ".env"), []byte("TOKEN="+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("version: 1\nrules:\n  - {action: read, target: \".env\", decision: deny}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "exec", "--workspace", ws, "--backend", "namespace", "--policy", pol, "--json", "--", "sh", "-c", "cat .env; echo done")
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != 0 || strings.Contains(stdout, secret) || !strings.Contains(stdout, "done") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// A command that wrote thousands of files must not print them all on the
// summary's one line; a few are named, the rest counted.
func TestSummaryNamesAFewCommittedPathsAndCountsTheRest(t *testing.T) {
	for _, n := range []int{1, maxNamedPaths, maxNamedPaths + 5, 1000} {
		res := &sandbox.Result{}
		for i := range n {
			res.Committed = append(res.Committed, fmt.Sprintf("f%04d.txt", i))
		}
		var b strings.Builder
		summarize(&b, res, "", "pulse cow", "", nil, 0)
		out := b.String()
		if !strings.Contains(out, fmt.Sprintf("committed %d path(s): f0000.txt", n)) {
			t.Fatalf("%d paths: summary lacks the count and first path:\n%s", n, out)
		}
		named := min(n, maxNamedPaths)
		if !strings.Contains(out, res.Committed[named-1]) {
			t.Fatalf("%d paths: summary lacks path %d:\n%s", n, named, out)
		}
		more := fmt.Sprintf("and %d more", n-named)
		if n > named && (strings.Contains(out, res.Committed[named]) || !strings.Contains(out, more)) {
			t.Fatalf("%d paths: summary names past %d or does not say %q:\n%s", n, named, more, out)
		}
		if n == named && strings.Contains(out, "more") {
			t.Fatalf("%d paths: summary counts a rest that is not there:\n%s", n, out)
		}
	}
}

// TestSummaryWarnsOfConcurrentChanges: the summary names the paths another
// command changed while this one ran, and how to look at both versions.
func TestSummaryWarnsOfConcurrentChanges(t *testing.T) {
	res := &sandbox.Result{Transaction: "abc", Staged: []string{"shared", "mine"}, ConcurrentChanges: []string{"shared"}}
	var b strings.Builder
	summarize(&b, res, "", "pulse cow", " --workspace ws", nil, 0)
	out := b.String()
	if !strings.Contains(out, "warning: shared changed while this command ran") ||
		!strings.Contains(out, "pulse cow diff --workspace ws abc shows") {
		t.Fatalf("summary:\n%s", out)
	}
	b.Reset()
	summarize(&b, &sandbox.Result{Transaction: "abc", Staged: []string{"mine"}}, "", "pulse cow", "", nil, 0)
	if strings.Contains(b.String(), "warning") {
		t.Fatalf("summary warns without a concurrent change:\n%s", b.String())
	}
}

// TestSummaryClipsALongDiff: the summary shows the head of a long diff,
// cut at a line end, and says how much is left and how to see it whole;
// a short one whole.
func TestSummaryClipsALongDiff(t *testing.T) {
	var long strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&long, "+line %d\n", i)
	}
	res := &sandbox.Result{Transaction: "abc", Staged: []string{"f"}}
	var b strings.Builder
	summarize(&b, res, long.String(), "pulse cow", "", nil, 0)
	out := b.String()
	if !strings.Contains(out, "+line 0\n") || !strings.Contains(out, fmt.Sprintf("+line %d\n", maxSummaryDiffLines-1)) ||
		strings.Contains(out, fmt.Sprintf("+line %d\n", maxSummaryDiffLines)) {
		t.Fatalf("summary does not end the diff at line %d:\n%.300s", maxSummaryDiffLines, out)
	}
	if want := fmt.Sprintf("and %d more line(s) of diff (pulse cow diff abc shows it whole", 2000-maxSummaryDiffLines); !strings.Contains(out, want) {
		t.Fatalf("summary lacks %q", want)
	}
	huge := strings.Repeat("+"+strings.Repeat("x", 999)+"\n", 100) // 100 KB in 100 lines
	b.Reset()
	summarize(&b, res, huge, "pulse cow", "", nil, 0)
	if out := b.String(); len(out) > maxSummaryDiffBytes+1024 || !strings.Contains(out, "more line(s) of diff") {
		t.Fatalf("a diff of long lines is shown whole (%d bytes)", len(out))
	}
	b.Reset()
	summarize(&b, res, "+short\n", "pulse cow", "", nil, 0)
	if out := b.String(); !strings.Contains(out, "+short\n") || strings.Contains(out, "more line(s)") {
		t.Fatalf("a short diff is clipped:\n%s", out)
	}
	if got, more := clipDiff("a\nb"); got != "a\nb" || more != 0 {
		t.Fatalf("clipDiff of a diff without a last newline = %q, %d", got, more)
	}
}

// A command whose writes the sandbox could not capture (here a file over
// the namespace backend's 1 GiB limit of one overlay file, made sparse so
// that it costs no disk) ran, but nothing of what it wrote is staged:
// ok.txt is lost with it. pulse exec must say so and fail, not print "no
// file changed" and exit with the command's 0, as if there had been
// nothing to review.
func TestExecSaysWhenTheCommandsWritesWereLost(t *testing.T) {
	script := "echo kept > ok.txt; truncate -s 1100M big.bin"
	for _, asJSON := range []bool{false, true} {
		ws := t.TempDir()
		args := []string{"exec", "--workspace", ws, "--backend", "namespace"}
		if asJSON {
			args = append(args, "--json")
		}
		code, stdout, stderr := runCLI(t, append(args, "--", "sh", "-c", script)...)
		if code == exitSandbox && strings.Contains(stderr, "namespace:") && !strings.Contains(stderr, "lost") {
			testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
		}
		if code != exitSandbox {
			t.Errorf("json=%v: exit %d, want %d\nstdout: %s\nstderr: %s", asJSON, code, exitSandbox, stdout, stderr)
		}
		if !strings.Contains(stderr, "writes were lost") {
			t.Errorf("json=%v: stderr does not say the writes were lost:\n%s", asJSON, stderr)
		}
		if !asJSON && strings.Contains(stderr, "no file changed") {
			t.Errorf("stderr claims no file changed:\n%s", stderr)
		}
		if asJSON {
			var res struct {
				ExitCode    int    `json:"exit_code"`
				Transaction string `json:"transaction"`
				Error       string `json:"error"`
			}
			if err := json.Unmarshal([]byte(stdout), &res); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, stdout)
			}
			if res.Transaction != "" || !strings.Contains(res.Error, "writes were lost") {
				t.Errorf("JSON result = %+v; want no transaction and an error saying the writes were lost", res)
			}
		}
		if _, err := os.Stat(filepath.Join(ws, "ok.txt")); !os.IsNotExist(err) {
			t.Errorf("json=%v: ok.txt reached the workspace: %v", asJSON, err)
		}
	}
}

// TestExecUnsafeHostRefusesWhatItCannotEnforce: --unsafe-host is consent
// to running unisolated, not to dropping rules. Under the built-in policy
// (network and secrets denied) the host is refused, naming the flag that
// accepts each rule (with those accepted already), until --unsafe-host
// names them; a policy the host
// enforces (network and secrets allowed) runs with the plain flag.
func TestExecUnsafeHostRefusesWhatItCannotEnforce(t *testing.T) {
	allow := filepath.Join(t.TempDir(), "allow.yaml")
	must(t, os.WriteFile(allow, []byte("version: 1\ndefaults: {read: allow, write: ask, delete: ask, shell: allow, git: ask, network: allow, secrets: allow}\n"), 0o644))
	for _, c := range []struct {
		flags []string
		code  int
		says  string
	}{
		{[]string{"--unsafe-host"}, exitSandbox, "--unsafe-host=network,secrets"},
		// The list to pass keeps what was accepted: secrets in addition.
		{[]string{"--unsafe-host=network"}, exitSandbox, "--unsafe-host=network,secrets`"},
		{[]string{"--unsafe-host=secrets,network"}, exitOK, ""},
		{[]string{"--unsafe-host", "--policy", allow}, exitOK, ""},
		{[]string{"--unsafe-host=network,everything"}, exitUsage, "everything"},
	} {
		ws := t.TempDir()
		args := append(append([]string{"exec", "--workspace", ws, "--backend", "host"}, c.flags...), "--", "sh", "-c", "echo ran > ran.txt")
		code, _, stderr := runCLI(t, args...)
		_, ran := os.Stat(filepath.Join(ws, "ran.txt"))
		if code != c.code || !strings.Contains(stderr, c.says) || (ran == nil) != (c.code == exitOK) {
			t.Errorf("%q: exit %d (ran: %v), want %d saying %q:\n%s", c.flags, code, ran == nil, c.code, c.says, stderr)
		}
	}

	code, stdout, _ := runCLI(t, "doctor", "--unsafe-host")
	for _, want := range []string{
		"the host enforces: network allow-all, secrets allow-all",
		"network deny-all, network allowlist: accepted by --unsafe-host=network",
		"files on disk stay readable): accepted by --unsafe-host=secrets",
		"read-deny rules (the command can read every file): accepted by --unsafe-host=reads",
		"to run anyway, accept each by name",
	} {
		if code != exitOK || !strings.Contains(strings.ToLower(stdout), strings.ToLower(want)) {
			t.Fatalf("pulse doctor --unsafe-host does not say %q:\n%s", want, stdout)
		}
	}
	code, stdout, _ = runCLI(t, "doctor", "--unsafe-host", "--json")
	if code != exitOK || !strings.Contains(stdout, `"needs_unsafe": [`) {
		t.Fatalf("doctor --unsafe-host --json does not list the rules to accept: %d\n%s", code, stdout)
	}
	code, stdout, _ = runCLI(t, "doctor", "--unsafe-host=network,secrets", "--json")
	if code != exitOK || !strings.Contains(stdout, `"name": "host"`) || strings.Contains(stdout, `"needs_unsafe"`) {
		t.Fatalf("doctor --unsafe-host=network,secrets --json: %d\n%s", code, stdout)
	}
}

// TestSummaryNamesTheDiskBound: a command stopped at the disk bound is
// told which bound it was: the policy's, by size, or, where the policy
// sets none, the backend's default and where to see it; never the
// default when the policy set one.
func TestSummaryNamesTheDiskBound(t *testing.T) {
	res := &sandbox.Result{Termination: backend.DiskLimit, ExitCode: -1}
	var b strings.Builder
	summarize(&b, res, "", "pulse cow", "", nil, 1<<30)
	if out := b.String(); !strings.Contains(out, "limits.disk_bytes of the policy, 1.0GiB") || strings.Contains(out, "default") {
		t.Fatalf("policy bound of 1 GiB, summary:\n%s", out)
	}
	b.Reset()
	summarize(&b, res, "", "pulse cow", "", nil, 0)
	if out := b.String(); !strings.Contains(out, "the backend's default") || !strings.Contains(out, "pulse doctor") ||
		!strings.Contains(out, "set limits.disk_bytes in the policy") {
		t.Fatalf("no policy bound, summary:\n%s", out)
	}
}

// TestSummaryDiskBoundOnDocker: a Docker command stops at a disk bound
// that is either the workspace space (limits.disk_bytes) or /tmp, whose
// size is fixed; the backend's own line says which. The summary must not
// tell a command that filled /tmp to raise limits.disk_bytes: it names
// both spaces and points at that line.
func TestSummaryDiskBoundOnDocker(t *testing.T) {
	res := &sandbox.Result{Backend: "docker", Isolation: backend.IsolationContainer, Termination: backend.DiskLimit, ExitCode: 1}
	for _, policyDisk := range []int64{0, 1 << 30} {
		var b strings.Builder
		summarize(&b, res, "", "pulse cow", "", nil, policyDisk)
		out := b.String()
		if strings.Contains(out, "to allow more") || !strings.Contains(out, "/tmp") || !strings.Contains(out, "disk_limit line above") {
			t.Fatalf("policy disk_bytes %d, summary:\n%s", policyDisk, out)
		}
		if policyDisk > 0 && !strings.Contains(out, "1.0GiB") {
			t.Fatalf("the policy's bound is not named:\n%s", out)
		}
	}
}

// TestSummaryExitIsPulsesExit: the summary line names the code pulse
// exec exits with, whatever the backend reported: a command killed at
// the disk bound with a raw exit code of 0 exits 137, and its summary
// must not say "exit 0".
func TestSummaryExitIsPulsesExit(t *testing.T) {
	for _, res := range []*sandbox.Result{
		{Backend: "namespace", Termination: backend.DiskLimit, ExitCode: 0},
		{Backend: "namespace", Termination: backend.DiskLimit, ExitCode: -1},
		{Backend: "namespace", Termination: backend.OOM, ExitCode: 0},
		{Backend: "namespace", Termination: backend.Timeout, ExitCode: 0},
		{Backend: "docker", Isolation: backend.IsolationContainer, Termination: backend.DiskLimit, ExitCode: 1},
		{Backend: "host", Termination: backend.Exited, ExitCode: 3},
		{Backend: "host", Termination: backend.Exited, ExitCode: 0},
	} {
		var b strings.Builder
		summarize(&b, res, "", "pulse cow", "", nil, 0)
		want := fmt.Sprintf("backend, exit %d (%s)", execExitCode(res), res.Termination)
		if !strings.Contains(b.String(), want) {
			t.Errorf("%s exit %d: summary does not say %q:\n%s", res.Termination, res.ExitCode, want, b.String())
		}
	}
	if got := execExitCode(&sandbox.Result{Termination: backend.DiskLimit}); got != exitKilled {
		t.Errorf("disk_limit with exit code 0 exits %d, want %d", got, exitKilled)
	}
}

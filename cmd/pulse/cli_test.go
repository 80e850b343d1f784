package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// everyCommand lists each command line that answers --help: every
// registered command and each of its subcommands.
func everyCommand() [][]string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var out [][]string
	for _, n := range names {
		out = append(out, []string{n})
		for _, s := range commands[n].subcommands {
			out = append(out, []string{n, s})
		}
	}
	return out
}

func TestEveryCommandAnswersHelpAndABadFlag(t *testing.T) {
	for _, path := range everyCommand() {
		name := strings.Join(path, " ")
		t.Run(name, func(t *testing.T) {
			for _, args := range [][]string{
				append(append([]string{}, path...), "--help"),
				append(append([]string{}, path...), "-h"),
				append([]string{"help"}, path...),
			} {
				code, stdout, stderr := runCLI(t, args...)
				if code != exitOK {
					t.Errorf("%q: exit %d, want 0 (stderr %q)", args, code, stderr)
				}
				if !strings.HasPrefix(stdout, "usage: pulse "+name) {
					t.Errorf("%q: help on stdout does not start with the usage line %q:\n%s", args, "usage: pulse "+name, stdout)
				}
				if stderr != "" {
					t.Errorf("%q: help wrote to stderr: %q", args, stderr)
				}
			}
			args := append(append([]string{}, path...), "--no-such-flag")
			if len(path) == 1 && commands[path[0]].subcommands != nil {
				args = []string{path[0], "no-such-subcommand"}
			}
			code, stdout, stderr := runCLI(t, args...)
			if code != exitUsage {
				t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
			}
			if stdout != "" {
				t.Errorf("%q: a usage error wrote to stdout: %q", args, stdout)
			}
			first, _, _ := strings.Cut(stderr, "\n")
			if !strings.HasPrefix(first, "pulse "+path[0]) || !strings.Contains(stderr, "\nusage: pulse "+name) ||
				!strings.Contains(stderr, "pulse help "+name) {
				t.Errorf("%q: stderr does not name the problem, then the usage, then where to look:\n%s", args, stderr)
			}
		})
	}
}

// TestJSONFailureIsAnObjectOnStdout runs each command with --json in a way
// that fails and checks the one shape every failure has.
func TestJSONFailureIsAnObjectOnStdout(t *testing.T) {
	empty := t.TempDir()
	fails := map[string][]string{
		"exec":    {"exec", "--json", "--workspace", empty, "--backend", "no-such-backend", "--", "true"},
		"mcp":     {"mcp", "--json"},
		"doctor":  {"doctor", "--json", "--policy", filepath.Join(empty, "missing.yaml")},
		"version": {"version", "--json", "extra"},
		"cow":     {"cow", "diff", "--json", "--workspace", empty, "no-such-id"},
		"audit":   {"audit", "tail", "--json", filepath.Join(empty, "missing.jsonl")},
		"image":   {"image", "build", "--json", "unexpected"},
		"cache":   {"cache", "prune", "--json", "no-such-cache"},
		"review":  {"review", "--json", "--workspace", empty},
		"gc":      {"gc", "--json", "unexpected"},
		"daemon":  {"daemon", "status", "--json", "unexpected"},
	}
	for name := range commands {
		if _, ok := fails[name]; !ok {
			t.Errorf("command %q has no --json failure case here; add one", name)
		}
	}
	for name, args := range fails {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, args...)
			if code == exitOK {
				t.Fatalf("%q succeeded; the case must fail", args)
			}
			var obj struct {
				Error    string `json:"error"`
				ExitCode *int   `json:"exit_code"`
			}
			dec := json.NewDecoder(strings.NewReader(stdout))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&obj); err != nil {
				t.Fatalf("%q: stdout is not a JSON error object: %v\n%s\nstderr: %s", args, err, stdout, stderr)
			}
			if obj.Error == "" || obj.ExitCode == nil || *obj.ExitCode != code {
				t.Errorf("%q: exit %d, object %+v", args, code, obj)
			}
			if strings.Contains(strings.ToLower(obj.Error), "usage:") {
				t.Errorf("%q: the error is the usage text, not the problem: %q", args, obj.Error)
			}
		})
	}
}

func TestTopLevelHelpDocumentsExitCodesAndJSON(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		code, stdout, _ := runCLI(t, args...)
		if code != exitOK {
			t.Errorf("%q: exit %d", args, code)
		}
		for _, want := range []string{"usage: pulse COMMAND", "exit codes:", "130", "125", "--json", "_ms"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("%q: help lacks %q", args, want)
			}
		}
	}
	if code, _, _ := runCLI(t, "help", "no-such-command"); code != exitUsage {
		t.Errorf("help of an unknown command: exit %d, want %d", code, exitUsage)
	}
}

func TestVersionReportsTheBuild(t *testing.T) {
	code, stdout, _ := runCLI(t, "version", "--json")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	var v versionInfo
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatal(err)
	}
	if v.Module != "github.com/pulse-agent/pulse" || !strings.HasPrefix(v.Go, "go") || v.Version == "" {
		t.Errorf("version = %+v", v)
	}
	if code, stdout, _ := runCLI(t, "version"); code != exitOK || !strings.Contains(stdout, "go:") {
		t.Errorf("version: exit %d, %q", code, stdout)
	}
}

func TestProgNameIsWhatTheUserRan(t *testing.T) {
	for in, want := range map[string]string{
		"pulse":                            "pulse",
		"./bin/pulse":                      "./bin/pulse",
		"/tmp/go-build123/b001/exe/pulse":  "go run github.com/pulse-agent/pulse/cmd/pulse", // no ./cmd/pulse below the test's directory
		"/home/u/go-builds/pulse/bin/tool": "/home/u/go-builds/pulse/bin/tool",
	} {
		if got := progName(in); got != want {
			t.Errorf("progName(%q) = %q, want %q", in, got, want)
		}
	}
	// The review hint after exec uses it.
	code, _, stderr := runCLIAs(t, "go run ./cmd/pulse", "exec", "--workspace", t.TempDir(), "--backend", "namespace", "--", "sh", "-c", "echo x > f")
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != 0 || !strings.Contains(stderr, "commit: go run ./cmd/pulse cow commit --workspace ") {
		t.Errorf("exit %d, hint:\n%s", code, stderr)
	}
}

// TestExecIsolationDowngradeExits125: a policy asking for isolation:
// strong with a backend that shares the host kernel named is refused as
// a sandbox that cannot run the command (125), not as a usage error.
func TestExecIsolationDowngradeExits125(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("isolation: strong\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCLI(t, "exec", "--workspace", t.TempDir(), "--policy", pol, "--backend", "host", "--unsafe-host", "--", "true")
	if code != exitSandbox || !strings.Contains(stderr, "isolation: strong") {
		t.Errorf("exit %d, stderr %q; want %d naming isolation: strong", code, stderr, exitSandbox)
	}
}

// TestSignalExitsWith128PlusN interrupts a real pulse process (this test
// binary acting as pulse) while its command runs: the exit code is 130,
// as a shell reports a command ended by SIGINT.
func TestSignalExitsWith128PlusN(t *testing.T) {
	self, err := os.Executable()
	must(t, err)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		cmd := exec.Command(self, "exec", "--workspace", t.TempDir(), "--backend", "host", "--unsafe-host=network,secrets", "--", "sh", "-c", "echo started; exec sleep 60")
		cmd.Env = append(os.Environ(), asPulseEnv+"=1")
		out, err := cmd.StdoutPipe()
		must(t, err)
		must(t, cmd.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "started\n" {
			cmd.Process.Kill()
			t.Fatalf("did not start: %q %v", line, err)
		}
		must(t, cmd.Process.Signal(sig))
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			t.Fatalf("%v: pulse did not stop", sig)
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(sig) {
			t.Errorf("%v: %v, want exit %d", sig, err, 128+int(sig))
		}
	}
}

func TestDoctorShowsWhatEachBackendDoesUnderAPolicy(t *testing.T) {
	pol := filepath.Join(t.TempDir(), "p.yaml")
	must(t, os.WriteFile(pol, []byte("limits:\n  memory_bytes: 268435456\n  timeout: 90s\n"), 0o644))
	code, stdout, stderr := runCLI(t, "doctor", "--json", "--policy", pol)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var report []struct {
		Name   string `json:"name"`
		Policy *struct {
			Network string `json:"network"`
			Limits  map[string]struct {
				Value float64 `json:"value"`
				Unit  string  `json:"unit"`
				Level string  `json:"level"`
			} `json:"limits"`
			Refused string `json:"refused"`
		} `json:"policy"`
	}
	must(t, json.Unmarshal([]byte(stdout), &report))
	seen := 0
	for _, st := range report {
		if st.Policy == nil {
			continue
		}
		seen++
		if m := st.Policy.Limits["memory_bytes"]; m.Value != 268435456 || m.Unit != "bytes" || m.Level == "" {
			t.Errorf("%s: memory limit %+v", st.Name, m)
		}
		if to := st.Policy.Limits["timeout"]; to.Value != 90000 || to.Unit != "ms" {
			t.Errorf("%s: timeout %+v, want 90000 ms", st.Name, to)
		}
		// The host backend cannot cap memory, and without the unsafe
		// opt-in nothing accepts that: a command would be refused.
		if st.Name == "host" && st.Policy.Refused == "" {
			t.Errorf("host: a memory cap it cannot enforce is not refused: %+v", st.Policy)
		}
		if st.Policy.Network != "deny-all" {
			t.Errorf("%s: network %q under a policy that does not allow it", st.Name, st.Policy.Network)
		}
	}
	if seen == 0 {
		t.Fatalf("no backend reported the policy: %s", stdout)
	}
	code, stdout, _ = runCLI(t, "doctor", "--policy", pol)
	if code != exitOK || !strings.Contains(stdout, "under "+pol) || !strings.Contains(stdout, "memory_bytes") {
		t.Errorf("text report lacks the policy table:\n%s", stdout)
	}
}

// TestExecTakesItsInitFromTheKeeper runs two real pulse processes (this
// test binary acting as pulse) on namespace: the first leaves the keeper
// running with an init ready (a run directory of the keeper's), which the
// second takes over: that run directory is gone after it, and its command
// ran as in any init (output, diff).
func TestExecTakesItsInitFromTheKeeper(t *testing.T) {
	self, err := os.Executable()
	must(t, err)
	// Short: the keeper's socket path must fit a socket address.
	rt, err := os.MkdirTemp("/tmp", "pk")
	must(t, err)
	state := filepath.Join(rt, "pulse-namespace")
	t.Cleanup(func() {
		socks, _ := filepath.Glob(filepath.Join(state, "keeper-*.sock"))
		for _, s := range socks {
			os.Remove(s) // the keeper sees it gone and exits within a second
		}
		_ = testenv.Poll(10*time.Second, func() error {
			if locks, _ := filepath.Glob(filepath.Join(state, "keeper-*.lock")); len(locks) != 0 {
				return errors.New("a keeper still runs")
			}
			return nil
		})
		os.RemoveAll(rt)
	})
	ws := t.TempDir()
	pulse := func(script string) (int, string) {
		cmd := exec.Command(self, "exec", "--workspace", ws, "--backend", "namespace", "--", "sh", "-c", script)
		cmd.Env = append(os.Environ(), asPulseEnv+"=1", "XDG_RUNTIME_DIR="+rt, "PULSE_KEEP_WARM=1m",
			"XDG_CACHE_HOME="+filepath.Join(rt, "cache"))
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), string(out)
	}
	if code, out := pulse("true"); code != 0 {
		if code == exitSandbox && strings.Contains(out, "namespace:") {
			testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+out)
		}
		t.Fatalf("first run: exit %d: %s", code, out)
	}
	var kept []string
	testenv.Eventually(t, 15*time.Second, func() error {
		ents, _ := os.ReadDir(state)
		for _, e := range ents {
			if e.IsDir() && strings.Contains(e.Name(), "-") {
				kept = append(kept, e.Name())
			}
		}
		if len(kept) == 0 {
			return fmt.Errorf("no keeper init appeared in %s", state)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond) // its cgroups, its config
	code, out := pulse("echo made > f; cat /proc/1/cmdline | tr '\\0' ' '")
	if code != 0 || !strings.Contains(out, "pulse-runtime ns-init") || !strings.Contains(out, "+made") {
		t.Fatalf("second run: exit %d: %s", code, out)
	}
	for _, k := range kept {
		if _, err := os.Stat(filepath.Join(state, k)); err == nil {
			t.Fatalf("the keeper's init %s was not taken over (still there after the second run)", k)
		}
	}
}

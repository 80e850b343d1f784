package sandbox

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/policy"
)

// checkShell runs a shell session on sb: cd and export in one command are
// where the next one starts, each command is its own pending transaction,
// the policy and the audit log see the command as given (never the
// wrapper that keeps the state), and the state never shows in the output.
func checkShell(t *testing.T, sb *Sandbox) {
	t.Helper()
	ctx := context.Background()
	sh := sb.NewShell()
	run := func(script string, stdout *bytes.Buffer) *Result {
		t.Helper()
		cmd := Command{Shell: script}
		if stdout != nil {
			cmd.Stdout = stdout
		}
		res, err := sh.Run(ctx, cmd)
		if err != nil {
			t.Fatalf("%q: %v", script, err)
		}
		if strings.Contains(res.Stdout, "PULSE-SHELL-STATE") || stdout != nil && strings.Contains(stdout.String(), "PULSE-SHELL-STATE") {
			t.Fatalf("%q: the session's state shows in the output: %q", script, res.Stdout)
		}
		return res
	}
	first := run("mkdir -p sub && cd sub && export X=1 Y='two words' && echo made > made.txt", nil)
	if first.ExitCode != 0 || first.Transaction == "" {
		t.Fatalf("first command: exit %d, transaction %q, stderr %s", first.ExitCode, first.Transaction, first.Stderr)
	}
	if sh.Dir() != "sub" {
		t.Fatalf("session dir %q, want sub", sh.Dir())
	}
	// Streamed to a writer of the caller's, the output is the command's alone.
	var out bytes.Buffer
	second := run(`pwd; echo "$X"; echo "$Y"; echo next > next.txt; printf 'no newline'`, &out)
	lines := strings.Split(out.String(), "\n")
	if len(lines) != 4 || !strings.HasSuffix(lines[0], "/sub") || lines[1] != "1" || lines[2] != "two words" || lines[3] != "no newline" {
		t.Fatalf("second command printed %q; want .../sub, 1, two words, no newline", out.String())
	}
	if second.Transaction == "" || second.Transaction == first.Transaction {
		t.Fatalf("transactions %q then %q: want one each", first.Transaction, second.Transaction)
	}
	if got, err := sb.ReadFile(ctx, "sub/next.txt"); err != nil || string(got) != "next\n" {
		t.Fatalf("sub/next.txt through the stack: %q %v", got, err)
	}
	st, err := sb.Stack(ctx)
	if err != nil || len(st) != 2 {
		t.Fatalf("pending stack %v, %v; want the two commands' transactions", st, err)
	}
	// unset and cd .. stay too; an exit status is the command's.
	if res := run("unset X; cd ..; export Z=3; exit 3", nil); res.ExitCode != 3 {
		t.Fatalf("exit status %d, want 3", res.ExitCode)
	}
	if res := run(`echo "${X-unset} $Z"; test "$PWD" = "$(cd "$PWD" && pwd)" && basename "$PWD"`, nil); !strings.HasPrefix(res.Stdout, "unset 3\n") || strings.Contains(res.Stdout, "sub") {
		t.Fatalf("after unset and cd ..: %q", res.Stdout)
	}
	// set -x in a command traces the command, never the wrapper; an EXIT
	// trap of the command's own runs, and the state is kept.
	if res := run(`set -x; trap 'echo own-trap' EXIT; export W=4`, nil); strings.Contains(res.Stderr, "__pulse") || res.Stdout != "own-trap\n" {
		t.Fatalf("set -x and an EXIT trap: stdout %q, stderr %q", res.Stdout, res.Stderr)
	}
	if res := run(`echo "$W"`, nil); res.Stdout != "4\n" {
		t.Fatalf("after a command with its own EXIT trap: %q", res.Stdout)
	}
	// A command that exec's another program leaves no state: Lost says
	// so, and the session keeps the one from before.
	run("cd / && export W=5 && exec true", nil)
	if !sh.Lost() || sh.Dir() != "" {
		t.Fatalf("after exec: Lost %v, dir %q; want true and the root", sh.Lost(), sh.Dir())
	}
	if res := run(`echo "$W"`, nil); res.Stdout != "4\n" || sh.Lost() {
		t.Fatalf("after a command that left no state: %q, Lost %v", res.Stdout, sh.Lost())
	}
	// The policy judges the command as given.
	if _, err := sh.Run(ctx, Command{Shell: "rm -rf sub"}); !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("rm -rf under a policy that denies it: %v", err)
	}
	if _, err := sh.Run(ctx, Command{Args: []string{"rm", "-rf", "sub"}}); !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("rm -rf as an argv under a policy that denies it: %v", err)
	}
	evs := verifyAudit(t, sb)
	if !hasEvent(evs, func(e audit.Event) bool {
		return e.Action == "shell" && e.Target == "rm -rf sub" && e.Decision == "deny"
	}) {
		t.Error("the refusal does not name the command as given")
	}
	for _, e := range evs {
		if strings.Contains(e.Target, "__pulse") || strings.Contains(e.Detail, "__pulse") {
			t.Errorf("the wrapper shows in the audit log: %+v", e)
		}
	}
}

func shellPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte("defaults: {shell: allow}\nrules:\n  - {action: shell, target: \"rm -rf *\", decision: deny}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestShellSessionNamespace(t *testing.T) {
	checkShell(t, newIsolated(t, t.TempDir(), WithPolicy(shellPolicy(t))))
}

func TestShellSessionDocker(t *testing.T) {
	checkShell(t, newDockerSandbox(t, t.TempDir(), WithPolicy(shellPolicy(t))))
}

// The state a command leaves is taken out of its output however the
// output is cut into writes.
func TestTrailerWriterSplitsAnywhere(t *testing.T) {
	const marker = "PULSE-SHELL-STATE-0123"
	stream := "out" + "PULS" + "put\n" + marker + "\x00/w\x00/w/sub\x00+X=1\x00" + marker + "own trap\n"
	for cut := 1; cut < len(stream); cut++ {
		var got bytes.Buffer
		tw := &trailerWriter{w: &got, marker: []byte(marker)}
		tw.Write([]byte(stream[:cut]))
		tw.Write([]byte(stream[cut:]))
		tw.flush()
		if got.String() != "outPULSput\nown trap\n" {
			t.Fatalf("cut at %d: output %q", cut, got.String())
		}
		st, ok := parseShellState(tw.trailer.Bytes(), marker, tw.done)
		if !ok || st.pwd != "/w/sub" || st.set["X"] != "1" {
			t.Fatalf("cut at %d: state %+v %v", cut, st, ok)
		}
	}
}

// A directory whose name is shell syntax is only ever a name to the
// wrapper, and a directory removed meanwhile sends the session back to
// the root, saying so.
func TestShellSessionOddDirectoryNamespace(t *testing.T) {
	sb := newIsolated(t, t.TempDir(), WithPolicy(shellPolicy(t)))
	sh := sb.NewShell()
	ctx := context.Background()
	odd := `a'b"$(touch pwned)` + "`touch pwned2`"
	res, err := sh.Run(ctx, Command{Args: []string{"sh", "-c", `mkdir -p "$1" g`, "sh", odd}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("mkdir: %v %+v", err, res)
	}
	if _, err := sh.Run(ctx, Command{Args: []string{"cd", odd}}); err != nil {
		t.Fatal(err)
	}
	if sh.Dir() != odd {
		t.Fatalf("dir %q, want %q", sh.Dir(), odd)
	}
	res, err = sh.Run(ctx, Command{Shell: `basename "$PWD"`})
	if err != nil || res.Stdout != odd+"\n" {
		t.Fatalf("in the odd directory: %v, stdout %q, stderr %q", err, res.Stdout, res.Stderr)
	}
	// It goes, by a command outside the session: the next command of the
	// session says so (the name printed, never run) and starts at the root.
	if res, err := sb.Execute(ctx, Command{Shell: "rm -r ./a*"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("rm: %v %+v", err, res)
	}
	res, err = sh.Run(ctx, Command{Shell: `test ! -e pwned && test ! -e pwned2 && test -d g && echo clean-root`})
	if err != nil || res.Stdout != "clean-root\n" || !strings.Contains(res.Stderr, odd+" is gone") || sh.Dir() != "" {
		t.Fatalf("after its directory went: %v, stdout %q, stderr %q, dir %q", err, res.Stdout, res.Stderr, sh.Dir())
	}
	if _, err := sh.Run(ctx, Command{Shell: "cd g"}); err != nil || sh.Dir() != "g" {
		t.Fatalf("cd g: %v, dir %q", err, sh.Dir())
	}
	if res, err := sb.Execute(ctx, Command{Shell: "rm -r g"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("rm -r g: %v %+v", err, res)
	}
	res, err = sh.Run(ctx, Command{Shell: "pwd"})
	if err != nil || !strings.Contains(res.Stderr, "g is gone") || sh.Dir() != "" {
		t.Fatalf("after g went: %v, stdout %q, stderr %q, dir %q", err, res.Stdout, res.Stderr, sh.Dir())
	}
}

// FuzzShellTrailer: what a command writes on its standard output (it may
// forge the marker) is passed on byte for byte up to the marker, and any
// state parsed from the rest names only valid variables.
func FuzzShellTrailer(f *testing.F) {
	const marker = "PULSE-SHELL-STATE-ab"
	f.Add([]byte("hello\n"+marker+"\x00/w\x00/w/a\x00+X=1\x00-Y\x00"+marker), 3)
	f.Add([]byte(marker+marker+marker), 1)
	f.Add([]byte("PULSE-SHELL-STATE-a"), 7)
	f.Fuzz(func(t *testing.T, data []byte, cut int) {
		var got bytes.Buffer
		tw := &trailerWriter{w: &got, marker: []byte(marker)}
		if cut < 0 || cut > len(data) {
			cut = len(data) / 2
		}
		tw.Write(data[:cut])
		tw.Write(data[cut:])
		tw.flush()
		// The output is the input less the state: from the first
		// marker to the next one, or to the end when there is none.
		want := data
		if i := bytes.Index(data, []byte(marker)); i >= 0 {
			want = append([]byte(nil), data[:i]...)
			rest := data[i+len(marker):]
			if j := bytes.Index(rest, []byte(marker)); j >= 0 {
				want = append(want, rest[j+len(marker):]...)
			}
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("output %q, want %q", got.Bytes(), want)
		}
		st, ok := parseShellState(tw.trailer.Bytes(), marker, tw.done)
		if !ok {
			return
		}
		for k := range st.set {
			if !shellName.MatchString(k) {
				t.Fatalf("bad name %q", k)
			}
		}
		for _, k := range st.unset {
			if !shellName.MatchString(k) {
				t.Fatalf("bad name %q", k)
			}
		}
	})
}

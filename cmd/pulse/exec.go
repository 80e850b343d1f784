package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
	"github.com/pulse-agent/pulse/secrets"
)

// exitSandbox is exec's exit code when the sandbox itself failed (no
// backend, refused by policy), as distinct from the command's own code;
// 124 and 137 follow timeout(1) and a SIGKILLed shell.
const (
	exitSandbox = 125
	exitTimeout = 124
	exitKilled  = 137
)

func init() {
	register(command{
		name:    "exec",
		summary: "run a command in a sandbox and show what it wrote as a diff",
		run:     runExec,
	})
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func runExec(ctx context.Context, env *cliEnv, args []string) int {
	fs := flag.NewFlagSet("pulse exec", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	backendName := fs.String("backend", "auto", "backend: auto, remote, docker, namespace or host")
	unsafeHost := fs.Bool("unsafe-host", false, "allow running unisolated on the host when nothing isolates")
	policyFile := fs.String("policy", "", "policy file (YAML or JSON); default: the built-in policy")
	autoCommit := fs.Bool("auto-commit", false, "commit the command's writes at once (conflicts are reported, never overwritten)")
	timeout := fs.Duration("timeout", 0, "command timeout; may only shorten the policy's (default 10m)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on stdout")
	workspace := fs.String("workspace", ".", "workspace directory")
	var secretEnv stringList
	fs.Var(&secretEnv, "secret-env", "name of an environment variable holding a secret to scrub (repeatable)")
	secretMode := fs.String("secrets", "", "which --secret-env secrets the command may see when the policy allows secrets: deny-all, allow-all or NAME,NAME (default deny-all)")
	fs.Usage = func() {
		fmt.Fprintln(env.stderr, "usage: pulse exec [flags] -- CMD [ARGS...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	argv := fs.Args()
	if len(argv) == 0 {
		fs.Usage()
		return exitUsage
	}

	opts := []sandbox.Option{sandbox.WithBackendName(*backendName)}
	if *unsafeHost {
		opts = append(opts, sandbox.WithUnsafeHostExecution())
	}
	if *autoCommit {
		opts = append(opts, sandbox.WithAutoCommit())
	}
	if *policyFile != "" {
		pol, err := policy.Load(*policyFile)
		if err != nil {
			fmt.Fprintf(env.stderr, "pulse exec: %v\n", err)
			return exitUsage
		}
		opts = append(opts, sandbox.WithPolicy(pol))
	}
	if len(secretEnv) > 0 {
		var list []secrets.Secret
		for _, name := range secretEnv {
			v := env.getenv(name)
			if v == "" {
				fmt.Fprintf(env.stderr, "pulse exec: warning: --secret-env %s: the variable is not set; nothing to scrub for it\n", name)
				continue
			}
			list = append(list, secrets.Secret{Name: name, Value: v})
		}
		opts = append(opts, sandbox.WithSecrets(list))
	}
	if *secretMode != "" {
		var sp secrets.SecretPolicy
		switch *secretMode {
		case string(secrets.DenyAll):
			sp = secrets.DenyAllSecrets()
		case string(secrets.AllowAll):
			sp = secrets.AllowAllSecrets()
		default:
			sp = secrets.AllowSecrets(strings.Split(*secretMode, ",")...)
		}
		opts = append(opts, sandbox.WithSecretPolicy(sp))
	}

	sb, err := sandbox.New(ctx, *workspace, opts...)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse exec: %v\n", err)
		if errors.Is(err, sandbox.ErrUnavailable) {
			return exitSandbox
		}
		return exitUsage
	}
	defer sb.Close()
	if env.getenv("PULSE_REMOTE_URL") != "" && sb.Backend().Name() != "remote" {
		for _, why := range sb.PassedOver() {
			if strings.HasPrefix(why, "remote:") {
				fmt.Fprintf(env.stderr, "pulse: WARNING: PULSE_REMOTE_URL is set but the remote backend is unavailable (%s); running on the %s backend on this machine\n",
					strings.TrimSpace(strings.TrimPrefix(why, "remote:")), sb.Backend().Name())
			}
		}
	}
	if sb.Capabilities().Isolation == backend.IsolationHostUnsafe && !*asJSON {
		fmt.Fprintln(env.stderr, "pulse: WARNING: UNSAFE_HOST: running unisolated on this machine, writing in the workspace itself")
	}

	cmd := sandbox.Command{Args: argv, Stdin: env.stdin}
	if len(argv) == 1 && strings.ContainsAny(argv[0], " \t;|&<>$`'\"") {
		// One argument with shell syntax is a script, as with ssh.
		cmd = sandbox.Command{Shell: argv[0], Stdin: env.stdin}
	}
	if !*asJSON {
		cmd.Stdout, cmd.Stderr = env.stdout, env.stderr
	}
	if *timeout > 0 {
		l := policy.ResourceLimits{Timeout: *timeout}
		cmd.Limits = &l
	}
	res, err := sb.Execute(ctx, cmd)
	if err != nil && res == nil {
		fmt.Fprintf(env.stderr, "pulse exec: %v\n", err)
		return exitSandbox
	}

	diff := ""
	if res.Transaction != "" {
		if tx, terr := sb.Transaction(res.Transaction); terr == nil {
			diff, _ = sb.Preview(tx)
		}
	}
	if *asJSON {
		writeExecJSON(env.stdout, res, diff)
	} else {
		wsFlag := ""
		if *workspace != "." {
			wsFlag = " --workspace " + shellQuote(*workspace)
		}
		summarize(env.stderr, res, diff, wsFlag)
	}
	return execExitCode(res)
}

func execExitCode(res *sandbox.Result) int {
	switch res.Termination {
	case backend.Timeout:
		return exitTimeout
	case backend.Exited:
		return res.ExitCode & 0xff
	}
	if res.ExitCode > 0 {
		return res.ExitCode & 0xff
	}
	return exitKilled
}

// summarize tells a person where the command's writes went.
// wsFlag is the --workspace flag the review commands need ("" for the
// current directory).
func summarize(w io.Writer, res *sandbox.Result, diff, wsFlag string) {
	fmt.Fprintf(w, "\n── pulse: %s backend, exit %d (%s) in %s\n", res.Backend, res.ExitCode, res.Termination,
		res.Duration.Round(time.Millisecond))
	if res.Truncated {
		fmt.Fprintln(w, "   output was truncated at the output cap")
	}
	for _, r := range res.Refused {
		fmt.Fprintf(w, "   not staged: %s (%s)\n", r.Path, r.Reason)
	}
	switch {
	case res.InPlace:
		if len(res.Changed)+len(res.Deleted) == 0 {
			fmt.Fprintln(w, "   the host backend wrote in place; no file changed")
			return
		}
		fmt.Fprintln(w, "   the host backend wrote IN PLACE (nothing to review or undo):")
		for _, p := range res.Changed {
			fmt.Fprintf(w, "     changed  %s\n", p)
		}
		for _, p := range res.Deleted {
			fmt.Fprintf(w, "     deleted  %s\n", p)
		}
	case len(res.Committed) > 0:
		fmt.Fprintf(w, "   committed %d path(s): %s\n", len(res.Committed), strings.Join(res.Committed, ", "))
	case res.Transaction != "":
		if res.CommitErr != nil {
			fmt.Fprintf(w, "   not committed: %v\n", res.CommitErr)
		}
		fmt.Fprintf(w, "   pending transaction %s (%d path(s)); the workspace is untouched:\n\n", res.Transaction, len(res.Staged))
		fmt.Fprint(w, hostRunWarning(res.RunsOnHost))
		fmt.Fprint(w, diff)
		fmt.Fprintf(w, "\n   review: pulse cow diff%[2]s %[1]s | commit: pulse cow commit%[2]s %[1]s | drop: pulse cow discard%[2]s %[1]s\n",
			res.Transaction, wsFlag)
	default:
		fmt.Fprintln(w, "   no file changed")
	}
}

func writeExecJSON(w io.Writer, res *sandbox.Result, diff string) {
	type refused struct {
		Path   string `json:"path"`
		Reason string `json:"reason"`
	}
	out := struct {
		ExecutionID string          `json:"execution_id"`
		Command     string          `json:"command"`
		Backend     string          `json:"backend"`
		Isolation   string          `json:"isolation_level"`
		ExitCode    int             `json:"exit_code"`
		Termination string          `json:"termination_reason"`
		TimedOut    bool            `json:"timed_out"`
		Truncated   bool            `json:"truncated"`
		DurationMS  float64         `json:"duration_ms"`
		Stdout      string          `json:"stdout"`
		Stderr      string          `json:"stderr"`
		Transaction string          `json:"transaction,omitempty"`
		Staged      []string        `json:"staged,omitempty"`
		Refused     []refused       `json:"refused,omitempty"`
		Committed   []string        `json:"committed,omitempty"`
		RunsOnHost  []string        `json:"runs_on_host,omitempty"`
		CommitError string          `json:"commit_error,omitempty"`
		InPlace     bool            `json:"in_place"`
		Changed     []string        `json:"changed,omitempty"`
		Deleted     []string        `json:"deleted,omitempty"`
		Diff        string          `json:"diff,omitempty"`
		Metrics     backend.Metrics `json:"metrics"`
	}{
		ExecutionID: res.ExecutionID, Command: res.Command, Backend: res.Backend, Isolation: string(res.Isolation),
		ExitCode: res.ExitCode, Termination: string(res.Termination), TimedOut: res.TimedOut, Truncated: res.Truncated,
		DurationMS: float64(res.Duration.Microseconds()) / 1000, Stdout: res.Stdout, Stderr: res.Stderr,
		Transaction: res.Transaction, Staged: res.Staged, Committed: res.Committed, RunsOnHost: res.RunsOnHost, InPlace: res.InPlace,
		Changed: res.Changed, Deleted: res.Deleted, Diff: diff, Metrics: res.Metrics,
	}
	for _, r := range res.Refused {
		out.Refused = append(out.Refused, refused{r.Path, r.Reason})
	}
	if res.CommitErr != nil {
		out.CommitError = res.CommitErr.Error()
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

// shellQuote quotes s for a POSIX shell when it needs it, so that a hint
// can be pasted as printed.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

package sandbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/pulse-agent/pulse/policy"
)

// SafeGit runs a fixed set of git operations through the sandbox: each is
// checked against the policy's git action (target: the subcommand and its
// arguments, e.g. "commit -m msg"), then run with Execute like any other
// command, so its writes to the work tree and to .git are staged, not
// applied.
type SafeGit struct{ s *Sandbox }

// Git returns the policy-checked git wrapper of the sandbox.
func (s *Sandbox) Git() *SafeGit { return &SafeGit{s: s} }

// Status runs `git status --porcelain`.
func (g *SafeGit) Status(ctx context.Context) (*Result, error) {
	return g.run(ctx, "status", "--porcelain")
}

// Diff runs `git diff`.
func (g *SafeGit) Diff(ctx context.Context) (*Result, error) { return g.run(ctx, "diff") }

// Add runs `git add -- PATHS` ("." when none are given).
func (g *SafeGit) Add(ctx context.Context, paths ...string) (*Result, error) {
	if len(paths) == 0 {
		paths = []string{"."}
	}
	return g.run(ctx, append([]string{"add", "--"}, paths...)...)
}

// Commit runs `git commit -m MESSAGE`.
func (g *SafeGit) Commit(ctx context.Context, message string) (*Result, error) {
	if message == "" {
		return nil, fmt.Errorf("%w: git commit needs a message", ErrInvalidCommand)
	}
	return g.run(ctx, "commit", "-m", message)
}

// Checkout runs `git checkout BRANCH --`. A branch name that starts with
// "-" is refused, so that it cannot be read as an option.
func (g *SafeGit) Checkout(ctx context.Context, branch string) (*Result, error) {
	if err := plainArg(branch); err != nil {
		return nil, err
	}
	return g.run(ctx, "checkout", branch, "--")
}

// Restore runs `git restore -- PATHS`.
func (g *SafeGit) Restore(ctx context.Context, paths ...string) (*Result, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("%w: git restore needs a path", ErrInvalidCommand)
	}
	return g.run(ctx, append([]string{"restore", "--"}, paths...)...)
}

func (g *SafeGit) run(ctx context.Context, args ...string) (*Result, error) {
	target := strings.Join(args, " ")
	review, err := g.s.decide(ctx, policy.Git, target, "")
	if err != nil {
		return nil, g.s.scrubErr(err)
	}
	// Hooks would run repository-controlled code with git's privileges;
	// the sandbox already isolates them, but a git operation asked for by
	// name should do only that operation.
	argv := append([]string{"git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"}, args...)
	return g.s.Execute(ctx, Command{Args: argv, review: review})
}

func plainArg(s string) error {
	if s == "" || strings.HasPrefix(s, "-") {
		return fmt.Errorf("%w: %q is not a plain git argument", ErrInvalidCommand, s)
	}
	return nil
}

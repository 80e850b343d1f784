package sandbox

import (
	"context"
	"fmt"
	"strings"
	"unicode"

	"github.com/pulse-agent/pulse/policy"
)

// SafeGit runs a fixed set of git operations through the sandbox: each is
// checked against the policy's git action (target: the subcommand and its
// arguments, e.g. "commit -m msg"), then run with Execute like any other
// command, so its writes to the work tree and to .git are staged, not
// applied. An operation git fails stages nothing.
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

// GitOption sets how a SafeGit operation runs.
type GitOption func(*gitOptions) error

type gitOptions struct {
	env map[string]string
}

// GitAuthor sets the author of a commit (GIT_AUTHOR_NAME and
// GIT_AUTHOR_EMAIL), and its committer too unless GitCommitter sets
// another: a repository and an environment that configure no identity
// (the sandbox's environment is built from scratch) make git refuse to
// commit without one. A name or email that is empty, or holds '<', '>'
// or a control character, is refused with ErrInvalidCommand.
func GitAuthor(name, email string) GitOption {
	return identity("AUTHOR", name, email)
}

// GitCommitter sets the committer of a commit (GIT_COMMITTER_NAME and
// GIT_COMMITTER_EMAIL); see GitAuthor.
func GitCommitter(name, email string) GitOption {
	return identity("COMMITTER", name, email)
}

func identity(role, name, email string) GitOption {
	return func(o *gitOptions) error {
		for _, v := range []string{name, email} {
			if v == "" || strings.ContainsAny(v, "<>") || strings.ContainsFunc(v, unicode.IsControl) {
				return fmt.Errorf("%w: git %s identity %q <%q>: empty, or holds <, > or a control character",
					ErrInvalidCommand, strings.ToLower(role), name, email)
			}
		}
		if o.env == nil {
			o.env = map[string]string{}
		}
		o.env["GIT_"+role+"_NAME"], o.env["GIT_"+role+"_EMAIL"] = name, email
		return nil
	}
}

// Commit runs `git commit -m MESSAGE`, as the identity GitAuthor and
// GitCommitter give (the author is the committer unless both are set). A
// commit git refuses (no identity, nothing to commit, a failed check)
// returns its Result with git's exit code and stages nothing: the objects
// it wrote before it failed are not a change to review.
func (g *SafeGit) Commit(ctx context.Context, message string, opts ...GitOption) (*Result, error) {
	if message == "" {
		return nil, fmt.Errorf("%w: git commit needs a message", ErrInvalidCommand)
	}
	var o gitOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if _, ok := o.env["GIT_COMMITTER_NAME"]; !ok && o.env["GIT_AUTHOR_NAME"] != "" {
		o.env["GIT_COMMITTER_NAME"], o.env["GIT_COMMITTER_EMAIL"] = o.env["GIT_AUTHOR_NAME"], o.env["GIT_AUTHOR_EMAIL"]
	}
	return g.runEnv(ctx, o.env, "commit", "-m", message)
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

// run runs git with args. Whatever git exits with but 0, the writes it
// made are not staged (they are listed in Result.Refused): a failed
// operation leaves nothing to review or commit.
func (g *SafeGit) run(ctx context.Context, args ...string) (*Result, error) {
	return g.runEnv(ctx, nil, args...)
}

func (g *SafeGit) runEnv(ctx context.Context, env map[string]string, args ...string) (*Result, error) {
	target := strings.Join(args, " ")
	review, err := g.s.decide(ctx, policy.Git, target, "")
	if err != nil {
		return nil, g.s.scrubErr(err)
	}
	// Hooks would run repository-controlled code with git's privileges;
	// the sandbox already isolates them, but a git operation asked for by
	// name should do only that operation.
	argv := append([]string{"git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"}, args...)
	return g.s.Execute(ctx, Command{Args: argv, Env: env, review: review, keepOnlyOnSuccess: true})
}

func plainArg(s string) error {
	if s == "" || strings.HasPrefix(s, "-") {
		return fmt.Errorf("%w: %q is not a plain git argument", ErrInvalidCommand, s)
	}
	return nil
}

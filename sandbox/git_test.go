package sandbox

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/policy"
)

// TestSafeGitCommitIdentity: on the namespace backend (the Docker image
// carries no git), a commit in a repository with no identity configured
// fails and stages nothing, with or without auto-commit; the same commit
// with GitAuthor (and a committer of its own) succeeds and its objects
// are pending, the author and committer as given; a malformed identity
// is refused before anything runs.
func TestSafeGitCommitIdentity(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	for _, auto := range []bool{false, true} {
		name := "pending"
		if auto {
			name = "autocommit"
		}
		t.Run(name, func(t *testing.T) {
			ws := t.TempDir()
			// The repository's own config says nothing of who commits,
			// and the command's environment carries no global one.
			if out, err := exec.Command("git", "-C", ws, "init", "-q").CombinedOutput(); err != nil {
				t.Fatalf("git init: %v %s", err, out)
			}
			writeFile(t, ws, "x.txt", "x\n")
			pol := policy.Default()
			pol.Defaults[policy.Git] = policy.Allow
			opts := []Option{WithPolicy(pol)}
			if auto {
				opts = append(opts, WithAutoCommit())
			}
			sb := newIsolated(t, ws, opts...)
			ctx := context.Background()
			g := sb.Git()
			res, err := g.Add(ctx, "x.txt")
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("git add: %+v, %v", res, err)
			}
			before, err := sb.Transactions(ctx)
			if err != nil {
				t.Fatal(err)
			}

			res, err = g.Commit(ctx, "first")
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode == 0 {
				t.Fatalf("commit with no identity succeeded: %+v", res)
			}
			if !strings.Contains(res.Stderr, "identity") {
				t.Errorf("stderr %q does not say why", res.Stderr)
			}
			if res.Transaction != "" || len(res.Staged) != 0 || len(res.Committed) != 0 {
				t.Errorf("a failed git commit staged %v (transaction %q), committed %v", res.Staged, res.Transaction, res.Committed)
			}
			if after, err := sb.Transactions(ctx); err != nil || len(after) != len(before) {
				t.Errorf("transactions %d before, %d after the failed commit (%v)", len(before), len(after), err)
			}

			for _, bad := range []GitOption{GitAuthor("", "a@example.com"), GitAuthor("A", "a@example.com>\nx"), GitCommitter("C <c>", "c@example.com")} {
				if _, err := g.Commit(ctx, "bad", bad); !errors.Is(err, ErrInvalidCommand) {
					t.Errorf("malformed identity: err = %v, want ErrInvalidCommand", err)
				}
			}

			res, err = g.Commit(ctx, "first", GitAuthor("Ada Agent", "ada@example.com"), GitCommitter("Rev Iewer", "rev@example.com"))
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("commit with an identity: %+v, %v", res, err)
			}
			if auto {
				if len(res.Committed) == 0 {
					t.Fatalf("auto-commit left it pending: %+v", res)
				}
			} else {
				if res.Transaction == "" {
					t.Fatal("the commit's objects were not staged")
				}
				if _, err := sb.CommitAll(ctx); err != nil {
					t.Fatal(err)
				}
			}
			out, err := exec.Command("git", "-C", ws, "log", "-1", "--format=%an <%ae> / %cn <%ce> / %s").CombinedOutput()
			if err != nil {
				t.Fatalf("git log: %v %s", err, out)
			}
			if got, want := strings.TrimSpace(string(out)), "Ada Agent <ada@example.com> / Rev Iewer <rev@example.com> / first"; got != want {
				t.Errorf("commit = %q, want %q", got, want)
			}
		})
	}
}

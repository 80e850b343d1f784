package policy

import "testing"

func TestRunsOnHost(t *testing.T) {
	host := []string{
		".git", "sub/.git", ".GIT", // the entry itself: a "gitdir:" file redirects git
		".git/config", ".git/config.worktree", ".git/commondir", ".Git/Config",
		".git/hooks", ".git/hooks/pre-commit", ".git/hooks/sub/x", ".git/HOOKS/post-checkout",
		".git/info/attributes",
		".git/rebase-merge/git-rebase-todo", ".git/rebase-apply/patch", ".git/sequencer/todo",
		".git/modules/lib/config", ".git/modules/lib/hooks/pre-commit", ".git/modules/a/modules/b/config",
		".git/modules/objects/config", // a submodule may be named "objects"
		".git/modules/lib/info/attributes", ".git/worktrees/wt/config.worktree", ".git/worktrees/wt/commondir",
		".git/worktrees/wt/gitdir",
		"vendor/dep/.git/config", "vendor/dep/.git/hooks/post-merge",
		".git/objects/.git/config", // a nested .git is judged on its own
		"./.git//config",
	}
	data := []string{
		"", "config", "hooks/pre-commit", "src/.gitignore", ".gitattributes", ".github/workflows/ci.yml", "git/config",
		".gitmodules", ".git-blame-ignore-revs",
		".git/objects/ab/cdef0123", ".git/objects/pack/pack-1.pack", ".git/objects/info/packs",
		".git/refs/heads/main", ".git/refs/heads/config", ".git/refs/heads/hooks/x", ".git/logs/HEAD",
		".git/logs/refs/heads/config", ".git/index", ".git/HEAD", ".git/ORIG_HEAD", ".git/COMMIT_EDITMSG",
		".git/packed-refs", ".git/description", ".git/info/exclude", ".git/FETCH_HEAD",
		".git/modules/lib/objects/ab/cd", ".git/modules/lib/index", ".git/modules/lib/HEAD",
	}
	for _, p := range host {
		if !RunsOnHost(p) {
			t.Errorf("RunsOnHost(%q) = false, want true", p)
		}
	}
	for _, p := range data {
		if RunsOnHost(p) {
			t.Errorf("RunsOnHost(%q) = true, want false", p)
		}
	}
}

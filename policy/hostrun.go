package policy

import "strings"

// RunsOnHost reports whether a workspace path (slash-separated, relative
// to the workspace) is one whose contents the next git command a person
// runs on the host reads as instructions: the command a sandboxed process
// writes there runs outside the sandbox, with the person's privileges, the
// moment they type `git status`. No policy decision or standing approval
// (auto-commit) may apply such a path; only a person who looked at it.
//
// The paths are, in a git directory (any path component named .git,
// compared without case, since a case-insensitive file system folds it):
//
//   - the .git entry itself: creating, replacing or removing it (a .git
//     file saying "gitdir: elsewhere") points git at another repository;
//   - config, config.worktree: core.fsmonitor, core.hooksPath,
//     core.sshCommand, aliases, filter and diff drivers, include.path;
//   - commondir and gitdir: they redirect git to another directory and so
//     to another config;
//   - hooks/ and everything beneath it;
//   - info/attributes: it routes files through configured drivers;
//   - rebase-merge/, rebase-apply/ and sequencer/: their todo lists hold
//     exec lines that `git rebase --continue` runs;
//   - the same names anywhere in modules/ and worktrees/ (the git
//     directories of submodules and linked worktrees), whatever the
//     module is called.
//
// Objects, refs, logs, the index, HEAD and the other files `git add` and
// `git commit` write are data, not instructions; they stay ordinary paths,
// so that git inside the sandbox keeps working. Beneath a git directory's
// own objects/, refs/ and logs/ nothing is reported (a branch may be
// called "config"); beneath modules/ every component is checked, because
// a submodule may be named "objects".
//
// Not covered: a bare repository a command lays out under another name
// (git only uses one when a person runs git inside that directory), and
// files git does not read but people run (Makefile, scripts) — those are
// the reviewable content of the work tree.
func RunsOnHost(p string) bool {
	p = cleanTarget(p)
	comps := strings.Split(p, "/")
	for i, c := range comps {
		if !strings.EqualFold(c, ".git") {
			continue
		}
		if i == len(comps)-1 || gitDirRunsOnHost(comps[i+1:]) {
			return true
		}
	}
	return false
}

// gitDirRunsOnHost reports whether rest, a path inside a git directory,
// is one of the instruction files listed at RunsOnHost.
func gitDirRunsOnHost(rest []string) bool {
	switch rest[0] {
	case "objects", "refs", "logs":
		return false
	}
	for i, c := range rest {
		c = strings.ToLower(c)
		switch c {
		case "hooks", "rebase-merge", "rebase-apply", "sequencer":
			return true
		}
		if i == len(rest)-1 {
			switch c {
			case "config", "config.worktree", "commondir", "gitdir":
				return true
			case "attributes":
				return i > 0 && strings.EqualFold(rest[i-1], "info")
			}
		}
	}
	return false
}

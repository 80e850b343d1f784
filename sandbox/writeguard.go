package sandbox

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/policy"
)

// workspaceRel turns a caller's path (relative to the workspace, or
// absolute inside it) into the clean slash-separated relative path that
// cowfs stages and that the policy's globs are matched against, so that
// one file cannot be spelled past a rule. It resolves no symlink: staging
// takes paths literally.
func (s *Sandbox) workspaceRel(p string) (string, error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: invalid path %q", ErrInvalidCommand, p)
	}
	if filepath.IsAbs(p) {
		r, err := filepath.Rel(s.workspace, filepath.Clean(p))
		if err != nil {
			return "", fmt.Errorf("%w: %q is outside the workspace", ErrInvalidCommand, p)
		}
		p = r
	}
	rel := path.Clean(filepath.ToSlash(p))
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || path.IsAbs(rel) {
		return "", fmt.Errorf("%w: %q is outside the workspace", ErrInvalidCommand, p)
	}
	return rel, nil
}

// ruled reports whether any rule of the policy concerns action a. Without
// one, every target gets the action's default decision, and the checks
// below that look at paths other than the one named can be skipped.
func (s *Sandbox) ruled(a policy.Action) bool { return s.ruledActions[a] }

// policyDigest precomputes, once per sandbox, what the staging checks ask
// of the policy for every path: which actions have rules, and the rules
// alone (every default Allow), to tell a rule's Ask from a default's.
func policyDigest(p *policy.Policy) (map[policy.Action]bool, *policy.Policy) {
	ruled := make(map[policy.Action]bool)
	for _, r := range p.Rules {
		ruled[r.Action] = true
	}
	defaults := make(map[policy.Action]policy.Decision, len(policy.Actions()))
	for _, act := range policy.Actions() {
		defaults[act] = policy.Allow
	}
	return ruled, &policy.Policy{Rules: p.Rules, Defaults: defaults}
}

// sideEffectDenied says whether staging op would also remove or replace a
// path the policy protects, which the op's own path does not show: a
// deletion (or a file written over a directory) takes the whole tree
// beneath it, and a write beneath an existing file turns that file into a
// directory. The answer comes from the workspace on disk, which is what a
// commit would destroy. It returns the protected path, or "".
func (s *Sandbox) sideEffectDenied(op cowfs.Op) string {
	deleteRuled, writeRuled := s.ruled(policy.Delete), s.ruled(policy.Write)
	if !deleteRuled && !writeRuled {
		return ""
	}
	denied := func(a policy.Action, p string) bool { return s.o.policy.Evaluate(a, p) == policy.Deny }

	// Ancestors that exist as something other than a directory are
	// replaced by directories.
	dir := path.Dir(op.Path)
	for dir != "." && dir != "/" {
		if fi, err := os.Lstat(filepath.Join(s.workspace, filepath.FromSlash(dir))); err == nil && !fi.IsDir() {
			if denied(policy.Delete, dir) || denied(policy.Write, dir) {
				return dir
			}
		}
		dir = path.Dir(dir)
	}

	fi, err := os.Lstat(filepath.Join(s.workspace, filepath.FromSlash(op.Path)))
	if err != nil {
		return ""
	}
	if op.Kind == cowfs.KindMkdir && !fi.IsDir() && denied(policy.Delete, op.Path) {
		return op.Path
	}
	replacesTree := fi.IsDir() && (op.Kind == cowfs.KindDelete || op.Kind == cowfs.KindWhiteout || op.Kind == cowfs.KindWrite || op.Kind == cowfs.KindSymlink)
	if !replacesTree || !deleteRuled {
		return ""
	}
	hit := ""
	root := filepath.Join(s.workspace, filepath.FromSlash(op.Path))
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return nil
		}
		rel, rerr := filepath.Rel(s.workspace, p)
		if rerr != nil {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if denied(policy.Delete, rel) {
			hit = rel
			return fs.SkipAll
		}
		return nil
	})
	return hit
}

// changesDenied checks what a transaction would really do — every change
// cowfs derived from the staged operations — against the write and delete
// policy, and returns the first path the policy denies. It is the last
// line behind sideEffectDenied: a transaction it objects to is not kept.
func (s *Sandbox) changesDenied(tx *cowfs.Tx) string {
	if !s.ruled(policy.Delete) && !s.ruled(policy.Write) {
		return ""
	}
	for _, c := range tx.Changes() {
		a := policy.Write
		if c.Kind == cowfs.KindDelete {
			a = policy.Delete
		}
		if s.o.policy.Evaluate(a, c.Path) == policy.Deny {
			return c.Path
		}
		if c.Kind == cowfs.KindMkdir && !c.New && !c.Implicit && s.o.policy.Evaluate(policy.Delete, c.Path) == policy.Deny {
			return c.Path
		}
	}
	return ""
}

// askedByRule reports whether a rule (not the action's default) makes
// the policy ask about a on target: such a path is one a person wanted to
// see, so auto-commit does not stand in for them.
func (s *Sandbox) askedByRule(a policy.Action, target string) bool {
	return s.rulesOnly.Evaluate(a, target) == policy.Ask
}

package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// DirEntry is one entry of a directory listed by ListDir.
type DirEntry struct {
	// Name is the entry's name; Path is it relative to the workspace,
	// slash-separated.
	Name string `json:"name"`
	Path string `json:"path"`
	// Type is "file", "dir", "symlink" or "other".
	Type string `json:"type"`
	// Size is in bytes (a file's length; 0 for a directory).
	Size int64 `json:"size_bytes"`
}

// ListOption changes what ListDir lists.
type ListOption func(*listOptions)

type listOptions struct{ committed bool }

// ListCommitted makes ListDir list the committed workspace alone: the
// writes of pending transactions are left out, as they are from what
// ReadCommittedFile reads.
func ListCommitted() ListOption { return func(o *listOptions) { o.committed = true } }

// ListDir lists the directory dir ("" or "." for the workspace root) as
// the next command would see it, like List: the workspace with the
// pending stack laid over it, so a directory that exists only as pending
// writes lists, and a path the stack deletes does not (ListCommitted
// lists the committed workspace alone). It lists only after the policy
// allows the read action on dir, as spelled and where it resolves (a
// link is followed within the workspace). Entries the policy denies
// reading are left out, as is the sandbox's own state (.pulse at the
// root), so a listing shows no more than ReadFile would read. A
// directory outside the workspace (also through a symlink) is refused
// with an error wrapping pathguard.ErrOutside. Names and paths are
// scrubbed of the configured secrets.
func (s *Sandbox) ListDir(ctx context.Context, dir string, opts ...ListOption) ([]DirEntry, error) {
	var o listOptions
	for _, opt := range opts {
		opt(&o)
	}
	ents, err := s.listDir(ctx, dir, o.committed)
	for i := range ents {
		ents[i].Name = s.scrubber.Redact(ents[i].Name)
		ents[i].Path = s.scrubber.Redact(ents[i].Path)
	}
	return ents, s.scrubErr(err)
}

func (s *Sandbox) listDir(ctx context.Context, dir string, committed bool) ([]DirEntry, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	rel, err := s.dirRel(ctx, dir)
	if err != nil {
		return nil, err
	}
	var ents []fs.DirEntry
	if committed {
		ents, err = s.listCommitted(ctx, rel)
	} else {
		ents, err = s.listView(ctx, rel)
	}
	if err != nil {
		return nil, err
	}
	out := make([]DirEntry, 0, len(ents))
	for _, e := range ents {
		p := e.Name()
		if rel != "." {
			p = path.Join(rel, e.Name())
		}
		de := DirEntry{Name: e.Name(), Path: p, Type: "other"}
		switch t := e.Type(); {
		case t.IsDir():
			de.Type = "dir"
		case t&fs.ModeSymlink != 0:
			de.Type = "symlink"
			if fi, err := e.Info(); err == nil {
				de.Size = fi.Size()
			}
		case t.IsRegular():
			de.Type = "file"
			if fi, err := e.Info(); err == nil {
				de.Size = fi.Size()
			}
		}
		out = append(out, de)
	}
	return out, nil
}

// dirRel is the directory a listing of dir reads, relative to the
// workspace, after every check a listing passes: inside the workspace
// (also where its links lead), not the sandbox's own state, and readable
// under the policy both as spelled and as it resolves, as ReadFile
// checks a file. Links are resolved in the committed workspace; where
// the pending stack decides the path as spelled (it made or replaced
// it), the stack's path is the one listed.
func (s *Sandbox) dirRel(ctx context.Context, dir string) (string, error) {
	if dir == "" {
		dir = "."
	}
	rel, err := s.guard.Rel(dir)
	if err == nil && (rel == ".." || strings.HasPrefix(rel, "../")) {
		err = fmt.Errorf("%w: %q", pathguard.ErrOutside, dir)
	}
	if err != nil {
		s.record(ctx, audit.Event{Action: "read", Target: dir, Decision: "deny", Detail: "list: " + err.Error()})
		return "", fmt.Errorf("sandbox: list: %w", err)
	}
	targets := []string{rel}
	spelled, err := s.workspaceRel(dir)
	if err == nil && spelled != rel {
		targets = append(targets, spelled)
	}
	for _, t := range targets {
		if pathguard.IsReserved(t) {
			s.record(ctx, audit.Event{Action: "read", Target: t, Decision: "deny", Detail: "list: reserved path"})
			return "", fmt.Errorf("%w: read %q: the sandbox's own state is not listed", ErrPolicyDenied, t)
		}
	}
	for _, t := range targets {
		if _, err := s.decide(ctx, policy.Read, t, ""); err != nil {
			return "", err
		}
	}
	if len(targets) > 1 {
		st, err := s.viewStack(ctx)
		if err != nil {
			return "", err
		}
		if st != nil {
			if _, decided, err := st.Lookup(spelled); err == nil && decided {
				return spelled, nil
			}
		}
	}
	return rel, nil
}

// listCommitted lists the committed directory rel (checked by dirRel),
// leaving out what may not be read.
func (s *Sandbox) listCommitted(ctx context.Context, rel string) ([]fs.DirEntry, error) {
	byName := map[string]fs.DirEntry{}
	if err := s.readWorkspaceDir(rel, byName); err != nil {
		return nil, fmt.Errorf("sandbox: list %s: %w", rel, err)
	}
	out := s.readable(rel, byName)
	s.record(ctx, audit.Event{Action: "read", Target: rel, Decision: "allow", Detail: "list"})
	return out, nil
}

// readable is the entries of directory rel that may be read, sorted by
// name: the sandbox's own state and what the policy denies reading are
// left out.
func (s *Sandbox) readable(rel string, byName map[string]fs.DirEntry) []fs.DirEntry {
	out := make([]fs.DirEntry, 0, len(byName))
	for name, e := range byName {
		p := name
		if rel != "." {
			p = path.Join(rel, name)
		}
		if pathguard.IsReserved(p) || s.o.policy.Evaluate(policy.Read, p) == policy.Deny {
			continue
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

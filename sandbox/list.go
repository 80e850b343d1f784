package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"os"
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

// ListDir lists the directory dir of the workspace ("" or "." for its
// root) after the policy allows the read action on it. Entries the policy
// denies reading are left out, as is the sandbox's own state (.pulse at
// the root), so a listing shows no more than ReadFile would read. A
// directory outside the workspace (also through a symlink) is refused
// with an error wrapping pathguard.ErrOutside.
//
// It lists the committed workspace: the writes of pending transactions
// are not in it.
func (s *Sandbox) ListDir(ctx context.Context, dir string) ([]DirEntry, error) {
	ents, err := s.listDir(ctx, dir)
	for i := range ents {
		ents[i].Name = s.scrubber.Redact(ents[i].Name)
		ents[i].Path = s.scrubber.Redact(ents[i].Path)
	}
	return ents, s.scrubErr(err)
}

func (s *Sandbox) listDir(ctx context.Context, dir string) ([]DirEntry, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	if dir == "" {
		dir = "."
	}
	rel, err := s.guard.Rel(dir)
	if err == nil && (rel == ".." || strings.HasPrefix(rel, "../")) {
		err = fmt.Errorf("%w: %q", pathguard.ErrOutside, dir)
	}
	if err != nil {
		s.record(ctx, audit.Event{Action: "read", Target: dir, Decision: "deny", Detail: "list: " + err.Error()})
		return nil, fmt.Errorf("sandbox: list: %w", err)
	}
	if pathguard.IsReserved(rel) {
		s.record(ctx, audit.Event{Action: "read", Target: rel, Decision: "deny", Detail: "list: reserved path"})
		return nil, fmt.Errorf("%w: read %q: the sandbox's own state is not listed", ErrPolicyDenied, rel)
	}
	// The directory is checked as spelled and as it resolves, as ReadFile
	// checks a file.
	targets := []string{rel}
	if spelled, err := s.workspaceRel(dir); err == nil && spelled != rel {
		targets = append(targets, spelled)
	}
	for _, t := range targets {
		if _, err := s.decide(ctx, policy.Read, t, ""); err != nil {
			return nil, err
		}
	}
	root, err := os.OpenRoot(s.guard.Root())
	if err != nil {
		return nil, fmt.Errorf("sandbox: list: %w", err)
	}
	defer root.Close()
	f, err := root.Open(rel)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list: %w", err)
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list %s: %w", dir, err)
	}
	out := make([]DirEntry, 0, len(ents))
	for _, e := range ents {
		p := e.Name()
		if rel != "." {
			p = path.Join(rel, e.Name())
		}
		if pathguard.IsReserved(p) || s.o.policy.Evaluate(policy.Read, p) == policy.Deny {
			continue
		}
		de := DirEntry{Name: e.Name(), Path: p, Type: "other"}
		switch t := e.Type(); {
		case t.IsDir():
			de.Type = "dir"
		case t&fs.ModeSymlink != 0:
			de.Type = "symlink"
		case t.IsRegular():
			de.Type = "file"
			if fi, err := e.Info(); err == nil {
				de.Size = fi.Size()
			}
		}
		out = append(out, de)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	s.record(ctx, audit.Event{Action: "read", Target: rel, Decision: "allow", Detail: "list"})
	return out, nil
}

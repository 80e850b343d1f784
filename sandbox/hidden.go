package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// readScope is what of the workspace the read policy can deny, worked out
// once per sandbox from its rules: nothing (the common case, no walk at
// all), a few subtrees (a rule "secrets/*" can only match under secrets/),
// or the whole tree (a rule "*.pem", or a read default that is not allow).
type readScope struct {
	all   bool
	roots []string
}

// readDigest finds the readScope of p. A rule can deny (or ask, which a
// command cannot answer) only below the literal directory its glob starts
// with, since "*" and the other wildcards are the only way a pattern
// matches more than its own spelling.
func readDigest(p *policy.Policy) readScope {
	if d, ok := p.Defaults[policy.Read]; !ok || d != policy.Allow {
		return readScope{all: true}
	}
	var sc readScope
	for _, r := range p.Rules {
		if r.Action != policy.Read || r.Decision == policy.Allow {
			continue
		}
		t := strings.TrimPrefix(path.Clean(strings.ReplaceAll(r.Target, "\\", "/")), "./")
		if i := strings.IndexAny(r.Target, "*?[\\"); i >= 0 {
			lit := r.Target[:i]
			j := strings.LastIndexByte(lit, '/')
			if j < 0 {
				return readScope{all: true}
			}
			t = strings.TrimPrefix(path.Clean(lit[:j]), "./")
		}
		if t == "." || t == "" || t == "/" || strings.HasPrefix(t, "../") || t == ".." {
			return readScope{all: true}
		}
		sc.roots = append(sc.roots, strings.TrimPrefix(t, "/"))
	}
	return sc
}

// aheadTargets are the paths read rules deny by their full name (no
// wildcard): such a path can be hidden before it exists, so that one
// made in the workspace while a command runs stays out of its view on a
// backend whose view is the live workspace (namespace). A pattern
// cannot be; see the README on read denials.
func aheadTargets(p *policy.Policy) []string {
	var out []string
	for _, r := range p.Rules {
		if r.Action != policy.Read || r.Decision == policy.Allow || strings.ContainsAny(r.Target, "*?[\\") {
			continue
		}
		t := strings.TrimPrefix(strings.TrimPrefix(path.Clean(r.Target), "./"), "/")
		if pathguard.IsWorkspacePath(t) {
			out = append(out, t)
		}
	}
	return out
}

// hiddenAhead returns the targets of aheadTargets the workspace does not
// hold now, beneath directories it does (real ones: a backend hides
// nothing beneath a link), that the policy denies as spelled (an earlier
// rule may allow one): hidden from a command before they exist.
func (s *Sandbox) hiddenAhead() []string {
	var out []string
	for _, t := range s.readAhead {
		if s.o.policy.Evaluate(policy.Read, t) == policy.Allow {
			continue
		}
		if _, err := os.Lstat(filepath.Join(s.workspace, filepath.FromSlash(t))); !errors.Is(err, fs.ErrNotExist) {
			continue // there: hiddenPaths has it; or unknown: nothing made
		}
		if realDirs(s.workspace, path.Dir(t)) {
			out = append(out, t)
		}
	}
	return out
}

// realDirs reports whether dir (workspace-relative) and every directory
// above it are real directories of ws.
func realDirs(ws, dir string) bool {
	for d := dir; d != "." && d != "/" && d != ""; d = path.Dir(d) {
		fi, err := os.Lstat(filepath.Join(ws, filepath.FromSlash(d)))
		if err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}

// hiddenPaths expands the read policy against the workspace as it is now:
// every path a command must not read (its read decision is not allow),
// cleaned, sorted, never under .pulse. A directory is listed alone when it
// and everything beneath it are hidden; otherwise its hidden entries are
// listed one by one, so that an allowed file in it stays visible. A
// directory that cannot be read fails the expansion: what it holds cannot
// be known to be readable.
func (s *Sandbox) hiddenPaths() ([]string, error) {
	sc := s.readScope
	if !sc.all && len(sc.roots) == 0 {
		return nil, nil
	}
	var out []string
	h := hider{ws: s.workspace, pol: s.o.policy, out: &out}
	if sc.all {
		if _, err := h.walk(".", fs.ModeDir); err != nil {
			return nil, err
		}
		return compact(out), nil
	}
	for _, r := range sc.roots {
		// A root reached through a link is the link's business: the
		// first component that is not a plain directory is what is
		// walked.
		at, typ, found := ".", fs.ModeDir, true
		for _, c := range strings.Split(r, "/") {
			next := path.Join(at, c)
			fi, err := os.Lstat(filepath.Join(s.workspace, filepath.FromSlash(next)))
			if errors.Is(err, os.ErrPermission) {
				// Nothing can be known about what is there.
				return nil, fmt.Errorf("sandbox: read policy: %s: %w", next, err)
			}
			if err != nil {
				found = false // missing: nothing to hide
				break
			}
			at, typ = next, fi.Mode().Type()
			if !fi.IsDir() {
				break
			}
		}
		if !found || at == "." {
			continue
		}
		if _, err := h.walk(at, typ); err != nil {
			return nil, err
		}
	}
	return compact(out), nil
}

type hider struct {
	ws  string
	pol *policy.Policy
	out *[]string
}

// Names spelled through a link to a directory are checked this many
// links deep (deeper spellings are not, so a cycle of links ends), and
// over at most linkBudget entries per link; a link over budget is hidden,
// since what it holds could not be checked.
const (
	maxLinkDepth = 8
	linkBudget   = 50_000
)

// walk adds what is hidden at and beneath rel, of type typ (its Lstat
// type bits), and reports whether all of it is. A link to a file is
// hidden or not by its own name (what it points to is hidden by its own).
// A link to a directory of the workspace is hidden whole when any name
// spelled through it is denied ("secrets -> real" under a rule
// "secrets/*"): a backend hides paths, not spellings, and cannot hide
// beneath a link.
func (h hider) walk(rel string, typ fs.FileMode) (bool, error) {
	if pathguard.IsReserved(rel) {
		return true, nil // never shown to a command anyway
	}
	self := rel != "." && h.pol.Evaluate(policy.Read, rel) != policy.Allow
	if typ&fs.ModeSymlink != 0 && !self {
		self = h.deniedThroughLink(rel)
	}
	if typ&fs.ModeDir == 0 {
		if self {
			*h.out = append(*h.out, rel)
		}
		return self, nil
	}
	ents, err := os.ReadDir(filepath.Join(h.ws, filepath.FromSlash(rel)))
	if err != nil {
		return false, fmt.Errorf("sandbox: read policy: cannot list %s to hide what it denies: %w", rel, err)
	}
	start := len(*h.out)
	all := self
	for _, e := range ents {
		child := e.Name()
		if rel != "." {
			child = rel + "/" + e.Name()
		}
		hid, err := h.walk(child, e.Type())
		if err != nil {
			return false, err
		}
		all = all && hid
	}
	if all {
		*h.out = append((*h.out)[:start], rel)
	}
	return all, nil
}

// deniedThroughLink reports whether the link at rel leads to a directory
// inside the workspace beneath which some name, spelled through the link,
// is denied while its own name is not — the one way to read through the
// link what the policy denies, since a backend hides real paths. Links met
// beneath are followed too, to maxLinkDepth.
func (h hider) deniedThroughLink(rel string) bool {
	real, ok := h.dirInside(filepath.Join(h.ws, filepath.FromSlash(rel)))
	if !ok {
		return false // dangling, a file, or outside: nothing of the workspace to read through it
	}
	budget := linkBudget
	var denied func(spelled, dir string, links int) bool
	denied = func(spelled, dir string, links int) bool {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return true // cannot tell: fail closed
		}
		for _, e := range ents {
			if budget--; budget < 0 {
				return true
			}
			child, next, hops := spelled+"/"+e.Name(), filepath.Join(dir, e.Name()), links
			// Denied as spelled but allowed under its own name, it would
			// be read through the link; denied under its own name too,
			// it is hidden there already.
			if h.pol.Evaluate(policy.Read, child) != policy.Allow {
				own, err := filepath.Rel(h.ws, next)
				if err != nil || h.pol.Evaluate(policy.Read, filepath.ToSlash(own)) == policy.Allow {
					return true
				}
			}
			switch {
			case e.IsDir():
			case e.Type()&fs.ModeSymlink != 0 && links < maxLinkDepth:
				if next, ok = h.dirInside(next); !ok {
					continue
				}
				hops++
			default:
				continue
			}
			if denied(child, next, hops) {
				return true
			}
		}
		return false
	}
	return denied(rel, real, 1)
}

// dirInside resolves p and reports whether it is a directory inside the
// workspace.
func (h hider) dirInside(p string) (string, bool) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", false
	}
	if r, err := filepath.Rel(h.ws, real); err != nil || r == ".." || strings.HasPrefix(r, "../") {
		return "", false
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return "", false
	}
	return real, true
}

// compact sorts paths and drops duplicates and paths beneath another.
func compact(paths []string) []string {
	sort.Strings(paths)
	out := paths[:0]
	for _, p := range paths {
		if n := len(out); n > 0 && (out[n-1] == p || strings.HasPrefix(p, out[n-1]+"/")) {
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// underHidden reports whether p is one of hidden (sorted, compact) or
// beneath one.
func underHidden(hidden []string, p string) bool {
	i := sort.SearchStrings(hidden, p)
	if i < len(hidden) && hidden[i] == p {
		return true
	}
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if j := sort.SearchStrings(hidden, d); j < len(hidden) && hidden[j] == d {
			return true
		}
	}
	return false
}

// holdsHidden reports whether a path of hidden (sorted) is beneath dir.
func holdsHidden(hidden []string, dir string) bool {
	i := sort.SearchStrings(hidden, dir+"/")
	return i < len(hidden) && strings.HasPrefix(hidden[i], dir+"/")
}

// checkHidden expands the read policy for a command and refuses it
// (audited, ErrUnsupportedPolicy) when paths must be hidden and the
// backend cannot hide them — the command would read what the policy
// denies. The unsafe host opt-in accepts that, audited, like its other
// downgrades. It returns the paths to put in Request.Hidden.
func (s *Sandbox) checkHidden(ctx context.Context, execID, cmdStr string) ([]string, error) {
	hidden, err := s.hiddenPaths()
	name := s.backend.Name()
	if err != nil {
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
			Backend: name, Reason: "unsupported_policy", Detail: err.Error()})
		return nil, fmt.Errorf("%w: %w", ErrUnsupportedPolicy, err)
	}
	if s.caps.HidesPaths {
		// A backend that cannot hide paths has nothing to hide ahead of
		// time either: only what is there now is refused or accepted.
		if ahead := s.hiddenAhead(); len(ahead) > 0 {
			hidden = compact(append(hidden, ahead...))
		}
	}
	if len(hidden) == 0 {
		return nil, nil
	}
	shown := hidden
	if len(shown) > 20 {
		shown = shown[:20]
	}
	list := strings.Join(shown, ", ")
	if len(hidden) > len(shown) {
		list += fmt.Sprintf(", ... (%d in all)", len(hidden))
	}
	if s.caps.HidesPaths {
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "read", Target: cmdStr, Decision: "deny", Backend: name,
			EnforcementLevel: "strong", Detail: "hidden from the command by the read policy: " + list})
		return hidden, nil
	}
	if s.acceptsUnsafe(UnsafeReads) {
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "read", Target: cmdStr, Decision: "allow", Backend: name,
			EnforcementLevel: "unsupported", Reason: "UNSAFE_HOST",
			Detail: "the read policy denies " + list + " but backend " + name + " cannot hide paths; accepted by the unsafe host opt-in for reads"})
		return nil, nil
	}
	s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
		IsolationLevel: string(s.caps.Isolation), Backend: name, EnforcementLevel: "unsupported",
		Reason: "unsupported_policy", Detail: "backend cannot hide what the read policy denies: " + list})
	if s.unsafeHostRun() {
		host := HostRuleError{Accepted: slices.Clone(s.o.unsafeAccept)}
		host.add(UnsafeReads, "the read policy, which denies "+list, policy.Unsupported, "the host cannot hide paths; the command could read them")
		return nil, &host
	}
	return nil, fmt.Errorf("%w: the read policy denies %s, and backend %q cannot hide paths from a command; refused to prevent a silent downgrade",
		ErrUnsupportedPolicy, list, name)
}

// dropHiddenDeletions keeps a command from deleting what it could not
// see: a deletion of a hidden path, of a path beneath one, or of a
// directory holding one (rm -rf of a directory whose secret the command
// never saw) is refused, not staged, so the real file is never lost to a
// command that was not allowed to read it.
func (s *Sandbox) dropHiddenDeletions(ctx context.Context, execID string, ov *backend.Overlay, hidden []string, res *Result) *backend.Overlay {
	if len(hidden) == 0 || ov == nil || len(ov.Deleted) == 0 {
		return ov
	}
	kept := make([]string, 0, len(ov.Deleted))
	var events []audit.Event
	const why = "is or holds a path hidden from the command by the read policy; a deletion of what it could not see is not staged"
	for _, p := range ov.Deleted {
		// Removing a directory removes the hidden paths in it too.
		if underHidden(hidden, p) || holdsHidden(hidden, p) {
			res.Refused = append(res.Refused, RefusedPath{Path: p, Reason: why})
			events = append(events, audit.Event{ExecutionID: execID, Action: "delete", Target: p, Decision: "deny", Detail: why})
			continue
		}
		kept = append(kept, p)
	}
	if len(events) == 0 {
		return ov
	}
	s.recordBatch(ctx, "hidden-deletions", events)
	return &backend.Overlay{Files: ov.Files, Deleted: kept}
}

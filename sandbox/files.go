package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// The files API reads the workspace as the next command sees it: the
// committed workspace with the pending stack laid over it, in order.
// Every call passes the read policy (and WriteFile the write policy)
// like ReadFile and Stage do, and is audited.

// List lists the directory dir ("" or "." for the workspace root) as the
// next command would see it: the workspace's entries with the pending
// stack's creations, changes and deletions applied. It passes the checks
// ListDir documents (the read policy on dir as spelled and where it
// resolves, containment, the sandbox's own state). Entries the policy
// denies reading, and the sandbox's own state (.pulse), are left out. An
// entry the stack decides reports the stack's type, size and permission
// bits, with a zero modification time; the others are the workspace's.
// Names and paths are not scrubbed (a secret in a file name would make
// the entry unusable); ListDir gives the same listing scrubbed, and with
// ListCommitted the committed workspace alone.
func (s *Sandbox) List(ctx context.Context, dir string) ([]fs.DirEntry, error) {
	ents, err := s.list(ctx, dir)
	return ents, s.scrubErr(err)
}

func (s *Sandbox) list(ctx context.Context, dir string) ([]fs.DirEntry, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	rel, err := s.dirRel(ctx, dir)
	if err != nil {
		return nil, err
	}
	return s.listView(ctx, rel)
}

// listView lists the directory rel (checked by dirRel) through the
// pending stack.
func (s *Sandbox) listView(ctx context.Context, rel string) ([]fs.DirEntry, error) {
	st, err := s.viewStack(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]fs.DirEntry{}
	pendingDir := false
	if st != nil && rel != "." {
		e, decided, err := st.Lookup(rel)
		switch {
		case err != nil:
			return nil, fmt.Errorf("sandbox: list: %w", err)
		case decided && e == nil:
			return nil, fmt.Errorf("sandbox: list %s: %w (deleted in the pending stack)", rel, fs.ErrNotExist)
		case decided && e.Kind != cowfs.KindMkdir:
			return nil, fmt.Errorf("sandbox: list %s: not a directory in the pending stack", rel)
		case decided:
			pendingDir = true
		}
	}
	wsErr := s.readWorkspaceDir(rel, byName)
	if st != nil {
		implicit := applyView(st.View(), rel, byName)
		pendingDir = pendingDir || implicit
	}
	if wsErr != nil && !(pendingDir && (errors.Is(wsErr, fs.ErrNotExist) || isNotDir(wsErr))) {
		s.record(ctx, audit.Event{Action: "read", Target: rel, Decision: "deny", Detail: "list: " + wsErr.Error()})
		return nil, fmt.Errorf("sandbox: list %s: %w", rel, wsErr)
	}
	out := s.readable(rel, byName)
	s.record(ctx, audit.Event{Action: "read", Target: rel, Decision: "allow", Detail: "list through the pending stack"})
	return out, nil
}

// readWorkspaceDir adds the committed entries of rel to byName.
func (s *Sandbox) readWorkspaceDir(rel string, byName map[string]fs.DirEntry) error {
	root, err := os.OpenRoot(s.guard.Root())
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := root.Open(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return err
	}
	for _, e := range ents {
		byName[e.Name()] = e
	}
	return nil
}

func isNotDir(err error) bool { return errors.Is(err, syscall.ENOTDIR) }

// applyView lays the pending view over the entries of directory rel, and
// reports whether the view holds anything beneath rel (which then exists
// as a directory in the view even if the workspace lacks it).
func applyView(view []cowfs.Entry, rel string, byName map[string]fs.DirEntry) (beneath bool) {
	prefix := rel + "/"
	if rel == "." {
		prefix = ""
	}
	for _, v := range view { // sorted: a path before what is beneath it
		rest, ok := strings.CutPrefix(v.Path, prefix)
		if !ok || rest == "" {
			continue
		}
		name, _, nested := strings.Cut(rest, "/")
		switch {
		case nested && v.Kind != cowfs.KindDelete:
			beneath = true
			if e, ok := byName[name]; !ok || !e.IsDir() {
				byName[name] = pendingEntry{info: pendingInfo{name: name, mode: fs.ModeDir | 0o755}}
			}
		case nested:
		case v.Kind == cowfs.KindDelete:
			delete(byName, name)
		default:
			beneath = true
			byName[name] = pendingEntry{info: entryInfo(name, v)}
		}
	}
	return beneath
}

// Stat describes path as the next command would see it (through the
// pending stack; a symlink is not followed), after the policy allows
// reading it.
func (s *Sandbox) Stat(ctx context.Context, p string) (fs.FileInfo, error) {
	fi, err := s.stat(ctx, p)
	return fi, s.scrubErr(err)
}

func (s *Sandbox) stat(ctx context.Context, p string) (fs.FileInfo, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	rel, err := s.entryRel(ctx, p, "stat")
	if err != nil {
		return nil, err
	}
	st, err := s.viewStack(ctx)
	if err != nil {
		return nil, err
	}
	if st != nil && rel != "." {
		e, decided, err := st.Lookup(rel)
		if err != nil {
			return nil, fmt.Errorf("sandbox: stat: %w", err)
		}
		if decided {
			if e == nil {
				return nil, &fs.PathError{Op: "stat", Path: rel, Err: fs.ErrNotExist}
			}
			return entryInfo(path.Base(rel), *e), nil
		}
	}
	root, err := os.OpenRoot(s.guard.Root())
	if err != nil {
		return nil, fmt.Errorf("sandbox: stat: %w", err)
	}
	defer root.Close()
	fi, err := root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) && st != nil {
		// A directory the stack creates only by writing beneath it.
		byName := map[string]fs.DirEntry{}
		if applyView(st.View(), rel, byName) {
			return pendingInfo{name: path.Base(rel), mode: fs.ModeDir | 0o755}, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: stat: %w", err)
	}
	return fi, nil
}

// WriteFile stages data at path as a transaction of its own on top of
// the pending stack, under every check a command's write gets — the path
// is the workspace's (no "..", no absolute path outside it, nothing
// staged through a link of the workspace) and not the sandbox's own
// state, the write policy and the Approver allow it (ErrPolicyDenied),
// no configured secret is in its name or content (ErrSecretInContent),
// the file size limit holds (ErrLimitExceeded), no path the policy
// protects is removed or replaced with it — and returns the
// transaction's id; nothing reaches the workspace until it is committed.
// A refused write stages nothing. WriteFiles stages many in one
// transaction.
func (s *Sandbox) WriteFile(ctx context.Context, p string, data []byte, mode os.FileMode) (string, error) {
	id, err := s.stageFiles(ctx, "write "+p, []cowfs.Op{cowfs.WriteOp(p, data, mode)})
	return id, s.scrubErr(err)
}

// fileRel cleans a caller's path for the files API and checks the read
// policy on it; what names the sandbox's own state is refused.
func (s *Sandbox) fileRel(ctx context.Context, p, op string) (string, error) {
	rel := "."
	if p != "" && p != "." {
		var err error
		if rel, err = s.workspaceRel(p); err != nil {
			s.record(ctx, audit.Event{Action: "read", Target: p, Decision: "deny", Detail: op + ": " + err.Error()})
			return "", err
		}
	}
	if pathguard.IsReserved(rel) {
		s.record(ctx, audit.Event{Action: "read", Target: rel, Decision: "deny", Detail: op + ": reserved path"})
		return "", fmt.Errorf("%w: read %q: the sandbox's own state", ErrPolicyDenied, rel)
	}
	if _, err := s.decide(ctx, policy.Read, rel, ""); err != nil {
		return "", err
	}
	return rel, nil
}

// entryRel is fileRel for a call that looks at the entry p itself (a
// last link not followed), as Stat does: the read policy must also allow
// where p lies once the links of the workspace on its way are resolved,
// so that no link lets a caller learn what is in a directory it may not
// read.
func (s *Sandbox) entryRel(ctx context.Context, p, op string) (string, error) {
	rel, err := s.fileRel(ctx, p, op)
	if err != nil || rel == "." {
		return rel, err
	}
	dir, err := s.resolvedReadTarget(path.Dir(rel))
	if err != nil {
		s.record(ctx, audit.Event{Action: "read", Target: rel, Decision: "deny", Detail: op + ": " + err.Error()})
		return "", fmt.Errorf("sandbox: %s: %w", op, err)
	}
	if t := path.Join(dir, path.Base(rel)); t != rel {
		if _, err := s.decide(ctx, policy.Read, t, ""); err != nil {
			return "", err
		}
	}
	return rel, nil
}

// viewStack is the pending stack the next command runs on, or nil on a
// backend that writes in place.
func (s *Sandbox) viewStack(ctx context.Context) (*cowfs.Stack, error) {
	if !s.caps.CapturesWrites {
		return nil, nil
	}
	st, err := s.cow.Stack(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox: reading the pending stack: %w", err)
	}
	return st, nil
}

// entryInfo describes a view entry.
func entryInfo(name string, e cowfs.Entry) pendingInfo {
	fi := pendingInfo{name: name, size: e.Size, mode: e.Mode.Perm()}
	switch e.Kind {
	case cowfs.KindMkdir:
		fi.mode |= fs.ModeDir
		fi.size = 0
	case cowfs.KindSymlink:
		fi.mode = fs.ModeSymlink | 0o777
		fi.size = int64(len(e.Target))
	}
	return fi
}

// pendingInfo is the fs.FileInfo of a path the pending stack decides.
type pendingInfo struct {
	name string
	size int64
	mode fs.FileMode
}

func (i pendingInfo) Name() string       { return i.name }
func (i pendingInfo) Size() int64        { return i.size }
func (i pendingInfo) Mode() fs.FileMode  { return i.mode }
func (i pendingInfo) ModTime() time.Time { return time.Time{} }
func (i pendingInfo) IsDir() bool        { return i.mode.IsDir() }
func (i pendingInfo) Sys() any           { return nil }

// pendingEntry is the fs.DirEntry of a path the pending stack decides.
type pendingEntry struct{ info pendingInfo }

func (e pendingEntry) Name() string               { return e.info.name }
func (e pendingEntry) IsDir() bool                { return e.info.IsDir() }
func (e pendingEntry) Type() fs.FileMode          { return e.info.mode.Type() }
func (e pendingEntry) Info() (fs.FileInfo, error) { return e.info, nil }

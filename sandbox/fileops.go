package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// The changing half of the files API: each call stages one transaction on
// top of the pending stack, as a command's writes do, and nothing reaches
// the workspace until it is committed. Every path of it passes the checks
// a command's write passes (fileOp), and a call stages all of its paths or
// none.

// FileWrite is one file of WriteFiles.
type FileWrite struct {
	// Path is relative to the workspace (or absolute inside it).
	Path string
	Data []byte
	// Mode is the permission bits; 0 keeps an existing file's, or 0644.
	Mode os.FileMode
}

// WriteFiles stages files as one transaction, in order, and returns its
// id: a batch of edits becomes one change to review and commit. Each
// file passes the checks WriteFile documents; when one is refused,
// nothing of the batch is staged and the error names it.
func (s *Sandbox) WriteFiles(ctx context.Context, files []FileWrite) (string, error) {
	if len(files) == 0 {
		return "", fmt.Errorf("%w: no files to write", ErrInvalidCommand)
	}
	ops := make([]cowfs.Op, len(files))
	desc := make([]string, len(files))
	for i, f := range files {
		ops[i] = cowfs.WriteOp(f.Path, f.Data, f.Mode.Perm())
		desc[i] = f.Path
	}
	id, err := s.stageFiles(ctx, "write "+describePaths(desc), ops)
	return id, s.scrubErr(err)
}

// Remove stages the removal of path — a file, a link, or a directory with
// everything beneath it — as a transaction of its own, and returns its id.
// The path is removed as the next command sees it: what only the pending
// stack holds is hidden from the stack above, what the workspace holds is
// deleted at commit. The delete policy must allow the path and every path
// of the workspace beneath it (ErrPolicyDenied); a path that is not there
// fails with an error wrapping fs.ErrNotExist.
func (s *Sandbox) Remove(ctx context.Context, p string) (string, error) {
	id, err := s.remove(ctx, p)
	return id, s.scrubErr(err)
}

func (s *Sandbox) remove(ctx context.Context, p string) (string, error) {
	n, err := s.viewNode(ctx, p)
	if err != nil {
		return "", err
	}
	return s.stageFiles(ctx, "remove "+n.rel, []cowfs.Op{n.removeOp()})
}

// Mkdir stages a directory at path (its missing parents too) with mode's
// permission bits (0: 0755) as a transaction of its own, and returns its
// id. A path that already exists in the view fails with an error wrapping
// fs.ErrExist. It passes the write policy like WriteFile.
func (s *Sandbox) Mkdir(ctx context.Context, p string, mode os.FileMode) (string, error) {
	id, err := s.mkdir(ctx, p, mode)
	return id, s.scrubErr(err)
}

func (s *Sandbox) mkdir(ctx context.Context, p string, mode os.FileMode) (string, error) {
	rel, err := s.workspaceRel(p)
	if err != nil {
		return "", err
	}
	if _, err := s.viewNode(ctx, rel); err == nil {
		return "", fmt.Errorf("sandbox: mkdir %s: %w", rel, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return s.stageFiles(ctx, "mkdir "+rel, []cowfs.Op{cowfs.MkdirOp(rel, mode.Perm())})
}

// Rename stages the move of oldpath (a file, a link, or a directory with
// everything beneath it, as the next command sees it) to newpath as one
// transaction, and returns its id. Reading oldpath passes the read policy
// (every path beneath it included: what may not be read cannot be moved,
// and the move is refused rather than leaving it to be deleted), removing
// it the delete policy, and writing newpath the write policy and the
// checks WriteFile documents. newpath must not exist (fs.ErrExist): a
// rename never replaces. Moving a path into itself is refused
// (ErrInvalidCommand).
func (s *Sandbox) Rename(ctx context.Context, oldpath, newpath string) (string, error) {
	id, err := s.rename(ctx, oldpath, newpath)
	return id, s.scrubErr(err)
}

func (s *Sandbox) rename(ctx context.Context, oldpath, newpath string) (string, error) {
	to, err := s.workspaceRel(newpath)
	if err != nil {
		return "", err
	}
	n, err := s.viewNode(ctx, oldpath)
	if err != nil {
		return "", err
	}
	if to == n.rel || strings.HasPrefix(to, n.rel+"/") {
		return "", fmt.Errorf("%w: rename %s into itself (%s)", ErrInvalidCommand, n.rel, to)
	}
	if _, err := s.viewNode(ctx, to); err == nil {
		return "", fmt.Errorf("sandbox: rename %s to %s: %w", n.rel, to, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	var ops []cowfs.Op
	if err := s.copyOps(ctx, n, to, &ops); err != nil {
		return "", err
	}
	ops = append(ops, n.removeOp())
	return s.stageFiles(ctx, "rename "+n.rel+" to "+to, ops)
}

// copyOps appends the ops that make a copy of n at to: n itself, then
// what is beneath it, each read through the pending stack.
func (s *Sandbox) copyOps(ctx context.Context, n *node, to string, ops *[]cowfs.Op) error {
	switch n.kind {
	case cowfs.KindSymlink:
		*ops = append(*ops, cowfs.SymlinkOp(n.target, to))
		return nil
	case cowfs.KindWrite:
		// Streamed: a moved tree is staged in bounded memory, each file
		// read when its turn comes (fileOp scans it first).
		*ops = append(*ops, cowfs.StreamOp(to, n.open, n.mode))
		return nil
	}
	*ops = append(*ops, cowfs.MkdirOp(to, n.mode))
	names, err := s.viewChildren(ctx, n.rel)
	if err != nil {
		return err
	}
	for _, name := range names {
		c, err := s.viewNode(ctx, path.Join(n.rel, name))
		if err != nil {
			return err
		}
		if err := s.copyOps(ctx, c, path.Join(to, name), ops); err != nil {
			return err
		}
	}
	return nil
}

// node is one entry of the view, as a rename copies it.
type node struct {
	rel    string
	kind   cowfs.ChangeKind // KindWrite (a file), KindMkdir, KindSymlink
	mode   os.FileMode
	target string
	open   func() (io.ReadCloser, error) // a file's bytes
	// workspace: found in the committed workspace, which the stack
	// leaves as it is.
	workspace bool
}

// removeOp is the op that removes n: a deletion of what the workspace
// holds (refused by cowfs through a link of the workspace, where it would
// delete nothing the caller named), or a removal through the stack of
// what the stack holds.
func (n *node) removeOp() cowfs.Op {
	if n.workspace {
		return cowfs.DeleteOp(n.rel)
	}
	return cowfs.WhiteoutOp(n.rel)
}

// viewNode describes p as the next command sees it, after the read policy
// allows it (as spelled; a path is taken literally, links not followed,
// as staging takes it). It fails with an error wrapping fs.ErrNotExist
// when nothing is there.
func (s *Sandbox) viewNode(ctx context.Context, p string) (*node, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	rel, err := s.entryRel(ctx, p, "stat")
	if err != nil {
		return nil, err
	}
	if rel == "." {
		return nil, fmt.Errorf("%w: the workspace root itself", ErrInvalidCommand)
	}
	st, err := s.viewStack(ctx)
	if err != nil {
		return nil, err
	}
	if st != nil {
		e, decided, err := st.Lookup(rel)
		if err != nil {
			return nil, fmt.Errorf("sandbox: %s: %w", rel, err)
		}
		if decided {
			if e == nil {
				return nil, &fs.PathError{Op: "stat", Path: rel, Err: fs.ErrNotExist}
			}
			n := &node{rel: rel, kind: e.Kind, mode: e.Mode.Perm(), target: e.Target}
			if e.Kind == cowfs.KindWrite {
				n.open = e.Open
			}
			return n, nil
		}
	}
	root, err := os.OpenRoot(s.guard.Root())
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	defer root.Close()
	fi, err := root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) && st != nil {
		if applyView(st.View(), rel, map[string]fs.DirEntry{}) {
			// A directory the stack makes only by writing beneath it.
			return &node{rel: rel, kind: cowfs.KindMkdir, mode: 0o755}, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: %s: %w", rel, err)
	}
	n := &node{rel: rel, mode: fi.Mode().Perm(), workspace: true}
	switch {
	case fi.IsDir():
		n.kind = cowfs.KindMkdir
	case fi.Mode()&fs.ModeSymlink != 0:
		n.kind = cowfs.KindSymlink
		if n.target, err = root.Readlink(rel); err != nil {
			return nil, fmt.Errorf("sandbox: %s: %w", rel, err)
		}
	case fi.Mode().IsRegular():
		n.kind = cowfs.KindWrite
		// Read through pathguard: regular files only, no link followed,
		// the size limit.
		n.open = func() (io.ReadCloser, error) { return s.guard.Open(rel) }
	default:
		return nil, fmt.Errorf("%w: %s is not a regular file, directory or symlink", ErrInvalidCommand, rel)
	}
	return n, nil
}

// viewChildren names every entry of directory rel in the view, and
// refuses (ErrPolicyDenied) when the read policy denies one of them: a
// move must not carry what may not be read, nor delete it unseen.
func (s *Sandbox) viewChildren(ctx context.Context, rel string) ([]string, error) {
	byName := map[string]fs.DirEntry{}
	wsErr := s.readWorkspaceDir(rel, byName)
	st, err := s.viewStack(ctx)
	if err != nil {
		return nil, err
	}
	if st != nil {
		applyView(st.View(), rel, byName)
	}
	if wsErr != nil && !errors.Is(wsErr, fs.ErrNotExist) {
		return nil, fmt.Errorf("sandbox: %s: %w", rel, wsErr)
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		p := path.Join(rel, name)
		if pathguard.IsReserved(p) || s.o.policy.Evaluate(policy.Read, p) == policy.Deny {
			s.record(ctx, audit.Event{Action: "read", Target: p, Decision: "deny", Detail: "rename: beneath the path moved"})
			return nil, fmt.Errorf("%w: read %q: beneath %q, which is moved", ErrPolicyDenied, p, rel)
		}
		names = append(names, name)
	}
	return names, nil
}

// stageFiles stages ops as one transaction of its own, all or nothing:
// each op passes fileOp's checks first, then the batch is staged, then
// what the transaction would really do is checked against the policy
// again (changesDenied). Any refusal discards the transaction.
func (s *Sandbox) stageFiles(ctx context.Context, description string, ops []cowfs.Op) (string, error) {
	if err := s.enter(); err != nil {
		return "", err
	}
	defer s.running.Done()
	for i := range ops {
		if err := s.fileOp(ctx, &ops[i]); err != nil {
			return "", err
		}
	}
	tx, err := s.cow.Begin(ctx, s.scrubber.Redact(description))
	if err != nil {
		return "", err
	}
	drop := func() { _ = tx.Discard(context.WithoutCancel(ctx)) }
	errs, err := tx.Stage(ctx, ops)
	if err != nil {
		drop()
		return "", fmt.Errorf("sandbox: staging: %w", err)
	}
	for i, e := range errs {
		if e != nil {
			drop()
			s.record(ctx, audit.Event{Action: "write", Target: ops[i].Path, Decision: "deny", Detail: "staging: " + e.Error()})
			return "", fmt.Errorf("sandbox: %s %s: %w (nothing staged)", ops[i].Kind, ops[i].Path, e)
		}
	}
	if hit := s.changesDenied(tx); hit != "" {
		drop()
		s.record(ctx, audit.Event{Action: "write", Target: hit, Decision: "deny", TxID: tx.ID(),
			Detail: "the staged changes would change a path the policy protects; nothing staged"})
		return "", fmt.Errorf("%w: %s would change %s (nothing staged)", ErrPolicyDenied, description, s.scrubber.Redact(hit))
	}
	events := make([]audit.Event, len(ops))
	for i, op := range ops {
		action := "write-staged"
		if op.Kind == cowfs.KindWhiteout || op.Kind == cowfs.KindDelete {
			action = "delete-staged"
		}
		events[i] = audit.Event{Action: action, Target: op.Path, Decision: "allow", Detail: "transaction " + tx.ID()}
	}
	s.recordBatch(ctx, "stage-files", events)
	return tx.ID(), nil
}

// fileOp checks one op of the files API as a command's write is checked,
// in the same order as a Tx's: the path is the workspace's (cleaned in
// op), not the sandbox's own state, allowed by the policy (write, or
// delete for a removal; the Approver asked on Ask), carries no configured
// secret in its name, content or link target, is within the file size
// limit, and removes or replaces no path the policy protects. Each
// refusal is audited.
func (s *Sandbox) fileOp(ctx context.Context, op *cowfs.Op) error {
	rel, err := s.workspaceRel(op.Path)
	if err != nil {
		s.record(ctx, audit.Event{Action: "write", Target: op.Path, Decision: "deny", Detail: err.Error()})
		return err
	}
	op.Path = rel
	if pathguard.IsReserved(rel) {
		s.record(ctx, audit.Event{Action: "write", Target: rel, Decision: "deny", Detail: "reserved path"})
		return fmt.Errorf("%w: %s %q: the sandbox's own state", ErrPolicyDenied, op.Kind, rel)
	}
	a := policy.Write
	if op.Kind == cowfs.KindWhiteout || op.Kind == cowfs.KindDelete {
		a = policy.Delete
	}
	if _, err := s.decide(ctx, a, rel, ""); err != nil {
		return err
	}
	if s.scrubber.Contains(rel) || s.scrubber.ContainsBytes(op.Data) || s.scrubber.Contains(op.Target) {
		s.record(ctx, audit.Event{Action: "write", Target: rel, Decision: "deny",
			Detail: "staged name, content or link target contains a configured secret"})
		return fmt.Errorf("%w: %s", ErrSecretInContent, s.scrubber.Redact(rel))
	}
	size := int64(len(op.Data))
	if op.Open != nil {
		var hit bool
		var err error
		if size, hit, err = s.scanStream(op.Open); err != nil {
			s.record(ctx, audit.Event{Action: "write", Target: rel, Decision: "deny", Detail: "reading: " + err.Error()})
			return fmt.Errorf("sandbox: %s: %w", rel, err)
		}
		if hit {
			s.record(ctx, audit.Event{Action: "write", Target: rel, Decision: "deny", Detail: "staged content contains a configured secret"})
			return fmt.Errorf("%w: %s", ErrSecretInContent, s.scrubber.Redact(rel))
		}
	}
	if limit := s.o.limits.FileSizeBytes; limit > 0 && size > limit {
		le := &policy.LimitError{Field: policy.LimitFileSizeBytes, Asked: strconv.FormatInt(size, 10), Allowed: strconv.FormatInt(limit, 10)}
		s.record(ctx, audit.Event{Action: "write", Target: rel, Decision: "deny", Reason: "limit_exceeded", Detail: le.Error()})
		return fmt.Errorf("sandbox: %s: %w", rel, le)
	}
	return s.checkSideEffects(ctx, *op)
}

// scanStream reads what open gives once, through, and returns its size
// and whether it holds a configured secret.
func (s *Sandbox) scanStream(open func() (io.ReadCloser, error)) (int64, bool, error) {
	r, err := open()
	if err != nil {
		return 0, false, err
	}
	defer r.Close()
	c := &countingReader{r: r}
	hit, err := s.scrubber.ContainsReader(c)
	if err == nil && !hit {
		// ContainsReader may stop early; the size is the whole file's.
		_, err = io.Copy(io.Discard, c)
	}
	return c.n, hit, err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// describePaths names a batch's paths in its description, the first few.
func describePaths(paths []string) string {
	const show = 3
	if len(paths) <= show {
		return strings.Join(paths, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(paths[:show], ", "), len(paths)-show)
}

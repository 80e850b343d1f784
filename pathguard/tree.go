package pathguard

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// ErrLinkTarget: a symlink target CheckLinkTarget refuses.
var ErrLinkTarget = errors.New("symlink target not allowed")

// CheckLinkTarget is the project's one rule for the target of a symlink
// that is about to be created at rel (a clean, slash-separated path
// relative to the workspace root): nil when following the link can lead
// neither outside the workspace nor into ReservedDir, else an error
// wrapping ErrLinkTarget that names the target and the reason.
//
// Cleaning a target lexically is not what the kernel does: it resolves
// ".." against the directory a symlinked component led to, not against
// the component's name, so "l/../../etc/passwd" (with l a link to the
// workspace root) cleans to "etc/passwd" but leaves the workspace. The
// rule is therefore on the target's elements as written:
//
//   - it is relative, not empty, no longer than MaxPathLen, free of NUL
//     and of backslashes, and does not start with a drive letter ("C:"):
//     a workspace may be packed here and unpacked on a system that reads
//     those as separators or roots;
//   - ".." elements come only first, as one leading run; a ".." after any
//     name is refused;
//   - that run climbs from the link's own directory and stays inside the
//     workspace. The rule assumes the link's ancestors are real
//     directories (cowfs checks them on commit and recovery, an archive
//     extractor resolves them), so each ".." is that directory's real
//     parent;
//   - what follows only descends by name, and no name is ReservedDir at
//     any depth, in any case (a link to a directory above could make a
//     nested one the reserved directory).
//
// Descending can still cross a symlink, but every link created under the
// same rule stays inside, so by induction the new one does too; only a
// link the workspace already held can lead out, and it already does.
func CheckLinkTarget(rel, target string) error {
	switch {
	case target == "" || strings.IndexByte(target, 0) >= 0 || len(target) > MaxPathLen:
		return fmt.Errorf("%w: %q is malformed", ErrLinkTarget, target)
	case strings.IndexByte(target, '\\') >= 0:
		return fmt.Errorf("%w: %q holds a backslash", ErrLinkTarget, target)
	case path.IsAbs(target) || hasDrive(target):
		return fmt.Errorf("%w: %q is absolute", ErrLinkTarget, target)
	}
	up, named := 0, false
	for _, e := range strings.Split(target, "/") {
		switch {
		case e == "" || e == ".":
			// The directory reached so far: never a symlink, never a climb.
		case e == "..":
			if named {
				return fmt.Errorf("%w: %q has .. after a name (it would climb out of whatever that name links to)", ErrLinkTarget, target)
			}
			up++
		default:
			named = true
			if IsReserved(e) {
				return fmt.Errorf("%w: %q names %s", ErrLinkTarget, target, ReservedDir)
			}
		}
	}
	if up > strings.Count(path.Clean(rel), "/") {
		return fmt.Errorf("%w: %q leaves the workspace", ErrLinkTarget, target)
	}
	if IsReserved(path.Join(path.Dir(rel), target)) {
		return fmt.Errorf("%w: %q points into %s", ErrLinkTarget, target, ReservedDir)
	}
	return nil
}

// hasDrive reports whether p starts with a drive letter ("C:").
func hasDrive(p string) bool {
	return len(p) >= 2 && p[1] == ':' && ('a' <= p[0]|0x20 && p[0]|0x20 <= 'z')
}

// WalkFunc is called by WalkWorkspace for each entry: rel is its path
// relative to the root, slash-separated; abs is root joined with rel, the
// path to open. d and err are as filepath.WalkDir gives them, and so is
// the meaning of returning filepath.SkipDir or filepath.SkipAll.
type WalkFunc func(rel, abs string, d fs.DirEntry, err error) error

// WalkWorkspace walks the tree under root as filepath.WalkDir does
// (lexical order, symlinks not followed) and calls fn for every entry
// except root itself and the reserved directory (IsReserved: any case
// spelling of ReservedDir at the top) with all beneath it, which no
// caller may copy, scan or pack. An error at root itself (it is missing
// or cannot be read) is returned without calling fn.
func WalkWorkspace(root string, fn WalkFunc) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if p == root {
			return err
		}
		rel, rerr := filepath.Rel(root, p)
		if rerr != nil {
			return rerr
		}
		rel = filepath.ToSlash(rel)
		if IsReserved(rel) {
			if d != nil && d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		return fn(rel, p, d, err)
	})
}

// IsWorkspacePath reports whether p is how a request names an entry
// beneath the workspace root: relative, slash-separated and already clean
// (path.Clean leaves it alone), neither the root itself nor leaving it,
// free of NUL, and not reserved (IsReserved).
func IsWorkspacePath(p string) bool {
	return p != "" && p != "." && p != ".." && path.Clean(p) == p && !path.IsAbs(p) &&
		!strings.HasPrefix(p, "../") && strings.IndexByte(p, 0) < 0 && !IsReserved(p)
}

// Topmost returns, sorted and once each, those of the clean,
// slash-separated relative paths that lie beneath no other of them: all a
// recursive removal of the set needs to name, and how an overlay lists a
// deleted directory (once, not with its contents).
func Topmost(paths []string) []string {
	set := make(map[string]bool, len(paths))
	for _, p := range paths {
		set[p] = true
	}
	var out []string
	for p := range set {
		under := false
		for d := path.Dir(p); d != "." && d != "/" && !under; d = path.Dir(d) {
			under = set[d]
		}
		if !under {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

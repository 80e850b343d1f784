package cowfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// DiffMaxBytes is the largest file Tx.Diff shows line by line; a larger
// one, on either side, is summarised by its size and SHA-256 (read in a
// stream, never whole), as a binary file is. DiffMaxLines is the same
// bound on lines. Together they bound Diff's memory: two files of at
// most DiffMaxBytes and their per-line index, about 60 bytes a line.
const (
	DiffMaxBytes = 8 << 20
	DiffMaxLines = 1 << 19
)

// diffMaxOutput bounds the text Diff accumulates: once the diff is past
// it, every further content change is summarised too.
var diffMaxOutput = 64 << 20 // a variable for the test of it

// side is one side of a file diff: absent (typ ""), a regular file, a
// symlink (data is its target) or a directory (only its mode matters).
// A file's content is in data when held; one too large to hold is known
// by its size and sha alone.
type side struct {
	typ  string
	mode uint32
	data string
	held bool
	size int64
	sha  string // hex SHA-256 of the content, when known
}

// digest returns the content's SHA-256 in hex.
func (s *side) digest() string {
	if s.sha == "" {
		sum := sha256.Sum256([]byte(s.data))
		s.sha = hex.EncodeToString(sum[:])
	}
	return s.sha
}

// sidesEqual says whether the two sides hold the same bytes.
func sidesEqual(a, b *side) bool {
	if a.held && b.held {
		return a.data == b.data
	}
	return a.size == b.size && a.digest() == b.digest()
}

// Diff renders the staged changes as a git-style unified diff against the
// workspace as it is now: "diff --git" headers, new/deleted file modes,
// mode changes, "Binary files ... differ" for binary content, and "\ No
// newline at end of file" markers, so that `patch -p1` (or `git apply`)
// reproduces the staged text files exactly. The line diff is git's
// histogram diff, so its hunks are the ones `git diff --histogram` shows.
//
// A binary file, and a file larger than DiffMaxBytes (or DiffMaxLines)
// on either side, is summarised, its content never held in memory whole:
//
//	Binary files a/path and b/path differ
//	old: 1073741824 bytes, sha256 <64 hex digits>
//	new: 1073741901 bytes, sha256 <64 hex digits>
//
// (one of the last two lines for a created or deleted file). Both tools
// skip the size lines; git apply refuses a binary change without its
// full index, GNU patch skips it.
//
// Modes are the real permission bits (100600, 100666, 102755), not git's
// 100644/100755 (which would hide 0600 becoming 0666): any change of them
// is shown, alone if the content is the same. GNU patch applies them;
// git apply accepts them, keeping only the owner-exec bit as git does.
// A directory has no place in a git diff, so the one change shown for
// it, its mode, is a line of its own that both tools skip:
//
//	directory "path": old mode 040755, new mode 040777
//
// New and removed directories are not shown, as in git.
func (t *Tx) Diff(ctx context.Context) (string, error) {
	unlock, err := t.fs.lock(ctx)
	if err != nil {
		return "", err
	}
	defer unlock()
	if err := t.refreshLocked(false); err != nil {
		return "", err
	}
	t.mu.Lock()
	changes := make([]change, 0, len(t.changes))
	for _, c := range t.changes {
		changes = append(changes, *c)
	}
	t.mu.Unlock()
	sort.Slice(changes, func(i, j int) bool { return changes[i].Path < changes[j].Path })
	var b strings.Builder
	for i := range changes {
		c := &changes[i]
		if c.Kind == KindMkdir && c.Implicit {
			continue // never changes a directory that exists
		}
		limit := int64(DiffMaxBytes)
		if b.Len() > diffMaxOutput {
			limit = 0
		}
		old, err := t.fs.oldSide(c.Path, limit)
		if err != nil {
			return "", err
		}
		var nw side
		switch c.Kind {
		case KindWrite:
			nw, err = t.fs.stagedSide(t.dir(), c, limit)
			if err != nil {
				return "", fmt.Errorf("cowfs: diff: %w", err)
			}
		case KindSymlink:
			nw = side{typ: typeSymlink, data: c.Target, held: true, size: int64(len(c.Target))}
		case KindMkdir:
			nw = side{typ: typeDir, mode: c.Mode}
		}
		writeFileDiff(&b, c.Path, old, nw)
	}
	return b.String(), nil
}

// stagedSide returns the staged content of write change c, held when it
// is at most limit bytes long. Held bytes are checked against the staged
// size and hash: the diff must show what a commit would write, and an
// error wrapping ErrDamaged names the path when it would not.
func (f *FS) stagedSide(dir string, c *change, limit int64) (side, error) {
	s := side{typ: typeFile, mode: c.Mode, size: c.Size, sha: c.Blob}
	if c.Size > limit {
		return s, nil
	}
	r, cl, err := f.openBlob(dir, c)
	if err != nil {
		return side{}, fmt.Errorf("%w: staged bytes of %q are missing: %v", ErrDamaged, c.Path, err)
	}
	defer cl.Close()
	var b strings.Builder
	b.Grow(int(c.Size))
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(&b, h), io.LimitReader(r, limit+1)); err != nil {
		return side{}, fmt.Errorf("%w: staged bytes of %q: %v", ErrDamaged, c.Path, err)
	}
	if err := verifySum(c, int64(b.Len()), h); err != nil {
		return side{}, err
	}
	s.data, s.held = b.String(), true
	return s, nil
}

// oldSide reads the workspace entry at rel for the diff: a file's content
// when it is at most limit bytes long, else its size and SHA-256 from one
// streamed pass. The diff shows what is there; the commit checks it.
func (f *FS) oldSide(rel string, limit int64) (side, error) {
	for attempt := 0; ; attempt++ {
		fi, err := f.ws.lstat(rel)
		if isNotExist(err) {
			return side{}, nil
		}
		if err != nil {
			return side{}, fmt.Errorf("cowfs: diff: %q: %w", rel, err)
		}
		switch s := statSnap(fi); s.Type {
		case typeFile:
			sd, again, err := f.readOld(rel, s, limit)
			if again && attempt < 3 {
				continue // replaced while opened: look again
			}
			if err != nil {
				return side{}, fmt.Errorf("cowfs: diff: %q: %w", rel, err)
			}
			return sd, nil
		case typeSymlink:
			t, err := f.ws.root.Readlink(rel)
			if isNotExist(err) && attempt < 3 {
				continue
			}
			if err != nil {
				return side{}, fmt.Errorf("cowfs: diff: %q: %w", rel, err)
			}
			return side{typ: typeSymlink, data: t, held: true, size: int64(len(t))}, nil
		case typeDir:
			return side{typ: typeDir, mode: s.Mode}, nil
		}
		return side{}, nil
	}
}

// readOld reads the regular file rel that lstat described as s. again
// reports that it is no longer a regular file.
func (f *FS) readOld(rel string, s snapshot, limit int64) (sd side, again bool, err error) {
	// O_NONBLOCK: a FIFO swapped in after the lstat must not hang the
	// diff; O_NOFOLLOW: nor may a symlink send it elsewhere.
	fl, err := f.ws.root.OpenFile(rel, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return side{}, isNotExist(err) || errors.Is(err, syscall.ELOOP), err
	}
	defer fl.Close()
	fi, err := fl.Stat()
	if err != nil {
		return side{}, false, err
	}
	if !fi.Mode().IsRegular() {
		return side{}, true, fmt.Errorf("not a regular file any more")
	}
	sd = side{typ: typeFile, mode: statSnap(fi).Mode}
	h := sha256.New()
	var b strings.Builder
	if fi.Size() <= limit {
		b.Grow(int(fi.Size()))
		if _, err := io.Copy(io.MultiWriter(&b, h), io.LimitReader(fl, limit+1)); err != nil {
			return side{}, false, err
		}
		if int64(b.Len()) <= limit {
			sd.data, sd.held, sd.size = b.String(), true, int64(b.Len())
			return sd, false, nil
		}
	}
	// Too large to hold: hash the rest in a stream.
	n, err := io.Copy(h, fl)
	if err != nil {
		return side{}, false, err
	}
	sd.size = int64(b.Len()) + n
	sd.sha = hex.EncodeToString(h.Sum(nil))
	return sd, false, nil
}

// gitMode spells the type and the real permission bits, setgid and
// sticky included, in git's octal form.
func gitMode(s side) string {
	switch s.typ {
	case typeSymlink:
		return "120000"
	case typeDir:
		return fmt.Sprintf("%06o", syscall.S_IFDIR|s.mode&0o7777)
	}
	return fmt.Sprintf("%06o", syscall.S_IFREG|s.mode&0o7777)
}

// writeFileDiff writes the git-style diff of one path. A change of type
// (file to symlink) is shown as a deletion and a creation, as git does.
func writeFileDiff(w *strings.Builder, p string, old, nw side) {
	if old.typ == typeDir || nw.typ == typeDir {
		if old.typ == typeDir && nw.typ == typeDir {
			if old.mode != nw.mode {
				// Always quoted, so that no name can read as part of
				// the line.
				q := quoteName(p)
				if !strings.HasPrefix(q, `"`) {
					q = `"` + q + `"`
				}
				w.WriteString("directory " + q + ": old mode " + gitMode(old) + ", new mode " + gitMode(nw) + "\n")
			}
			return
		}
		// A directory replaced by a file or link shows as its creation,
		// a file or link replaced by a directory as its deletion.
		if old.typ == typeDir {
			old = side{}
		} else {
			nw = side{}
		}
	}
	if old.typ != "" && nw.typ != "" && old.typ != nw.typ {
		writeFileDiff(w, p, old, side{})
		writeFileDiff(w, p, side{}, nw)
		return
	}
	from, to := quoteName("a/"+p), quoteName("b/"+p)
	header := "diff --git " + from + " " + to + "\n"
	switch {
	case old.typ == "" && nw.typ == "":
		return
	case old.typ == "":
		w.WriteString(header)
		w.WriteString("new file mode " + gitMode(nw) + "\n")
		from = "/dev/null"
	case nw.typ == "":
		w.WriteString(header)
		w.WriteString("deleted file mode " + gitMode(old) + "\n")
		to = "/dev/null"
	default:
		sameMode := gitMode(old) == gitMode(nw)
		same := sidesEqual(&old, &nw)
		if sameMode && same {
			return
		}
		w.WriteString(header)
		if !sameMode {
			w.WriteString("old mode " + gitMode(old) + "\nnew mode " + gitMode(nw) + "\n")
		}
		if same {
			return
		}
	}
	if old.size == 0 && nw.size == 0 {
		return
	}
	var a, b []string
	summarise := !old.held && old.typ != "" || !nw.held && nw.typ != "" ||
		isBinary(old.data) || isBinary(nw.data)
	if !summarise {
		a, b = splitLines(old.data), splitLines(nw.data)
		summarise = len(a) > DiffMaxLines || len(b) > DiffMaxLines
	}
	if summarise {
		w.WriteString("Binary files " + from + " and " + to + " differ\n")
		if old.typ != "" {
			w.WriteString("old: " + strconv.FormatInt(old.size, 10) + " bytes, sha256 " + old.digest() + "\n")
		}
		if nw.typ != "" {
			w.WriteString("new: " + strconv.FormatInt(nw.size, 10) + " bytes, sha256 " + nw.digest() + "\n")
		}
		return
	}
	w.WriteString("--- " + from + "\n+++ " + to + "\n")
	writeHunks(w, a, b, 3)
}

// quoteName quotes a name the way git does when it holds a byte that
// would be ambiguous in a patch header (space, quote, backslash, control,
// non-ASCII): C-style, with octal escapes. GNU patch and git apply both
// read it; an unquoted name with a space is misread by GNU patch.
func quoteName(name string) string {
	need := false
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c == '"' || c == '\\' || c >= 0x7f {
			need = true
			break
		}
	}
	if !need {
		return name
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case ' ':
			b.WriteByte(c)
		default:
			if c < ' ' || c >= 0x7f {
				fmt.Fprintf(&b, "\\%03o", c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// isBinary uses git's rule: a NUL byte in the first 8000 bytes.
func isBinary(s string) bool {
	if len(s) > 8000 {
		s = s[:8000]
	}
	return strings.IndexByte(s, 0) >= 0
}

// splitLines splits after every newline; the last line may lack one.
func splitLines(s string) []string {
	if len(s) == 0 {
		return nil
	}
	out := make([]string, 0, strings.Count(s, "\n")+1)
	for len(s) > 0 {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

// writeHunks writes unified-diff hunks of a against b with ctx lines of
// context.
func writeHunks(w io.StringWriter, a, b []string, ctx int) {
	for _, group := range groupedOpCodes(a, b, ctx) {
		first, last := group[0], group[len(group)-1]
		w.WriteString("@@ -" + unifiedRange(first.I1, last.I2) + " +" + unifiedRange(first.J1, last.J2) + " @@\n")
		for _, op := range group {
			if op.Tag == 'e' {
				for _, l := range a[op.I1:op.I2] {
					writeLine(w, ' ', l)
				}
				continue
			}
			if op.Tag == 'r' || op.Tag == 'd' {
				for _, l := range a[op.I1:op.I2] {
					writeLine(w, '-', l)
				}
			}
			if op.Tag == 'r' || op.Tag == 'i' {
				for _, l := range b[op.J1:op.J2] {
					writeLine(w, '+', l)
				}
			}
		}
	}
}

func writeLine(w io.StringWriter, prefix byte, l string) {
	w.WriteString(string(prefix))
	w.WriteString(l)
	if !strings.HasSuffix(l, "\n") {
		w.WriteString("\n\\ No newline at end of file\n")
	}
}

// unifiedRange formats a hunk range the way diff -u does.
func unifiedRange(start, stop int) string {
	begin, n := start+1, stop-start
	switch n {
	case 1:
		return strconv.Itoa(begin)
	case 0:
		begin--
	}
	return strconv.Itoa(begin) + "," + strconv.Itoa(n)
}

// groupedOpCodes returns the opcodes of a against b in hunks with ctx
// lines of context.
func groupedOpCodes(a, b []string, ctx int) [][]opCode {
	return groupOpCodes(lineDiff(a, b), ctx)
}

// groupOpCodes splits opcodes into hunks with n lines of context; changes
// at most 2n lines apart share a hunk, as in git and difflib.
func groupOpCodes(codes []opCode, n int) [][]opCode {
	if len(codes) == 0 {
		return nil
	}
	codes = append([]opCode(nil), codes...)
	if c := codes[0]; c.Tag == 'e' {
		codes[0] = opCode{Tag: 'e', I1: max(c.I1, c.I2-n), I2: c.I2, J1: max(c.J1, c.J2-n), J2: c.J2}
	}
	if c := codes[len(codes)-1]; c.Tag == 'e' {
		codes[len(codes)-1] = opCode{Tag: 'e', I1: c.I1, I2: min(c.I2, c.I1+n), J1: c.J1, J2: min(c.J2, c.J1+n)}
	}
	var groups [][]opCode
	var group []opCode
	for _, c := range codes {
		if c.Tag == 'e' && c.I2-c.I1 > 2*n {
			group = append(group, opCode{Tag: 'e', I1: c.I1, I2: min(c.I2, c.I1+n), J1: c.J1, J2: min(c.J2, c.J1+n)})
			groups = append(groups, group)
			group = nil
			c.I1, c.J1 = max(c.I1, c.I2-n), max(c.J1, c.J2-n)
		}
		group = append(group, c)
	}
	if len(group) > 0 && !(len(group) == 1 && group[0].Tag == 'e') {
		groups = append(groups, group)
	}
	return groups
}

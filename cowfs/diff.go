package cowfs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/pmezard/go-difflib/difflib"
)

// side is one side of a file diff: absent (typ ""), a regular file, a
// symlink (data is its target) or a directory (only its mode matters).
type side struct {
	typ  string
	mode uint32
	data []byte
}

// Diff renders the staged changes as a git-style unified diff against the
// workspace as it is now: "diff --git" headers, new/deleted file modes,
// mode changes, "Binary files ... differ" for binary content, and "\ No
// newline at end of file" markers, so that `patch -p1` (or `git apply`)
// reproduces the staged text files exactly.
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
func (t *Tx) Diff() (string, error) {
	unlock, err := t.fs.lock(context.Background())
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
		old, err := t.fs.oldSide(c.Path)
		if err != nil {
			return "", err
		}
		var nw side
		switch c.Kind {
		case KindWrite:
			data, err := t.fs.readBlob(t.dir(), c)
			if err != nil {
				return "", fmt.Errorf("cowfs: diff: %q: %w", c.Path, err)
			}
			nw = side{typ: typeFile, mode: c.Mode, data: data}
		case KindSymlink:
			nw = side{typ: typeSymlink, data: []byte(c.Target)}
		case KindMkdir:
			if c.Implicit {
				continue // never changes a directory that exists
			}
			nw = side{typ: typeDir, mode: c.Mode}
		}
		writeFileDiff(&b, c.Path, old, nw)
	}
	return b.String(), nil
}

// oldSide reads the workspace entry at rel for the diff (no hashing: the
// diff shows what is there, the commit checks it).
func (f *FS) oldSide(rel string) (side, error) {
	fi, err := f.ws.lstat(rel)
	if isNotExist(err) {
		return side{}, nil
	}
	if err != nil {
		return side{}, fmt.Errorf("cowfs: diff: %q: %w", rel, err)
	}
	switch s := statSnap(fi); s.Type {
	case typeFile:
		data, err := f.ws.root.ReadFile(rel)
		if err != nil {
			return side{}, fmt.Errorf("cowfs: diff: %q: %w", rel, err)
		}
		return side{typ: typeFile, mode: s.Mode, data: data}, nil
	case typeSymlink:
		t, err := f.ws.root.Readlink(rel)
		if err != nil {
			return side{}, fmt.Errorf("cowfs: diff: %q: %w", rel, err)
		}
		return side{typ: typeSymlink, data: []byte(t)}, nil
	case typeDir:
		return side{typ: typeDir, mode: s.Mode}, nil
	}
	return side{}, nil
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
		if sameMode && bytes.Equal(old.data, nw.data) {
			return
		}
		w.WriteString(header)
		if !sameMode {
			w.WriteString("old mode " + gitMode(old) + "\nnew mode " + gitMode(nw) + "\n")
		}
		if bytes.Equal(old.data, nw.data) {
			return
		}
	}
	if len(old.data) == 0 && len(nw.data) == 0 {
		return
	}
	if isBinary(old.data) || isBinary(nw.data) {
		w.WriteString("Binary files " + from + " and " + to + " differ\n")
		return
	}
	w.WriteString("--- " + from + "\n+++ " + to + "\n")
	writeHunks(w, splitLines(old.data), splitLines(nw.data), 3)
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
func isBinary(b []byte) bool {
	if len(b) > 8000 {
		b = b[:8000]
	}
	return bytes.IndexByte(b, 0) >= 0
}

// splitLines splits after every newline; the last line may lack one.
func splitLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	n := bytes.Count(b, []byte{'\n'})
	out := make([]string, 0, n+1)
	s := string(b)
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
// lines of context, as difflib's GetGroupedOpCodes does.
func groupedOpCodes(a, b []string, ctx int) [][]difflib.OpCode {
	return groupOpCodes(opCodes(a, b), ctx)
}

// opCodes diffs a against b. difflib's matcher alone is slow on large
// files and, on files of few distinct lines, its auto-junk heuristic
// degrades the result to a near-total rewrite. So, as patience diff
// does, the common prefix and suffix are set aside, lines that occur
// exactly once in each side are matched (longest increasing run of their
// positions) as anchors, and difflib's matcher only runs on the small
// regions between anchors.
func opCodes(a, b []string) []difflib.OpCode {
	var out []difflib.OpCode
	emit := func(tag byte, i1, i2, j1, j2 int) {
		if i1 == i2 && j1 == j2 {
			return
		}
		if n := len(out); n > 0 && out[n-1].Tag == tag && out[n-1].I2 == i1 && out[n-1].J2 == j1 {
			out[n-1].I2, out[n-1].J2 = i2, j2
			return
		}
		out = append(out, difflib.OpCode{Tag: tag, I1: i1, I2: i2, J1: j1, J2: j2})
	}
	region := func(i1, i2, j1, j2 int) {
		switch {
		case i1 == i2 && j1 == j2:
		case i1 == i2:
			emit('i', i1, i2, j1, j2)
		case j1 == j2:
			emit('d', i1, i2, j1, j2)
		case (i2-i1)*(j2-j1) <= 64 && disjoint(a[i1:i2], b[j1:j2]):
			// The usual region between anchors: a line or two replaced.
			// Nothing to match, so skip building a matcher.
			emit('r', i1, i2, j1, j2)
		default:
			m := difflib.NewMatcher(a[i1:i2], b[j1:j2])
			for _, op := range m.GetOpCodes() {
				emit(op.Tag, op.I1+i1, op.I2+i1, op.J1+j1, op.J2+j1)
			}
		}
	}
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	emit('e', 0, p, 0, p)
	ai, bj := p, p
	for _, an := range uniqueAnchors(a[p:len(a)-s], b[p:len(b)-s]) {
		i, j := an[0]+p, an[1]+p
		region(ai, i, bj, j)
		emit('e', i, i+1, j, j+1)
		ai, bj = i+1, j+1
	}
	region(ai, len(a)-s, bj, len(b)-s)
	emit('e', len(a)-s, len(a), len(b)-s, len(b))
	return out
}

func disjoint(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return false
			}
		}
	}
	return true
}

// uniqueAnchors returns pairs (i, j) with a[i] == b[j], each line unique
// in a and in b, forming the longest chain increasing in both i and j.
func uniqueAnchors(a, b []string) [][2]int {
	// One map lookup per line and no allocation per distinct line: this
	// runs over every line of both files.
	type seen struct{ na, nb, i, j int32 }
	idx := make(map[string]int32, len(a))
	counts := make([]seen, 0, len(a))
	for i, l := range a {
		k, ok := idx[l]
		if !ok {
			k = int32(len(counts))
			idx[l] = k
			counts = append(counts, seen{})
		}
		counts[k].na++
		counts[k].i = int32(i)
	}
	for j, l := range b {
		if k, ok := idx[l]; ok {
			counts[k].nb++
			counts[k].j = int32(j)
		}
	}
	var pairs [][2]int // in increasing i
	for _, c := range counts {
		if c.na == 1 && c.nb == 1 {
			pairs = append(pairs, [2]int{int(c.i), int(c.j)})
		}
	}
	sort.Slice(pairs, func(x, y int) bool { return pairs[x][0] < pairs[y][0] })
	// Longest increasing subsequence of j, by patience sorting.
	tails := []int{} // index into pairs of the smallest tail of each length
	prev := make([]int, len(pairs))
	for k, pr := range pairs {
		lo, hi := 0, len(tails)
		for lo < hi {
			mid := (lo + hi) / 2
			if pairs[tails[mid]][1] < pr[1] {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		if lo > 0 {
			prev[k] = tails[lo-1]
		} else {
			prev[k] = -1
		}
		if lo == len(tails) {
			tails = append(tails, k)
		} else {
			tails[lo] = k
		}
	}
	if len(tails) == 0 {
		return nil
	}
	out := make([][2]int, len(tails))
	for k, n := tails[len(tails)-1], len(tails)-1; n >= 0; k, n = prev[k], n-1 {
		out[n] = pairs[k]
	}
	return out
}

// groupOpCodes splits opcodes into hunks with n lines of context, as
// difflib's GetGroupedOpCodes does.
func groupOpCodes(codes []difflib.OpCode, n int) [][]difflib.OpCode {
	if len(codes) == 0 {
		return nil
	}
	codes = append([]difflib.OpCode(nil), codes...)
	if c := codes[0]; c.Tag == 'e' {
		codes[0] = difflib.OpCode{Tag: 'e', I1: max(c.I1, c.I2-n), I2: c.I2, J1: max(c.J1, c.J2-n), J2: c.J2}
	}
	if c := codes[len(codes)-1]; c.Tag == 'e' {
		codes[len(codes)-1] = difflib.OpCode{Tag: 'e', I1: c.I1, I2: min(c.I2, c.I1+n), J1: c.J1, J2: min(c.J2, c.J1+n)}
	}
	var groups [][]difflib.OpCode
	var group []difflib.OpCode
	for _, c := range codes {
		if c.Tag == 'e' && c.I2-c.I1 > 2*n {
			group = append(group, difflib.OpCode{Tag: 'e', I1: c.I1, I2: min(c.I2, c.I1+n), J1: c.J1, J2: min(c.J2, c.J1+n)})
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

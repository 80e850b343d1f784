package boxrt

import (
	"bufio"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	// Named tree here: capture is this package's capture of a command.
	tree "github.com/pulse-agent/pulse/internal/capture"
)

// A manifest line is "<mode> <value> <name>": the raw st_mode in hex,
// then for a regular file the MD5 of its contents, for a symlink its
// target in hex, else "-", then the name, "./" and the path below the
// tree's top (no name holds a newline: such entries are left out of
// every manifest, see walk). The first line of a manifest file is
// G<generation>.

// errManifest is a manifest line or file that does not parse.
var errManifest = errors.New("bad manifest")

// manifest is a parsed manifest file.
type manifest struct {
	gen   uint64            // 0: the file had none
	names []string          // in file order
	lines map[string]string // name → "<mode> <value>"
}

// readManifest reads a manifest file; lines holds every entry.
func readManifest(p string) (*manifest, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := &manifest{lines: map[string]string{}}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	first := true
	for sc.Scan() {
		l := sc.Text()
		if first {
			first = false
			g, ok := parseGen(l)
			if !ok {
				return nil, fmt.Errorf("%w: %s: no generation line", errManifest, p)
			}
			m.gen = g
			continue
		}
		name, sig, ok := parseLine(l)
		if !ok {
			return nil, fmt.Errorf("%w: %s: line %q", errManifest, p, l)
		}
		if _, dup := m.lines[name]; !dup {
			m.names = append(m.names, name)
		}
		m.lines[name] = sig
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if first {
		return nil, fmt.Errorf("%w: %s: empty", errManifest, p)
	}
	return m, nil
}

func parseGen(l string) (uint64, bool) {
	if !strings.HasPrefix(l, "G") {
		return 0, false
	}
	g, err := strconv.ParseUint(l[1:], 10, 64)
	return g, err == nil
}

// parseLine splits an entry line into its name and the rest.
func parseLine(l string) (name, sig string, ok bool) {
	i := strings.IndexByte(l, ' ')
	if i <= 0 {
		return "", "", false
	}
	j := strings.IndexByte(l[i+1:], ' ')
	if j <= 0 {
		return "", "", false
	}
	if _, err := strconv.ParseUint(l[:i], 16, 32); err != nil {
		return "", "", false
	}
	name = l[i+1+j+1:]
	if !strings.HasPrefix(name, "./") || len(name) < 3 {
		return "", "", false
	}
	return name, l[:i+1+j], true
}

// sigMode is the raw mode of an entry line's sig.
func sigMode(sig string) uint32 {
	m, _ := strconv.ParseUint(sig[:strings.IndexByte(sig, ' ')], 16, 32)
	return uint32(m)
}

// write replaces p with m by rename.
func (m *manifest) write(p string) error {
	f, err := os.OpenFile(p+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 64<<10)
	fmt.Fprintf(w, "G%d\n", m.gen)
	for _, n := range m.names {
		if s, ok := m.lines[n]; ok {
			fmt.Fprintf(w, "%s %s\n", s, n)
		}
	}
	err = w.Flush()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(p+".tmp", p)
	}
	if err != nil {
		os.Remove(p + ".tmp")
	}
	return err
}

// sigOf is the "<mode> <value>" of the entry at full path p, whose
// lstat said mode.
func sigOf(p string, mode uint32) (string, error) {
	val := "-"
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			return "", err
		}
		h := md5.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
		val = hex.EncodeToString(h.Sum(nil))
	case unix.S_IFLNK:
		t, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		val = hex.EncodeToString([]byte(t))
	}
	return strconv.FormatUint(uint64(mode), 16) + " " + val, nil
}

// node is an entry found by walk.
type node struct {
	name  string // "./" and the path below the top
	mode  uint32 // st_mode
	nlink uint64
	ctime int64 // nanoseconds
}

func (n *node) isDir() bool { return n.mode&unix.S_IFMT == unix.S_IFDIR }

// walkOpts says what walk leaves out besides names holding a newline.
type walkOpts struct {
	// skipPulse leaves out .pulse at the top, exactly that name (the
	// backend's own, never listed); any other spelling a command made is
	// walked, so that the repair of a kept copy sees it.
	skipPulse bool
	// newline is called for each entry whose own name holds a newline
	// (nothing beneath it is walked); nil: such entries are skipped.
	newline func(n node) error
}

// walk calls fn for every entry below top, a directory before what is
// in it, each directory's entries in byte order of their names: every
// manifest of equal trees lists them alike. An entry gone by the time it
// is stat'ed is left out; any other error fails the walk.
func walk(top string, o walkOpts, fn func(n node) error) error {
	co := tree.Options{Vanished: true, Sorted: true, KeepReserved: true}
	if o.skipPulse {
		co.Filter = func(rel string) tree.Verdict {
			if rel == ".pulse" {
				return tree.Skip
			}
			return tree.Visit
		}
	}
	return tree.Walk(filepath.Clean(top), co, func(e *tree.Entry) error {
		n := node{name: "./" + e.Rel, mode: e.Mode, nlink: e.Nlink, ctime: e.Ctime}
		if strings.IndexByte(path.Base(e.Rel), '\n') >= 0 {
			if o.newline != nil {
				if err := o.newline(n); err != nil {
					return err
				}
			}
			if n.isDir() {
				return fs.SkipDir
			}
			return nil
		}
		return fn(n)
	})
}

// treeManifest is the manifest of every entry below top.
func treeManifest(top string, skipPulse bool) (*manifest, error) {
	m := &manifest{lines: map[string]string{}}
	err := walk(top, walkOpts{skipPulse: skipPulse}, func(n node) error {
		s, err := sigOf(top+"/"+n.name[2:], n.mode)
		if err != nil {
			return err
		}
		m.names = append(m.names, n.name)
		m.lines[n.name] = s
		return nil
	})
	return m, err
}

// fullman writes the manifest of all of dir (.pulse/ left out) to p, of
// the generation after p's own.
func fullman(dir, p string) error {
	var g uint64
	if old, err := readManifest(p); err == nil {
		g = old.gen
	}
	m, err := treeManifest(dir, true)
	if err != nil {
		return err
	}
	m.gen = g + 1
	return m.write(p)
}

// manlines writes the manifest lines of all of dir, without a
// generation line, to w.
func manlines(dir string, w io.Writer) error {
	m, err := treeManifest(dir, false)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	for _, n := range m.names {
		fmt.Fprintf(bw, "%s %s\n", m.lines[n], n)
	}
	return bw.Flush()
}

// readNames reads a list of names, one a line.
func readNames(p string) ([]string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}

// under reports whether a directory above name is in set.
func under(name string, set map[string]bool) bool {
	for i := strings.LastIndexByte(name, '/'); i > 1; i = strings.LastIndexByte(name[:i], '/') {
		if set[name[:i]] {
			return true
		}
	}
	return false
}

// depth is the number of slashes in a name.
func depth(name string) int { return strings.Count(name, "/") }

// mfupdate replaces the manifest p with itself without the names in the
// file gone (and all beneath them), with the entry lines of the file
// add in place of its own, at the next generation. With delta (base's,
// under the box's lock), it first writes what the step changed, for a
// copy that was equal to p before it: delta.drop (every name of gone and
// add) and delta.fix (add's names, directories before what is in them),
// each after the line "G<old> G<new>"; or "x" alone when a copy cannot
// be brought along by removing the first and copying the second (an
// existing directory in add but not in gone: its removal would take
// what is in it). Should replacing p fail, they are removed, so their
// line names p's generation only when they say how it came about.
func mfupdate(p, gonePath, addPath, delta string) (err error) {
	m, err := readManifest(p)
	if err != nil {
		return err
	}
	goneList, err := readNames(gonePath)
	if err != nil {
		return err
	}
	addLines, err := readNames(addPath)
	if err != nil {
		return err
	}
	gone := make(map[string]bool, len(goneList))
	for _, n := range goneList {
		gone[n] = true
	}
	type added struct{ name, sig string }
	adds := make([]added, 0, len(addLines))
	isNew := make(map[string]bool, len(addLines))
	for _, l := range addLines {
		n, s, ok := parseLine(l)
		if !ok {
			return fmt.Errorf("%w: %s: line %q", errManifest, addPath, l)
		}
		adds = append(adds, added{n, s})
		isNew[n] = true
	}
	cx := false
	next := &manifest{gen: m.gen + 1, lines: make(map[string]string, len(m.lines)+len(adds))}
	for _, n := range m.names {
		s := m.lines[n]
		if isNew[n] && !gone[n] && sigMode(s)&unix.S_IFMT == unix.S_IFDIR {
			cx = true
		}
		if gone[n] || isNew[n] || (len(gone) > 0 && under(n, gone)) {
			continue
		}
		next.names = append(next.names, n)
		next.lines[n] = s
	}
	for _, a := range adds {
		if _, dup := next.lines[a.name]; !dup {
			next.names = append(next.names, a.name)
		}
		next.lines[a.name] = a.sig
	}
	if delta != "" {
		head := "x"
		if m.gen != 0 && !cx {
			head = fmt.Sprintf("G%d G%d", m.gen, next.gen)
		}
		drop := []string{head}
		fix := []string{head}
		if head != "x" {
			drop = append(drop, goneList...)
			names := make([]string, 0, len(adds))
			for _, a := range adds {
				drop = append(drop, a.name)
				names = append(names, a.name)
			}
			slices.SortStableFunc(names, func(a, b string) int { return depth(a) - depth(b) })
			fix = append(fix, names...)
		}
		defer func() {
			if err != nil {
				os.Remove(delta + ".drop")
				os.Remove(delta + ".fix")
			}
		}()
		if err := writeLines(delta+".drop", drop); err != nil {
			return err
		}
		if err := writeLines(delta+".fix", fix); err != nil {
			return err
		}
	}
	return next.write(p)
}

// writeLines writes lines, one a line, to p.
func writeLines(p string, lines []string) error {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return os.WriteFile(p, []byte(b.String()), 0o600)
}

// mdiff compares base's manifest with a copy's, for the copy's repair:
// drop gets what the copy holds that base does not hold as it is (the
// topmost of those only), fix what base holds that the copy does not
// (or that is dropped, or beneath what is), sorted so that a directory
// comes before what is in it.
func mdiff(basePath, copyPath, dropPath, fixPath string) error {
	base, err := readManifest(basePath)
	if err != nil {
		return err
	}
	cp, err := readManifest(copyPath)
	if err != nil {
		return err
	}
	drop := map[string]bool{}
	for _, n := range cp.names {
		if s, ok := base.lines[n]; !ok || s != cp.lines[n] {
			drop[n] = true
		}
	}
	var dl, fl []string
	for _, n := range cp.names {
		if drop[n] && !under(n, drop) {
			dl = append(dl, n)
		}
	}
	for _, n := range base.names {
		if _, ok := cp.lines[n]; !ok || drop[n] || under(n, drop) {
			fl = append(fl, n)
		}
	}
	slices.Sort(fl)
	if err := writeLines(dropPath, dl); err != nil {
		return err
	}
	return writeLines(fixPath, fl)
}

package boxrt

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// errLinks: a regular file of the copy has more than one link (the
// command's ln). The pending stack holds each name as a file of its own,
// so the links are broken (as the command's uid, by the caller) and the
// copy captured again.
var errLinks = errors.New("a regular file has more than one link")

// errNewlineDir: a directory whose name holds a newline has entries in
// it; none of the names beneath can be carried, nor told apart from the
// lines of a list, so the capture fails and what the command wrote is
// reported lost.
var errNewlineDir = errors.New("a directory whose name holds a newline has entries in it")

// capture tells what a command changed in its copy r, against before,
// the manifest of the copy as the command found it. q is the prefix of
// the step's own files, o the report directory the host reads.
//
// Every change of an entry (content, mode, owner, links, a rename onto
// it) sets its ctime to the kernel's clock, and no process can set ctime
// itself. The mark q.m0 was made after the copy was ready and before the
// command started, q.m1 after it ended: an entry whose ctime is earlier
// than m0's was not touched by the command; only the others (and new
// names: a directory renamed onto a new name brings what is in it with
// the ctimes it had) are hashed and compared with before. Should the
// clock have gone back while the command ran (m1 or m2 before m0),
// every entry is. When no entry's ctime is at or after the mark, the top
// of the copy's included, nothing changed (an entry made, removed or
// renamed changes its directory's ctime), and before is not even read.
//
// It writes q.changed (the names of the entries new or different, one a
// line), q.new (their manifest lines), q.removed (the names before holds
// that are gone, and those whose type changed, for base to drop before
// the merge), o/deleted (the names gone), and for a name holding a
// newline, which no line can carry, o/newline (for the host to report
// it as not staged), a warning in o/warn and q.bad (the copy is not kept).
func capture(r, q, o, before string) error {
	m0, err := ctimeOf(q + ".m0")
	if err != nil {
		return err
	}
	m1, err := ctimeOf(q + ".m1")
	if err != nil {
		return err
	}
	var nodes []node
	var nls []node
	err = walk(r, walkOpts{skipPulse: true, newline: func(n node) error {
		if n.isDir() {
			ents, err := os.ReadDir(r + "/" + n.name[2:])
			if err != nil {
				return err
			}
			if len(ents) > 0 {
				return errNewlineDir
			}
		}
		nls = append(nls, n)
		return nil
	}}, func(n node) error {
		if n.mode&unix.S_IFMT == unix.S_IFREG && n.nlink > 1 {
			return errLinks
		}
		nodes = append(nodes, n)
		return nil
	})
	if err != nil {
		return err
	}
	if err := touch(q + ".m2"); err != nil {
		return err
	}
	m2, err := ctimeOf(q + ".m2")
	if err != nil {
		return err
	}
	var top unix.Stat_t
	if err := unix.Lstat(r, &top); err != nil {
		return err
	}
	all := m1 < m0 || m2 < m1
	if len(nls) > 0 {
		if err := writeNewline(o+"/newline", m0, m1, nls); err != nil {
			return err
		}
		if err := appendLine(o+"/warn", "a name holding a newline cannot be carried back: not staged"); err != nil {
			return err
		}
		if err := touch(q + ".bad"); err != nil {
			return err
		}
	}
	touched := all || ctimeNs(&top) >= m0
	for i := range nodes {
		if touched {
			break
		}
		touched = nodes[i].ctime >= m0
	}
	if !touched {
		return nil
	}
	bm, err := readManifest(before)
	if err != nil {
		return err
	}
	seen := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		seen[n.name] = true
	}
	var removed, deleted, changed, newLines []string
	for _, n := range bm.names {
		if !seen[n] {
			removed = append(removed, n)
			deleted = append(deleted, n)
		}
	}
	for i := range nodes {
		n := &nodes[i]
		old, had := bm.lines[n.name]
		if had && !all && n.ctime < m0 {
			continue
		}
		s, err := sigOf(r+"/"+n.name[2:], n.mode)
		if err != nil {
			return err
		}
		if !had || s != old {
			changed = append(changed, n.name)
			newLines = append(newLines, s+" "+n.name)
		}
		if had && sigMode(old)&unix.S_IFMT != n.mode&unix.S_IFMT {
			removed = append(removed, n.name)
		}
	}
	slices.Sort(deleted)
	for _, w := range []struct {
		p     string
		lines []string
	}{{q + ".changed", changed}, {q + ".new", newLines}, {q + ".removed", removed}, {o + "/deleted", deleted}} {
		if len(w.lines) == 0 {
			continue
		}
		if err := writeLines(w.p, w.lines); err != nil {
			return err
		}
	}
	return nil
}

// writeNewline writes the list of entries whose name holds a newline
// that the host reads (parseNewline there): NUL-separated records, the
// first the marks m0 and m1 ("s|ctime", a line each), each other
// "ctime|type|./name\n", the ctimes as fixed-width decimal nanoseconds,
// so that they compare as strings.
func writeNewline(p string, m0, m1 int64, nls []node) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "%d|%020d\n%d|%020d\n\x00", m0/1e9, m0, m1/1e9, m1)
	for _, n := range nls {
		typ := "file"
		if n.isDir() {
			typ = "directory"
		}
		fmt.Fprintf(w, "%020d|%s|%s\n\x00", n.ctime, typ, n.name)
	}
	err = w.Flush()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func ctimeNs(st *unix.Stat_t) int64 { return st.Ctim.Nano() }

func ctimeOf(p string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return ctimeNs(&st), nil
}

func touch(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

func appendLine(p, l string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(l + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

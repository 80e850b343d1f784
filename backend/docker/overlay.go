package docker

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/fsmode"
	"github.com/pulse-agent/pulse/pathguard"
)

// ErrBadOverlay is returned when what a command left in its out directory
// cannot be trusted: an unsafe path, an unexpected entry type, or more
// bytes than allowed. The command runs as the same user as the wrapper
// that writes the out directory, so its content is untrusted input.
var ErrBadOverlay = errors.New("docker: bad overlay")

// outcome is what the wrapper left behind for one command.
type outcome struct {
	status  string // "exit N", or why the wrapper stopped ("nodir", "copy", ...)
	pgid    int
	warn    string
	signal  int // the signal that killed the command, as time saw it; 0 if none
	metrics backend.Metrics
	overlay *backend.Overlay
	// disk names the tmpfs the command filled ("/work": the scratch,
	// limits.disk_bytes; "/tmp"), "" when none was full when it ended.
	disk string
	// nomerge: the wrapper merged nothing into base (a full scratch
	// would not hold it); basefail: its merge failed part way, so base
	// holds what nobody knows.
	nomerge, basefail bool
}

// parseTime reads what busybox time wrote: an optional "Command
// terminated by signal N" line, then "usage MAXRSS_KB ELAPSED USER SYS".
func (o *outcome) parseTime(b []byte) {
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		switch {
		case strings.HasPrefix(l, "Command terminated by signal ") && len(f) == 5:
			o.signal, _ = strconv.Atoi(f[4])
		case len(f) == 5 && f[0] == "usage":
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil && kb >= 0 && kb < 1<<40 {
				o.metrics.MaxRSSBytes = kb * 1024
			}
			o.metrics.UserCPU = seconds(f[3])
			o.metrics.SystemCPU = seconds(f[4])
		}
	}
}

func seconds(s string) time.Duration {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v > 1e9 {
		return 0
	}
	return time.Duration(v * float64(time.Second))
}

// maxBatches bounds the batches a report may announce.
const maxBatches = 1 << 16

// parseReport reads the report the runtime's exec step writes after its
// marker (see finish in internal/boxrt/exec_linux.go): the tar of its small status files, then, when
// those list batches, a tar of changed entries per batch, then one byte,
// '0' when the batches came out whole. (A files-*.tar inside the first
// tar is read as a batch too.) It fails closed on anything it does not
// expect. maxBytes bounds the sum of file contents (0: no bound). When
// only the changed entries are refused, it still returns the outcome read
// from the status files (without an overlay), with the error: the
// command's exit status stands.
func parseReport(b []byte, maxBytes int64) (*outcome, error) {
	out := &outcome{}
	var deleted []string
	var files, untracked []backend.File
	var filesErr error
	var batches []int64
	var lim int64 = -1
	if maxBytes > 0 {
		lim = maxBytes
	}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading out directory: %v", ErrBadOverlay, err)
		}
		name := h.Name
		if i := strings.IndexByte(name, '/'); i >= 0 {
			name = name[i+1:] // drop the ID/ directory
		} else {
			continue
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		switch name {
		case "nomerge":
			out.nomerge = true
		case "basefail":
			out.basefail = true
		case "status", "pgid", "warn", "deleted", "time", "newline", "disk", "batches":
			b, err := io.ReadAll(io.LimitReader(tr, 1<<24))
			if err != nil {
				return nil, fmt.Errorf("%w: reading %s: %v", ErrBadOverlay, name, err)
			}
			switch name {
			case "status":
				out.status = strings.TrimSpace(string(b))
			case "pgid":
				out.pgid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			case "time":
				out.parseTime(b)
			case "warn":
				out.warn = strings.TrimSpace(string(b))
			case "disk":
				out.disk = strings.TrimSpace(string(b))
			case "batches":
				for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
					n, err := strconv.ParseInt(strings.TrimSpace(l), 10, 64)
					if err != nil || n <= 0 || len(batches) >= maxBatches {
						return nil, fmt.Errorf("%w: bad batch list", ErrBadOverlay)
					}
					batches = append(batches, n)
				}
			case "newline":
				nl, err := parseNewline(b)
				if err != nil {
					return nil, err
				}
				untracked = append(untracked, nl...)
			case "deleted":
				for _, l := range strings.Split(string(b), "\n") {
					if l == "" {
						continue
					}
					p, err := cleanPath(l)
					if err != nil {
						return nil, err
					}
					if p != "" {
						deleted = append(deleted, p)
					}
				}
			}
		default:
			if !strings.HasPrefix(name, "files-") || !strings.HasSuffix(name, ".tar") {
				continue
			}
			if filesErr != nil {
				continue
			}
			files, err = parseFilesTar(tr, files, lim)
			if err != nil {
				filesErr, files = err, nil
			}
		}
	}
	if len(batches) > 0 && filesErr == nil {
		var total int64
		for _, n := range batches {
			total += n
			if total >= int64(len(b)) {
				return nil, fmt.Errorf("%w: the batches are larger than the report", ErrBadOverlay)
			}
		}
		end := len(b) - 1
		if b[end] != '0' {
			filesErr = fmt.Errorf("%w: the changed entries could not be read back whole", ErrBadOverlay)
		}
		at := int64(end) - total
		for _, n := range batches {
			if filesErr != nil {
				break
			}
			var err error
			if files, err = parseFilesTar(bytes.NewReader(b[at:at+n]), files, lim); err != nil {
				filesErr, files = err, nil
			}
			at += n
		}
	}
	if filesErr != nil {
		return out, filesErr
	}
	files = append(files, untracked...)
	sort.Strings(deleted)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for i := 1; i < len(files); i++ {
		if files[i].Path == files[i-1].Path {
			return nil, fmt.Errorf("%w: %q listed twice", ErrBadOverlay, files[i].Path)
		}
	}
	if len(files) > 0 || len(deleted) > 0 {
		out.overlay = &backend.Overlay{Files: files, Deleted: deleted}
	} else {
		out.overlay = &backend.Overlay{}
	}
	return out, nil
}

// parseNewline reads the wrapper's list of entries whose name holds a
// newline (the runtime's capture, O/newline): NUL-separated records, the first the
// marks' ctimes (m0, m1), each other "ctime|type|./name\n". Those changed
// at or after the mark (all of them should the clock have gone back) come
// back as entries of mode fs.ModeIrregular: the wrapper could not carry
// them, and the facade reports each as not staged rather than let what
// the command wrote there vanish.
func parseNewline(b []byte) ([]backend.File, error) {
	recs := strings.Split(string(b), "\x00")
	bad := func(why string) error {
		return fmt.Errorf("%w: list of names holding a newline: %s", ErrBadOverlay, why)
	}
	if len(recs) < 2 || recs[len(recs)-1] != "" {
		return nil, bad("truncated")
	}
	marks := strings.Split(strings.TrimSuffix(recs[0], "\n"), "\n")
	if len(marks) != 2 {
		return nil, bad("no marks")
	}
	var m [2]string
	for i, l := range marks {
		_, z, ok := strings.Cut(l, "|")
		if !ok || z == "" {
			return nil, bad("bad mark")
		}
		m[i] = z
	}
	all := m[1] < m[0] // the clock went back while the command ran
	var out []backend.File
	for _, r := range recs[1 : len(recs)-1] {
		r, ok := strings.CutSuffix(r, "\n")
		f := strings.SplitN(r, "|", 3)
		if !ok || len(f) != 3 || f[0] == "" {
			return nil, bad(fmt.Sprintf("bad record %q", r))
		}
		if !all && f[0] < m[0] {
			continue // not touched by the command
		}
		p, err := cleanPath(f[2])
		if err != nil {
			return nil, err
		}
		if p == "" || !strings.Contains(path.Base(p), "\n") {
			return nil, bad(fmt.Sprintf("%q holds no newline", p))
		}
		out = append(out, backend.File{Path: p, Mode: fs.ModeIrregular})
	}
	return out, nil
}

// parseFilesTar appends the changed entries of one batch to files. limit
// bounds the content of all batches together; < 0 means unbounded.
func parseFilesTar(r io.Reader, files []backend.File, limit int64) ([]backend.File, error) {
	tr := tar.NewReader(r)
	var total int64
	for _, f := range files {
		if f.Mode.IsRegular() {
			total += int64(len(f.Data))
		}
	}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading changed files: %v", ErrBadOverlay, err)
		}
		p, err := cleanPath(h.Name)
		if err != nil {
			return nil, err
		}
		if p == "" {
			continue // the workspace root itself
		}
		perm := fsmode.FromUnix(uint32(h.Mode))
		f := backend.File{Path: p}
		switch h.Typeflag {
		case tar.TypeReg:
			if h.Size < 0 || limit >= 0 && total+h.Size > limit {
				return nil, fmt.Errorf("%w: changed files exceed %d bytes", ErrBadOverlay, limit)
			}
			var buf bytes.Buffer
			buf.Grow(int(min(h.Size, 1<<20)))
			n, err := io.Copy(&buf, io.LimitReader(tr, h.Size))
			if err != nil || n != h.Size {
				return nil, fmt.Errorf("%w: %q truncated", ErrBadOverlay, p)
			}
			total += n
			f.Mode = perm
			f.Data = buf.Bytes()
			if f.Data == nil {
				f.Data = []byte{}
			}
		case tar.TypeDir:
			f.Mode = fs.ModeDir | perm
		case tar.TypeSymlink:
			if h.Linkname == "" || strings.IndexByte(h.Linkname, 0) >= 0 {
				return nil, fmt.Errorf("%w: symlink %q has a bad target", ErrBadOverlay, p)
			}
			f.Mode = fs.ModeSymlink | 0o777
			f.Data = []byte(h.Linkname)
		case tar.TypeLink:
			// busybox tar stores a second name of a hard-linked file as a
			// link to the first; the overlay carries content, so resolve it.
			tp, err := cleanPath(h.Linkname)
			if err != nil {
				return nil, err
			}
			found := false
			for _, g := range files {
				if g.Path == tp && g.Mode.IsRegular() {
					f.Mode, f.Data, found = perm, g.Data, true
					total += int64(len(g.Data))
					break
				}
			}
			if !found || limit >= 0 && total > limit {
				return nil, fmt.Errorf("%w: hard link %q to %q", ErrBadOverlay, p, h.Linkname)
			}
		case tar.TypeFifo:
			// Not workspace content, but reported (backend.File): a FIFO
			// made where a file was must not read as nothing changed.
			f.Mode = fs.ModeNamedPipe | perm&fs.ModePerm
		case tar.TypeChar:
			f.Mode = fs.ModeDevice | fs.ModeCharDevice | perm&fs.ModePerm
		case tar.TypeBlock:
			f.Mode = fs.ModeDevice | perm&fs.ModePerm
		default:
			// Anything else tar can carry is not an entry of a tree
			// (sockets it cannot carry at all).
			continue
		}
		files = append(files, f)
	}
}

// cleanPath turns a wrapper path ("./a/b") into an overlay path ("a/b"),
// refusing anything that could leave the workspace or touch .pulse/.
func cleanPath(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 || strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: unsafe path %q", ErrBadOverlay, p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", fmt.Errorf("%w: unsafe path %q", ErrBadOverlay, p)
		}
	}
	c := path.Clean(p)
	if c == "." {
		return "", nil
	}
	// The sandbox's own hidden directory, spelled exactly: the wrapper prunes
	// it from its listings, so a path in it comes from a forged report (the
	// out directory is the command user's). Another case spelling is
	// a directory of the command's own on this case-sensitive copy; it is
	// passed on so that the facade refuses it visibly (pathguard.IsReserved),
	// as the namespace backend does.
	if c == pathguard.ReservedDir || strings.HasPrefix(c, pathguard.ReservedDir+"/") {
		return "", fmt.Errorf("%w: path under .pulse/: %q", ErrBadOverlay, p)
	}
	return c, nil
}

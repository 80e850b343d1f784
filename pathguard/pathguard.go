package pathguard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pulse-agent/pulse/internal/randhex"
)

// Error classes. Every error a Guard returns for a refused path wraps one
// of them; test with errors.Is.
var (
	// ErrOutside: the path is, or leads, outside the root (or is malformed:
	// NUL byte, too long, too many symlinks).
	ErrOutside = errors.New("path outside the workspace")
	// ErrNotRegular: the path names a directory, symlink, FIFO, socket or
	// device where a regular file is needed.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge: the file is larger than the guard's size limit.
	ErrTooLarge = errors.New("file too large")
)

// Reasons openNoFollow gives (open_linux.go, open_other.go), each then
// wrapped in an error class above.
var (
	errNotDir  = syscall.ENOTDIR
	errSymlink = errors.New("symlink in path")
	errEscape  = errors.New("path escapes the base")
	errIsRoot  = errors.New("the root is a directory")
	errSpecial = errors.New("special file")
)

// Limits on what Resolve accepts. They match Linux PATH_MAX and NAME_MAX,
// so anything longer could not be opened anyway.
const (
	MaxPathLen = 4096
	MaxNameLen = 255
	// DefaultMaxFileSize is the read size limit when WithMaxFileSize is not given.
	DefaultMaxFileSize int64 = 10 << 20
	// maxSymlinks matches the Linux kernel's MAXSYMLINKS.
	maxSymlinks = 40
)

// ReservedDir is the workspace directory that holds Pulse's own state.
const ReservedDir = ".pulse"

// IsReserved reports whether rel, a path relative to the workspace root
// (slash- or OS-separated), is ReservedDir or lies under it. The match is
// case-insensitive so that a case-insensitive file system cannot alias it.
func IsReserved(rel string) bool {
	c := path.Clean("/" + filepath.ToSlash(rel))
	first, _, _ := strings.Cut(strings.TrimPrefix(c, "/"), "/")
	return strings.EqualFold(first, ReservedDir)
}

type options struct {
	external []string
	maxSize  int64
	logger   *slog.Logger
}

// Option configures a Guard.
type Option func(*options) error

// WithExternalReads allows Open and ReadFile (never WriteFile or Resolve)
// under extra directories, such as a shared toolchain or a module cache.
// Each directory must exist.
func WithExternalReads(dirs ...string) Option {
	return func(o *options) error {
		o.external = append(o.external, dirs...)
		return nil
	}
}

// WithMaxFileSize sets the size limit of Open and ReadFile, in bytes.
func WithMaxFileSize(n int64) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("pathguard: max file size must be positive, got %d", n)
		}
		o.maxSize = n
		return nil
	}
}

// WithLogger sets the logger refusals are reported to (at debug level).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("pathguard: nil logger")
		}
		o.logger = l
		return nil
	}
}

// base is one directory a Guard lets paths resolve under.
type base struct {
	real  string // absolute, symlinks resolved
	given string // absolute and clean, as the caller spelled it
}

// Guard confines paths to a root directory. It is immutable and safe for
// concurrent use.
type Guard struct {
	root     base
	external []base
	maxSize  int64
	log      *slog.Logger
}

// New returns a Guard for root, which must be an existing directory.
func New(root string, opts ...Option) (*Guard, error) {
	o := options{maxSize: DefaultMaxFileSize}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	rb, err := newBase(root)
	if err != nil {
		return nil, err
	}
	g := &Guard{root: rb, maxSize: o.maxSize, log: o.logger}
	for _, d := range o.external {
		eb, err := newBase(d)
		if err != nil {
			return nil, fmt.Errorf("external read directory: %w", err)
		}
		g.external = append(g.external, eb)
	}
	return g, nil
}

func newBase(dir string) (base, error) {
	if dir == "" || strings.IndexByte(dir, 0) >= 0 {
		return base{}, fmt.Errorf("pathguard: invalid directory %q", dir)
	}
	given, err := filepath.Abs(dir)
	if err != nil {
		return base{}, fmt.Errorf("pathguard: %q: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(given)
	if err != nil {
		return base{}, fmt.Errorf("pathguard: %q: %w", dir, err)
	}
	if real == "/proc" || strings.HasPrefix(real, "/proc/") {
		// Paths under /proc change meaning with the process that opens them.
		return base{}, fmt.Errorf("pathguard: %q: /proc cannot be a root", dir)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return base{}, fmt.Errorf("pathguard: %q: %w", dir, err)
	}
	if !fi.IsDir() {
		return base{}, fmt.Errorf("pathguard: %q: not a directory", dir)
	}
	return base{real: real, given: filepath.Clean(given)}, nil
}

// Root returns the absolute root directory, with symlinks resolved.
func (g *Guard) Root() string { return g.root.real }

// MaxFileSize returns the size limit of Open and ReadFile.
func (g *Guard) MaxFileSize() int64 { return g.maxSize }

// Resolve returns the absolute path p names inside the root, following
// symlinks that stay inside it. A relative p is taken from the root.
func (g *Guard) Resolve(p string) (string, error) {
	abs, _, err := g.resolve(p, false)
	return abs, err
}

// Rel resolves p as Resolve does and returns it relative to the root,
// slash-separated ("." for the root itself).
func (g *Guard) Rel(p string) (string, error) {
	abs, _, err := g.resolve(p, false)
	if err != nil {
		return "", err
	}
	return relTo(g.root.real, abs), nil
}

// Open opens the regular file p for reading, inside the root or a
// directory given to WithExternalReads. See the package doc for what it
// refuses. The caller closes the file.
func (g *Guard) Open(p string) (*os.File, error) {
	f, _, err := g.open(p)
	return f, err
}

// open is Open, also returning the size it checked.
func (g *Guard) open(p string) (*os.File, int64, error) {
	f, err := g.openFast(p)
	if f == nil {
		if err != nil {
			return nil, 0, err
		}
		abs, b, err := g.resolve(p, true)
		if err != nil {
			return nil, 0, err
		}
		f, err = openNoFollow(b.real, relTo(b.real, abs))
		if err != nil {
			return nil, 0, g.openErr(p, err)
		}
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, g.refuse(p, "stat", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, g.refuse(p, "file type "+typeName(fi.Mode()), ErrNotRegular)
	}
	if fi.Size() > g.maxSize {
		f.Close()
		return nil, 0, g.refuse(p, fmt.Sprintf("%d bytes, limit %d", fi.Size(), g.maxSize), ErrTooLarge)
	}
	return f, fi.Size(), nil
}

// openFast tries to open p in one kernel call that follows symlinks only
// beneath the base (openBeneath). It returns a nil file and a nil error
// whenever the careful path must decide instead: a symlink at the last
// element or leading out, an absolute symlink, any failure at all. It
// returns an error only for input the careful path would refuse too.
func (g *Guard) openFast(p string) (*os.File, error) {
	if err := checkInput(p); err != nil {
		return nil, g.refuse(p, err.Error(), ErrOutside)
	}
	b, elems, ok := g.locate(g.lexical(p), true)
	if !ok || len(elems) == 0 {
		return nil, nil
	}
	f, err := openBeneath(b.real, strings.Join(elems, "/"))
	if err != nil {
		return nil, nil
	}
	return f, nil
}

func (g *Guard) openErr(p string, err error) error {
	switch {
	case errors.Is(err, errEscape):
		return g.refuse(p, "path changed to lead outside the root", ErrOutside)
	case errors.Is(err, errSymlink):
		return g.refuse(p, "a symlink appeared in the path", ErrNotRegular)
	case errors.Is(err, errIsRoot):
		return g.refuse(p, "the root is a directory", ErrNotRegular)
	case errors.Is(err, errSpecial):
		// Sockets (ENXIO) and some device files refuse open(2) itself.
		return g.refuse(p, "special file", ErrNotRegular)
	}
	return g.refuse(p, "open", err)
}

// ReadFile reads the regular file p through Open. A file that grows past
// the limit while it is read is refused with ErrTooLarge too.
func (g *Guard) ReadFile(p string) ([]byte, error) {
	f, size, err := g.open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Room for one byte more than the size seen, so that growth shows
	// without a second allocation in the common case.
	buf := bytes.NewBuffer(make([]byte, 0, size+1))
	if _, err := buf.ReadFrom(io.LimitReader(f, g.maxSize+1)); err != nil {
		return nil, g.refuse(p, "read", err)
	}
	if int64(buf.Len()) > g.maxSize {
		return nil, g.refuse(p, fmt.Sprintf("grew past limit %d while read", g.maxSize), ErrTooLarge)
	}
	return buf.Bytes(), nil
}

// WriteFile atomically replaces (or creates) the file p inside the root
// with data and permission bits mode.Perm(), creating missing parent
// directories. The size limit does not apply: writers set their own.
func (g *Guard) WriteFile(p string, data []byte, mode os.FileMode) (err error) {
	if err := checkInput(p); err != nil {
		return g.refuse(p, err.Error(), ErrOutside)
	}
	clean := g.lexical(p)
	name := filepath.Base(clean)
	if clean == g.root.real || clean == g.root.given {
		return g.refuse(p, "the root is a directory", ErrNotRegular)
	}
	dirAbs, _, err := g.resolveAs(p, filepath.Dir(clean), false)
	if err != nil {
		return err
	}
	rel := relTo(g.root.real, filepath.Join(dirAbs, name))
	relDir := path.Dir(rel)

	r, err := os.OpenRoot(g.root.real)
	if err != nil {
		return g.refuse(p, "open root", err)
	}
	defer r.Close()
	if relDir != "." {
		if err := r.MkdirAll(relDir, 0o755); err != nil {
			return g.refuse(p, "create parent", err)
		}
	}
	if fi, err := r.Lstat(rel); err == nil {
		if !fi.Mode().IsRegular() {
			return g.refuse(p, "destination is a "+typeName(fi.Mode()), ErrNotRegular)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return g.refuse(p, "stat", err)
	}

	tmp, f, err := createTemp(r, relDir, name, mode.Perm())
	if err != nil {
		return g.refuse(p, "create temporary file", err)
	}
	defer func() {
		if err != nil {
			_ = r.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err == nil {
		// Chmod so the result does not depend on the process umask.
		if err = f.Chmod(mode.Perm()); err == nil {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return g.refuse(p, "write temporary file", err)
	}
	// rename(2) replaces the directory entry itself, so even a symlink
	// swapped in since the Lstat above is replaced, never followed.
	if err = r.Rename(tmp, rel); err != nil {
		return g.refuse(p, "rename", err)
	}
	d, err := r.Open(relDir)
	if err != nil {
		return g.refuse(p, "open parent for sync", err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return g.refuse(p, "sync parent", err)
	}
	return nil
}

func createTemp(r *os.Root, relDir, name string, perm os.FileMode) (string, *os.File, error) {
	for range 10 {
		suffix := randhex.String(8)
		tmpName := "." + name + ".tmp-" + suffix
		if len(tmpName) > MaxNameLen {
			tmpName = ".pulse-tmp-" + suffix
		}
		tmp := path.Join(relDir, tmpName)
		f, err := r.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return tmp, f, err
	}
	return "", nil, errors.New("no free temporary name")
}

// refuse builds the error for p. p is the caller's own input, so echoing
// it leaks nothing; reasons never include a symlink's target.
func (g *Guard) refuse(p, reason string, err error) error {
	g.log.Debug("pathguard refused path", "path", p, "reason", reason, "err", err)
	return &PathError{Path: p, Reason: reason, Err: err}
}

// PathError says which path was refused and why.
type PathError struct {
	Path   string
	Reason string
	Err    error
}

func (e *PathError) Error() string {
	return fmt.Sprintf("pathguard: %q: %s: %v", e.Path, e.Reason, e.Err)
}

func (e *PathError) Unwrap() error { return e.Err }

func checkInput(p string) error {
	switch {
	case p == "":
		return errors.New("empty path")
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("NUL byte in path")
	case len(p) > MaxPathLen:
		return fmt.Errorf("path longer than %d bytes", MaxPathLen)
	}
	for _, name := range strings.Split(p, string(filepath.Separator)) {
		if len(name) > MaxNameLen {
			return fmt.Errorf("name longer than %d bytes", MaxNameLen)
		}
	}
	return nil
}

// lexical makes p absolute (relative to the root) and clean.
func (g *Guard) lexical(p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(g.root.real, p)
}

// within reports whether p equals dir or lies under it; both are clean.
func within(p, dir string) bool {
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func relTo(dir, p string) string {
	if p == dir {
		return "."
	}
	if dir == "/" {
		return strings.TrimPrefix(p, "/")
	}
	return filepath.ToSlash(strings.TrimPrefix(p, dir+"/"))
}

// locate finds the base that holds the clean absolute path p, lexically,
// and returns p's elements below it. Paths spelled through the root as the
// caller gave it (before symlinks were resolved) are accepted too.
func (g *Guard) locate(p string, external bool) (base, []string, bool) {
	bases := []base{g.root}
	if external {
		bases = append(bases, g.external...)
	}
	for _, b := range bases {
		for _, dir := range []string{b.real, b.given} {
			if within(p, dir) {
				rest := relTo(dir, p)
				if rest == "." {
					return b, nil, true
				}
				return b, strings.Split(rest, "/"), true
			}
		}
	}
	return base{}, nil, false
}

// resolve walks p element by element, following symlinks, and never lets
// the walk leave the base it started in. Elements that do not exist are
// taken as they are (a file about to be created).
func (g *Guard) resolve(p string, external bool) (string, base, error) {
	return g.resolveAs(p, p, external)
}

// resolveAs is resolve with errors naming display, the caller's own input.
func (g *Guard) resolveAs(display, p string, external bool) (string, base, error) {
	fail := func(reason string) (string, base, error) {
		return "", base{}, g.refuse(display, reason, ErrOutside)
	}
	if err := checkInput(p); err != nil {
		return fail(err.Error())
	}
	b, todo, ok := g.locate(g.lexical(p), external)
	if !ok {
		return fail("outside the root")
	}
	cur := b.real
	links := 0
	exists := true
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			if cur == b.real {
				return fail("symlink leads outside the root")
			}
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		if !exists {
			cur = next
			continue
		}
		fi, err := os.Lstat(next)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotDir) {
				exists = false
				cur = next
				continue
			}
			// Unknown: it might be a symlink, so fail closed.
			return fail("cannot inspect path: " + errText(err))
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		links++
		if links > maxSymlinks {
			return fail("too many symlinks")
		}
		target, err := os.Readlink(next)
		if err != nil {
			return fail("cannot read symlink: " + errText(err))
		}
		if target == "" || strings.IndexByte(target, 0) >= 0 {
			return fail("invalid symlink")
		}
		var rest []string
		if filepath.IsAbs(target) {
			tb, elems, ok := g.locate(filepath.Clean(target), external)
			if !ok || tb.real != b.real {
				return fail("symlink leads outside the root")
			}
			cur = b.real
			rest = elems
		} else {
			rest = strings.Split(target, "/")
		}
		todo = append(rest, todo...)
	}
	if len(cur) > MaxPathLen {
		return fail(fmt.Sprintf("resolved path longer than %d bytes", MaxPathLen))
	}
	if !within(cur, b.real) {
		return fail("outside the root")
	}
	return cur, b, nil
}

// errText returns the errno text of err without the path inside it, which
// may be a host path outside the root.
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

func typeName(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	case m.IsRegular():
		return "regular file"
	default:
		return "special file"
	}
}

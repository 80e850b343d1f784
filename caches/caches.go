package caches

import (
	"cmp"
	"errors"
	"fmt"
	"github.com/pulse-agent/pulse/errdefs"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/pulse-agent/pulse/policy"
)

// DirEnv overrides Root's default location (tests, CI, shared machines).
const DirEnv = "PULSE_CACHE_DIR"

// ErrNotFound: no cache of that name exists under the root.
var ErrNotFound = errdefs.New("cache not found", errdefs.ErrNotFound)

// Root is where the caches live: $PULSE_CACHE_DIR when set, else
// os.UserCacheDir()/pulse/caches. getenv nil means os.Getenv.
func Root(getenv func(string) string) (string, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if d := getenv(DirEnv); d != "" {
		if !filepath.IsAbs(d) {
			return "", fmt.Errorf("caches: %s=%q is not absolute", DirEnv, d)
		}
		return filepath.Clean(d), nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("caches: no user cache directory (set %s): %w", DirEnv, err)
	}
	return filepath.Join(d, "pulse", "caches"), nil
}

// Ensure returns the directory of cache name under root, creating it
// (and root, private to the user) when missing. A name that is not a
// valid cache name, or an entry there that is not a plain directory, is
// an error: the directory is mounted writable into commands.
func Ensure(root, name string) (string, error) {
	if err := policy.ValidCacheName(name); err != nil {
		return "", fmt.Errorf("caches: %w", err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("caches: %w", err)
	}
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("caches: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("caches: %w", err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("caches: %s is not a directory", dir)
	}
	return dir, nil
}

// Info describes one cache on disk.
type Info struct {
	Name  string `json:"name"`
	Dir   string `json:"dir"`
	Bytes int64  `json:"bytes"`
	Files int    `json:"files"`
	// Modified is the newest modification time of anything in it.
	Modified time.Time `json:"modified"`
}

// List measures every cache under root, by name. A missing root is no
// caches.
func List(root string) ([]Info, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("caches: %w", err)
	}
	var out []Info
	for _, e := range ents {
		if !e.IsDir() || policy.ValidCacheName(e.Name()) != nil {
			continue
		}
		in, err := Stat(root, e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, nil
}

// Stat measures cache name under root (ErrNotFound when it is missing).
func Stat(root, name string) (Info, error) {
	if err := policy.ValidCacheName(name); err != nil {
		return Info{}, fmt.Errorf("caches: %w", err)
	}
	dir := filepath.Join(root, name)
	in := Info{Name: name, Dir: dir}
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() {
		return in, fmt.Errorf("caches: %s: %w", name, ErrNotFound)
	}
	in.Modified = st.ModTime()
	files, err := walk(dir)
	if err != nil {
		return in, err
	}
	for _, f := range files {
		in.Bytes += f.size
		in.Files++
		if f.mod.After(in.Modified) {
			in.Modified = f.mod
		}
	}
	return in, nil
}

// Prune removes cache name under root with everything in it.
func Prune(root, name string) error {
	if err := policy.ValidCacheName(name); err != nil {
		return fmt.Errorf("caches: %w", err)
	}
	dir := filepath.Join(root, name)
	if _, err := os.Lstat(dir); err != nil {
		return fmt.Errorf("caches: %s: %w", name, ErrNotFound)
	}
	if err := removeAll(dir); err != nil {
		return fmt.Errorf("caches: pruning %s: %w", name, err)
	}
	return nil
}

// removeAll is os.RemoveAll that first makes directories writable: Go's
// module cache makes its directories read-only. A cache is written by
// commands, some of which may still run: every directory is reached
// beneath dir only (see chmodDir), never through a link a command put
// there or swapped in meanwhile.
func removeAll(dir string) error {
	if root, err := os.OpenRoot(dir); err == nil {
		fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				chmodDir(root, p)
			}
			return nil
		})
		root.Close()
	}
	return os.RemoveAll(dir) // removes links, never follows them
}

// chmodDir makes the directory rel of root writable. It is resolved
// beneath root, whatever links lead there: one that leads out fails it,
// and one swapped in at rel itself meanwhile is not followed
// (os.Root.Chmod).
func chmodDir(root *os.Root, rel string) {
	root.Chmod(rel, 0o755)
}

type file struct {
	path string
	size int64
	mod  time.Time
}

// walk lists the regular files and symlinks below dir, sizes in bytes
// on disk as the files say (not blocks: what a cap means to a user).
func walk(dir string) ([]file, error) {
	var out []file
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed by a command meanwhile
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		st, err := d.Info()
		if err != nil {
			return nil
		}
		out = append(out, file{path: p, size: st.Size(), mod: st.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("caches: measuring %s: %w", dir, err)
	}
	return out, nil
}

// afterWalk, when set (tests), runs between Trim's walk and its removals:
// where commands still running can change the cache.
var afterWalk func()

// Trim removes the least recently modified files of dir until it holds
// at most maxBytes (no cap when maxBytes <= 0). It returns the bytes it
// held before and how many files it removed. A file another command
// removes meanwhile is not an error.
//
// The cache is writable by commands, and one may still run while this
// one's trim does: a directory the walk saw may be a link by the time its
// file is removed. Each removal is resolved beneath dir (os.Root), so a
// link swapped in to lead out of the cache fails it rather than remove
// the host file it names.
func Trim(dir string, maxBytes int64) (before int64, removed int, err error) {
	files, err := walk(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, f := range files {
		before += f.size
	}
	if maxBytes <= 0 || before <= maxBytes {
		return before, 0, nil
	}
	slices.SortFunc(files, func(a, b file) int {
		return cmp.Or(a.mod.Compare(b.mod), cmp.Compare(a.path, b.path))
	})
	root, err := os.OpenRoot(dir)
	if err != nil {
		return before, 0, fmt.Errorf("caches: trimming %s: %w", dir, err)
	}
	defer root.Close()
	if afterWalk != nil {
		afterWalk()
	}
	total := before
	for _, f := range files {
		if total <= maxBytes {
			break
		}
		rel, rerr := filepath.Rel(dir, f.path)
		if rerr == nil {
			rerr = root.Remove(rel)
		}
		if errors.Is(rerr, fs.ErrPermission) {
			// A read-only directory (Go's module cache) holds it.
			chmodDir(root, filepath.Dir(rel))
			rerr = root.Remove(rel)
		}
		if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return before, removed, fmt.Errorf("caches: trimming %s: %w", dir, rerr)
		}
		total -= f.size
		removed++
	}
	return before, removed, nil
}

package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// rotate renames the live file aside and starts a new one. Call with the
// lock held; seq is the last sequence number in the live file.
func (l *Logger) rotate(seq uint64) error {
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("audit: fsync before rotation: %w", err)
	}
	name := rotatedName(l.path, seq)
	// Never rename over history: a file already there means the chain or
	// the directory is not what this logger thinks it is.
	if _, err := os.Lstat(name); err == nil {
		return fmt.Errorf("audit: rotate: %s already exists", name)
	}
	if err := os.Rename(l.path, name); err != nil {
		return fmt.Errorf("audit: rotate: %w", err)
	}
	// reopen creates the new file and syncs the directory, which makes
	// the rename durable too.
	if err := l.reopen(); err != nil {
		return err
	}
	l.o.log.Info("audit log rotated", "path", l.path, "to", name)
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

func rotatedName(path string, seq uint64) string {
	return fmt.Sprintf("%s.%020d", path, seq)
}

// Files lists the files of the log at path, oldest first: the files
// rotated from it (PATH.<last seq, 20 digits>), then path itself if it
// exists, as they stood at one moment, under the append lock. A writer
// may rotate the live file as soon as Files returns: to read the log,
// take an OpenSnapshot, which keeps the live file open.
func Files(path string) ([]string, error) {
	s, err := OpenSnapshot(context.Background(), path)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Files(), nil
}

// rotatedFiles lists PATH.<20 digits> files, oldest first.
func rotatedFiles(path string) ([]string, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("audit: list rotated files: %w", err)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, base+".") {
			continue
		}
		suf := n[len(base)+1:]
		if len(suf) != 20 {
			continue
		}
		if _, err := strconv.ParseUint(suf, 10, 64); err != nil {
			continue
		}
		out = append(out, filepath.Join(dir, n))
	}
	sort.Strings(out)
	return out, nil
}

func (l *Logger) reopen() error {
	_, statErr := os.Lstat(l.path)
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("audit: open log: %w", err)
	}
	if errors.Is(statErr, os.ErrNotExist) {
		// A new file is only durable once its directory entry is.
		syncDir(filepath.Dir(l.path))
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit: stat log: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		// An audit log may quote commands and paths; keep it private.
		if err := f.Chmod(0o600); err != nil {
			l.o.log.Warn("audit log is readable by others and could not be restricted", "path", l.path, "err", err)
		}
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f = f
	l.fid = idOf(st)
	l.cacheOK = false
	return nil
}

type fileID struct{ dev, ino uint64 }

func idOf(st os.FileInfo) fileID {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return fileID{dev: uint64(s.Dev), ino: uint64(s.Ino)}
	}
	return fileID{}
}

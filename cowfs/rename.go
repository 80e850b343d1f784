package cowfs

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"syscall"
)

// errNoExchange: the file system cannot exchange or refuse to replace
// in a rename (renameat2 flags); the caller falls back to a plain rename.
var errNoExchange = errors.New("renameat2 flags not supported here")

// rename2 renames old to new, both in the same workspace directory, with
// renameat2 flags (RENAME_NOREPLACE, RENAME_EXCHANGE). The directory is
// opened by dirFD, so no symlink on the way is followed, and the names
// passed to the kernel are single components, so none is followed
// either. errNoExchange when the file system does not know the flags.
func (w *workspace) rename2(old, new string, flags uint) error {
	dir := path.Dir(new)
	if path.Dir(old) != dir {
		return fmt.Errorf("cowfs: rename2 %q %q: not in one directory", old, new)
	}
	fd, release, err := w.dirFD(dir)
	if err != nil {
		return err
	}
	defer release()
	err = ignoringEINTR(func() error { return renameat(fd, path.Base(old), path.Base(new), flags) })
	switch {
	case err == nil:
		return nil
	case flagsUnsupported(err):
		return errNoExchange
	}
	return &fs.PathError{Op: "renameat2", Path: new, Err: err}
}

// renameNoReplace renames old to new only when nothing is at new; an
// entry that appeared there meanwhile is reported as fs.ErrExist and left
// alone. Without renameat2 support it checks with Lstat first, which
// leaves a window of one system call.
func (w *workspace) renameNoReplace(old, new string) error {
	err := w.rename2(old, new, renameNoReplace)
	if err != errNoExchange {
		return err
	}
	if _, err := w.root.Lstat(new); err == nil {
		return &fs.PathError{Op: "rename", Path: new, Err: syscall.EEXIST}
	}
	return w.root.Rename(old, new)
}

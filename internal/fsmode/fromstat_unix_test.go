//go:build unix

package fsmode

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// FromStat agrees with os.Lstat on every kind of entry a tree holds.
func TestFromStatIsLstat(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o2750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "d"), fs.ModeSetgid|fs.ModeSticky|0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "f"), fs.ModeSetuid|0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "p"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"d", "f", "l", "p", "/dev/null"} {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, name)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := FromStat(uint32(fi.Sys().(*syscall.Stat_t).Mode)); got != fi.Mode() {
			t.Errorf("%s: FromStat = %v, os.Lstat says %v", name, got, fi.Mode())
		}
	}
}

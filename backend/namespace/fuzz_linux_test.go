package namespace

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzReadOverlay: the upper directory is written by the sandboxed command,
// so it is untrusted input to readOverlay. The fuzzer builds an arbitrary
// upper tree (files, directories, symlinks, whiteouts, opaque marks, a
// .pulse entry) over a fixed lower tree whose symlinks point at a host
// secret. Whatever the tree, every reported path is clean, relative,
// outside .pulse, and no reported content comes from the secret.
func FuzzReadOverlay(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5})
	f.Add([]byte("\x03\x00\x01\x02\x04\x05\x06\x07"))
	f.Add([]byte{4, 2, 0, 9, 1, 8, 3, 3})
	names := []string{"a", "b", "dir", ".pulse", "link", "lowerfile", "x y", "ünï", "sub"}
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		tmp := t.TempDir()
		secret := filepath.Join(tmp, "secret")
		if err := os.WriteFile(secret, []byte("HOST-SECRET"), 0o600); err != nil {
			t.Fatal(err)
		}
		lower := filepath.Join(tmp, "lower")
		upper := filepath.Join(tmp, "upper")
		for _, d := range []string{lower, upper, filepath.Join(lower, "dir")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		os.WriteFile(filepath.Join(lower, "lowerfile"), []byte("lower"), 0o644)
		os.WriteFile(filepath.Join(lower, "dir", "a"), []byte("lower a"), 0o644)
		os.Symlink(secret, filepath.Join(lower, "link"))
		os.Symlink(tmp, filepath.Join(lower, "sub"))

		cur := upper
		for i := 0; i+1 < len(ops); i += 2 {
			name := names[int(ops[i+1])%len(names)]
			p := filepath.Join(cur, name)
			switch ops[i] % 7 {
			case 0:
				os.WriteFile(p, []byte("upper "+name), 0o644)
			case 1:
				if os.Mkdir(p, 0o755) == nil {
					cur = p
				}
			case 2:
				os.Symlink(secret, p)
			case 3:
				unix.Mknod(p, unix.S_IFCHR, 0) // whiteout; needs CAP_MKNOD
			case 4:
				if os.Mkdir(p, 0o755) == nil {
					unix.Setxattr(p, "user.overlay.opaque", []byte("y"), 0)
					cur = p
				}
			case 5:
				cur = upper
			case 6:
				os.Symlink("..", p)
			}
		}
		ov, err := readOverlay(upper, lower, nil)
		if err != nil {
			return // an unreadable tree is refused, never misread
		}
		check := func(p string) {
			if p == "" || p != path.Clean(p) || strings.HasPrefix(p, "/") || p == ".." || strings.HasPrefix(p, "../") {
				t.Fatalf("bad overlay path %q", p)
			}
			if p == ".pulse" || strings.HasPrefix(p, ".pulse/") {
				t.Fatalf("overlay path under .pulse: %q", p)
			}
		}
		for _, fl := range ov.Files {
			check(fl.Path)
			if strings.Contains(string(fl.Data), "HOST-SECRET") {
				t.Fatalf("%s carries the host secret: a symlink was followed", fl.Path)
			}
			if fl.Mode&fs.ModeDir != 0 && fl.Data != nil {
				t.Fatalf("directory %s has data", fl.Path)
			}
		}
		for _, d := range ov.Deleted {
			check(d)
			if strings.Contains(d, "secret") || strings.Contains(d, "upper") {
				t.Fatalf("deletion %q names a host entry outside the workspace", d)
			}
		}
	})
}

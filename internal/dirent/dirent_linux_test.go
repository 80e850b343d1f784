package dirent

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadMatchesReadDir reads a directory larger than the buffer (so
// getdents is called more than once) and compares names and types with
// os.ReadDir's.
func TestReadMatchesReadDir(t *testing.T) {
	dir := t.TempDir()
	for i := range 300 {
		name := filepath.Join(dir, "file-with-a-longish-name-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		if err := os.WriteFile(name, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint8{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		typ := uint8(unix.DT_REG)
		switch {
		case e.IsDir():
			typ = unix.DT_DIR
		case e.Type()&os.ModeSymlink != 0:
			typ = unix.DT_LNK
		}
		want[e.Name()] = typ
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	got := map[string]uint8{}
	if err := Read(fd, make([]byte, 1024), func(name []byte, typ uint8) { got[string(name)] = typ }); err != nil {
		t.Fatal(err)
	}
	// "." and ".." are left out, as os.ReadDir leaves them out.
	if len(got) != len(want) {
		t.Fatalf("read %d entries, want %d", len(got), len(want))
	}
	for name, typ := range want {
		g, ok := got[name]
		if !ok {
			t.Fatalf("missing %q", name)
		}
		// A file system may report DT_UNKNOWN; tmpfs and ext4 do not.
		if g != typ && g != unix.DT_UNKNOWN {
			t.Fatalf("%q: type %d, want %d", name, g, typ)
		}
	}
}

package artifact

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/pulse-agent/pulse/protocol"
)

// A workspace packed with PackDir and compared with DiffTar gives the same
// overlay as Diff on the directory itself.
func TestDiffTarAgreesWithDiff(t *testing.T) {
	ws := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(ws, "d/e"), 0o755))
	must(os.WriteFile(filepath.Join(ws, "d/e/f"), []byte("f"), 0o644))
	must(os.WriteFile(filepath.Join(ws, "keep"), []byte("k"), 0o600))
	must(os.WriteFile(filepath.Join(ws, "edit"), []byte("v1"), 0o644))
	must(os.Symlink("keep", filepath.Join(ws, "ln")))
	snap, err := Take(ws)
	must(err)

	packed, err := PackDir(ws, protocol.ArchiveLimits{})
	must(err)
	ov, err := snap.DiffTar(bytes.NewReader(packed), protocol.ArchiveLimits{})
	must(err)
	if !ov.Empty() {
		t.Fatalf("unchanged workspace gives overlay %+v", ov)
	}

	must(os.WriteFile(filepath.Join(ws, "edit"), []byte("v2"), 0o644))
	must(os.RemoveAll(filepath.Join(ws, "d")))
	must(os.Remove(filepath.Join(ws, "ln")))
	must(os.Symlink("edit", filepath.Join(ws, "ln")))
	must(os.WriteFile(filepath.Join(ws, "new"), []byte{0, 1}, 0o755))
	must(os.Chmod(filepath.Join(ws, "keep"), 0o644))
	want, err := snap.Diff(ws, 1<<20)
	must(err)
	packed, err = PackDir(ws, protocol.ArchiveLimits{})
	must(err)
	got, err := snap.DiffTar(bytes.NewReader(packed), protocol.ArchiveLimits{})
	must(err)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("DiffTar = %+v\nDiff    = %+v", got, want)
	}
	if len(got.Files) != 4 || len(got.Deleted) != 1 || got.Deleted[0] != "d" {
		t.Fatalf("overlay = %+v", got)
	}
	if _, err := PackDir(ws, protocol.ArchiveLimits{MaxMembers: 2}); !errors.Is(err, protocol.ErrLimit) {
		t.Fatalf("PackDir over member limit: %v", err)
	}
	if _, err := snap.DiffTar(bytes.NewReader(build(t, reg("../x", "y"))), protocol.ArchiveLimits{}); !errors.Is(err, protocol.ErrUnsafe) {
		t.Fatalf("DiffTar of an escaping name: %v", err)
	}
}

// FuzzDiffTar feeds arbitrary archives, as a worker could send back, to
// DiffTar: it must not panic, and every overlay path it returns must be
// clean, relative and outside .pulse/.
func FuzzDiffTar(f *testing.F) {
	f.Add(build(f, reg("a", "x"), reg("d/b", "y")))
	f.Add(build(f, reg("../x", "x")))
	f.Add([]byte{0x1f, 0x8b})
	f.Add(build(f, member{hdr: tar.Header{Name: "a", Typeflag: tar.TypeSymlink, Linkname: "d"}}, reg("a", "x")))
	f.Add(build(f, reg("a", "y"), reg("a", "x")))
	ws := f.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "a"), []byte("x"), 0o644); err != nil {
		f.Fatal(err)
	}
	snap, err := Take(ws)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ov, err := snap.DiffTar(bytes.NewReader(data), protocol.ArchiveLimits{MaxUnpacked: 1 << 20, MaxMembers: 64})
		if err != nil {
			return
		}
		once := map[string]bool{}
		for _, file := range ov.Files {
			if c, err := protocol.CleanName(file.Path); err != nil || c != file.Path || c == "." {
				t.Fatalf("overlay path %q not clean: %v", file.Path, err)
			}
			if once[file.Path] {
				t.Fatalf("overlay holds %q twice", file.Path)
			}
			once[file.Path] = true
		}
		if _, err := protocol.PackOverlay(ov); err != nil {
			t.Fatalf("overlay from DiffTar does not pack: %v", err)
		}
	})
}

// A later member of the same name replaces the earlier one, as GNU tar
// extracts it, and the overlay holds the path once.
func TestDiffTarLaterMemberWins(t *testing.T) {
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "a"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := Take(ws)
	if err != nil {
		t.Fatal(err)
	}
	link := member{hdr: tar.Header{Name: "b", Typeflag: tar.TypeSymlink, Linkname: "a"}}
	ov, err := snap.DiffTar(bytes.NewReader(build(t, link, reg("b", "new"), reg("a", "changed"), reg("a", "x"))), protocol.ArchiveLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ov.Files) != 1 || ov.Files[0].Path != "b" || !ov.Files[0].Mode.IsRegular() || string(ov.Files[0].Data) != "new" {
		t.Fatalf("overlay = %+v, want only b as the regular file that came last", ov.Files)
	}
}

package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

type member struct {
	hdr  tar.Header
	data []byte
}

func reg(name, data string) member {
	return member{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}, data: []byte(data)}
}

func build(t testing.TB, ms ...member) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, m := range ms {
		h := m.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if len(m.data) > 0 {
			if _, err := tw.Write(m.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestExtractRegularTree(t *testing.T) {
	ws := filepath.Join(t.TempDir(), "tenant", "exec")
	data := build(t,
		member{hdr: tar.Header{Name: "src/", Typeflag: tar.TypeDir, Mode: 0o755}},
		reg("src/main.go", "package main\n"),
		reg("./README", "hi"),
		member{hdr: tar.Header{Name: "run.sh", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 2}, data: []byte("#!")},
		reg("deep/er/file", "x"),
		reg(".pulse/state", "never extracted"),
	)
	if err := Extract(data, ws, protocol.ArchiveLimits{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"src/main.go": "package main\n", "README": "hi", "deep/er/file": "x", "run.sh": "#!"} {
		got, err := os.ReadFile(filepath.Join(ws, name))
		if err != nil || string(got) != want {
			t.Fatalf("%s = %q, %v", name, got, err)
		}
	}
	info, err := os.Stat(filepath.Join(ws, "run.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode()&fs.ModeSetuid != 0 || info.Mode().Perm() != 0o755 {
		t.Fatalf("run.sh mode = %v, want 0755 without setuid", info.Mode())
	}
	if _, err := os.Stat(filepath.Join(ws, ".pulse")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf(".pulse was extracted: %v", err)
	}
	if err := Extract(data, ws, protocol.ArchiveLimits{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second extract: %v, want ErrExists", err)
	}
}

func TestExtractRefusesUnsafeArchives(t *testing.T) {
	big := bytes.Repeat([]byte{0}, 4<<20)
	many := make([]member, 0, 12)
	for i := range 12 {
		many = append(many, reg("f"+string(rune('a'+i)), "x"))
	}
	cases := []struct {
		name string
		data func(t *testing.T) []byte
		lim  protocol.ArchiveLimits
		want error
	}{
		{"parent escape", func(t *testing.T) []byte { return build(t, reg("../evil", "x")) }, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"nested parent escape", func(t *testing.T) []byte { return build(t, reg("a/../../evil", "x")) }, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"backslash escape", func(t *testing.T) []byte { return build(t, reg(`a\..\..\evil`, "x")) }, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"absolute", func(t *testing.T) []byte { return build(t, reg("/tmp/evil", "x")) }, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"drive letter", func(t *testing.T) []byte { return build(t, reg("C:/evil", "x")) }, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"symlink", func(t *testing.T) []byte {
			return build(t, member{hdr: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}})
		}, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"symlink then write through it", func(t *testing.T) []byte {
			return build(t, member{hdr: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}}, reg("l/evil", "x"))
		}, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"hardlink", func(t *testing.T) []byte {
			return build(t, member{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}})
		}, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"char device", func(t *testing.T) []byte {
			return build(t, member{hdr: tar.Header{Name: "d", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}})
		}, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"fifo", func(t *testing.T) []byte { return build(t, member{hdr: tar.Header{Name: "p", Typeflag: tar.TypeFifo}}) }, protocol.ArchiveLimits{}, protocol.ErrUnsafe},
		{"too many members", func(t *testing.T) []byte { return build(t, many...) }, protocol.ArchiveLimits{MaxMembers: 10}, protocol.ErrLimit},
		{"unpacked bomb", func(t *testing.T) []byte {
			return build(t, member{hdr: tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(big))}, data: big})
		}, protocol.ArchiveLimits{MaxUnpacked: 1 << 20}, protocol.ErrLimit},
		{"bomb over many files", func(t *testing.T) []byte {
			ms := []member{}
			for i := range 5 {
				ms = append(ms, member{hdr: tar.Header{Name: "z" + string(rune('0'+i)), Typeflag: tar.TypeReg, Mode: 0o644, Size: 300 << 10}, data: big[:300<<10]})
			}
			return build(t, ms...)
		}, protocol.ArchiveLimits{MaxUnpacked: 1 << 20}, protocol.ErrLimit},
		{"compressed over limit", func(t *testing.T) []byte { return build(t, reg("a", strings.Repeat("x", 100))) }, protocol.ArchiveLimits{MaxCompressed: 10}, protocol.ErrLimit},
		{"not gzip", func(t *testing.T) []byte { return []byte("PK\x03\x04 this is a zip") }, protocol.ArchiveLimits{}, protocol.ErrCorrupt},
		{"truncated", func(t *testing.T) []byte {
			d := build(t, reg("a", strings.Repeat("y", 10000)))
			return d[:len(d)/2]
		}, protocol.ArchiveLimits{}, protocol.ErrCorrupt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			ws := filepath.Join(parent, "ws")
			err := Extract(tc.data(t), ws, tc.lim)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if _, err := os.Stat(ws); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("refused workspace left behind: %v", err)
			}
			if _, err := os.Stat(filepath.Join(parent, "evil")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("a file escaped the workspace")
			}
		})
	}
}

func TestSnapshotDiff(t *testing.T) {
	ws := t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(ws, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("same.txt", "same")
	write("changed.txt", "v1")
	write("rewritten.txt", "equal")
	write("gone/a", "1")
	write("gone/b", "2")
	write("single", "x")
	write(".pulse/state", "ignored")
	snap, err := Take(ws)
	if err != nil {
		t.Fatal(err)
	}
	write("changed.txt", "v2")
	write("rewritten.txt", "equal") // same bytes: not a change
	write("new/dir/file", "n")
	write(".pulse/state", "still ignored")
	if err := os.RemoveAll(filepath.Join(ws, "gone")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(ws, "single")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("changed.txt", filepath.Join(ws, "ln")); err != nil {
		t.Fatal(err)
	}
	ov, err := snap.Diff(ws, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]backend.File{}
	for _, f := range ov.Files {
		files[f.Path] = f
	}
	if len(files) != 5 {
		t.Fatalf("files = %+v, want changed.txt, new, new/dir, new/dir/file, ln", ov.Files)
	}
	if string(files["changed.txt"].Data) != "v2" || string(files["new/dir/file"].Data) != "n" ||
		!files["new/dir"].Mode.IsDir() || string(files["ln"].Data) != "changed.txt" || files["ln"].Mode&fs.ModeSymlink == 0 {
		t.Fatalf("files = %+v", files)
	}
	if strings.Join(ov.Deleted, ",") != "gone,single" {
		t.Fatalf("deleted = %v, want [gone single]", ov.Deleted)
	}
	if _, err := snap.Diff(ws, 1); !errors.Is(err, ErrOverlayTooLarge) {
		t.Fatalf("over limit: %v", err)
	}
}

// FuzzExtract feeds arbitrary archives to Extract: it must never panic, and
// whatever it accepts must hold only regular files, directories and
// symlinks that resolve inside the workspace.
func FuzzExtract(f *testing.F) {
	f.Add(build(f, reg("a/b", "x"), member{hdr: tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}}))
	f.Add(build(f, reg("../x", "x")))
	f.Add(build(f, member{hdr: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}}))
	f.Add([]byte{0x1f, 0x8b, 8, 0})
	f.Add(build(f, member{hdr: tar.Header{Name: "a/b", Typeflag: tar.TypeSymlink, Linkname: ".."}},
		member{hdr: tar.Header{Name: "c", Typeflag: tar.TypeSymlink, Linkname: "a/b/../x"}}))
	f.Add(build(f, member{hdr: tar.Header{Name: "d", Typeflag: tar.TypeSymlink, Linkname: "sub"}}, reg("d/f", "x")))
	// Into the reserved directory through a link, and a file over a link.
	f.Add(build(f, member{hdr: tar.Header{Name: "p", Typeflag: tar.TypeSymlink, Linkname: "."}}, reg("p/.pulse/planted", "x")))
	f.Add(build(f, reg("victim", "v"), member{hdr: tar.Header{Name: "a", Typeflag: tar.TypeSymlink, Linkname: "victim"}}, reg("a", "new")))
	f.Add(build(f, member{hdr: tar.Header{Name: "p", Typeflag: tar.TypeSymlink, Linkname: "."}},
		member{hdr: tar.Header{Name: "q", Typeflag: tar.TypeSymlink, Linkname: "p/.pulse"}}, reg("q/x", "x")))
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		ws := filepath.Join(parent, "ws")
		err := Extract(data, ws, protocol.ArchiveLimits{MaxUnpacked: 1 << 20, MaxMembers: 64})
		entries, _ := os.ReadDir(parent)
		if err != nil {
			if len(entries) != 0 {
				t.Fatalf("refused archive left %d entries behind", len(entries))
			}
			return
		}
		if len(entries) != 1 || entries[0].Name() != "ws" {
			t.Fatalf("extraction wrote outside the workspace: %v", entries)
		}
		if top, _ := os.ReadDir(ws); len(top) > 0 {
			for _, e := range top {
				if strings.EqualFold(e.Name(), ".pulse") {
					t.Fatalf("extraction made the reserved %s", e.Name())
				}
			}
		}
		checkNoWriteThroughLinks(t, data, ws)
		var total int64
		filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			info, _ := d.Info()
			if info.Mode()&fs.ModeSymlink != 0 {
				// A link is accepted only when it resolves inside.
				rel, _ := filepath.Rel(ws, p)
				if _, err := protocol.Resolve(ws, filepath.ToSlash(rel)); err != nil {
					t.Fatalf("accepted link %s: %v", rel, err)
				}
				return nil
			}
			if !info.Mode().IsRegular() && !info.IsDir() {
				t.Fatalf("%s has mode %v", p, info.Mode())
			}
			if info.Mode().IsRegular() {
				total += info.Size()
			}
			return nil
		})
		if total > 1<<20 {
			t.Fatalf("unpacked %d bytes over the limit", total)
		}
	})
}

// checkNoWriteThroughLinks checks a flat archive (no name with a "/", so
// no member is reached through a link) that was extracted: a name whose
// last member is a regular file must be a regular file, not a link that
// member was written through.
func checkNoWriteThroughLinks(t *testing.T, data []byte, ws string) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return
	}
	tr := tar.NewReader(zr)
	last := map[string]byte{}
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		name, err := protocol.CleanName(hdr.Name)
		if err != nil || strings.Contains(name, "/") {
			return
		}
		last[name] = hdr.Typeflag
	}
	for name, typ := range last {
		if typ != tar.TypeReg || name == "." || strings.EqualFold(name, ".pulse") {
			continue
		}
		fi, err := os.Lstat(filepath.Join(ws, name))
		if err != nil {
			t.Fatalf("%s: last member is a regular file, but: %v", name, err)
		}
		if !fi.Mode().IsRegular() {
			t.Fatalf("%s: last member is a regular file, but it is %v", name, fi.Mode())
		}
	}
}

// Symlinks whose target stays inside the workspace are extracted, even
// dangling ones and links to directories that later members write
// through; any that leads out, however indirectly, refuses the archive.
func TestExtractSymlinks(t *testing.T) {
	link := func(name, target string) member {
		return member{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target}}
	}
	ws := filepath.Join(t.TempDir(), "ws")
	data := build(t, reg("README", "hi"), link("docs/readme", "../README"), link("self", "."),
		link("dangling", "not/yet/here"), link("d", "sub"), reg("sub/keep", "k"), reg("d/through", "via link"))
	if err := Extract(data, ws, protocol.ArchiveLimits{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"docs/readme": "../README", "self": ".", "dangling": "not/yet/here", "d": "sub"} {
		if got, err := os.Readlink(filepath.Join(ws, name)); err != nil || got != want {
			t.Fatalf("%s -> %q, %v; want %q", name, got, err, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, "docs/readme")); err != nil || string(b) != "hi" {
		t.Fatalf("docs/readme reads %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "sub/through")); err != nil || string(b) != "via link" {
		t.Fatalf("a file written through a link to a directory: %q, %v", b, err)
	}

	for name, ms := range map[string][]member{
		"parent":                   {link("l", "..")},
		"nested parent":            {link("a/l", "../../x")},
		"absolute":                 {link("l", "/etc/passwd")},
		"drive":                    {link("l", "C:/x")},
		"backslash":                {link("l", `..\x`)},
		"reserved":                 {link("l", ".pulse/state")},
		"through a link":           {link("a/b", ".."), link("c", "a/b/../outside")},
		"loop":                     {link("x", "y"), link("y", "x")},
		"empty target":             {link("l", "")},
		"root is a link":           {link(".", "sub")},
		"write out through":        {link("a/b", ".."), link("c", "a/b/.."), reg("c/evil", "x")},
		"reserved through":         {link("p", "."), reg("p/.pulse/planted", "x")},
		"reserved dir through":     {link("p", "."), member{hdr: tar.Header{Name: "p/.pulse/", Typeflag: tar.TypeDir, Mode: 0o755}}},
		"link into reserved":       {link("p", "."), link("q", "p/.pulse")},
		"later link into reserved": {link("q", "p/.pulse"), link("p", ".")},
		"file over a directory":    {reg("d/x", "x"), reg("d", "y")},
	} {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			ws := filepath.Join(parent, "ws")
			if err := Extract(build(t, ms...), ws, protocol.ArchiveLimits{}); !errors.Is(err, protocol.ErrUnsafe) {
				t.Fatalf("err = %v, want protocol.ErrUnsafe", err)
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Fatalf("refused archive left %d entries", len(entries))
			}
		})
	}
}

// A member over an earlier member's symlink replaces the link, as GNU tar
// does, instead of writing through it to the link's target.
func TestExtractReplacesSymlinksInsteadOfWritingThrough(t *testing.T) {
	link := func(name, target string) member {
		return member{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target}}
	}
	ws := filepath.Join(t.TempDir(), "ws")
	data := build(t, reg("victim", "v"), link("a", "victim"), reg("a", "new"),
		link("b", "victim"), link("b", "other"),
		link("d", "sub"), reg("sub/keep", "k"), member{hdr: tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}}, reg("d/own", "o"))
	if err := Extract(data, ws, protocol.ArchiveLimits{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"victim": "v", "a": "new", "sub/keep": "k", "d/own": "o"} {
		if b, err := os.ReadFile(filepath.Join(ws, name)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", name, b, err, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(ws, "a")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("a is %v, %v; want a regular file in place of the link", fi.Mode(), err)
	}
	if got, err := os.Readlink(filepath.Join(ws, "b")); err != nil || got != "other" {
		t.Errorf("b -> %q, %v; want the later link", got, err)
	}
	if fi, err := os.Lstat(filepath.Join(ws, "d")); err != nil || !fi.IsDir() {
		t.Errorf("d is %v, %v; want the directory member in place of the link", fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "sub/own")); err == nil {
		t.Error("d/own was written through the replaced link")
	}
}

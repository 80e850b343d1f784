package protocol

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/pathguard"
)

func TestCleanName(t *testing.T) {
	for in, want := range map[string]string{"a/b": "a/b", "./a//b/": "a/b", "a\\b": "a/b", ".": ".", "./": "."} {
		if got, err := CleanName(in); err != nil || got != want {
			t.Errorf("CleanName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "a\x00b", "/a", "../a", "a/..", "a\\..\\b", "C:x", strings.Repeat("n", 256)} {
		if got, err := CleanName(in); !errors.Is(err, ErrUnsafe) {
			t.Errorf("CleanName(%q) = %q, %v; want ErrUnsafe", in, got, err)
		}
	}
}

func TestPackWritesFilesAndManifest(t *testing.T) {
	ov := &backend.Overlay{
		Files: []backend.File{
			{Path: "b/new.bin", Mode: 0o755, Data: []byte{0, 1, 0xff}},
			{Path: "b", Mode: fs.ModeDir | 0o755},
			{Path: "link", Mode: fs.ModeSymlink, Data: []byte("b/new.bin")},
		},
		Deleted: []string{"z/gone", "a.txt"},
	}
	data, err := PackOverlay(ov)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	got := map[string]*tar.Header{}
	contents := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
		contents[h.Name], _ = io.ReadAll(tr)
	}
	if h := got["b/new.bin"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode != 0o755 || !bytes.Equal(contents["b/new.bin"], []byte{0, 1, 0xff}) {
		t.Fatalf("b/new.bin: %+v %q", h, contents["b/new.bin"])
	}
	if h := got["b/"]; h == nil || h.Typeflag != tar.TypeDir {
		t.Fatalf("dir b/: %+v", h)
	}
	if h := got["link"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "b/new.bin" {
		t.Fatalf("link: %+v", h)
	}
	var m Manifest
	if err := json.Unmarshal(contents[ManifestName], &m); err != nil {
		t.Fatal(err)
	}
	if m.Version != 1 || len(m.Deleted) != 2 || m.Deleted[0] != "a.txt" || m.Deleted[1] != "z/gone" {
		t.Fatalf("manifest = %+v", m)
	}
	if _, err := PackOverlay(&backend.Overlay{Files: []backend.File{{Path: "../x"}}}); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("unsafe overlay path: %v", err)
	}
	if _, err := PackOverlay(&backend.Overlay{Files: []backend.File{{Path: ".pulse/x"}}}); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("reserved overlay path: %v", err)
	}
}

// TestOverlayRoundTrip: the server's overlay archive comes back as the
// overlay it packed.
func TestOverlayRoundTrip(t *testing.T) {
	want := &backend.Overlay{
		Files: []backend.File{
			{Path: "a.txt", Mode: 0o644, Data: []byte("a")},
			{Path: "bin", Mode: 0o755, Data: []byte{0, 255}},
			{Path: "d", Mode: fs.ModeDir | 0o755},
			{Path: "d/link", Mode: fs.ModeSymlink | 0o777, Data: []byte("../a.txt")},
		},
		Deleted: []string{"gone", "old/dir"},
	}
	data, err := PackOverlay(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnpackOverlay(data, OverlayLimits{Bytes: 1 << 20, Members: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Files) != len(want.Files) || len(got.Deleted) != len(want.Deleted) {
		t.Fatalf("got %+v", got)
	}
	byPath := map[string]backend.File{}
	for _, f := range got.Files {
		byPath[f.Path] = f
	}
	for _, w := range want.Files {
		g := byPath[w.Path]
		if g.Mode != w.Mode || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("%s: mode %v data %q; want %v %q", w.Path, g.Mode, g.Data, w.Mode, w.Data)
		}
	}
}

type member struct {
	name string
	typ  byte
	data string
	link string
	mode int64
}

func overlayArchive(members ...member) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, m := range members {
		mode := m.mode
		if mode == 0 {
			mode = 0o644
		}
		tw.WriteHeader(&tar.Header{Name: m.name, Typeflag: m.typ, Size: int64(len(m.data)), Linkname: m.link, Mode: mode})
		tw.Write([]byte(m.data))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

var manifest = member{name: ManifestName, typ: tar.TypeReg, data: `{"version":1,"deleted":[]}`}

// TestOverlayRefusesUnsafe: every unsafe shape fails the whole overlay.
func TestOverlayRefusesUnsafe(t *testing.T) {
	for name, data := range map[string][]byte{
		"not gzip":         []byte("plain"),
		"no manifest":      overlayArchive(member{name: "a", typ: tar.TypeReg, data: "a"}),
		"absolute":         overlayArchive(member{name: "/etc/passwd", typ: tar.TypeReg, data: "x"}, manifest),
		"parent":           overlayArchive(member{name: "a/../../x", typ: tar.TypeReg, data: "x"}, manifest),
		"backslash":        overlayArchive(member{name: `a\..\x`, typ: tar.TypeReg, data: "x"}, manifest),
		"reserved":         overlayArchive(member{name: ".pulse/hook", typ: tar.TypeReg, data: "x"}, manifest),
		"hard link":        overlayArchive(member{name: "h", typ: tar.TypeLink, link: "a"}, manifest),
		"device":           overlayArchive(member{name: "dev", typ: tar.TypeChar}, manifest),
		"duplicate":        overlayArchive(member{name: "a", typ: tar.TypeReg}, member{name: "a", typ: tar.TypeReg}, manifest),
		"bad manifest":     overlayArchive(member{name: ManifestName, typ: tar.TypeReg, data: `{"version":2}`}),
		"deleted escapes":  overlayArchive(member{name: ManifestName, typ: tar.TypeReg, data: `{"version":1,"deleted":["../x"]}`}),
		"deleted reserved": overlayArchive(member{name: ManifestName, typ: tar.TypeReg, data: `{"version":1,"deleted":[".pulse"]}`}),
		"too big":          overlayArchive(member{name: "big", typ: tar.TypeReg, data: string(make([]byte, 2048))}, manifest),
	} {
		_, err := UnpackOverlay(data, OverlayLimits{Bytes: 1024, Members: 10})
		if !errors.Is(err, ErrUnsafe) && !errors.Is(err, ErrLimit) && !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v; want ErrUnsafe, ErrLimit or ErrCorrupt", name, err)
		}
	}
	// Set-id bits never come through.
	ov, err := UnpackOverlay(overlayArchive(member{name: "s", typ: tar.TypeReg, data: "x", mode: 0o4755}, manifest), OverlayLimits{Bytes: 1024, Members: 10})
	if err != nil || ov.Files[0].Mode != 0o755 {
		t.Errorf("set-uid member: %v, %+v", err, ov)
	}
}

// FuzzUnpackOverlay: whatever the server sends, an accepted overlay only
// holds clean, relative, unreserved paths of known types within limits.
func FuzzUnpackOverlay(f *testing.F) {
	f.Add(overlayArchive(member{name: "a.txt", typ: tar.TypeReg, data: "a"}, member{name: "d/", typ: tar.TypeDir},
		member{name: "l", typ: tar.TypeSymlink, link: "a.txt"}, manifest))
	f.Add(overlayArchive(member{name: "../x", typ: tar.TypeReg, data: "x"}, manifest))
	f.Add(overlayArchive(member{name: ManifestName, typ: tar.TypeReg, data: `{"version":1,"deleted":["a","b/c"]}`}))
	f.Add([]byte{0x1f, 0x8b})
	const limit = 1 << 16
	f.Fuzz(func(t *testing.T, data []byte) {
		ov, err := UnpackOverlay(data, OverlayLimits{Bytes: limit, Members: 64})
		if err != nil {
			if !errors.Is(err, ErrUnsafe) && !errors.Is(err, ErrLimit) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is of no archive class", err)
			}
			return
		}
		var total int
		check := func(p string) {
			c, err := cleanOverlayMember(p)
			if err != nil || c != p || pathguard.IsReserved(p) {
				t.Fatalf("accepted path %q", p)
			}
		}
		for _, fl := range ov.Files {
			check(fl.Path)
			total += len(fl.Data)
			switch fl.Mode.Type() {
			case 0, fs.ModeDir, fs.ModeSymlink:
			default:
				t.Fatalf("%q has type %v", fl.Path, fl.Mode.Type())
			}
			if fl.Mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
				t.Fatalf("%q has set-id or sticky bits", fl.Path)
			}
		}
		for _, d := range ov.Deleted {
			check(d)
		}
		if total > limit {
			t.Fatalf("accepted %d bytes over the %d limit", total, limit)
		}
	})
}

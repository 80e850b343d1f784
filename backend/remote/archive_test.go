package remote

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/artifact"
)

var testPackLimits = packLimits{compressed: DefaultMaxCompressed, unpacked: DefaultMaxUnpacked, members: DefaultMaxMembers}

// TestPackExtractsOnServer: what pack writes is what the server's own
// fail-closed extractor accepts, byte-exact, without .pulse/.
func TestPackExtractsOnServer(t *testing.T) {
	ws := t.TempDir()
	files := map[string][]byte{
		"a.txt":           []byte("alpha\n"),
		"dir/sub/b.bin":   {0, 1, 2, 255, 254},
		"empty":           {},
		"dir/exec.sh":     []byte("#!/bin/sh\n"),
		".pulse/state.db": []byte("private"),
		".hidden/c.txt":   []byte("c"),
	}
	for p, data := range files {
		full := filepath.Join(ws, filepath.FromSlash(p))
		os.MkdirAll(filepath.Dir(full), 0o755)
		os.WriteFile(full, data, 0o644)
	}
	os.Chmod(filepath.Join(ws, "dir/exec.sh"), 0o755)
	os.Mkdir(filepath.Join(ws, "emptydir"), 0o755)
	pk, err := pack(ws, []extraFile{{name: ".pulse-stdin-x", data: []byte("in")}}, testPackLimits)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "ws")
	if err := artifact.Extract(pk.data, dst, artifact.Limits{}); err != nil {
		t.Fatalf("the server refuses the packed workspace: %v", err)
	}
	for p, want := range files {
		got, err := os.ReadFile(filepath.Join(dst, filepath.FromSlash(p)))
		if p == ".pulse/state.db" {
			if err == nil {
				t.Error(".pulse/ was sent")
			}
			continue
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %q, %v; want %q", p, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dst, "dir/exec.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("exec.sh lost its executable bit: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "emptydir")); err != nil || !fi.IsDir() {
		t.Errorf("empty directory not sent: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, ".pulse-stdin-x")); string(got) != "in" {
		t.Errorf("extra file: %q", got)
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
	data, err := artifact.Pack(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := unpackOverlay(data, overlayLimits{bytes: 1 << 20, members: 100})
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

var manifest = member{name: manifestName, typ: tar.TypeReg, data: `{"version":1,"deleted":[]}`}

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
		"bad manifest":     overlayArchive(member{name: manifestName, typ: tar.TypeReg, data: `{"version":2}`}),
		"deleted escapes":  overlayArchive(member{name: manifestName, typ: tar.TypeReg, data: `{"version":1,"deleted":["../x"]}`}),
		"deleted reserved": overlayArchive(member{name: manifestName, typ: tar.TypeReg, data: `{"version":1,"deleted":[".pulse"]}`}),
		"too big":          overlayArchive(member{name: "big", typ: tar.TypeReg, data: string(make([]byte, 2048))}, manifest),
	} {
		if _, err := unpackOverlay(data, overlayLimits{bytes: 1024, members: 10}); !errors.Is(err, ErrOverlay) {
			t.Errorf("%s: %v; want ErrOverlay", name, err)
		}
	}
	// Set-id bits never come through.
	ov, err := unpackOverlay(overlayArchive(member{name: "s", typ: tar.TypeReg, data: "x", mode: 0o4755}, manifest), overlayLimits{bytes: 1024, members: 10})
	if err != nil || ov.Files[0].Mode != 0o755 {
		t.Errorf("set-uid member: %v, %+v", err, ov)
	}
}

// TestPackLeavesHiddenPathsOut: a hidden file, and a hidden directory
// with everything below it, are not in the upload; the rest is.
func TestPackLeavesHiddenPathsOut(t *testing.T) {
	ws := t.TempDir()
	for p, data := range map[string]string{".env": "secret", "secrets/a.pem": "secret", "conf/key.pem": "secret", "conf/app.yaml": "ok", "keep": "ok"} {
		full := filepath.Join(ws, filepath.FromSlash(p))
		os.MkdirAll(filepath.Dir(full), 0o755)
		os.WriteFile(full, []byte(data), 0o644)
	}
	lim := testPackLimits
	lim.hidden = map[string]bool{".env": true, "secrets": true, "conf/key.pem": true}
	pk, err := pack(ws, nil, lim)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "ws")
	if err := artifact.Extract(pk.data, dst, artifact.Limits{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".env", "secrets", "conf/key.pem"} {
		if _, err := os.Lstat(filepath.Join(dst, filepath.FromSlash(p))); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("hidden %s was uploaded: %v", p, err)
		}
	}
	for _, p := range []string{"keep", "conf/app.yaml"} {
		if _, err := os.Lstat(filepath.Join(dst, filepath.FromSlash(p))); err != nil {
			t.Errorf("%s was left out: %v", p, err)
		}
	}
}

package docker

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"slices"
	"strconv"
	"testing"
	"time"
)

type entry struct {
	name, data, link string
	typ              byte
	mode             int64
}

func tarOf(t testing.TB, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.data)), Linkname: e.link}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.data))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func outTar(t testing.TB, files []byte, extra ...entry) []byte {
	entries := append([]entry{
		{name: "ID/", typ: tar.TypeDir, mode: 0o755},
		{name: "ID/status", typ: tar.TypeReg, data: "exit 0\n", mode: 0o644},
		{name: "ID/pgid", typ: tar.TypeReg, data: "42\n", mode: 0o644},
		{name: "ID/time", typ: tar.TypeReg, data: "Command terminated by signal 9\nusage 2048 0.10 0.25 0.50\n", mode: 0o644},
		{name: "ID/files-7.tar", typ: tar.TypeReg, data: string(files), mode: 0o644},
	}, extra...)
	return tarOf(t, entries)
}

func TestParseOutTar(t *testing.T) {
	files := tarOf(t, []entry{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "./a.txt", typ: tar.TypeReg, data: "A\x00", mode: 0o640},
		{name: "./d/", typ: tar.TypeDir, mode: 0o700},
		{name: "./d/run.sh", typ: tar.TypeReg, data: "#!", mode: 0o4755},
		{name: "./l", typ: tar.TypeSymlink, link: "a.txt", mode: 0o777},
		{name: "./h", typ: tar.TypeLink, link: "./a.txt", mode: 0o640},
		{name: "./fifo", typ: tar.TypeFifo, mode: 0o644},
	})
	oc, err := parseOutTar(bytes.NewReader(outTar(t, files, entry{name: "ID/deleted", typ: tar.TypeReg, data: "./x\n./y/z\n"})), 0)
	if err != nil {
		t.Fatal(err)
	}
	if oc.status != "exit 0" || oc.pgid != 42 || oc.signal != 9 {
		t.Errorf("status %q pgid %d signal %d", oc.status, oc.pgid, oc.signal)
	}
	if oc.metrics.MaxRSSBytes != 2048*1024 || oc.metrics.UserCPU != 250*time.Millisecond || oc.metrics.SystemCPU != 500*time.Millisecond {
		t.Errorf("metrics %+v", oc.metrics)
	}
	want := []struct {
		path string
		mode fs.FileMode
		data string
	}{
		{"a.txt", 0o640, "A\x00"},
		{"d", fs.ModeDir | 0o700, ""},
		{"d/run.sh", fs.ModeSetuid | 0o755, "#!"},
		{"fifo", fs.ModeNamedPipe | 0o644, ""},
		{"h", 0o640, "A\x00"},
		{"l", fs.ModeSymlink | 0o777, "a.txt"},
	}
	got := oc.overlay.Files
	if len(got) != len(want) {
		t.Fatalf("files %+v", got)
	}
	for i, w := range want {
		if got[i].Path != w.path || got[i].Mode != w.mode || string(got[i].Data) != w.data {
			t.Errorf("file %d = %s %v %q, want %s %v %q", i, got[i].Path, got[i].Mode, got[i].Data, w.path, w.mode, w.data)
		}
	}
	if d := oc.overlay.Deleted; len(d) != 2 || d[0] != "x" || d[1] != "y/z" {
		t.Errorf("deleted %v", d)
	}
}

func TestParseOutTarRejectsUnsafeInput(t *testing.T) {
	for name, files := range map[string][]entry{
		"dotdot":        {{name: "./../escape", typ: tar.TypeReg, data: "x"}},
		"absolute":      {{name: "/etc/passwd", typ: tar.TypeReg, data: "x"}},
		"pulse dir":     {{name: "./.pulse/state", typ: tar.TypeReg, data: "x"}},
		"twice":         {{name: "./a", typ: tar.TypeReg, data: "x"}, {name: "a", typ: tar.TypeReg, data: "y"}},
		"dangling link": {{name: "./h", typ: tar.TypeLink, link: "./nowhere"}},
		"empty symlink": {{name: "./l", typ: tar.TypeSymlink, link: ""}},
	} {
		_, err := parseOutTar(bytes.NewReader(outTar(t, tarOf(t, files))), 0)
		if !errors.Is(err, ErrBadOverlay) {
			t.Errorf("%s: err = %v, want ErrBadOverlay", name, err)
		}
	}
	_, err := parseOutTar(bytes.NewReader(outTar(t, nil, entry{name: "ID/deleted", typ: tar.TypeReg, data: "../../x\n"})), 0)
	if !errors.Is(err, ErrBadOverlay) {
		t.Errorf("unsafe deletion: err = %v", err)
	}
	big := tarOf(t, []entry{{name: "./a", typ: tar.TypeReg, data: "0123456789"}, {name: "./b", typ: tar.TypeReg, data: "0123456789"}})
	if _, err := parseOutTar(bytes.NewReader(outTar(t, big)), 15); !errors.Is(err, ErrBadOverlay) {
		t.Errorf("over the byte bound: err = %v", err)
	}
	if _, err := parseOutTar(bytes.NewReader(outTar(t, big)), 20); err != nil {
		t.Errorf("at the byte bound: err = %v", err)
	}
}

// streamedReport is a report as finish writes it for a command with
// changes: the out directory's tar (its batches file listing the
// batches' sizes, no files-*.tar), the batches, then the status byte.
func streamedReport(t testing.TB, status byte, batches ...[]byte) []byte {
	sizes := ""
	for _, b := range batches {
		sizes += strconv.Itoa(len(b)) + "\n"
	}
	out := tarOf(t, []entry{
		{name: "ID/", typ: tar.TypeDir, mode: 0o755},
		{name: "ID/status", typ: tar.TypeReg, data: "exit 0\n", mode: 0o644},
		{name: "ID/batches", typ: tar.TypeReg, data: sizes, mode: 0o644},
		{name: "ID/disk", typ: tar.TypeReg, data: "/work\n", mode: 0o644},
		{name: "ID/nomerge", typ: tar.TypeReg, mode: 0o644},
	})
	for _, b := range batches {
		out = append(out, b...)
	}
	return append(out, status)
}

// TestParseStreamedReport: the changed entries that follow the out
// directory's tar, batch by batch, are read as the overlay; a report
// whose status byte says a batch did not come out whole, or whose
// batches are larger than itself, is refused.
func TestParseStreamedReport(t *testing.T) {
	b1 := tarOf(t, []entry{{name: "./a", typ: tar.TypeReg, data: "A", mode: 0o644}, {name: "./d/", typ: tar.TypeDir, mode: 0o755}})
	b2 := tarOf(t, []entry{{name: "./d/b", typ: tar.TypeReg, data: "BB", mode: 0o600}})
	oc, err := parseReport(streamedReport(t, '0', b1, b2), 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range oc.overlay.Files {
		got = append(got, f.Path+"="+string(f.Data))
	}
	if want := []string{"a=A", "d=", "d/b=BB"}; !slices.Equal(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
	if oc.status != "exit 0" || oc.disk != "/work" || !oc.nomerge || oc.basefail {
		t.Errorf("outcome %+v", oc)
	}
	if oc, err := parseReport(streamedReport(t, '1', b1, b2), 0); !errors.Is(err, ErrBadOverlay) || oc == nil || oc.overlay != nil {
		t.Errorf("a batch that did not come out whole: %+v, %v; want the status without an overlay and ErrBadOverlay", oc, err)
	}
	r := streamedReport(t, '0', b1)
	r = bytes.Replace(r, []byte(strconv.Itoa(len(b1))+"\n"), []byte(strconv.Itoa(len(r))+"\n"), 1)
	if _, err := parseReport(r, 0); !errors.Is(err, ErrBadOverlay) {
		t.Errorf("batches larger than the report: %v, want ErrBadOverlay", err)
	}
}

func TestContainerDir(t *testing.T) {
	for in, want := range map[string]string{"": ".", ".": ".", "a/b/": "a/b", "a/../b": "b"} {
		if got, err := containerDir(in); err != nil || got != want {
			t.Errorf("containerDir(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"..", "../x", "a/../../x", "/abs"} {
		if _, err := containerDir(in); err == nil {
			t.Errorf("containerDir(%q) accepted", in)
		}
	}
}

// FuzzParseOutTar: the out directory is written by the same user the
// command runs as, so its tar is untrusted. Whatever it holds, the parser
// must not panic, and every path it accepts must be a clean relative path
// outside .pulse/.
func FuzzParseOutTar(f *testing.F) {
	f.Add(outTar(f, tarOf(f, []entry{{name: "./a", typ: tar.TypeReg, data: "x", mode: 0o644}})))
	f.Add(outTar(f, tarOf(f, []entry{{name: "./../a", typ: tar.TypeReg, data: "x"}})))
	f.Add(outTar(f, nil, entry{name: "ID/deleted", typ: tar.TypeReg, data: "./a\n./.pulse\n"}))
	f.Add([]byte("garbage"))
	f.Add(streamedReport(f, '0', tarOf(f, []entry{{name: "./a", typ: tar.TypeReg, data: "x", mode: 0o644}})))
	f.Fuzz(func(t *testing.T, data []byte) {
		oc, err := parseOutTar(bytes.NewReader(data), 1<<20)
		if err != nil {
			return
		}
		paths := append([]string{}, oc.overlay.Deleted...)
		for _, file := range oc.overlay.Files {
			paths = append(paths, file.Path)
		}
		for _, p := range paths {
			if c, err := cleanPath(p); err != nil || c != p || p == "" {
				t.Fatalf("accepted path %q (clean %q, %v)", p, c, err)
			}
		}
	})
}

func TestTrailerSplitter(t *testing.T) {
	marker := "\x1ePULSE-END-abc\x1e"
	for _, tc := range []struct {
		name     string
		chunks   []string
		out      string
		report   string
		complete bool
		extra    bool
	}{
		{"one write", []string{"hello\x1eworld" + marker + "3\nTAR"}, "hello\x1eworld", "TAR", true, false},
		{"marker split", []string{"out\x1ePUL", "SE-END-a", "bc\x1e3", "\nT", "AR"}, "out", "TAR", true, false},
		{"report not yet whole", []string{"o" + marker + "5\nTAR"}, "o", "", false, false},
		{"bytes after the report", []string{marker + "1\nXY"}, "", "X", true, true},
		{"near miss", []string{"a\x1ePULSE-END-abd\x1e", "b"}, "a\x1ePULSE-END-abd\x1eb", "", false, false},
		{"held tail flushed", []string{"x\x1ePULSE"}, "x\x1ePULSE", "", false, false},
	} {
		var out bytes.Buffer
		s := newSplitter(marker, &out, true)
		for _, c := range tc.chunks {
			if n, err := s.Write([]byte(c)); n != len(c) || err != nil {
				t.Fatalf("%s: Write = %d, %v", tc.name, n, err)
			}
		}
		s.flush()
		if out.String() != tc.out || string(s.report()) != tc.report || s.complete() != tc.complete || s.extra != tc.extra {
			t.Errorf("%s: out %q report %q complete %v extra %v; want %q %q %v %v", tc.name, out.String(), s.report(), s.complete(), s.extra, tc.out, tc.report, tc.complete, tc.extra)
		}
	}
	s := newSplitter(marker, io.Discard, true)
	s.Write([]byte(marker + "99999999999999999999\n"))
	if !s.overflow {
		t.Error("an unreadable report size was not flagged")
	}
	e := newSplitter("\x1eERR\x1e", io.Discard, false)
	e.Write([]byte("warning\x1eERR\x1e"))
	if !e.complete() || e.extra {
		t.Errorf("stderr splitter: complete %v extra %v", e.complete(), e.extra)
	}
}

// parseNewline keeps the entries changed at or after the mark (all of
// them when the clock went back), and fails closed on a forged list.
func TestParseNewline(t *testing.T) {
	const m0 = "1|2026-01-01 00:00:10.000000000 +0000\n"
	const m1 = "1|2026-01-01 00:00:20.000000000 +0000\n"
	rec := func(z, name string) string { return z + "|regular file|" + name + "\n\x00" }
	old := rec("2026-01-01 00:00:09.000000000 +0000", "./o\nld")
	nu := rec("2026-01-01 00:00:10.000000000 +0000", "./d/n|e\nw")
	fs1, err := parseNewline([]byte(m0 + m1 + "\x00" + old + nu))
	if err != nil || len(fs1) != 1 || fs1[0].Path != "d/n|e\nw" || fs1[0].Mode != fs.ModeIrregular {
		t.Errorf("got %+v, %v; want d/n|e\\nw alone", fs1, err)
	}
	back, err := parseNewline([]byte(m1 + m0 + "\x00" + old + nu))
	if err != nil || len(back) != 2 {
		t.Errorf("clock gone back: got %+v, %v; want both", back, err)
	}
	for _, bad := range []string{
		"",
		m0 + m1 + "\x00" + rec("2026-01-01 00:00:11.000000000 +0000", "./plain"),
		m0 + m1 + "\x00" + rec("2026-01-01 00:00:11.000000000 +0000", "./../x\ny"),
		m0 + m1 + "\x00" + rec("2026-01-01 00:00:11.000000000 +0000", "./.pulse/x\ny"),
		m0 + m1 + "\x00" + "2026|./x\ny",
	} {
		if _, err := parseNewline([]byte(bad)); !errors.Is(err, ErrBadOverlay) {
			t.Errorf("parseNewline(%q) = %v, want ErrBadOverlay", bad, err)
		}
	}
}

// parseOutTar is parseReport of a report read from r.
func parseOutTar(r io.Reader, maxBytes int64) (*outcome, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return parseReport(b, maxBytes)
}

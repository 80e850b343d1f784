package boxrt

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func lines(t *testing.T, p string) []string {
	t.Helper()
	b, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	l := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	slices.Sort(l)
	return l
}

// mark makes a mark file a few clock ticks after everything before it,
// as the wrapper does, so that ctimes tell before from after.
func mark(t *testing.T, p string) {
	t.Helper()
	time.Sleep(30 * time.Millisecond)
	if err := touch(p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
}

// A command's changes, removals and type changes are what capture lists,
// and nothing it left alone.
func TestCaptureListsWhatChanged(t *testing.T) {
	dir := t.TempDir()
	r, q, o := filepath.Join(dir, "r"), filepath.Join(dir, "q"), filepath.Join(dir, "o")
	if err := os.Mkdir(o, 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, r+"/same", "s")
	write(t, r+"/edit", "e")
	write(t, r+"/gone/f", "g")
	write(t, r+"/todir", "x")
	write(t, r+"/.pulse/x", "never listed")
	if err := fullman(r, q+".before"); err != nil {
		t.Fatal(err)
	}
	mark(t, q+".m0")
	write(t, r+"/edit", "E")
	write(t, r+"/new/n", "n")
	if err := os.RemoveAll(r + "/gone"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(r + "/todir"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(r+"/todir", 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, r+"/.pulse/y", "never listed")
	mark(t, q+".m1")
	if err := capture(r, q, o, q+".before"); err != nil {
		t.Fatal(err)
	}
	if got, want := lines(t, q+".changed"), []string{"./edit", "./new", "./new/n", "./todir"}; !slices.Equal(got, want) {
		t.Errorf("changed %q, want %q", got, want)
	}
	if got, want := lines(t, o+"/deleted"), []string{"./gone", "./gone/f"}; !slices.Equal(got, want) {
		t.Errorf("deleted %q, want %q", got, want)
	}
	if got, want := lines(t, q+".removed"), []string{"./gone", "./gone/f", "./todir"}; !slices.Equal(got, want) {
		t.Errorf("removed %q, want %q", got, want)
	}
	if n := len(lines(t, q+".new")); n != 4 {
		t.Errorf("%d new manifest lines, want 4", n)
	}
}

// When nothing changed since the mark, capture says so without reading
// the manifest at all (here there is none to read).
func TestCaptureUntouchedCopyReadsNoManifest(t *testing.T) {
	dir := t.TempDir()
	r, q, o := filepath.Join(dir, "r"), filepath.Join(dir, "q"), filepath.Join(dir, "o")
	write(t, r+"/a/b", "b")
	mark(t, q+".m0")
	mark(t, q+".m1")
	if err := capture(r, q, o, filepath.Join(dir, "absent")); err != nil {
		t.Fatalf("capture of an untouched copy: %v", err)
	}
	write(t, r+"/a/c", "c")
	if err := capture(r, q, o, filepath.Join(dir, "absent")); err == nil {
		t.Fatal("a changed copy was captured without its manifest")
	}
}

// A second link to a file is refused (the caller breaks the links), and
// a directory whose name holds a newline fails the capture once it has
// entries, but is listed apart while empty.
func TestCaptureLinksAndNewlines(t *testing.T) {
	dir := t.TempDir()
	r, q, o := filepath.Join(dir, "r"), filepath.Join(dir, "q"), filepath.Join(dir, "o")
	if err := os.Mkdir(o, 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, r+"/a", "a")
	if err := fullman(r, q+".before"); err != nil {
		t.Fatal(err)
	}
	mark(t, q+".m0")
	if err := os.Link(r+"/a", r+"/b"); err != nil {
		t.Fatal(err)
	}
	mark(t, q+".m1")
	if err := capture(r, q, o, q+".before"); err != errLinks {
		t.Fatalf("capture with a hard link: %v, want errLinks", err)
	}
	if err := os.Remove(r + "/b"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(r+"/x\ny", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := capture(r, q, o, q+".before"); err != nil {
		t.Fatal(err)
	}
	nl, err := os.ReadFile(o + "/newline")
	if err != nil || !strings.Contains(string(nl), "|directory|./x\ny\n\x00") {
		t.Errorf("newline list %q, %v", nl, err)
	}
	if _, err := os.Stat(q + ".bad"); err != nil {
		t.Errorf("a copy with a newline name is kept: %v", err)
	}
	write(t, r+"/x\ny/f", "f")
	if err := capture(r, q, o, q+".before"); err != errNewlineDir {
		t.Fatalf("capture with entries under a newline name: %v, want errNewlineDir", err)
	}
}

// mfupdate drops what is gone and beneath it, puts in what is new, moves
// the generation on and says how (delta); mdiff lists what brings a
// copy to base.
func TestMfupdateAndMdiff(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	write(t, base+"/d/f", "f")
	write(t, base+"/k", "k")
	man := filepath.Join(dir, "man")
	if err := fullman(base, man); err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(dir, "copy.man")
	old, _ := os.ReadFile(man)
	if err := os.WriteFile(cp, old, 0o600); err != nil {
		t.Fatal(err)
	}
	write(t, base+"/n", "n")
	add, err := treeManifest(base, true)
	if err != nil {
		t.Fatal(err)
	}
	writeLines(dir+"/gone", []string{"./d"})
	writeLines(dir+"/new", []string{add.lines["./n"] + " ./n"})
	if err := mfupdate(man, dir+"/gone", dir+"/new", dir+"/delta"); err != nil {
		t.Fatal(err)
	}
	m, err := readManifest(man)
	if err != nil {
		t.Fatal(err)
	}
	if m.gen != 2 || !slices.Equal(m.names, []string{"./k", "./n"}) {
		t.Errorf("manifest gen %d names %q", m.gen, m.names)
	}
	if got := lines(t, dir+"/delta.drop"); !slices.Equal(got, []string{"./d", "./n", "G1 G2"}) {
		t.Errorf("drop %q", got)
	}
	if err := mdiff(man, cp, dir+"/drop", dir+"/fix"); err != nil {
		t.Fatal(err)
	}
	if got := lines(t, dir+"/drop"); !slices.Equal(got, []string{"./d"}) {
		t.Errorf("mdiff drop %q", got)
	}
	if got := lines(t, dir+"/fix"); !slices.Equal(got, []string{"./n"}) {
		t.Errorf("mdiff fix %q", got)
	}
}

// A manifest line names one entry whatever its name holds (spaces, the
// separators of other formats); parseLine never takes another's part.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{"81a4 d41d8cd98f00b204e9800998ecf8427e ./a b", "41ed - ./d", "a1ff 2e2f78 ./l -> x", "", "G1", "zz - ./a", "41ed - a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, l string) {
		name, sig, ok := parseLine(l)
		if !ok {
			return
		}
		if sig+" "+name != l || !strings.HasPrefix(name, "./") {
			t.Fatalf("%q parsed as %q %q", l, sig, name)
		}
		_ = sigMode(sig)
	})
}

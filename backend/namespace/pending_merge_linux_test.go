package namespace

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

func pfile(p, data string) backend.PendingEntry {
	return backend.PendingEntry{Path: p, Kind: backend.PendingFile, Mode: 0o644, Size: int64(len(data)),
		Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader([]byte(data))), nil }}
}

func pdir(p string) backend.PendingEntry {
	return backend.PendingEntry{Path: p, Kind: backend.PendingDir, Mode: 0o755}
}

func pgone(p string) backend.PendingEntry {
	return backend.PendingEntry{Path: p, Kind: backend.PendingDeleted}
}

func mergedDirs(t *testing.T, b *Backend) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(b.o.stateDir, layersDir))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "merged-") {
			n++
		}
	}
	return n
}

// A run of mergeRun layers is mounted as one directory with the effect of
// the run; a run that would need an opaque directory is mounted layer by
// layer. Either way the command sees the same stack.
func TestPendingLayersMerged(t *testing.T) {
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "old.txt"), "old\n")
	writeFile(t, filepath.Join(ws, "dir/x"), "x\n")
	writeFile(t, filepath.Join(ws, "d/old"), "old\n")
	layers := func(unsafe bool) *backend.Pending {
		var p backend.Pending
		for i := range mergeRun + 8 {
			l := backend.PendingLayer{ID: fmt.Sprintf("t-%v-%d", unsafe, i)}
			l.Entries = append(l.Entries, pfile("f.txt", fmt.Sprint(i)), pdir("g"), pfile(fmt.Sprintf("g/%d.txt", i), "g"))
			switch i {
			case 2:
				l.Entries = append(l.Entries, pgone("d"))
			case 3:
				l.Entries = append(l.Entries, pgone("old.txt"))
			case 4:
				if unsafe {
					// d made again after its deletion: over the
					// workspace's d it must be opaque.
					l.Entries = append(l.Entries, pdir("d"), pfile("d/new", "new\n"))
				}
			case 10:
				l.Entries = append(l.Entries, pfile("dir", "file now\n"))
			}
			p.Layers = append(p.Layers, l)
		}
		for i := range p.Layers {
			l := &p.Layers[i]
			sortEntries(l.Entries)
		}
		p.View = []backend.PendingEntry{pfile("f.txt", fmt.Sprint(mergeRun+7))}
		return &p
	}
	for _, unsafe := range []bool{false, true} {
		b := newBackend(t)
		want := fmt.Sprintf("%d\n%d\ngone\nfile now\n", mergeRun+7, mergeRun+8)
		script := "cat f.txt; echo; ls g | wc -l; test ! -e old.txt && echo gone; cat dir"
		if unsafe {
			script += "; cat d/new; ls d"
			want += "new\nnew\n"
		} else {
			script += "; test ! -e d && echo nod"
			want += "nod\n"
		}
		res, out, errs := runCmd(t, b, &backend.Request{Workspace: ws, Shell: script, Pending: layers(unsafe)})
		if res.ExitCode != 0 || out != want {
			t.Fatalf("unsafe=%v: exit %d, stdout %q, want %q\nstderr %s", unsafe, res.ExitCode, out, want, errs)
		}
		// Safe: layers 0-31 merged. Unsafe: every run holding layers 2
		// and 4 is refused, and 3-34 merged (d's whiteout in layer 2
		// stays beneath it, as it must).
		if n := mergedDirs(t, b); n != 1 {
			t.Errorf("unsafe=%v: %d merged directories, want 1", unsafe, n)
		}
	}
	p := layers(true)
	if _, ok := mergeLayers(p.Layers[2:5]); ok {
		t.Error("a directory over a whiteout of a layer below was merged")
	}
	if _, ok := mergeLayers([]backend.PendingLayer{{ID: "a", Entries: []backend.PendingEntry{pfile("x", "f")}},
		{ID: "b", Entries: []backend.PendingEntry{pdir("x"), pfile("x/y", "y")}}}); ok {
		t.Error("a directory over a file of a layer below was merged")
	}
	m, ok := mergeLayers(p.Layers[5:9])
	if !ok || len(m.Entries) != 6 { // f.txt, g, g/5..8.txt
		t.Errorf("merge of four plain layers: %v %+v", ok, m)
	}
}

func sortEntries(es []backend.PendingEntry) {
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && es[j].Path < es[j-1].Path; j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}

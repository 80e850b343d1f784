package backend

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The tree a copying backend lays out is WalkBase's entries plus Shown's:
// every path exactly once, the view winning where it decides.
func TestPendingWalkBaseAndShown(t *testing.T) {
	ws := t.TempDir()
	for _, d := range []string{".pulse/cow", "keep/sub", "gone/sub", "merged", "secret/in", "asfile"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"a.txt", "keep/sub/f", "gone/sub/f", "merged/base.txt", "merged/over.txt", "secret/in/f", "asfile/x"} {
		if err := os.WriteFile(filepath.Join(ws, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pend := &Pending{View: []PendingEntry{
		{Path: "asfile", Kind: PendingFile},  // a file over a workspace directory
		{Path: "gone", Kind: PendingDeleted}, // with all beneath it
		{Path: "merged", Kind: PendingDir},   // walked into: base.txt shows through
		{Path: "merged/new", Kind: PendingSymlink, Target: "base.txt"},
		{Path: "merged/over.txt", Kind: PendingFile},
		{Path: "new/dir", Kind: PendingDir},   // beneath nothing in the workspace
		{Path: "secret/p", Kind: PendingFile}, // hidden with its directory
	}}
	hidden := map[string]bool{"secret": true}
	var base []string
	err := pend.WalkBase(ws, hidden, func(rel, _ string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base = append(base, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a.txt", "keep", "keep/sub", "keep/sub/f", "merged/base.txt"}; !slices.Equal(base, want) {
		t.Errorf("WalkBase: %q, want %q", base, want)
	}
	var shown []string
	for _, e := range pend.Shown(hidden) {
		shown = append(shown, e.Path)
	}
	if want := []string{"asfile", "merged", "merged/new", "merged/over.txt", "new/dir"}; !slices.Equal(shown, want) {
		t.Errorf("Shown: %q, want %q", shown, want)
	}
	// No view: the workspace minus the hidden and reserved paths.
	var none *Pending
	base = nil
	if err := none.WalkBase(ws, hidden, func(rel, _ string, _ fs.DirEntry, _ error) error {
		base = append(base, rel)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(base) != 12 || slices.Contains(base, "secret") || slices.Contains(base, ".pulse") {
		t.Errorf("WalkBase of no view: %q", base)
	}
	if got := none.Shown(hidden); got != nil {
		t.Errorf("Shown of no view: %v", got)
	}
}

package cowfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestSyncTogetherReportsAnyFailure: the fsyncs run at once, and a
// failure of any one of them (here a file already closed, wherever it is
// in the list) fails the whole, so that the caller never renames or
// records what one of them did not make durable.
func TestSyncTogetherReportsAnyFailure(t *testing.T) {
	dir := t.TempDir()
	open := func(name string) *os.File {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	a, b, c := open("a"), open("b"), open("c")
	if err := syncTogether(a, b, c); err != nil {
		t.Fatalf("all open: %v", err)
	}
	for i := range 3 {
		files := []*os.File{open("x"), open("y"), open("z")}
		files[i].Close()
		if err := syncTogether(files...); !errors.Is(err, os.ErrClosed) {
			t.Errorf("file %d closed: got %v, want an error wrapping os.ErrClosed", i, err)
		}
	}
	d := open("d")
	d.Close()
	if err := syncTogether(d); !errors.Is(err, os.ErrClosed) {
		t.Errorf("one closed file: got %v", err)
	}
}

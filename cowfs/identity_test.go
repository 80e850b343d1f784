package cowfs

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// rewriteDev adds delta to every recorded device number in a record
// file (stage log, WAL or after-images), as if the file system had come
// back under another device number. That is the seam this test uses:
// remounting a loop image under another number needs a second free loop
// device, which CI does not promise; what cowfs sees is the same either
// way, the recorded st_dev differing from the live one.
func rewriteDev(t *testing.T, p string, delta uint64) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	frames, _, err := decodeFrames(b)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for _, fr := range frames {
		// Numbers stay json.Number: mtimes in ns do not fit a float64.
		var v map[string]any
		dec := json.NewDecoder(bytes.NewReader(fr))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		bump(v, delta)
		nb, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out = appendFrame(out, nb)
	}
	if err := os.WriteFile(p, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

func bump(v any, delta uint64) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if d, ok := e.(json.Number); ok && k == "dev" {
				n, _ := strconv.ParseUint(string(d), 10, 64)
				x[k] = n + delta
				continue
			}
			bump(e, delta)
		}
	case []any:
		for _, e := range x {
			bump(e, delta)
		}
	}
}

// TestDeviceNumberChangeIsNoConflict: a pending transaction whose files
// were recorded under another device number commits, and a commit
// interrupted mid-way rolls forward instead of being quarantined.
func TestDeviceNumberChangeIsNoConflict(t *testing.T) {
	t.Run("pending", func(t *testing.T) {
		fx := newCrashFixture(t)
		rewriteDev(t, filepath.Join(fx.ws, StateDir, "tx", fx.id, "stage.log"), 7)
		f := openFS(t, fx.ws)
		tx, err := f.Tx(t.Context(), fx.id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Commit(context.Background()); err != nil {
			t.Fatalf("Commit after a device number change: %v", err)
		}
		fx.checkAllNew(t)
	})
	t.Run("mid-commit", func(t *testing.T) {
		fx := newCrashFixture(t)
		fx.crashAt(t, fpApplyRenamed, 20)
		rewriteDev(t, filepath.Join(fx.ws, StateDir, "tx", fx.id, "wal"), 7)
		f := openFS(t, fx.ws)
		if err := f.RecoveryErr(); err != nil {
			t.Fatalf("recovery after a device number change: %v", err)
		}
		fx.checkAllNew(t)
	})
	t.Run("undo", func(t *testing.T) {
		fx := newCrashFixture(t)
		f := openFS(t, fx.ws)
		tx, _ := f.Tx(t.Context(), fx.id)
		if _, err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		after, _ := filepath.Glob(filepath.Join(fx.ws, StateDir, "done", "*", "after"))
		rewriteDev(t, after[0], 7)
		if _, err := f.Undo(context.Background()); err != nil {
			t.Fatalf("Undo after a device number change: %v", err)
		}
		fx.checkAllOld(t)
	})
}

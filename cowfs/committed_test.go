package cowfs

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestCommittedSince: the commits that finished after a moment are listed
// oldest first with the paths each changed, and the list says it is not
// whole once commits after that moment may have been pruned from the
// undo history.
func TestCommittedSince(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws, WithUndoDepth(3))
	commit := func(paths ...string) string {
		t.Helper()
		tx, err := f.Begin(t.Context(), fmt.Sprint(paths))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			if err := tx.Write(t.Context(), p, []byte(p), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
		return tx.ID()
	}
	commit("before")
	mark := time.Now()
	a := commit("d/x", "y")
	b := commit("z")
	got, whole, err := f.CommittedSince(t.Context(), mark)
	if err != nil || !whole {
		t.Fatalf("CommittedSince: whole %v, err %v", whole, err)
	}
	if len(got) != 2 || got[0].ID != a || got[1].ID != b || !got[0].At.After(mark) {
		t.Fatalf("CommittedSince = %+v, want %s then %s", got, a, b)
	}
	if want := []string{"d", "d/x", "y"}; !slices.Equal(slices.Sorted(slices.Values(got[0].Paths)), want) {
		t.Errorf("paths of %s = %v, want %v", a, got[0].Paths, want)
	}
	if got, whole, err := f.CommittedSince(t.Context(), time.Now()); err != nil || !whole || len(got) != 0 {
		t.Errorf("since now: %+v, whole %v, err %v", got, whole, err)
	}
	// Two more commits prune "before" and a: the three kept all finished
	// after mark, so one before them may be missing.
	commit("w")
	commit("v")
	got, whole, err = f.CommittedSince(t.Context(), mark)
	if err != nil || whole || len(got) != 3 || got[0].ID != b {
		t.Fatalf("after pruning: %+v, whole %v, err %v", got, whole, err)
	}
}

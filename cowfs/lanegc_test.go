package cowfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func laneExists(t *testing.T, ws, id string) bool {
	t.Helper()
	_, err := os.Lstat(filepath.Join(ws, StateDir, "lanes", id))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// A lane's record stays while the lane has pending transactions of its
// own, a lane forked from it, or an FS open on it (or on the lane that
// forked it); it goes once none of these holds, and then the lane can no
// longer be opened.
func TestLaneRecordRemovedWhenUnused(t *testing.T) {
	ws := newWS(t)
	ctx := t.Context()
	f := openFS(t, ws)
	stageCmd(t, f, "base", WriteOp("s.txt", []byte("s"), 0o644))
	x, err := f.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The forking FS keeps the new lane until the FS meant for it opens,
	// whoever sweeps meanwhile.
	other := openFS(t, ws)
	if _, err := other.Lanes(ctx); err != nil {
		t.Fatal(err)
	}
	if !laneExists(t, ws, x) {
		t.Fatal("a lane just forked was removed before it was opened")
	}
	fx := openFS(t, ws, WithLane(x))
	own := stageCmd(t, fx, "fork's", WriteOp("f.txt", []byte("f"), 0o644))
	y, err := fx.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fy := openFS(t, ws, WithLane(y))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fx.Close(); err != nil {
		t.Fatal(err)
	}
	if !laneExists(t, ws, x) || !laneExists(t, ws, y) {
		t.Fatal("a lane with pending transactions, or a child lane, lost its record")
	}
	// x's own transaction goes (discarded from the default lane): x is
	// still needed by y, which is open.
	tx, err := other.Tx(ctx, own)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Discard(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lanes(ctx); err != nil {
		t.Fatal(err)
	}
	if !laneExists(t, ws, x) || !laneExists(t, ws, y) {
		t.Fatal("the parent of an open lane, or the open lane, lost its record")
	}
	// y closes with nothing pending: y goes, and then x, which only y
	// needed.
	if err := fy.Close(); err != nil {
		t.Fatal(err)
	}
	if laneExists(t, ws, x) || laneExists(t, ws, y) {
		t.Fatalf("unused lanes kept: x %v, y %v", laneExists(t, ws, x), laneExists(t, ws, y))
	}
	if _, err := Open(ctx, ws, WithLane(y)); !errors.Is(err, ErrLane) {
		t.Fatalf("open on a removed lane: %v", err)
	}
	if got := stack(t, other); len(got.Txs) != 1 || seen(t, got, "s.txt") != "s" {
		t.Fatalf("default lane after the lanes went: %v", ids(got))
	}
	if ls, err := other.Lanes(ctx); err != nil || len(ls) != 0 {
		t.Fatalf("lanes: %+v %v", ls, err)
	}
}

// Nothing is removed while a pending transaction cannot be read: it may
// be the lane's.
func TestLaneRecordKeptBesideDamagedTx(t *testing.T) {
	ws := newWS(t)
	ctx := t.Context()
	f := openFS(t, ws)
	bad := stageCmd(t, f, "bad", WriteOp("b", []byte("b"), 0o644))
	x, err := f.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fx := openFS(t, ws, WithLane(x))
	log := filepath.Join(ws, StateDir, "tx", bad, "stage.log")
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0xff
	if err := os.WriteFile(log, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fx.Close()
	g := openFS(t, ws)
	if _, err := g.Lanes(ctx); err != nil {
		t.Fatal(err)
	}
	if !laneExists(t, ws, x) {
		t.Fatal("a lane record was removed while a pending transaction could not be read")
	}
}

package cowfs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// TestLaneHelperProcess is the process TestLaneKeptWhileOpenInAnotherProcess
// opens a lane in; it runs only when re-executed by that test.
func TestLaneHelperProcess(t *testing.T) {
	ws, lane := os.Getenv("PULSE_COWFS_LANE_WS"), os.Getenv("PULSE_COWFS_LANE")
	if ws == "" {
		t.Skip("helper process for the lane record tests; runs only when re-executed by them")
	}
	f, err := Open(t.Context(), ws, WithLane(lane))
	if err != nil {
		fmt.Println(err)
		os.Exit(4)
	}
	defer f.Close()
	fmt.Println("open")
	select {} // until killed
}

// An FS open on a lane in another process keeps its record; once that
// process is killed (no Close), the kernel drops its flock and the next
// sweep removes the record.
func TestLaneKeptWhileOpenInAnotherProcess(t *testing.T) {
	ws := newWS(t)
	ctx := t.Context()
	f := openFS(t, ws)
	x, err := f.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLaneHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PULSE_COWFS_LANE_WS="+ws, "PULSE_COWFS_LANE="+x)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "open\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
	f.Close() // the forking FS lets go: only the other process holds x now
	g := openFS(t, ws)
	if _, err := g.Lanes(ctx); err != nil {
		t.Fatal(err)
	}
	if !laneExists(t, ws, x) {
		t.Fatal("a lane open in another process lost its record")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := g.Lanes(ctx); err != nil {
		t.Fatal(err)
	}
	if laneExists(t, ws, x) {
		t.Fatal("the record of a lane whose only holder was killed was kept")
	}
}

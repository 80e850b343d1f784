package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/cowfs"
)

// The CLI works on the default lane; --lane shows and commits a fork's
// stack, list names each transaction's lane, lanes lists the forks.
func TestCowLanes(t *testing.T) {
	ws := t.TempDir()
	f, err := cowfs.Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	stage := func(f *cowfs.FS, ops ...cowfs.Op) string {
		tx, err := f.Begin(t.Context(), "cmd")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Stage(context.Background(), ops); err != nil {
			t.Fatal(err)
		}
		return tx.ID()
	}
	shared := stage(f, cowfs.WriteOp("s.txt", []byte("shared\n"), 0o644))
	lane, err := f.Fork(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	g, err := cowfs.Open(t.Context(), ws, cowfs.WithLane(lane))
	if err != nil {
		t.Fatal(err)
	}
	own := stage(g, cowfs.WriteOp("f.txt", []byte("fork\n"), 0o644))
	stage(f, cowfs.WriteOp("p.txt", []byte("parent\n"), 0o644))
	g.Close()
	f.Close()

	code, out, errOut := runCLI(t, "cow", "lanes", "--json", "--workspace", ws)
	var lanes []cowfs.LaneInfo
	if code != exitOK || json.Unmarshal([]byte(out), &lanes) != nil || len(lanes) != 1 || lanes[0].ID != lane {
		t.Fatalf("lanes: %d %q %s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "cow", "list", "--json", "--workspace", ws)
	var infos []cowfs.TxInfo
	if code != exitOK || json.Unmarshal([]byte(out), &infos) != nil || len(infos) != 3 {
		t.Fatalf("list: %d %q", code, out)
	}
	for _, i := range infos {
		if (i.ID == own) != (i.Lane == lane) {
			t.Errorf("list: %s has lane %q", i.ID, i.Lane)
		}
	}
	if code, out, _ := runCLI(t, "cow", "list", "--workspace", ws); code != exitOK || !strings.Contains(out, "[lane "+lane+"]") {
		t.Errorf("list text does not name the lane: %q", out)
	}
	code, out, _ = runCLI(t, "cow", "diff", "--workspace", ws)
	if code != exitOK || !strings.Contains(out, "+parent") || strings.Contains(out, "+fork") {
		t.Fatalf("default lane's stack diff: %q", out)
	}
	code, out, _ = runCLI(t, "cow", "diff", "--lane", lane, "--workspace", ws)
	if code != exitOK || !strings.Contains(out, "+fork") || !strings.Contains(out, "+shared") || strings.Contains(out, "+parent") {
		t.Fatalf("fork's stack diff: %q", out)
	}
	if code, out, _ := runCLI(t, "cow", "diff", own, "--workspace", ws); code != exitOK || !strings.Contains(out, "+fork") {
		t.Fatalf("diff of the fork's transaction by id: %q", out)
	}
	if code, _, _ := runCLI(t, "cow", "list", "--lane", lane, "--workspace", ws); code != exitUsage {
		t.Errorf("--lane on list: exit %d, want %d", code, exitUsage)
	}
	if code, _, errOut := runCLI(t, "cow", "diff", "--lane", "0123456789abcdef", "--workspace", ws); code != exitFailure {
		t.Errorf("an unknown lane: exit %d %s", code, errOut)
	}
	code, out, errOut = runCLI(t, "cow", "commit", "--all", "--lane", lane, "--json", "--workspace", ws)
	if code != exitOK || !strings.Contains(out, shared) || !strings.Contains(out, own) {
		t.Fatalf("commit --all --lane: %d %q %s", code, out, errOut)
	}
	for p, want := range map[string]string{"s.txt": "shared\n", "f.txt": "fork\n"} {
		if b, _ := os.ReadFile(filepath.Join(ws, p)); string(b) != want {
			t.Errorf("%s = %q", p, b)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, "p.txt")); !os.IsNotExist(err) {
		t.Error("the fork's commit --all landed the parent's transaction")
	}
}

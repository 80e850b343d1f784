package cowfs

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/pathguard"
)

// The rule is pathguard.CheckLinkTarget (its tests hold the cases); cowfs
// refuses what it refuses, as ErrInvalidPath.
func TestLinkTargetRule(t *testing.T) {
	for _, c := range []struct {
		rel, target string
		ok          bool
	}{
		{"bin/link", "../mod.txt", true},
		{"a/b/l", "../../..", false},
		{"esc", "a/b/l/../outside.txt", false},
		{"sub/link", "../.PULSE/cow", false},
	} {
		err := checkLinkTarget(c.rel, c.target)
		if c.ok && err != nil {
			t.Errorf("checkLinkTarget(%q, %q) = %v, want nil", c.rel, c.target, err)
		}
		if !c.ok && (!errors.Is(err, ErrInvalidPath) || !errors.Is(err, pathguard.ErrLinkTarget)) {
			t.Errorf("checkLinkTarget(%q, %q) = %v, want ErrInvalidPath and pathguard.ErrLinkTarget", c.rel, c.target, err)
		}
	}
}

// deepLinkOps is the escape a lexical check let through: a link to the
// workspace root twelve directories down, then a link whose target
// lexically cleans to a workspace path but, resolved by the kernel,
// climbs from the root through the first link and out to the host.
func deepLinkOps() (link Op, escapes []Op) {
	dirs := make([]string, 12)
	for i := range dirs {
		dirs[i] = "d" + string(rune('a'+i))
	}
	deep := strings.Join(dirs, "/")
	up := strings.TrimSuffix(strings.Repeat("../", 12), "/")
	link = SymlinkOp(up, deep+"/l")
	escapes = []Op{
		SymlinkOp(deep+"/l/"+up+"/etc/passwd", "pw"),
		SymlinkOp(deep+"/l/../outside.txt", "esc"),
	}
	return link, escapes
}

func TestSymlinkThroughLinkCannotLeaveWorkspace(t *testing.T) {
	parent, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(parent, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, parent, "outside.txt", "HOST FILE", 0o644)
	f := openFS(t, ws)
	tx, err := f.Begin(t.Context(), "links")
	if err != nil {
		t.Fatal(err)
	}
	link, escapes := deepLinkOps()
	errs, err := tx.Stage(context.Background(), append([]Op{link}, escapes...))
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil {
		t.Fatalf("link to the workspace root refused: %v", errs[0])
	}
	for i, op := range escapes {
		if !errors.Is(errs[i+1], ErrInvalidPath) {
			t.Errorf("Stage(%s -> %q) = %v, want ErrInvalidPath", op.Path, op.Target, errs[i+1])
		}
		if err := tx.Symlink(t.Context(), op.Target, op.Path); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("Symlink(%q, %q) = %v, want ErrInvalidPath", op.Target, op.Path, err)
		}
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The allowed link leads to the workspace root, no further.
	got, err := os.Stat(filepath.Join(ws, link.Path))
	if err != nil {
		t.Fatal(err)
	}
	root, _ := os.Stat(ws)
	if !os.SameFile(got, root) {
		t.Errorf("%s does not resolve to the workspace root", link.Path)
	}
	for _, op := range escapes {
		if b, err := os.ReadFile(filepath.Join(ws, op.Path)); err == nil {
			t.Errorf("%s was committed and reads %.20q", op.Path, b)
		}
	}
}

// A stage log is a file anyone with access to .pulse/cow can append to;
// Commit must not trust that its links were checked when staged.
func TestCommitRechecksStagedLinkTargets(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "keep.txt", "x", 0o644)
	f := openFS(t, ws)
	tx, err := f.Begin(t.Context(), "tampered")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Symlink(t.Context(), "keep.txt", "ok"); err != nil {
		t.Fatal(err)
	}
	before := snapshotTree(t, ws)
	p, err := json.Marshal(stageRec{Op: "set", Change: &change{Path: "esc", Kind: KindSymlink, Target: "ok/../../x"}})
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(ws, StateDir, "tx", tx.ID(), "stage.log")
	lf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lf.Write(appendFrame(nil, p)); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	if _, err := tx.Commit(context.Background()); !errors.Is(err, ErrInvalidPath) {
		t.Fatalf("Commit with a tampered link = %v, want ErrInvalidPath", err)
	}
	if after := snapshotTree(t, ws); !equalTrees(before, after) {
		t.Errorf("a refused commit changed the workspace:\n%v\n%v", before, after)
	}
	if _, err := os.Lstat(filepath.Join(ws, "ok")); err == nil {
		t.Error("a refused commit wrote part of the transaction")
	}
}

// Recovery re-checks the links of a WAL as Commit does, and quarantines
// a WAL holding one the rule refuses.
func TestRecoveryQuarantinesEscapingLinkTarget(t *testing.T) {
	for _, target := range []string{"newdir/../../x", "/etc/passwd", "../x", "a/.pulse/cow"} {
		t.Run(target, func(t *testing.T) {
			fx := newCrashFixture(t)
			fx.crashAt(t, fpWALSynced, 1)
			walPath := filepath.Join(fx.ws, StateDir, "tx", fx.id, "wal")
			b, err := os.ReadFile(walPath)
			if err != nil {
				t.Fatal(err)
			}
			w, err := decodeWAL(b)
			if err != nil {
				t.Fatal(err)
			}
			w.Ops = append(w.Ops, walOp{change: change{Path: "zz-link", Kind: KindSymlink, Target: target}})
			bad, err := encodeWAL(w)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(walPath, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			fx.checkQuarantined(t, bad)
			if _, err := os.Lstat(filepath.Join(fx.ws, "zz-link")); err == nil {
				t.Fatal("the refused link was written")
			}
		})
	}
}

// A WAL that creates entries beneath a path it turns into a symlink
// would write them wherever the link points, and their ".." would climb
// from there: decoding refuses it.
func TestWALCreatingBeneathALinkIsRefused(t *testing.T) {
	ops := []walOp{
		{change: change{Path: "a", Kind: KindSymlink, Target: "."}},
		{change: change{Path: "a/b", Kind: KindMkdir, Mode: 0o755}},
		{change: change{Path: "a/b/l", Kind: KindSymlink, Target: "../.."}},
	}
	b, err := encodeWAL(&walFile{ID: "0123456789abcdef", Created: 1, Ops: ops})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeWAL(b); !errors.Is(err, errCorrupt) {
		t.Fatalf("decodeWAL = %v, want errCorrupt", err)
	}
	// Deleting beneath a path replaced by a link is what replacing a
	// directory by a link means, and stays valid.
	ops[1] = walOp{change: change{Path: "a/b", Kind: KindDelete, Before: snapshot{Type: typeDir}}}
	b, err = encodeWAL(&walFile{ID: "0123456789abcdef", Created: 1, Ops: ops[:2]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeWAL(b); err != nil {
		t.Fatalf("decodeWAL of a directory replaced by a link: %v", err)
	}
}

// Undo gives back a link the workspace held before, even one the rule
// would refuse to stage (an absolute link into a toolchain, say).
func TestUndoRestoresReplacedLinkOfAnyTarget(t *testing.T) {
	ws := newWS(t)
	const target = "/usr/bin/python3"
	if err := os.Symlink(target, filepath.Join(ws, "py")); err != nil {
		t.Fatal(err)
	}
	f := openFS(t, ws)
	tx, err := f.Begin(t.Context(), "replace link")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(t.Context(), "py", []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Undo(context.Background()); err != nil {
		t.Fatalf("Undo: %v", err)
	}
	if got, err := os.Readlink(filepath.Join(ws, "py")); err != nil || got != target {
		t.Fatalf("after undo py -> %q, %v; want %q", got, err, target)
	}
}

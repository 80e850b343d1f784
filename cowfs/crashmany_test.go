package cowfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// richTx stages, in workspace ws, a commit with every kind of change:
// files modified, created (some in new directories) and deleted, a
// directory renamed (its tree deleted and created under the new name),
// mode changes with and without new content, a directory's mode change,
// a binary file, a new symlink and a file replaced by a symlink, a
// directory replaced by a file and a file by a directory.
func richTx(t *testing.T, ws string) string {
	t.Helper()
	for i := 0; i < 30; i++ {
		writeFile(t, ws, fmt.Sprintf("src/m%02d.go", i), strings.Repeat(fmt.Sprintf("old line %d\n", i), 20+i), 0o644)
	}
	for i := 0; i < 8; i++ {
		writeFile(t, ws, fmt.Sprintf("src/gone%d.txt", i), "to be deleted\n", 0o644)
		writeFile(t, ws, fmt.Sprintf("olddir/sub/r%d.txt", i), fmt.Sprintf("renamed %d\n", i), 0o640)
	}
	writeFile(t, ws, "bin/tool", "#!/bin/sh\necho old\n", 0o644)
	writeFile(t, ws, "bin/same", "same bytes\n", 0o600)
	writeFile(t, ws, "data/blob.bin", "\x00\x01old\xff", 0o644)
	writeFile(t, ws, "becomes-link", "a file\n", 0o644)
	writeFile(t, ws, "becomes-file/inner", "inner\n", 0o644)
	writeFile(t, ws, "becomes-dir", "was a file\n", 0o644)
	os.Chmod(filepath.Join(ws, "data"), 0o755)
	f := openFS(t, ws)
	tx, err := f.Begin(t.Context(), "rich")
	if err != nil {
		t.Fatal(err)
	}
	var ops []Op
	for i := 0; i < 30; i++ {
		ops = append(ops, WriteOp(fmt.Sprintf("src/m%02d.go", i), []byte(strings.Repeat(fmt.Sprintf("new line %d\n", i), 25+i)), 0))
	}
	for i := 0; i < 12; i++ {
		p := fmt.Sprintf("src/new%02d.go", i)
		if i >= 6 {
			p = fmt.Sprintf("fresh/deep/n%02d.go", i)
		}
		ops = append(ops, WriteOp(p, []byte(fmt.Sprintf("package new // %d\n", i)), 0o644))
	}
	for i := 0; i < 8; i++ {
		ops = append(ops, DeleteOp(fmt.Sprintf("src/gone%d.txt", i)))
	}
	ops = append(ops, DeleteOp("olddir"))
	for i := 0; i < 8; i++ {
		ops = append(ops, WriteOp(fmt.Sprintf("newdir/sub/r%d.txt", i), []byte(fmt.Sprintf("renamed %d\n", i)), 0o640))
	}
	bin := make([]byte, 3000)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	ops = append(ops,
		WriteOp("bin/tool", []byte("#!/bin/sh\necho new\n"), 0o755), // new bytes and mode
		WriteOp("bin/same", []byte("same bytes\n"), 0o644),          // mode only
		MkdirOp("data", 0o750),                                      // a directory's mode
		WriteOp("data/blob.bin", bin, 0o600),                        // binary
		SymlinkOp("src/m00.go", "link-to-m00"),                      // new symlink
		SymlinkOp("bin/tool", "becomes-link"),                       // file replaced by a symlink
		WriteOp("becomes-file", []byte("now a file\n"), 0),          // directory replaced by a file
		MkdirOp("becomes-dir", 0o700),                               // file replaced by a directory
		WriteOp("becomes-dir/child", []byte("child\n"), 0),
	)
	errs, err := tx.Stage(context.Background(), ops)
	if err == nil {
		err = errors.Join(errs...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tx.ID()
}

// TestCrashAtManyPoints SIGKILLs a re-executed test binary at every pass
// of every failpoint of a commit holding every kind of change (over 200
// kills), and checks after recovery that every path is wholly as before
// or wholly as after (content, type and mode), that the transaction is
// either entirely applied or still pending with nothing applied, that no
// temp entry is left, and that a pending one then commits.
func TestCrashAtManyPoints(t *testing.T) {
	// The reference: what the workspace holds before and after, and how
	// often a commit passes each failpoint.
	ref := newWS(t)
	id := richTx(t, ref)
	oldTree := snapshotTree(t, ref)
	hits := map[int]int{}
	failpointHook = func(fp int) { hits[fp]++ }
	f := openFS(t, ref)
	tx, _ := f.Tx(t.Context(), id)
	_, err := tx.Commit(context.Background())
	failpointHook = nil
	if err != nil {
		t.Fatal(err)
	}
	newTree := snapshotTree(t, ref)
	type point struct{ fp, hit int }
	var points []point
	fps := make([]int, 0, len(hits))
	for fp := range hits {
		fps = append(fps, fp)
	}
	sort.Ints(fps)
	for _, fp := range fps {
		for h := 1; h <= hits[fp]; h++ {
			points = append(points, point{fp, h})
		}
	}
	if len(points) < 200 {
		t.Fatalf("only %d kill points; the fixture must pass failpoints at least 200 times", len(points))
	}
	t.Logf("%d kill points over %d failpoints", len(points), len(fps))
	paths := map[string]bool{}
	for p := range oldTree {
		paths[p] = true
	}
	for p := range newTree {
		paths[p] = true
	}
	for _, pt := range points {
		t.Run(fmt.Sprintf("%s-%d", failpointName(pt.fp), pt.hit), func(t *testing.T) {
			t.Parallel()
			ws := newWS(t)
			id := richTx(t, ws)
			fx := &crashFixture{ws: ws, id: id}
			fx.crashAt(t, pt.fp, pt.hit)
			f := openFS(t, ws)
			if err := f.RecoveryErr(); err != nil {
				t.Fatalf("recovery: %v", err)
			}
			got := snapshotTree(t, ws)
			nOld, nNew := 0, 0
			for p := range paths {
				g, ok := got[p]
				o, okOld := oldTree[p]
				n, okNew := newTree[p]
				if ok == okOld && g == o {
					nOld++
				}
				if ok == okNew && g == n {
					nNew++
				}
				if !(ok == okOld && g == o) && !(ok == okNew && g == n) {
					t.Fatalf("%s is torn: %q, neither old %q nor new %q", p, g, o, n)
				}
			}
			fx.checkNoTemps(t)
			infos, err := f.List(t.Context())
			if err != nil || len(infos) != 1 {
				t.Fatalf("List = %+v, %v", infos, err)
			}
			switch {
			case nNew == len(paths) && infos[0].State == StateCommitted:
			case nOld == len(paths) && infos[0].State == StateOpen:
				tx, err := f.Tx(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Commit(context.Background()); err != nil {
					t.Fatalf("commit after recovery: %v", err)
				}
				if got := snapshotTree(t, ws); !equalTrees(got, newTree) {
					t.Fatal("the pending transaction committed to something else")
				}
			default:
				t.Fatalf("after recovery %d of %d paths old, %d new, transaction %s: neither applied nor pending",
					nOld, len(paths), nNew, infos[0].State)
			}
		})
	}
}

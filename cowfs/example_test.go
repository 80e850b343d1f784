package cowfs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pulse-agent/pulse/cowfs"
)

func Example() {
	ws, _ := os.MkdirTemp("", "cowfs-example")
	defer os.RemoveAll(ws)
	os.WriteFile(filepath.Join(ws, "greeting.txt"), []byte("hello\n"), 0o644)

	ctx := context.Background()
	fsys, err := cowfs.Open(ctx, ws)
	if err != nil {
		panic(err)
	}
	defer fsys.Close()
	tx, _ := fsys.Begin(ctx, "be polite")
	tx.Write(ctx, "greeting.txt", []byte("hello, world\n"), 0)

	diff, _ := tx.Diff(ctx)
	fmt.Print(diff)

	paths, err := tx.Commit(ctx)
	fmt.Println(paths, err)
	b, _ := os.ReadFile(filepath.Join(ws, "greeting.txt"))
	fmt.Print(string(b))
	// Output:
	// diff --git a/greeting.txt b/greeting.txt
	// --- a/greeting.txt
	// +++ b/greeting.txt
	// @@ -1 +1 @@
	// -hello
	// +hello, world
	// [greeting.txt] <nil>
	// hello, world
}

// A command's whole overlay is staged as one batch: one refusal does not
// stop the rest, and the accepted ops are durable together.
func ExampleTx_Stage() {
	ws, _ := os.MkdirTemp("", "cowfs-example")
	defer os.RemoveAll(ws)

	ctx := context.Background()
	fsys, err := cowfs.Open(ctx, ws)
	if err != nil {
		panic(err)
	}
	defer fsys.Close()
	tx, _ := fsys.Begin(ctx, "overlay")
	errs, err := tx.Stage(ctx, []cowfs.Op{
		cowfs.WriteOp("src/a.txt", []byte("a\n"), 0o644),
		cowfs.WriteOp("../outside", []byte("no\n"), 0),
		cowfs.SymlinkOp("a.txt", "src/link"),
	})
	fmt.Println(err, errs[0], errors.Is(errs[1], cowfs.ErrInvalidPath), errs[2])
	for _, c := range tx.Changes() {
		fmt.Println(c.Kind, c.Path)
	}
	// Output:
	// <nil> <nil> true <nil>
	// mkdir src
	// write src/a.txt
	// symlink src/link
}

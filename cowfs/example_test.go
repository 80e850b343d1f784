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

	fsys, err := cowfs.Open(ws)
	if err != nil {
		panic(err)
	}
	defer fsys.Close()
	tx, _ := fsys.Begin("be polite")
	tx.Write("greeting.txt", []byte("hello, world\n"), 0)

	diff, _ := tx.Diff()
	fmt.Print(diff)

	paths, err := tx.Commit(context.Background())
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

	fsys, err := cowfs.Open(ws)
	if err != nil {
		panic(err)
	}
	defer fsys.Close()
	tx, _ := fsys.Begin("overlay")
	errs, err := tx.Stage(context.Background(), []cowfs.Op{
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

package cowfs_test

import (
	"context"
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

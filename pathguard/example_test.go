//go:build unix

package pathguard_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pulse-agent/pulse/pathguard"
)

func Example() {
	root, _ := os.MkdirTemp("", "workspace")
	defer os.RemoveAll(root)
	_ = os.Symlink("/etc/passwd", filepath.Join(root, "escape"))

	g, err := pathguard.New(root)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := g.WriteFile("notes/todo.txt", []byte("ship it\n"), 0o644); err != nil {
		fmt.Println(err)
	}
	data, _ := g.ReadFile("notes/todo.txt")
	fmt.Printf("%s", data)

	_, err = g.ReadFile("escape")
	fmt.Println(errors.Is(err, pathguard.ErrOutside))
	_, err = g.ReadFile("../../etc/passwd")
	fmt.Println(errors.Is(err, pathguard.ErrOutside))
	// Output:
	// ship it
	// true
	// true
}

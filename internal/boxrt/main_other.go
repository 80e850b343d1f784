//go:build !linux

package boxrt

import (
	"fmt"
	"os"
)

// Main runs one step of the runtime; boxes are Linux.
func Main(args []string) int {
	if len(args) == 1 && args[0] == "identity" {
		fmt.Println(Identity())
		return 0
	}
	fmt.Fprintln(os.Stderr, Name+": the in-box runtime runs on Linux only")
	return 2
}

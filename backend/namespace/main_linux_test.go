package namespace

import (
	"fmt"
	"os"
	"testing"
)

// helperEnv makes the test binary, run inside a sandbox, act as a small
// probe program (the go-plugin pattern) instead of running tests: it tries
// one forbidden operation and prints what happened.
const helperEnv = "PULSE_NS_TEST_HELPER"

func TestMain(m *testing.M) {
	Init()
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(runHelper(h, os.Args[1:]))
	}
	if os.Getenv(outerEnv) != "" {
		os.Exit(runOuter())
	}
	os.Exit(m.Run())
}

func runHelper(name string, args []string) int {
	fn, ok := helpers[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown helper %q\n", name)
		return 2
	}
	if err := fn(args); err != nil {
		fmt.Println("refused:", err)
		return 0
	}
	fmt.Println("ESCAPED")
	return 0
}

package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// ChildEnv is the variable that tells a re-executed test binary which
// program to be. Its value is the name a TestMain passes to RunIfChild.
const ChildEnv = "PULSE_TEST_CHILD"

// RunIfChild is called first in a TestMain. When this process was started
// by Command(t, name, ...) it runs main — the real main function of the
// command, or the test's stand-in for it — and exits with status 0 when
// main returns (main exits on its own for any other status); otherwise it
// returns at once and the TestMain runs the tests.
//
//	func TestMain(m *testing.M) {
//		testenv.RunIfChild("pulse-worker", main)
//		os.Exit(m.Run())
//	}
func RunIfChild(name string, main func()) {
	if os.Getenv(ChildEnv) != name {
		return
	}
	// The child's own children (sandbox inits, helpers) must not take
	// themselves for this program.
	os.Unsetenv(ChildEnv)
	main()
	os.Exit(0)
}

// Command returns a command that runs this test binary as the program
// name, which the binary's TestMain dispatches with RunIfChild. args are
// the program's arguments: the test binary's own flags are not passed,
// and os.Args[0] is the program name, as for a real binary. The
// environment is this process's plus ChildEnv; append to cmd.Env to add
// to it.
func Command(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("cannot find the test binary to re-execute: %v", err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Args[0] = name
	cmd.Env = append(os.Environ(), ChildEnv+"="+name)
	return cmd
}

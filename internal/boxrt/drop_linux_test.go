package boxrt

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// mainEnv makes the test binary the runtime: TestMain runs Main on its
// arguments when it is set.
const mainEnv = "PULSE_BOXRT_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// runtimeCmd is the runtime (this test binary) run with args.
func runtimeCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(self, args...)
	c.Env = []string{mainEnv + "=1"}
	return c
}

// The cmd step, run as root by a multi-threaded Go program, gives the
// program it execs the uid and gid it was told, no supplementary group
// and every capability set empty, the bounding set included; and the
// umask (decimal, as the exec step passes it) and file size limit it
// was told. Ids that are no user's, or too
// few arguments, run nothing.
func TestCmdStepDropsEverything(t *testing.T) {
	testenv.MustHaveRoot(t, "setuid and PR_CAPBSET_DROP need root's capabilities")
	env := testenv.MustHaveCommand(t, testenv.Root, "env", "coreutils")
	sh := testenv.MustHaveCommand(t, testenv.Root, "sh", "a POSIX shell")
	out, err := runtimeCmd(t, "cmd", "65534", "65533", "8", strconv.Itoa(0o027), env, "PATH=/usr/bin:/bin", sh, "-c",
		`cat /proc/self/status; echo "umask $(umask)"; echo "fsize $(ulimit -f)"`).Output()
	if err != nil {
		t.Fatalf("cmd step: %v", err)
	}
	want := map[string]string{
		"Uid:":    "65534\t65534\t65534\t65534",
		"Gid:":    "65533\t65533\t65533\t65533",
		"Groups:": "",
		"CapInh:": "0000000000000000",
		"CapPrm:": "0000000000000000",
		"CapEff:": "0000000000000000",
		"CapBnd:": "0000000000000000",
		"CapAmb:": "0000000000000000",
		"umask":   "0027",
		"fsize":   "8",
	}
	for _, l := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(l, "\t")
		if !ok {
			k, v, _ = strings.Cut(l, " ")
		}
		if w, ok := want[k]; ok {
			if strings.TrimSpace(v) != w {
				t.Errorf("%s %q, want %q", k, v, w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		t.Errorf("not in the output: %v\n%s", want, out)
	}
	for _, args := range [][]string{
		{"0", "0", "0", "022", env, "true"},
		{"65534", "0", "0", "022", env, "true"},
		{"x", "1", "0", "022", env, "true"},
		{"65534", "65534", "-1", "022", env, "true"},
		{"65534", "65534", "0", "022", env},
	} {
		c := runtimeCmd(t, append([]string{"cmd"}, args...)...)
		var stderr bytes.Buffer
		c.Stderr = &stderr
		out, err := c.Output()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || (ee.ExitCode() != 126 && ee.ExitCode() != ExitUsage) || len(out) != 0 {
			t.Errorf("cmd %q: %v, stdout %q, stderr %q; want nothing run", args, err, out, stderr.String())
		}
	}
}

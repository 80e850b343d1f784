package docker

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// capdropOnHost writes the program to a file this host can run.
func capdropOnHost(t *testing.T) string {
	t.Helper()
	elf := capdropELF()
	if elf == nil {
		t.Skipf("no capdrop program for %s", runtime.GOARCH)
	}
	p := filepath.Join(t.TempDir(), "capdrop")
	if err := os.WriteFile(p, elf, 0o555); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCapdropDropsAndExecs runs the program itself, as root on this
// host: the program it execs has the uid and gid it was given, no
// supplementary group and an empty bounding set; a uid that is not a
// number, or too few arguments, run nothing and exit 126.
func TestCapdropDropsAndExecs(t *testing.T) {
	testenv.MustHaveRoot(t, "setuid and PR_CAPBSET_DROP need root's capabilities")
	p := capdropOnHost(t)
	cat := testenv.MustHaveCommand(t, testenv.Root, "cat", "coreutils")
	out, err := exec.Command(p, "65534", "65533", cat, "/proc/self/status").Output()
	if err != nil {
		t.Fatalf("capdrop: %v", err)
	}
	want := map[string]string{
		"Uid:":    "65534\t65534\t65534\t65534",
		"Gid:":    "65533\t65533\t65533\t65533",
		"Groups:": "",
		"CapBnd:": "0000000000000000",
		"CapPrm:": "0000000000000000",
		"CapEff:": "0000000000000000",
	}
	for _, l := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(l, "\t")
		if w, ok := want[k]; ok {
			if strings.TrimSpace(v) != w {
				t.Errorf("%s %q, want %q", k, v, w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		t.Errorf("not in the status: %v\n%s", want, out)
	}
	for _, args := range [][]string{{"x1", "0", cat, "/dev/null"}, {"1", "1234567890", cat}, {"1", "1"}, {"", "1", cat}} {
		cmd := exec.Command(p, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 126 || len(out) != 0 || !strings.Contains(stderr.String(), "pulse-capdrop:") {
			t.Errorf("capdrop %q: %v, stdout %q, stderr %q; want exit 126 and nothing run", args, err, out, stderr.String())
		}
	}
}

// TestCapdropMatchesSource: the machine code embedded is what its source,
// testdata/capdrop_amd64.S, assembles to.
func TestCapdropMatchesSource(t *testing.T) {
	as := testenv.MustHaveCommand(t, testenv.Root, "as", "binutils: assembles testdata/capdrop_amd64.S")
	objcopy := testenv.MustHaveCommand(t, testenv.Root, "objcopy", "binutils")
	dir := t.TempDir()
	obj, bin := filepath.Join(dir, "capdrop.o"), filepath.Join(dir, "capdrop.bin")
	for _, c := range [][]string{{as, "--64", "-o", obj, "testdata/capdrop_amd64.S"}, {objcopy, "-O", "binary", "--only-section=.text", obj, bin}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c[0], err, out)
		}
	}
	got, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, capdropCode) {
		t.Fatalf("testdata/capdrop_amd64.S assembles to %d bytes that differ from capdropCode (%d bytes): regenerate capdropCode", len(got), len(capdropCode))
	}
}

// TestDockerCommandBoundingSetEmpty: a command's capability bounding set
// is empty, as on the namespace backend, although the wrapper that
// starts it holds a few capabilities; every set else is empty too. So
// with the injected busybox and without it (the image's own tools).
func TestDockerCommandBoundingSetEmpty(t *testing.T) {
	if capdropELF() == nil {
		t.Skipf("no capdrop program for %s: the bounding set stays the wrapper's", runtime.GOARCH)
	}
	for name, opts := range map[string][]Option{"tools": nil, "image-tools": {WithTools("-")}} {
		t.Run(name, func(t *testing.T) {
			b := newDocker(t, opts...)
			r := execShell(t, b, t.TempDir(), `grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|Uid|Groups):' /proc/self/status`)
			if r.res.ExitCode != 0 {
				t.Fatalf("exit %d, stderr %q", r.res.ExitCode, r.stderr)
			}
			for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
				if !strings.Contains(r.stdout, k+":\t0000000000000000\n") {
					t.Errorf("%s not empty:\n%s", k, r.stdout)
				}
			}
			if !regexp.MustCompile(`(?m)^Groups:\s*$`).MatchString(r.stdout) {
				t.Errorf("the command has supplementary groups:\n%s", r.stdout)
			}
			if !regexp.MustCompile(`(?m)^Uid:\t2[0-9]{4}\t`).MatchString(r.stdout) {
				t.Errorf("the command does not run as a uid of its own:\n%s", r.stdout)
			}
		})
	}
}

package docker

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// probeWorkspace returns a workspace holding the static probe program
// (testdata/probe), which the container runs as ./probe. It is built with
// `go build` rather than by re-executing this test binary: the container
// has no libc for a binary that links it (as a -race test binary does),
// so the probe must be a CGO_ENABLED=0 build. It goes straight into the
// workspace, a t.TempDir(); the build cache makes the second build cheap.
func probeWorkspace(t *testing.T) string {
	t.Helper()
	ws := t.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(ws, "probe"), "./testdata/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: go build ./testdata/probe: %v\n%s", err, out)
	}
	return ws
}

// TestDockerSeccompDenyList: the container's profile refuses what the
// namespace backend's filter refuses and the engine's default profile
// lets through: TIOCSTI on a terminal the command controls, ptrace of the
// wrapper, io_uring.
func TestDockerSeccompDenyList(t *testing.T) {
	b := newDocker(t)
	ws := probeWorkspace(t)
	for name, script := range map[string]string{
		"tiocsti": `./probe tiocsti`,
		"ptrace":  `./probe ptrace $PPID`,
		"iouring": `./probe iouring`,
	} {
		t.Run(name, func(t *testing.T) {
			r := execShell(t, b, ws, script+"; true")
			if !strings.HasPrefix(r.stdout, "refused: operation not permitted") {
				t.Fatalf("%s: %q (stderr %q), want refused with EPERM", name, r.stdout, r.stderr)
			}
		})
	}
}

// TestDockerScriptsRunInWorkspaceAndTmp: ./script.sh runs from the
// workspace copy and from /tmp (both were noexec tmpfs).
func TestDockerScriptsRunInWorkspaceAndTmp(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "script.sh"), []byte("#!/bin/sh\necho ran-$1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := execShell(t, b, ws, `./script.sh ws && cp script.sh /tmp/s.sh && /tmp/s.sh tmp`)
	if r.res.ExitCode != 0 || r.stdout != "ran-ws\nran-tmp\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.res.ExitCode, r.stdout, r.stderr)
	}
}

// TestDockerCopyInVolumeIsCapped: the volume the workspace is copied into
// holds no more than the scratch size; it used to be a directory on the
// engine's disk with no bound.
func TestDockerCopyInVolumeIsCapped(t *testing.T) {
	b := newDocker(t, WithScratchSize("16m"))
	r := execShell(t, b, t.TempDir(), `head -c 64m /dev/zero > /pulse/fill; echo rc=$?; ls -l /pulse/fill | awk '{print $5}'; rm -f /pulse/fill`)
	if !strings.Contains(r.stdout, "rc=1") || strings.Contains(r.stdout, "67108864") {
		t.Fatalf("64 MiB written to the copy-in volume of a 16 MiB sandbox: %q (stderr %q)", r.stdout, r.stderr)
	}
}

// TestDockerDefaultLimits: with no limits given, a command cannot start
// 1,200 processes nor hold 1 GiB.
func TestDockerDefaultLimits(t *testing.T) {
	b := newDocker(t)
	ws := probeWorkspace(t)
	caps := b.Capabilities()
	if caps.Limits["pids"] != "strong" || caps.Limits["memory_bytes"] != "strong" {
		t.Errorf("default limits not reported as enforced: %v", caps.Limits)
	}
	// Each sleep outlives the loop however slowly the machine starts
	// them (at 30 s, the first ones ended before the 1,200th started at
	// load 20, and the count passed the limit without breaking it).
	r := execShell(t, b, ws, `n=0; while [ $n -lt 1200 ]; do sleep 600 & [ $? = 0 ] || break; n=$((n+1)); done 2>/dev/null; echo started=$n; kill -9 $(jobs -p) 2>/dev/null; true`)
	if strings.Contains(r.stdout, "started=1200") {
		t.Errorf("1,200 processes started under the default limits: %q", r.stdout)
	}
	r = execShell(t, b, ws, `./probe alloc 1100`)
	if strings.Contains(r.stdout, "allocated") {
		t.Errorf("1.1 GiB allocated under the default limits: %q", r.stdout)
	}
}

// TestDockerCommandHasOnlyStdio: nothing the wrapper holds open (its log)
// reaches the command.
func TestDockerCommandHasOnlyStdio(t *testing.T) {
	b := newDocker(t)
	r := execShell(t, b, t.TempDir(), `ls /proc/self/fd | tr '\n' ' '`)
	if r.stdout != "0 1 2 3 " {
		t.Fatalf("the command's descriptors: %q, want 0 1 2 and the one ls reads with", r.stdout)
	}
}

// TestDockerCommandBoundingSetEmpty: a command's capability bounding set
// is empty, as on the namespace backend, although the wrapper that
// starts it holds a few capabilities; every set else is empty too. So
// with the injected busybox and without it (the image's own tools), on
// every architecture: the runtime's cmd step drops them.
func TestDockerCommandBoundingSetEmpty(t *testing.T) {
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

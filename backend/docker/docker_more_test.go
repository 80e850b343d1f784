package docker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

func TestDockerEightConcurrentExecsGetTheirOwnOverlays(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"shared.txt": "base\n"})
	// Warm the container so the eight really overlap in their execs.
	execShell(t, b, ws, "true")
	const n = 8
	var wg sync.WaitGroup
	runs := make([]run, n)
	for i := range n {
		wg.Go(func() {
			runs[i] = execShell(t, b, ws, fmt.Sprintf(`echo out-%d; echo err-%d >&2; echo %d > own-%d.txt; sleep 0.3; cat shared.txt`, i, i, i, i))
		})
	}
	wg.Wait()
	for i, r := range runs {
		if r.res.ExitCode != 0 {
			t.Errorf("exec %d: exit %d, stderr %q", i, r.res.ExitCode, r.stderr)
			continue
		}
		if r.stdout != fmt.Sprintf("out-%d\nbase\n", i) || r.stderr != fmt.Sprintf("err-%d\n", i) {
			t.Errorf("exec %d: stdout %q stderr %q", i, r.stdout, r.stderr)
		}
		ov := r.res.Overlay
		if ov == nil || len(ov.Files) != 1 || len(ov.Deleted) != 0 {
			t.Errorf("exec %d: overlay %+v, want exactly its own file", i, ov)
			continue
		}
		if f := ov.Files[0]; f.Path != fmt.Sprintf("own-%d.txt", i) || string(f.Data) != fmt.Sprintf("%d\n", i) {
			t.Errorf("exec %d: overlay file %s = %q", i, f.Path, f.Data)
		}
	}
	// None of the eight writes is in the next command's view: it runs on
	// the workspace plus the pending stack it is given, and none is.
	r := execShell(t, b, ws, `cat own-*.txt 2>/dev/null | sort | tr -d '\n'; cat shared.txt`)
	if r.stdout != "base\n" {
		t.Fatalf("after the concurrent commands the next one sees %q", r.stdout)
	}
}

// The host listener must be unreachable from a deny-all command, and the
// same probe must succeed under allow-all, or the test proves nothing.
func TestDockerCommandCannotReachHostListener(t *testing.T) {
	b := newDocker(t)
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello-from-host\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	gw := bridgeGateway(t, b)
	probe := fmt.Sprintf(`nc -w 2 %s %d </dev/null; nc -w 2 127.0.0.1 %d </dev/null; echo end`, gw, port, port)

	ws := t.TempDir()
	r := execShell(t, b, ws, probe)
	if strings.Contains(r.stdout, "hello-from-host") || !strings.Contains(r.stdout, "end") {
		t.Fatalf("deny-all command output %q (stderr %q): the host listener was reachable", r.stdout, r.stderr)
	}
	r = execShell(t, b, ws, probe, func(req *backend.Request) { req.Network = policy.NetworkPolicy{Mode: policy.NetworkAllowAll} })
	if !strings.Contains(r.stdout, "hello-from-host") {
		t.Skipf("the host listener is not reachable even with allow-all (firewall?), so deny-all proves nothing here: stdout %q stderr %q", r.stdout, r.stderr)
	}
}

// bridgeGateway is the host's address on the default bridge network.
func bridgeGateway(t *testing.T, b *Backend) string {
	t.Helper()
	nw, err := b.cli.NetworkInspect(context.Background(), "bridge", network.InspectOptions{})
	if err == nil && len(nw.IPAM.Config) > 0 && nw.IPAM.Config[0].Gateway != "" {
		return nw.IPAM.Config[0].Gateway
	}
	// Older engines leave IPAM empty; the host's docker0 address is it.
	if ifc, err := net.InterfaceByName("docker0"); err == nil {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	t.Skipf("cannot find the bridge gateway (the engine may be remote): %v", err)
	return ""
}

func TestDockerProbeNamesMissingImage(t *testing.T) {
	newDocker(t) // skips without an engine
	b, err := New(WithImage("pulse-no-such-image:missing"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = b.Probe(context.Background())
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("Probe = %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "pulse image build --tag pulse-no-such-image:missing") {
		t.Fatalf("Probe error does not say how to build the image: %v", err)
	}
}

func TestDockerHardenedContainer(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	r := execShell(t, b, ws, `id -u; echo "groups $(id -G)"; grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status; touch /etc/x 2>/dev/null && echo rootfs-writable; touch /tmp/x && echo tmp-ok; ls /sys/class/net | tr '\n' ' '`)
	if uid, _, _ := strings.Cut(r.stdout, "\n"); !commandUID(uid) {
		t.Errorf("the command runs as uid %q, want one of its own (%d and up)", uid, firstCommandUID)
	}
	// Only the group commands share for caches (commandGID): no
	// supplementary group of the wrapper's (root's) is left.
	for _, want := range []string{fmt.Sprintf("groups %d\n", commandGID), "CapEff:\t0000000000000000", "NoNewPrivs:\t1", "tmp-ok"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in %q (stderr %q)", want, r.stdout, r.stderr)
		}
	}
	if strings.Contains(r.stdout, "rootfs-writable") {
		t.Error("the root filesystem is writable")
	}
	if !strings.HasSuffix(r.stdout, "lo ") {
		t.Errorf("deny-all container has interfaces besides lo: %q", r.stdout)
	}
}

const helperEnv = "PULSE_DOCKER_TEST_HELPER"

// TestDockerHelperProcess is not a test: it is the child of
// TestDockerReconcileRemovesLeftovers, which kills it mid-life.
func TestDockerHelperProcess(t *testing.T) {
	ws := os.Getenv(helperEnv)
	if ws == "" {
		t.Skip("helper process for TestDockerReconcileRemovesLeftovers")
	}
	b, err := New()
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	if _, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Args: []string{"true"}, Network: policy.DenyAllNetwork()}); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("sandbox", b.ID())
	time.Sleep(time.Minute) // killed long before
	os.Exit(0)
}

func TestDockerReconcileRemovesLeftovers(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	// A live container of this process must survive Reconcile.
	execShell(t, b, ws, "true")

	cmd := exec.Command(os.Args[0], "-test.run=^TestDockerHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+ws)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "sandbox "); ok {
				found <- s
			}
		}
		close(found)
	}()
	var sandbox string
	select {
	case sandbox = <-found:
	case <-time.After(60 * time.Second):
	}
	if sandbox == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("helper did not report its sandbox")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// Every Docker sandbox that opens reconciles the whole engine, and
	// `go test ./...` runs other packages' Docker tests beside this one:
	// one of them may collect the dead helper's container first (0 here),
	// and this Reconcile must then find nothing of it either.
	if n := countContainers(t, b, sandbox); n > 1 {
		t.Fatalf("the killed helper left %d containers, want 1", n)
	} else if n == 0 {
		t.Log("the dead helper's container was collected by a concurrent Reconcile before this one")
	}
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if n := countContainers(t, b, sandbox); n != 0 {
		t.Fatalf("Reconcile left %d containers of the dead helper", n)
	}
	if n := countContainers(t, b, b.ID()); n != 1 {
		t.Fatalf("Reconcile removed a live container: %d left, want 1", n)
	}
	// The live sandbox still works.
	if r := execShell(t, b, ws, "echo alive"); r.stdout != "alive\n" {
		t.Fatalf("live sandbox after Reconcile: %q", r.stdout)
	}
}

func countContainers(t *testing.T, b *Backend, sandbox string) int {
	t.Helper()
	list, err := b.cli.ContainerList(context.Background(), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", LabelSandbox+"="+sandbox))})
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

func TestDockerCloseRemovesContainers(t *testing.T) {
	b := newDocker(t)
	execShell(t, b, t.TempDir(), "true")
	if n := countContainers(t, b, b.ID()); n != 1 {
		t.Fatalf("%d containers before Close, want 1", n)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	list, err := c.cli.ContainerList(context.Background(), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", LabelSandbox+"="+b.ID()))})
	if err != nil || len(list) != 0 {
		t.Fatalf("after Close: %d containers, err %v", len(list), err)
	}
	if _, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Args: []string{"true"}}); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("Exec after Close: %v, want ErrClosed", err)
	}
}

func TestDockerLimitsAndNotes(t *testing.T) {
	b := newDocker(t, WithContainerLimits(policy.ResourceLimits{Pids: 256, MemoryBytes: 512 << 20}))
	ws := t.TempDir()
	r := execShell(t, b, ws, `head -c 4096 /dev/zero > small && head -c 100000 /dev/zero > big; echo rc=$?`,
		func(req *backend.Request) { req.Limits.FileSizeBytes = 8192 })
	if !strings.Contains(r.stdout, "rc=") || strings.Contains(r.stdout, "rc=0") {
		t.Errorf("writing past FileSizeBytes succeeded: stdout %q stderr %q", r.stdout, r.stderr)
	}
	for _, f := range r.res.Overlay.Files {
		if len(f.Data) > 8192 {
			t.Errorf("%s has %d bytes, over the 8192 limit", f.Path, len(f.Data))
		}
	}
	r = execShell(t, b, ws, `cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max`)
	if strings.TrimSpace(r.stdout) != "256" {
		t.Errorf("pids.max in the container = %q, want 256", r.stdout)
	}
	caps := b.Capabilities()
	if caps.Limits["pids"] != "strong" || caps.Limits["memory_bytes"] != "strong" || caps.Limits["cpus"] != "unsupported" {
		t.Errorf("limit levels %v", caps.Limits)
	}
	notes := strings.Join(caps.Notes, "\n")
	for _, want := range []string{"capabilities dropped", "no-new-privileges", "read-only root", "never root", "allowlist: none, plus the egress proxy"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes do not mention %q:\n%s", want, notes)
		}
	}
}

// A pooled request near maxPooledArgs runs as one command: xargs in the
// pooled exec counts the wrapper too, and a limit below wrapper plus
// request split it into two wrapper runs, the second without its
// arguments.
func TestDockerPooledRequestNearTheLimitRunsOnce(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	execShell(t, b, ws, "true")
	pad := strings.Repeat("x", maxPooledArgs-2048)
	r := execShell(t, b, ws, ": "+pad+"; echo ran")
	if r.res.ExitCode != 0 || r.stdout != "ran\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 0 and one \"ran\"", r.res.ExitCode, r.stdout, r.stderr)
	}
}

//go:build linux

package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/egress/bypass"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// newWarm is a backend whose commands must run in its warm sandbox: a
// test fails where it falls back to cold ones.
func newWarm(t *testing.T) *Backend {
	t.Helper()
	b := newBackend(t)
	var errb bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Args: []string{"true"}, Stderr: &errb})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("first command: %v %+v: %s", err, res, errb.String())
	}
	if ok, err := b.Warm(); !ok {
		t.Fatalf("no warm sandbox: %v", err)
	}
	return b
}

// TestWarmOneSandbox: commands of one Backend run in one gVisor sandbox
// (the boot time gVisor's kernel reports stays the same), each in its own
// pid namespace (the runtime's serve step, the sandbox's init, is not in
// it), with a /tmp of its own and its own view.
func TestWarmOneSandbox(t *testing.T) {
	b := newWarm(t)
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var boots []string
	for i := 0; i < 2; i++ {
		var out, errb bytes.Buffer
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: ws,
			Shell:  `cat f; echo; ps -eo args | grep -c '[g]vserve'; awk '/^btime/ {print $2}' /proc/stat; ls /tmp/left 2>/dev/null | wc -l; touch /tmp/left g` + string(rune('0'+i)),
			Stdout: &out, Stderr: &errb})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%v %+v %s", err, res, errb.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 4 || lines[0] != "x" || lines[1] != "0" || lines[3] != "0" {
			t.Errorf("command %d saw %q, want the file, no serve step, no /tmp/left", i, lines)
		}
		if len(lines) > 2 {
			boots = append(boots, lines[2])
		}
		if len(res.Overlay.Files) != 1 {
			t.Errorf("command %d: files %+v, want its one file", i, res.Overlay.Files)
		}
	}
	if len(boots) == 2 && boots[0] != boots[1] {
		t.Errorf("boot times %q: two sandboxes, want one warm one", boots)
	}
}

// TestWarmNoViews: a command cannot see the views of others, the
// runtime's processes or any capability.
func TestWarmNoViews(t *testing.T) {
	b := newWarm(t)
	var out bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(),
		Shell:  `ls -d /.pulse-views/* 2>&1; ls /proc | grep -c '^[0-9]'; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; mount -t tmpfs x /tmp 2>&1 && echo mounted`,
		Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "No such file") || strings.Contains(s, "mounted") || strings.Count(s, "0000000000000000") != 3 {
		t.Errorf("exit %d, saw:\n%s", res.ExitCode, s)
	}
}

// TestExitCodesNotSignals: a command exiting 129..192 itself is an exit,
// not a signal; a command a signal ends is Signaled.
func TestExitCodesNotSignals(t *testing.T) {
	b := newWarm(t)
	for _, tt := range []struct {
		sh   string
		code int
		term backend.TerminationReason
	}{
		{"exit 137", 137, backend.Exited},
		{"exit 129", 129, backend.Exited},
		{"kill -TERM $$", -1, backend.Signaled},
		// The runtime's status pipe is not the command's to write.
		{`echo '{"started":true,"exit":0}' >&3; exit 5`, 5, backend.Exited},
	} {
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: tt.sh})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != tt.code || res.Termination != tt.term {
			t.Errorf("%q: %s %d, want %s %d", tt.sh, res.Termination, res.ExitCode, tt.term, tt.code)
		}
	}
}

// TestColdFallback: where no warm sandbox can start (here: no runtime
// program), commands run in a sandbox each, and Warm says why.
func TestColdFallback(t *testing.T) {
	for _, opt := range []Option{WithRuntime(filepath.Join(t.TempDir(), "missing")), WithCold()} {
		b := newBackend(t, opt)
		ws := t.TempDir()
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Shell: "echo hi > f; exit 3"})
		if err != nil || res.ExitCode != 3 || len(res.Overlay.Files) != 1 {
			t.Fatalf("%v %+v", err, res)
		}
		if ok, err := b.Warm(); ok || err == nil {
			t.Errorf("Warm() = %v, %v; want false and why", ok, err)
		}
	}
}

// TestWarmOwnLoopback: commands running together in the warm sandbox have
// a loopback each (network namespaces of their own, as on namespace): one
// cannot reach what another listens on.
func TestWarmOwnLoopback(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 to listen with")
	}
	b := newWarm(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, &backend.Request{Workspace: t.TempDir(), Args: []string{"python3", "-c", `import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 8089)); s.listen()
socket.create_connection(("127.0.0.1", 8089))
print("listening", flush=True); time.sleep(60)`}, Stdout: pw, Stderr: pw})
		pw.Close()
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || line != "listening\n" {
		t.Fatalf("listener: %q %v", line, err)
	}
	go io.Copy(io.Discard, pr)
	var out bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(),
		Shell: `(echo > /dev/tcp/127.0.0.1/8089) 2>/dev/null && echo reached || echo refused`, Stdout: &out})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v %+v", err, res)
	}
	if out.String() != "refused\n" {
		t.Errorf("another command's listener: %q, want refused", out.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestEgressBypassSuite runs every attack of the egress bypass suite in
// the warm sandbox: allowed destinations work through the proxy the
// runtime relays to, nothing else is reachable.
func TestEgressBypassSuite(t *testing.T) {
	b := newWarm(t)
	results, err := bypass.Run(context.Background(), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		switch {
		case r.Skipped != "" && testenv.Required(testenv.GVisor):
			t.Errorf("SKIPPED %s where nothing may skip: %s", r.Name, r.Skipped)
		case r.Skipped != "":
			t.Logf("SKIP %s: %s", r.Name, r.Skipped)
		case !r.Held:
			t.Errorf("FAILED %s: %s", r.Name, r.Detail)
		default:
			t.Logf("held %s: %s", r.Name, r.Detail)
		}
	}
}

// TestEgressLoopbackForward: an allowlisted 127.0.0.1:PORT is reached
// without the proxy variables too (as Go's net/http does, which never
// proxies a loopback address): the runtime listens on it in the command's
// network namespace and the host tunnels it through the proxy.
func TestEgressLoopbackForward(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl")
	}
	b := newWarm(t)
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "fwd-ok\n") })}
	go hs.Serve(hl)
	t.Cleanup(func() { hs.Close() })
	np := policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{hl.Addr().String()}}
	p, err := egress.New(egress.Config{Policy: np})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	sock := filepath.Join(t.TempDir(), "proxy.sock")
	pl, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(pl)
	var out bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Network: np, Egress: &backend.Egress{Socket: sock},
		Args: []string{"curl", "-sS", "--noproxy", "*", "http://" + hl.Addr().String() + "/"}, Stdout: &out, Stderr: &out})
	if err != nil || res.ExitCode != 0 || out.String() != "fwd-ok\n" {
		t.Fatalf("%v %+v: %q", err, res, out.String())
	}
}

// TestProbeIsWarmStart: the probe's sandbox is the warm one the commands
// then run in: after Probe and two commands, runsc lists one sandbox.
func TestProbeIsWarmStart(t *testing.T) {
	b := newBackend(t)
	b.warmMu.Lock()
	n := len(b.warms)
	b.warmMu.Unlock()
	if n != 1 {
		t.Fatalf("%d warm sandboxes after Probe, want 1", n)
	}
	for i := 0; i < 2; i++ {
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Args: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%v %+v", err, res)
		}
	}
	out, err := exec.Command(b.runscBin(), "--root", b.runscRoot(), "list", "-quiet").Output()
	if err != nil {
		t.Fatal(err)
	}
	if ids := strings.Fields(string(out)); len(ids) != 1 {
		t.Errorf("runsc lists %q, want the one warm sandbox", ids)
	}
}

package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/policy"
)

// readUntil reads r until the bytes read contain want (or r ends), and
// returns what it read. It fails the test when want has not come within
// two minutes, a bound on a hung process (whose output reader would
// otherwise block until the process ends, if ever), not a speed check.
func readUntil(t *testing.T, r io.Reader, want string) string {
	t.Helper()
	type read struct {
		got string
		err error
	}
	done := make(chan read, 1)
	go func() {
		var got bytes.Buffer
		buf := make([]byte, 256)
		for !strings.Contains(got.String(), want) {
			n, err := r.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				done <- read{got.String(), err}
				return
			}
		}
		done <- read{got.String(), nil}
	}()
	select {
	case res := <-done:
		if res.err != nil {
			t.Fatalf("output ended (%v) before %q; got %q", res.err, want, res.got)
		}
		return res.got
	case <-time.After(2 * time.Minute):
		if c, ok := r.(io.Closer); ok {
			c.Close() // ends the reading goroutine
		}
		t.Fatalf("no %q in the output within 2 minutes", want)
		return ""
	}
}

// TestStartStdinOutputWait: a process started on the namespace backend
// echoes its input, prints while it runs and writes a file; its output is
// read whole from offset 0 while it runs, again from a later offset, and
// once more after it ended, each byte once; its file joins the pending
// stack like an Execute's.
func TestStartStdinOutputWait(t *testing.T) {
	ws := t.TempDir()
	sb := newIsolated(t, ws)
	ctx := context.Background()
	p, err := sb.Start(ctx, Command{Shell: `echo ready; read line; echo "got $line"; echo "$line" > note.txt; echo err >&2; echo bye`})
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Processes()) != 1 || sb.Processes()[0] != p {
		t.Fatalf("Processes() = %v, want the one started", sb.Processes())
	}
	r := p.Output(0)
	first := readUntil(t, r, "ready\n")
	if _, err := io.WriteString(p.Stdin(), "hello\n"); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	whole := first + string(rest)
	for _, want := range []string{"ready\n", "got hello\n", "err\n", "bye\n"} {
		if !strings.Contains(whole, want) {
			t.Errorf("output %q lacks %q", whole, want)
		}
	}
	res, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Transaction == "" {
		t.Fatalf("exit %d, transaction %q", res.ExitCode, res.Transaction)
	}
	// A reader that reconnects at the count it had read gets the rest,
	// nothing twice; one from 0 after the end gets it all.
	tail, _ := io.ReadAll(p.Output(int64(len(first))))
	if first+string(tail) != whole {
		t.Errorf("reconnected read %q + %q, want %q", first, tail, whole)
	}
	again, _ := io.ReadAll(p.Output(0))
	if string(again) != whole {
		t.Errorf("replay after the end %q, want %q", again, whole)
	}
	if got, err := sb.ReadFile(ctx, "note.txt"); err != nil || string(got) != "hello\n" {
		t.Errorf("note.txt through the stack = %q, %v", got, err)
	}
	if len(sb.Processes()) != 0 {
		t.Errorf("an ended process is still listed")
	}
}

// TestStartKillTree: Kill ends a process and the grandchildren it started
// in the background; the writes it made before are staged.
func TestStartKillTree(t *testing.T) {
	ws := t.TempDir()
	sb := newIsolated(t, ws)
	ctx := context.Background()
	// The loops carry a mark of this run, so the check below sees only
	// them, not the same test running elsewhere on the machine.
	mark := fmt.Sprintf("killtree-%d-%d", os.Getpid(), time.Now().UnixNano())
	p, err := sb.Start(ctx, Command{Shell: `echo x > before.txt; ( while :; do sleep 0.05; : ` + mark + `; done ) & ( sh -c 'while :; do sleep 0.05; : ` + mark + `; done' ) & echo up; wait`})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Output(0)
	readUntil(t, r, "up\n")
	r.Close()
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Termination != backend.Cancelled {
		t.Errorf("termination %q, want %q", res.Termination, backend.Cancelled)
	}
	if got, err := sb.ReadFile(ctx, "before.txt"); err != nil || string(got) != "x\n" {
		t.Errorf("before.txt = %q, %v", got, err)
	}
	// Every process of the sandbox ran in its own pid namespace under its
	// init; none is left on the host.
	if left := processesMatching(t, mark); len(left) != 0 {
		t.Errorf("processes left running after Kill: %q", left)
	}
	if err := p.Kill(); err != nil {
		t.Errorf("second Kill: %v", err)
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("Signal after the end: %v, want ErrProcessDone", err)
	}
}

// TestStartSignal: a signal reaches the command, which traps it.
func TestStartSignal(t *testing.T) {
	sb := newIsolated(t, t.TempDir())
	ctx := context.Background()
	p, err := sb.Start(ctx, Command{Shell: `trap 'echo caught; exit 3' TERM; echo armed; while :; do sleep 0.05; done`})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Output(0)
	defer r.Close()
	readUntil(t, r, "armed\n")
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 {
		t.Errorf("exit %d, want 3 (the trap)", res.ExitCode)
	}
}

// TestStartRefusedLikeExecute: a command the policy denies is refused by
// Start itself, audited, and nothing runs.
func TestStartRefusedLikeExecute(t *testing.T) {
	pol := policy.Default()
	pol.Rules = append([]policy.Rule{{Action: policy.Shell, Target: "touch *", Decision: policy.Deny}}, pol.Rules...)
	ws := t.TempDir()
	sb := newIsolated(t, ws, WithPolicy(pol))
	if _, err := sb.Start(context.Background(), Command{Shell: "touch x"}); !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("err = %v, want ErrPolicyDenied", err)
	}
	if _, err := sb.Start(context.Background(), Command{Shell: "cat", Stdin: strings.NewReader("x")}); !errors.Is(err, ErrInvalidCommand) {
		t.Fatalf("Stdin set: err = %v, want ErrInvalidCommand", err)
	}
	if n := len(sb.Processes()); n != 0 {
		t.Errorf("%d processes listed", n)
	}
}

// execOnly is a real backend seen without its optional interfaces, as a
// backend that implements only Exec (the remote one, today) is.
type execOnly struct{ backend.Backend }

// TestStartUnsupportedBackend: a backend without backend.Starter refuses
// Start, and Expose, with ErrUnsupported; Execute still runs.
func TestStartUnsupportedBackend(t *testing.T) {
	hb, err := host.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hb.Close() })
	pol := policy.Default()
	pol.Network = &policy.NetworkPolicy{Mode: policy.NetworkDenyAll, Expose: []int{8000}}
	sb, err := New(context.Background(), t.TempDir(), withGetenv(noEnv), WithBackend(execOnly{hb}), WithUnsafeHostExecution(), WithPolicy(pol))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	if _, err := sb.Start(context.Background(), Command{Shell: "true"}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Start: err = %v, want ErrUnsupported", err)
	}
	if _, err := sb.Expose(context.Background(), 8000); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Expose: err = %v, want ErrUnsupported", err)
	}
}

// TestCloseKillsProcesses: Close ends a process still running and returns.
func TestCloseKillsProcesses(t *testing.T) {
	sb := newIsolated(t, t.TempDir())
	p, err := sb.Start(context.Background(), Command{Shell: "echo up; sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Output(0)
	readUntil(t, r, "up\n")
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Close returned with the process still running")
	}
	if _, err := r.Read(make([]byte, 8)); !errors.Is(err, errLogClosed) {
		t.Errorf("read after Close: %v, want errLogClosed", err)
	}
}

// TestExposeHTTPServer is the done-when on the namespace backend
// (a sandbox with a network of its own, deny-all): see exposeDoneWhen.
func TestExposeHTTPServer(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox (httpd) not installed")
	}
	exposeDoneWhen(t, newIsolated(t, t.TempDir(), WithPolicy(exposePolicy())))
}

// TestExposeHTTPServerDocker is the same on the Docker backend (network
// none; the image has busybox).
func TestExposeHTTPServerDocker(t *testing.T) {
	exposeDoneWhen(t, newDockerSandbox(t, t.TempDir(), WithPolicy(exposePolicy())))
}

// TestExposeRangeHTTPServer and TestExposeRangeHTTPServerDocker are
// exposeDoneWhen under a policy that lists no port, only a range holding
// 8000 (9000 and 22, outside it, are still refused).
func TestExposeRangeHTTPServer(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox (httpd) not installed")
	}
	exposeDoneWhen(t, newIsolated(t, t.TempDir(), WithPolicy(exposeRangePolicy())))
}

func TestExposeRangeHTTPServerDocker(t *testing.T) {
	exposeDoneWhen(t, newDockerSandbox(t, t.TempDir(), WithPolicy(exposeRangePolicy())))
}

func exposeRangePolicy() *policy.Policy {
	pol := policy.Default()
	pol.Network = &policy.NetworkPolicy{Mode: policy.NetworkDenyAll, ExposeRanges: []policy.PortRange{{From: 7990, To: 8010}}}
	return pol
}

func exposePolicy() *policy.Policy {
	pol := policy.Default()
	pol.Network = &policy.NetworkPolicy{Mode: policy.NetworkDenyAll, Expose: []int{8000}}
	return pol
}

// exposeDoneWhen: an HTTP server started in the sandbox is reached
// through Expose (an unlisted port is refused), its log is read from
// offset 0 by a new reader, Kill leaves nothing of it running, and the
// files it and a command before it wrote are listed and read through the
// pending stack; each exposure and refusal is audited.
func exposeDoneWhen(t *testing.T, sb *Sandbox) {
	ctx := context.Background()
	// The site directory carries a mark of this run, so the check for a
	// surviving httpd below sees only this one, not the same test on the
	// other backend or in another test process on the machine.
	site := fmt.Sprintf("site-%d-%d", os.Getpid(), time.Now().UnixNano())
	if _, err := sb.Execute(ctx, Command{Shell: "mkdir -p " + site + " && echo hello from the sandbox > " + site + "/index.html"}); err != nil {
		t.Fatal(err)
	}
	httpd := "httpd -f -v -p 127.0.0.1:8000 -h " + site
	p, err := sb.Start(ctx, Command{Shell: "echo serving; echo up > served.txt; exec busybox " + httpd,
		Limits: &policy.ResourceLimits{Timeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Output(0)
	readUntil(t, r, "serving\n")
	r.Close()

	if _, err := sb.Expose(ctx, 9000); !errors.Is(err, ErrPortNotExposed) || !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("unlisted port: err = %v, want ErrPortNotExposed", err)
	}
	var ee *ExposeError
	if _, err := sb.Expose(ctx, 22); !errors.As(err, &ee) || ee.Port != 22 {
		t.Fatalf("unlisted port: err = %v, want an *ExposeError for 22", err)
	}
	addr, err := sb.Expose(ctx, 8000)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("addr %q not on loopback", addr)
	}
	if again, err := sb.Expose(ctx, 8000); err != nil || again != addr {
		t.Errorf("second Expose = %q, %v; want %q", again, err, addr)
	}
	if body := getOK(t, "http://"+addr+"/index.html"); body != "hello from the sandbox\n" {
		t.Errorf("body %q", body)
	}
	// The server's log (httpd -v logs each response to stderr), read
	// again from the start by a new reader.
	log := readUntil(t, p.Output(0), "response:200")
	if !strings.HasPrefix(log, "serving\n") {
		t.Errorf("log from offset 0 = %q", log)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if left := processesMatching(t, httpd); len(left) != 0 {
		t.Errorf("httpd left running after Kill: %q", left)
	}
	if _, err := http.Get("http://" + addr + "/index.html"); err == nil {
		t.Error("the exposed address still answers with no process behind it")
	}
	ents, err := sb.List(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	if got := names(ents); !slices.Equal(got, []string{"served.txt", site + "/"}) {
		t.Errorf("List(.) = %v, want served.txt and %s/", got, site)
	}
	if got, err := sb.ReadFile(ctx, "served.txt"); err != nil || string(got) != "up\n" {
		t.Errorf("served.txt = %q, %v", got, err)
	}
	evs := verifyAudit(t, sb)
	var allowed, denied int
	for _, e := range evs {
		if e.Action == "expose" && e.Decision == "allow" {
			allowed++
		}
		if e.Action == "expose" && e.Decision == "deny" {
			denied++
		}
	}
	if allowed != 1 || denied != 2 {
		t.Errorf("expose events: %d allowed, %d denied; want 1, 2", allowed, denied)
	}
}

// TestStartTTY: a process on a terminal of the sandbox's own echoes its
// input into the log, sees Resize, and Execute refuses a terminal.
func TestStartTTY(t *testing.T) {
	sb := newIsolated(t, t.TempDir())
	ctx := context.Background()
	if _, err := sb.Execute(ctx, Command{Shell: "true", TTY: &TTY{Rows: 24, Cols: 80}}); !errors.Is(err, ErrInvalidCommand) {
		t.Fatalf("Execute with a TTY: err = %v, want ErrInvalidCommand", err)
	}
	p, err := sb.Start(ctx, Command{Shell: `trap 'stty size; exit 0' WINCH; echo ready; read l; echo "got $l"; while :; do sleep 0.05; done`,
		TTY: &TTY{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Output(0)
	defer r.Close()
	readUntil(t, r, "ready\r\n")
	if _, err := io.WriteString(p.Stdin(), "hi\n"); err != nil {
		t.Fatal(err)
	}
	readUntil(t, r, "got hi\r\n")
	if err := p.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	readUntil(t, r, "40 120\r\n")
	if res, err := p.Wait(ctx); err != nil || res.ExitCode != 0 {
		t.Fatalf("Wait = %v, %v", res, err)
	}
	if err := p.Resize(1, 1); !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("Resize after the end = %v", err)
	}
}

// TestStartOutputOrderAcrossStreams: the output log takes stdout and
// stderr in the order the command printed them, and a caller's writer
// that blocks holds nothing of the log back: stdout goes to a writer that
// blocks until the end, stderr to none, and each line is printed only
// once the one before is in the log.
func TestStartOutputOrderAcrossStreams(t *testing.T) {
	sb := newIsolated(t, t.TempDir())
	ctx := context.Background()
	bw := &blockingWriter{release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(bw.release)
		}
	}
	defer release()
	p, err := sb.Start(ctx, Command{Shell: `echo out1; read a; echo out2; read b; echo err1 >&2; read c; echo out3; read d; echo err2 >&2`,
		Stdout: bw, Limits: &policy.ResourceLimits{Timeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	want := "out1\nout2\nerr1\nout3\nerr2\n"
	lines := strings.SplitAfter(want, "\n")
	var have string
	for i, l := range lines[:len(lines)-1] {
		have += l
		deadline := time.Now().Add(time.Minute)
		for {
			b, err := io.ReadAll(io.LimitReader(p.Output(0), p.OutputSize()))
			if err != nil {
				t.Fatal(err)
			}
			if string(b) == have {
				break
			}
			if !strings.HasPrefix(have, string(b)) || time.Now().After(deadline) {
				t.Fatalf("output log %q, want %q next", b, have)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if i < len(lines)-2 {
			if _, err := io.WriteString(p.Stdin(), "go\n"); err != nil {
				t.Fatal(err)
			}
		}
	}
	release()
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// processesMatching lists the command lines of the machine's processes
// that contain pattern, read from /proc (as pgrep -f would, but with no
// need for procps: where pgrep is missing, a check through it passes
// whatever runs).
func processesMatching(t *testing.T, pattern string) []string {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatalf("listing processes: %v", err)
	}
	var found []string
	for _, d := range dirs {
		if d.Name()[0] < '0' || d.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil {
			continue // gone meanwhile
		}
		if line := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")); strings.Contains(line, pattern) {
			found = append(found, d.Name()+": "+line)
		}
	}
	return found
}

// TestCloseDuringStartEndsTheProcess: a Start that Close overtakes (Close
// begins while the command is being approved, and lists the live
// processes before this one is launched) does not leave it running: the
// Start is refused with ErrClosed, Close returns at once, and nothing of
// the command runs on the host.
func TestCloseDuringStartEndsTheProcess(t *testing.T) {
	pol := policy.Default()
	pol.Defaults[policy.Shell] = policy.Ask
	asked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	appr := func(_ context.Context, a policy.Action, _ string) (bool, error) {
		if a == policy.Shell {
			once.Do(func() { close(asked) })
			<-release
		}
		return true, nil
	}
	sb := newIsolated(t, t.TempDir(), WithPolicy(pol), WithApprover(appr))
	mark := fmt.Sprintf("closerace-%d-%d", os.Getpid(), time.Now().UnixNano())
	type started struct {
		p   *Process
		err error
	}
	startDone := make(chan started, 1)
	go func() {
		p, err := sb.Start(context.Background(), Command{Shell: `echo up; while :; do sleep 0.05; : ` + mark + `; done`,
			Limits: &policy.ResourceLimits{Timeout: 2 * time.Minute}})
		startDone <- started{p, err}
	}()
	<-asked
	closed := make(chan error, 1)
	go func() { closed <- sb.Close() }()
	<-sb.closing()
	// Close has listed the live processes it kills; now the command runs.
	time.Sleep(200 * time.Millisecond)
	close(release)

	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		left := processesMatching(t, mark)
		for _, l := range left {
			if pid, err := strconv.Atoi(strings.SplitN(l, ":", 2)[0]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		<-closed
		t.Fatalf("Close did not return within 30s: the process started while it began still ran: %q", left)
	}
	st := <-startDone
	if st.err == nil {
		t.Errorf("Start overtaken by Close succeeded (process %s)", st.p.ID())
		select {
		case <-st.p.Done():
		default:
			t.Errorf("Close returned with the process still running")
		}
	} else if !errors.Is(st.err, ErrClosed) {
		t.Errorf("Start overtaken by Close: err = %v, want ErrClosed", st.err)
	}
	if left := processesMatching(t, mark); len(left) != 0 {
		t.Errorf("processes left running after Close: %q", left)
	}
}

// TestProcessOutputSnapshot: OutputSnapshot returns what a running
// process printed so far without waiting (ended false while it runs), the
// rest from the offset reached, and, after the end, everything from 0
// with ended true — on the namespace and the Docker backend.
func TestProcessOutputSnapshot(t *testing.T) {
	for _, bk := range []struct {
		name string
		open func(*testing.T, string, ...Option) *Sandbox
	}{{"namespace", newIsolated}, {"docker", newDockerSandbox}} {
		t.Run(bk.name, func(t *testing.T) {
			sb := bk.open(t, t.TempDir())
			ctx := context.Background()
			p, err := sb.Start(ctx, Command{Shell: `echo one; read line; echo "two $line"`,
				Limits: &policy.ResourceLimits{Timeout: 2 * time.Minute}})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Kill()
			// Polled: a snapshot never waits. The bound is on a hung
			// process, not a speed check.
			var first []byte
			for deadline := time.Now().Add(2 * time.Minute); ; {
				out, ended, err := p.OutputSnapshot(0)
				if err != nil {
					t.Fatal(err)
				}
				if ended {
					t.Fatalf("ended before its input came; output %q", out)
				}
				if string(out) == "one\n" {
					first = out
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no %q within 2 minutes; got %q", "one\n", out)
				}
				time.Sleep(20 * time.Millisecond)
			}
			// Nothing past the end yet: an empty snapshot, not a wait.
			if out, ended, err := p.OutputSnapshot(int64(len(first))); err != nil || len(out) != 0 || ended {
				t.Fatalf("snapshot at the end = %q, %v, %v; want nothing, not ended", out, ended, err)
			}
			if _, err := io.WriteString(p.Stdin(), "x\n"); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			rest, ended, err := p.OutputSnapshot(int64(len(first)))
			if err != nil || string(rest) != "two x\n" || !ended {
				t.Fatalf("snapshot after the end = %q, %v, %v; want %q, ended", rest, ended, err, "two x\n")
			}
			all, ended, err := p.OutputSnapshot(0)
			if err != nil || string(all) != "one\ntwo x\n" || !ended {
				t.Fatalf("whole snapshot = %q, %v, %v", all, ended, err)
			}
			if past, _, err := p.OutputSnapshot(1 << 20); err != nil || len(past) != 0 {
				t.Fatalf("snapshot past the end = %q, %v", past, err)
			}
			sb.Close()
			if _, _, err := p.OutputSnapshot(0); err == nil {
				t.Fatal("snapshot after Close: no error")
			}
		})
	}
}

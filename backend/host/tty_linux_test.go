package host_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// ttyOuterEnv makes TestHostOuterTTYProcess the caller: it starts the
// script in outerScriptEnv on a terminal of the backend's (Request.TTY).
// injectEnv makes TestHostTTYInject the command.
const (
	ttyOuterEnv = "PULSE_HOST_TEST_OUTER_TTY"
	injectEnv   = "PULSE_HOST_TEST_INJECT"
)

// TestHostOuterTTYProcess is not a test: it is the caller, on a terminal
// of its own, that TestTTYCommandCannotReachCallersTerminal starts.
func TestHostOuterTTYProcess(t *testing.T) {
	if os.Getenv(ttyOuterEnv) == "" {
		t.Skip("helper process for tests that start a caller of the backend")
	}
	b, err := host.New()
	if err != nil {
		fmt.Println("outer:", err)
		os.Exit(125)
	}
	var out bytes.Buffer
	p, err := b.Start(context.Background(), &backend.Request{
		Workspace: os.Getenv(outerWSEnv), Shell: os.Getenv(outerScriptEnv),
		Stdout: &out, TTY: &backend.TTY{Rows: 24, Cols: 80},
		Network: policy.NetworkPolicy{Mode: policy.NetworkAllowAll},
		Limits:  policy.ResourceLimits{Timeout: time.Minute},
	})
	if err != nil {
		fmt.Println("outer:", err)
		os.Exit(125)
	}
	res, err := p.Wait()
	if err != nil {
		fmt.Println("outer:", err)
		os.Exit(125)
	}
	fmt.Printf("%s\nOUTER-END\n", out.Bytes())
	os.Exit(res.ExitCode)
}

// TestHostTTYInject is not a test: it is the command, which types into
// its controlling terminal with TIOCSTI and says whether that worked.
func TestHostTTYInject(t *testing.T) {
	if os.Getenv(injectEnv) == "" {
		t.Skip("helper process: the command that types into its terminal")
	}
	fd, err := unix.Open("/dev/tty", unix.O_RDWR, 0)
	if err != nil {
		fmt.Println("INJECT no /dev/tty:", err)
		os.Exit(0)
	}
	for _, c := range []byte("echo INJECTED\n") {
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafe.Pointer(&c))); e != 0 {
			fmt.Println("INJECT refused:", e)
			os.Exit(0)
		}
	}
	fmt.Println("INJECT typed")
	os.Exit(0)
}

// TestTTYCommandCannotReachCallersTerminal: a caller on a terminal (an
// interactive program embedding the backend) starts a command with
// Request.TTY. The command's terminal is a new one, its /dev/tty is that
// one, and what it types with TIOCSTI lands there, never in the caller's
// input queue.
func TestTTYCommandCannotReachCallersTerminal(t *testing.T) {
	newBackend(t)
	master, slave := testenv.OpenPTY(t)
	callerTTY, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(slave.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`echo "TTY=$(tty)"; exec 3<>/dev/tty && stty rows 7 cols 9 <&3 && echo "DEVTTY=$(stty size)"; exec 3<&-
%s=1 %q -test.run='^TestHostTTYInject$'; read -r typed; echo "READ=$typed"`, injectEnv, exe)
	cmd := exec.Command(exe, "-test.run=^TestHostOuterTTYProcess$")
	cmd.Env = append(os.Environ(), ttyOuterEnv+"=1", outerScriptEnv+"="+script, outerWSEnv+"="+t.TempDir(),
		"GORACE=atexit_sleep_ms=0")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	var out bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = io.Copy(&out, master) }()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	werr := cmd.Wait()
	queued, err := unix.IoctlGetInt(int(slave.Fd()), unix.TIOCINQ)
	if err != nil {
		t.Fatal(err)
	}
	slave.Close() // the master reads EIO once no one holds the slave
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		master.Close()
		<-done
	}
	got := out.String()
	if werr != nil {
		t.Fatalf("caller: %v: %s", werr, got)
	}
	if queued != 0 {
		t.Fatalf("the command pushed %d bytes into the caller's terminal: %q", queued, got)
	}
	if !strings.Contains(got, "OUTER-END") {
		t.Fatalf("the caller did not finish: %q", got)
	}
	var own string
	for _, l := range strings.Split(got, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "TTY="); ok {
			own = v
		}
	}
	if !strings.HasPrefix(own, "/dev/pts/") || own == callerTTY {
		t.Fatalf("the command's terminal is %q (the caller's is %s): %q", own, callerTTY, got)
	}
	// Resized through /dev/tty, the terminal on its stdin changed.
	if !strings.Contains(got, "DEVTTY=7 9") {
		t.Errorf("the command's /dev/tty is not its own terminal %s: %q", own, got)
	}
	// Where the kernel lets a process type into its own controlling
	// terminal, the typed line is read back from the command's terminal.
	if strings.Contains(got, "INJECT typed") && !strings.Contains(got, "READ=echo INJECTED") {
		t.Errorf("typed input did not reach the command's own terminal: %q", got)
	}
	if !strings.Contains(got, "INJECT typed") && !strings.Contains(got, "INJECT refused") {
		t.Errorf("the injecting command did not run: %q", got)
	}
}

// TestTTYResizeRefused: a terminal command's Resize after its end, and a
// zero size, are refused with the backend's errors.
func TestTTYResizeRefused(t *testing.T) {
	b := newBackend(t)
	var out bytes.Buffer
	p, err := b.Start(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "sleep 0.2",
		Stdout: &out, TTY: &backend.TTY{Rows: 5, Cols: 5}, Limits: policy.ResourceLimits{Timeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(0, 10); !errors.Is(err, backend.ErrInvalidRequest) {
		t.Errorf("Resize(0, 10) = %v, want ErrInvalidRequest", err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(10, 10); !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("Resize after the end = %v, want ErrProcessDone", err)
	}
	if _, err := b.Start(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "true",
		Stdout: &out, TTY: &backend.TTY{Rows: 0, Cols: 80}, Limits: policy.ResourceLimits{Timeout: time.Minute}}); !errors.Is(err, backend.ErrInvalidRequest) {
		t.Errorf("Start with a 0x80 terminal = %v, want ErrInvalidRequest", err)
	}
}

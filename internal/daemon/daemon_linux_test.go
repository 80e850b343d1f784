package daemon

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/daemon/client"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// serveInProcess runs a daemon for this process's directory and
// environment in a fresh socket directory, with handle.
func serveInProcess(t *testing.T, handle Handler) (dir, name string, srv *Server) {
	t.Helper()
	return serveIn(t, t.TempDir(), handle)
}

// serveIn is serveInProcess with the socket directory in base.
func serveIn(t *testing.T, base string, handle Handler) (dir, name string, srv *Server) {
	t.Helper()
	dir = filepath.Join(base, "d")
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	name = Name(wd, os.Environ())
	srv = &Server{Dir: dir, Name: name, Idle: time.Minute, Handle: handle, Logger: testenv.Logger(t)}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	testenv.Eventually(t, 5*time.Second, func() error {
		_, err := os.Stat(socketPath(dir, name))
		return err
	})
	return dir, name, srv
}

func request(t *testing.T) *Request {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return &Request{Args: []string{"exec", "--", "true"}, Dir: wd, Env: os.Environ()}
}

// pipes returns the three descriptors a client passes, and the other
// ends: stdin's writer, stdout's and stderr's readers.
func pipes(t *testing.T) (stdio [3]*os.File, in *os.File, out, errOut *os.File) {
	t.Helper()
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, f := range []*os.File{inR, inW, outR, outW, errR, errW} {
			f.Close()
		}
	})
	return [3]*os.File{inR, outW, errW}, inW, outR, errR
}

func TestRunPassesStreamsAndExitCode(t *testing.T) {
	dir, name, _ := serveInProcess(t, func(ctx context.Context, req *Request, stdio [3]*os.File) int {
		data, _ := io.ReadAll(stdio[0])
		stdio[1].Write(append([]byte("out:"), data...))
		stdio[2].WriteString(req.Args[len(req.Args)-1])
		return 7
	})
	stdio, in, out, errOut := pipes(t)
	in.WriteString("hello")
	in.Close()
	code, err := Run(dir, name, request(t), stdio, nil)
	if err != nil || code != 7 {
		t.Fatalf("Run = %d, %v; want 7", code, err)
	}
	stdio[1].Close()
	stdio[2].Close()
	if got, _ := io.ReadAll(out); string(got) != "out:hello" {
		t.Errorf("stdout %q", got)
	}
	if got, _ := io.ReadAll(errOut); string(got) != "true" {
		t.Errorf("stderr %q", got)
	}
}

func TestRunForwardsSignal(t *testing.T) {
	cause := make(chan error, 1)
	dir, name, _ := serveInProcess(t, func(ctx context.Context, req *Request, stdio [3]*os.File) int {
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return 1
	})
	stdio, _, _, _ := pipes(t)
	sigs := make(chan os.Signal, 1)
	sigs <- syscall.SIGINT
	code, err := Run(dir, name, request(t), stdio, sigs)
	if err != nil || code != 130 {
		t.Fatalf("Run = %d, %v; want 130", code, err)
	}
	if c := testenv.Recv(t, cause, 5*time.Second, "the command's cancellation"); !errors.Is(c, Signaled(2)) {
		t.Errorf("cause %v, want Signaled(2)", c)
	}
}

func TestRequestOfAnotherDirectoryOrEnvironmentIsRefused(t *testing.T) {
	ran := make(chan struct{}, 4)
	dir, name, _ := serveInProcess(t, func(ctx context.Context, req *Request, stdio [3]*os.File) int {
		ran <- struct{}{}
		return 0
	})
	other := t.TempDir()
	for _, tc := range []struct {
		name string
		edit func(r *Request)
	}{
		{"environment", func(r *Request) { r.Env = append(r.Env, "DOCKER_HOST=unix:///elsewhere") }},
		{"directory", func(r *Request) { r.Dir = other }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t)
			tc.edit(req)
			stdio, _, _, _ := pipes(t)
			if _, err := Run(dir, name, req, stdio, nil); !errors.Is(err, ErrRefused) {
				t.Fatalf("Run = %v, want ErrRefused", err)
			}
		})
	}
	if len(ran) != 0 {
		t.Errorf("the daemon ran %d foreign request(s)", len(ran))
	}
	// What only the shell changes between commands picks the same daemon.
	req := request(t)
	req.Env = append(req.Env, "OLDPWD=/somewhere", "SHLVL=9", "_=/bin/x")
	stdio, _, _, _ := pipes(t)
	if _, err := Run(dir, name, req, stdio, nil); err != nil {
		t.Fatalf("Run with only volatile variables changed: %v", err)
	}
}

func TestClientRefusesDirectoryOpenToOthers(t *testing.T) {
	dir, name, _ := serveInProcess(t, func(ctx context.Context, req *Request, stdio [3]*os.File) int { return 0 })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stdio, _, _, _ := pipes(t)
	if _, err := Run(dir, name, request(t), stdio, nil); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("Run in a 0755 directory = %v, want ErrUntrusted", err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(link, name, request(t), stdio, nil); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("Run through a symlink = %v, want ErrUntrusted", err)
	}
	if _, err := Run(filepath.Join(t.TempDir(), "none"), name, request(t), stdio, nil); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Run in a missing directory = %v, want ErrNotRunning", err)
	}
}

func TestStatusAndStop(t *testing.T) {
	dir, name, _ := serveInProcess(t, func(ctx context.Context, req *Request, stdio [3]*os.File) int { return 0 })
	stdio, _, _, _ := pipes(t)
	if _, err := Run(dir, name, request(t), stdio, nil); err != nil {
		t.Fatal(err)
	}
	req := request(t)
	req.Op = OpStatus
	rep, err := Ask(dir, name, req)
	if err != nil || rep.Status == nil || rep.Status.Served != 1 || rep.Status.Pid != os.Getpid() {
		t.Fatalf("status = %+v, %v; want 1 served by pid %d", rep, err, os.Getpid())
	}
	req.Op = OpStop
	if _, err := Ask(dir, name, req); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if _, err := os.Stat(socketPath(dir, name)); !errors.Is(err, os.ErrNotExist) {
			return errors.New("the socket is still there")
		}
		return nil
	})
	if _, err := Run(dir, name, request(t), stdio, nil); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Run after stop = %v, want ErrNotRunning", err)
	}
}

// TestClientOfAnotherUserIsRefused is the second wall, behind the
// directory only its user can open: a client of another uid that reaches
// the socket anyway (here the directory and socket are opened to all on
// purpose) is refused by the daemon's SO_PEERCRED check, and the daemon's
// client refuses a daemon of another uid.
func TestClientOfAnotherUserIsRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a process as another uid")
	}
	const nobody = 65534
	// Under a directory uid 65534 can pass through.
	base, err := os.MkdirTemp("", "daemon-uid")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	ran := make(chan struct{}, 1)
	dir, name, _ := serveIn(t, base, func(ctx context.Context, req *Request, stdio [3]*os.File) int {
		ran <- struct{}{}
		return 0
	})
	sock := socketPath(dir, name)
	for _, p := range []string{base, dir} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(sock, 0o777); err != nil {
		t.Fatal(err)
	}
	// The test binary, where uid 65534 may run it.
	bin := filepath.Join(filepath.Dir(dir), "daemon.test")
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	cmd := testenv.Command(t, "daemon-dial", append([]string{sock, wd}, os.Environ()...)...)
	cmd.Path = bin
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the client as uid %d: %v: %s", nobody, err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "closed" {
		t.Errorf("the daemon answered uid %d: %q, want it to hang up", nobody, got)
	}
	if len(ran) != 0 {
		t.Errorf("the daemon ran a command of uid %d", nobody)
	}
	// The other way round: a listener of uid 65534 is not this user's
	// daemon, whatever the socket is called.
	other := filepath.Join(filepath.Dir(dir), "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	srv := testenv.Command(t, "daemon-listen", filepath.Join(other, "y.sock"))
	srv.Path = bin
	srv.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "listening" {
		t.Fatalf("the listener of uid %d: %q %v", nobody, line, err)
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: filepath.Join(other, "y.sock"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, _ := c.SyscallConn()
	var perr error
	raw.Control(func(fd uintptr) { _, perr = checkPeer(int(fd), "/proc/self/exe") })
	if !errors.Is(perr, ErrUntrusted) {
		t.Errorf("checkPeer of a uid %d listener = %v, want ErrUntrusted", nobody, perr)
	}
}

// A client that finds the socket finds it accepting: the name appears
// only once the daemon listens (a socket bound and not yet listening
// refuses, which a client takes for no daemon). Each round races a
// client against a starting daemon.
func TestSocketAppearsOnlyWhenListening(t *testing.T) {
	for i := range 50 {
		base := t.TempDir()
		dir := filepath.Join(base, "d")
		wd, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		name := Name(wd, os.Environ())
		srv := &Server{Dir: dir, Name: name, Idle: time.Minute, Logger: testenv.Logger(t),
			Handle: func(context.Context, *Request, [3]*os.File) int { return 0 }}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(context.Background()) }()
		sock := socketPath(dir, name)
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the socket never appeared")
			}
		}
		c, _, err := client.Dial("/proc/self/exe", dir, name)
		if err != nil {
			t.Errorf("round %d: the socket is there and refuses: %v", i, err)
		} else {
			c.Close()
		}
		srv.Stop()
		if err := <-done; err != nil {
			t.Fatalf("Serve: %v", err)
		}
	}
}

// Replied, in the Handler's ctx, is open while the command runs and is
// closed once the client has its exit code: the work a command leaves
// for later waits for it.
func TestRepliedClosesAfterTheExit(t *testing.T) {
	got := make(chan (<-chan struct{}), 1)
	dir, name, _ := serveInProcess(t, func(ctx context.Context, req *Request, stdio [3]*os.File) int {
		r := Replied(ctx)
		got <- r
		if r == nil {
			return 1
		}
		select {
		case <-r:
			return 2 // closed before the exit was sent
		default:
		}
		return 0
	})
	stdio, _, _, _ := pipes(t)
	code, err := Run(dir, name, request(t), stdio, nil)
	if err != nil || code != 0 {
		t.Fatalf("Run = %d, %v; want 0 (1: no Replied channel; 2: closed while the command ran)", code, err)
	}
	select {
	case <-<-got:
	case <-time.After(time.Minute): // a daemon that never closes it, not a slow one
		t.Fatal("Replied not closed after the client had its exit")
	}
	if Replied(context.Background()) != nil {
		t.Fatal("Replied of a ctx not a Handler's is not nil")
	}
}

// A second signal returns at once, with the first one's code, though the
// command has not ended (its client then exits, which cancels it).
func TestRunReturnsOnASecondSignal(t *testing.T) {
	release := make(chan struct{})
	dir, name, _ := serveInProcess(t, func(ctx context.Context, req *Request, stdio [3]*os.File) int {
		<-release
		return 0
	})
	defer close(release)
	stdio, _, _, _ := pipes(t)
	sigs := make(chan os.Signal, 2)
	sigs <- syscall.SIGTERM
	sigs <- syscall.SIGINT
	code, err := Run(dir, name, request(t), stdio, sigs)
	if err != nil || code != 143 {
		t.Fatalf("Run = %d, %v; want 143", code, err)
	}
}

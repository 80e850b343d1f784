package namespace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

func init() { helpers["keeper"] = keeperProbe }

// keeperProbe asks the keeper at args[0] for an init, from inside a
// sandbox: it must be refused (no reply, no descriptors).
func keeperProbe(args []string) error {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: args[0], Net: "unixpacket"})
	if err != nil {
		return err
	}
	defer c.Close()
	data, _ := json.Marshal(keeperRequest{NewNet: true})
	if _, err := c.Write(data); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf, oob := make([]byte, keeperMsgMax), make([]byte, unix.CmsgSpace(keeperFds*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return err
	}
	if n == 0 && oobn == 0 {
		return errors.New("closed without a reply")
	}
	return nil // it answered: the test fails on "refused" missing
}

// adoptOnce makes a backend of state with a keeper, as a CLI process has
// it, and starts ahead on it under n and lim: an error unless the init it
// got came from the keeper (the first tries start the keeper, or find it
// starting an init).
func adoptOnce(state string, n policy.NetworkPolicy, lim policy.ResourceLimits, opts ...Option) (*Backend, error) {
	b, err := New(append([]Option{WithStateDir(state), WithoutPrestart(), WithKeeper(time.Minute)}, opts...)...)
	if err != nil {
		return nil, err
	}
	b.StartAhead(n, lim)
	newNet, _ := networkNamespace(n)
	b.waitAhead(newNet)
	b.mu.Lock()
	ok := len(b.warm[newNet]) == 1 && b.warm[newNet][0].kept != nil
	b.mu.Unlock()
	if !ok {
		b.Close()
		return nil, errors.New("the init did not come from the keeper")
	}
	return b, nil
}

// adopted is adoptOnce until it succeeds; the backend is closed by the
// test's end.
func adopted(t *testing.T, state string, lim policy.ResourceLimits) *Backend {
	t.Helper()
	var b *Backend
	testenv.Eventually(t, 20*time.Second, func() (err error) {
		b, err = adoptOnce(state, policy.DenyAllNetwork(), lim, WithLogger(testenv.Logger(t)))
		return err
	})
	t.Cleanup(func() { b.Close() })
	return b
}

// stopKeeper ends the keeper of state by removing its socket, and waits
// for it to exit (it looks every second), which removes its lock file.
func stopKeeper(t *testing.T, state string) {
	t.Helper()
	socks, _ := filepath.Glob(filepath.Join(state, "keeper-*.sock"))
	for _, s := range socks {
		os.Remove(s)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if locks, _ := filepath.Glob(filepath.Join(state, "keeper-*.lock")); len(locks) != 0 {
			return fmt.Errorf("a keeper still holds %q", locks)
		}
		return nil
	})
}

// TestKeeperHandsOverAnInit: a later process's first command runs in an
// init the keeper started, exactly as in one of its own: output, exit
// code, writes, limits' cgroups, and the init reaped once it is done.
func TestKeeperHandsOverAnInit(t *testing.T) {
	newBackend(t)
	state := filepath.Join(t.TempDir(), "s")
	t.Cleanup(func() { stopKeeper(t, state) })
	lim := policy.ResourceLimits{Timeout: 30 * time.Second}.WithDefaults().WithIsolationDefaults()
	b := adopted(t, state, lim)
	b.mu.Lock()
	p := b.warm[true][0]
	b.mu.Unlock()
	pid := p.pid()
	if strings.HasPrefix(filepath.Base(p.run.dir), strconv.Itoa(os.Getpid())+"-") {
		t.Fatalf("adopted run %s is this process's own", p.run.dir)
	}
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "in"), []byte("base\n"), 0o644)
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: ws, Network: policy.DenyAllNetwork(), Limits: lim,
		Shell: `cat in; echo made > out; cat /proc/1/cmdline | tr '\0' ' '; exit 3`})
	if res.ExitCode != 3 || res.Termination != backend.Exited {
		t.Fatalf("exit %d %v, want 3 exited", res.ExitCode, res.Termination)
	}
	if !strings.Contains(out, "base") || !strings.Contains(out, "pulse-runtime ns-init") {
		t.Fatalf("output %q", out)
	}
	if len(res.Overlay.Files) != 1 || res.Overlay.Files[0].Path != "out" || string(res.Overlay.Files[0].Data) != "made\n" {
		t.Fatalf("overlay: %+v", res.Overlay)
	}
	// The keeper reaped it when asked: the pid is no process of ours, or
	// another process altogether.
	testenv.Eventually(t, 5*time.Second, func() error {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err == nil && strings.Contains(string(st), "pulse-namespace") {
			return fmt.Errorf("the adopted init %d is still there", pid)
		}
		return nil
	})
}

// TestKeeperAdoptedInitIsKilled: a timeout ends a command in an adopted
// init as in any other.
func TestKeeperAdoptedInitIsKilled(t *testing.T) {
	newBackend(t)
	state := filepath.Join(t.TempDir(), "s")
	t.Cleanup(func() { stopKeeper(t, state) })
	lim := policy.ResourceLimits{Timeout: 300 * time.Millisecond}.WithDefaults().WithIsolationDefaults()
	b := adopted(t, state, lim)
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Network: policy.DenyAllNetwork(),
		Limits: lim, Shell: "sleep 30", Stdout: &strings.Builder{}, Stderr: &strings.Builder{}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Termination != backend.Timeout {
		t.Fatalf("termination %v, want timeout", res.Termination)
	}
}

// TestKeeperRefusesASandboxedClient: a command that can reach the
// keeper's socket (its state dir bound read-only into the sandbox; a
// socket connects through a read-only mount) gets nothing from it.
func TestKeeperRefusesASandboxedClient(t *testing.T) {
	newBackend(t)
	state := filepath.Join(t.TempDir(), "s")
	t.Cleanup(func() { stopKeeper(t, state) })
	lim := policy.ResourceLimits{Timeout: 30 * time.Second}.WithDefaults().WithIsolationDefaults()
	adopted(t, state, lim).Close() // the keeper runs
	sock, err := filepath.Glob(filepath.Join(state, "keeper-*.sock"))
	if err != nil || len(sock) != 1 {
		t.Fatalf("keeper sockets: %v %v", sock, err)
	}
	b, exe := helperBackend(t, WithReadOnlyBind(state))
	if out := runHelperIn(t, b, exe, "keeper", sock[0]); !strings.Contains(out, "refused:") {
		t.Fatalf("a sandboxed process was answered by the keeper: %q", out)
	}
}

// crashKeptHelper runs, in a process of its own, a command in an init it
// adopted from the keeper, and is killed while the command runs.
func crashKeptHelper(args []string) error {
	beat, state, ws := args[0], args[1], args[2]
	lim := policyTimeout(time.Minute)
	var b *Backend
	err := testenv.Poll(20*time.Second, func() (err error) {
		b, err = adoptOnce(state, policy.NetworkPolicy{}, lim, WithReadWriteBind(beat))
		return err
	})
	if err != nil {
		return err
	}
	_, err = b.Exec(context.Background(), &backend.Request{Workspace: ws,
		Shell:  "while :; do echo x >> " + beat + "/beat; sleep 0.05; done",
		Limits: lim})
	return fmt.Errorf("exec returned: %v", err)
}

func init() { helpers["crashkept"] = crashKeptHelper }

// TestKeeperAdopterCrash: when a process that adopted an init dies
// (SIGKILL) while its command runs, the command dies too (the keeper,
// seeing the adopter go, kills the init), and once the keeper is gone
// Reconcile leaves no run directory behind.
func TestKeeperAdopterCrash(t *testing.T) {
	newBackend(t)
	beat, state, ws := t.TempDir(), filepath.Join(t.TempDir(), "s"), t.TempDir()
	t.Cleanup(func() { stopKeeper(t, state) })
	cmd, out, size := startBeatHelper(t, "crashkept", beat, state, ws)
	if err := testenv.Poll(30*time.Second, func() error {
		if size() == 0 {
			return errors.New("no beat yet")
		}
		return nil
	}); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the command never ran: %q", out.String())
	}
	cmd.Process.Kill()
	cmd.Wait()
	var last int64 = -1
	for i := 0; ; i++ {
		s := size()
		if s == last {
			break
		}
		if i > 100 {
			t.Fatalf("the command outlived the adopter that was killed (helper said %q)", out.String())
		}
		last = s
		time.Sleep(200 * time.Millisecond)
	}
	stopKeeper(t, state)
	// What a keeper killed with -9 would leave: its lock, unheld, and
	// its socket.
	for _, f := range []string{"keeper-0000000000000000.lock", "keeper-0000000000000000.sock"} {
		if err := os.WriteFile(filepath.Join(state, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := New(WithStateDir(state))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The keeper that exited removed its own files; Reconcile the rest
	// and every run directory.
	if ents, _ := os.ReadDir(state); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("left in the state dir: %q", names)
	}
}

// FuzzKeeperReply: whatever the keeper's socket carries, a cgroup record
// is accepted only as cgroups the keeper could have made (pulse-* under
// their bases) with its limit files inside them, so that an adopter
// writes limits, adds its init and removes directories nowhere else.
func FuzzKeeperReply(f *testing.F) {
	f.Add([]byte(`{"pid":7,"run":"/s/7-a","home":"/root","new_net":true,"cgroup":{"dirs":["/sys/fs/cgroup/pids/pulse-7-a"],"bases":["/sys/fs/cgroup/pids"],"v1":[true],"born":[false],"pids":"/sys/fs/cgroup/pids/pulse-7-a","key":"k","added":7}}`))
	f.Add([]byte(`{"cgroup":{"dirs":["/sys/fs/cgroup/pulse-1/../x"],"bases":["/sys/fs/cgroup"],"v1":[false],"born":[true],"memory":"/etc"}}`))
	f.Add([]byte(`{"none":true}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var rep keeperReply
		if json.Unmarshal(data, &rep) != nil {
			return
		}
		cg, err := rep.Cgroup.cgroup()
		if err != nil || cg == nil {
			return
		}
		if len(cg.bases) != len(cg.dirs) || len(cg.v1) != len(cg.dirs) || len(cg.born) != len(cg.dirs) {
			t.Fatalf("accepted a record of uneven lengths: %+v", rep.Cgroup)
		}
		for i, d := range cg.dirs {
			if !filepath.IsAbs(d) || filepath.Clean(d) != d || filepath.Dir(d) != cg.bases[i] || !strings.HasPrefix(filepath.Base(d), "pulse-") {
				t.Fatalf("accepted cgroup directory %q (base %q)", d, cg.bases[i])
			}
		}
		for _, p := range []string{cg.memory, cg.pids} {
			if p != "" && !inDirs(p, cg.dirs) {
				t.Fatalf("accepted limit path %q outside %q", p, cg.dirs)
			}
		}
	})
}

// TestKeeperShunsAStateDirOfAnotherUser: a state dir another user made
// first (squatted in /tmp before this user's first run) gets no run, and
// no keeper either: the process neither dials a socket there nor starts a
// keeper, and a keeper started with it exits at once, leaving nothing of
// its own there (a lock file and a socket of this user that the dir's
// owner could move, or redirect elsewhere by swapping the dir).
func TestKeeperShunsAStateDirOfAnotherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to make a state dir another user owns")
	}
	newBackend(t)
	state := filepath.Join(t.TempDir(), "s")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopKeeper(t, state) })
	b, err := New(WithStateDir(state), WithoutPrestart(), WithKeeper(time.Minute), WithLogger(testenv.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	lim := policyTimeout(30 * time.Second).WithDefaults().WithIsolationDefaults()
	if p, start := b.adopt(true, lim); p != nil || start != "" {
		t.Fatalf("adopt in another user's state dir: init %v, keeper to start %q", p != nil, start)
	}
	if _, err := b.newRun(); err == nil {
		t.Fatal("a run was made in another user's state dir")
	}
	done := make(chan int, 1)
	go func() {
		done <- keep(keeperSpec{StateDir: state, Name: "keeper-0123456789abcdef", Idle: time.Second,
			First: keeperRequest{NewNet: true, Limits: lim}})
	}()
	select {
	case code := <-done:
		if code != 2 {
			t.Fatalf("keeper in another user's state dir exited %d, want 2 (refused)", code)
		}
	case <-time.After(500 * time.Millisecond):
		names, _ := filepath.Glob(filepath.Join(state, "keeper-*"))
		<-done
		t.Fatalf("a keeper ran in another user's state dir, making %q", names)
	}
	if ents, _ := os.ReadDir(state); len(ents) != 0 {
		t.Fatalf("left in another user's state dir: %v", ents)
	}
}

// TestDefaultStateDirCannotBeSquatted: without XDG_RUNTIME_DIR, another
// user who makes /tmp/pulse-namespace-<uid> first (here: a directory of
// nobody's) does not disable the backend: the default state dir is one
// that user cannot take, and a command runs.
func TestDefaultStateDirCannotBeSquatted(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to make a directory another user owns")
	}
	newBackend(t) // skips without namespaces
	tmp, home := t.TempDir(), t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("TMPDIR", tmp)
	t.Setenv("HOME", home)
	squat := filepath.Join(tmp, "pulse-namespace-"+strconv.Itoa(os.Getuid()))
	if err := os.Mkdir(squat, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(squat, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	b, err := New(WithoutPrestart(), WithLogger(testenv.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if want := filepath.Join(home, ".cache", "pulse", "namespace"); b.o.stateDir != want {
		t.Fatalf("default state dir %s, want %s", b.o.stateDir, want)
	}
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: "echo ok"})
	if res.ExitCode != 0 || out != "ok\n" {
		t.Fatalf("exit %d, output %q", res.ExitCode, out)
	}
	if ents, _ := os.ReadDir(squat); len(ents) != 0 {
		t.Fatalf("the backend used the squatted dir: %v", ents)
	}
	// A state dir of this user's at the old name is still used: nobody
	// else can take it, and an earlier pulse's keeper and runs are there.
	if err := os.Chown(squat, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if got := defaultStateDir(); got != squat {
		t.Fatalf("with the old dir this user's, the default is %s, want %s", got, squat)
	}
	// And a refusal says what to do.
	if err := os.Chown(squat, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := checkStateDir(squat); !errors.Is(err, errStateDirNotOwn) || !strings.Contains(err.Error(), "XDG_RUNTIME_DIR") {
		t.Fatalf("checkStateDir of a squatted dir = %v", err)
	}
}

// TestDefaultStateDirWithoutAHome: a user whose home cannot hold a cache
// directory (HOME=/nonexistent, as service accounts have) and who has no
// XDG_RUNTIME_DIR keeps the backend: the default state dir falls back to
// the fixed name in the temporary directory, which nobody else has taken
// here, instead of a cache directory that cannot be made.
func TestDefaultStateDirWithoutAHome(t *testing.T) {
	newBackend(t) // skips without namespaces
	tmp := t.TempDir()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("TMPDIR", tmp)
	t.Setenv("HOME", filepath.Join(file, "home")) // under a file: no one can make it, root included
	want := filepath.Join(tmp, "pulse-namespace-"+strconv.Itoa(os.Getuid()))
	if got := defaultStateDir(); got != want {
		t.Fatalf("default state dir %s, want %s", got, want)
	}
	b, err := New(WithoutPrestart(), WithLogger(testenv.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: "echo ok"})
	if res.ExitCode != 0 || out != "ok\n" {
		t.Fatalf("exit %d, output %q", res.ExitCode, out)
	}
}

package namespace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// countStarts makes b count the inits it starts.
func countStarts(b *Backend) *atomic.Int32 {
	var n atomic.Int32
	b.o.phaseHook = func(name string, _ int64) {
		if name == "clone-exec" {
			n.Add(1)
		}
	}
	return &n
}

// inPulseCgroup reports whether /proc/<pid>/cgroup text, read on the
// host, puts the process in a run's cgroup of the controller ctrl (v1) or
// of the unified hierarchy.
func inPulseCgroup(text, ctrl string) bool {
	for _, line := range strings.Split(text, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && strings.Contains(f[2], "pulse-") && (f[1] == "" || strings.Contains(","+f[1]+",", ","+ctrl+",")) {
			return true
		}
	}
	return false
}

// runInPulseCgroup runs req (its command replaced by a long sleep) and
// reports whether its init, seen from the host while it runs, is in a
// run's cgroup of ctrl; the command is then cancelled. Inside, the
// sandbox's own cgroup namespace may hide the run's cgroup path (its root
// is the cgroup the init was born in).
func runInPulseCgroup(t *testing.T, b *Backend, req *backend.Request, ctrl string) bool {
	t.Helper()
	req.Args, req.Shell = nil, "sleep 60"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, req)
		done <- err
	}()
	var cg string
	waitFor(t, func() bool {
		var ok bool
		cg, ok = runningInitCgroups(b)
		return ok
	})
	in := inPulseCgroup(cg, ctrl)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Exec: %v", err)
	}
	return in
}

// runningInitCgroups returns the /proc/PID/cgroup of the init of an Exec
// of b that runs now, read from the host side; false while none does.
func runningInitCgroups(b *Backend) (string, bool) {
	b.mu.Lock()
	var pid int
	for p := range b.running {
		pid = p.pid()
	}
	b.mu.Unlock()
	if pid == 0 {
		return "", false
	}
	cg, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	return string(cg), err == nil
}

// TestStartAheadIsTheFirstExecsInit: under WithoutPrestart, StartAhead
// starts one init, already in the cgroups of the limits it was given; the
// Exec with those limits runs in it (no second init) and leaves none
// behind.
func TestStartAheadIsTheFirstExecsInit(t *testing.T) {
	b := newBackend(t, WithoutPrestart())
	starts := countStarts(b)
	lim := policy.ResourceLimits{Pids: 200}
	b.StartAhead(policy.DenyAllNetwork(), lim)
	req := &backend.Request{Workspace: t.TempDir(), Limits: lim}
	in := runInPulseCgroup(t, b, req, "pids")
	if n := starts.Load(); n != 1 {
		t.Fatalf("%d inits started for StartAhead and one Exec, want 1", n)
	}
	b.waitWarm()
	if n := idleInits(b); n != 0 {
		t.Fatalf("%d idle inits after the Exec under WithoutPrestart, want 0", n)
	}
	if b.cg.pids && !in {
		t.Fatal("the command is not in the run's pids cgroup")
	}
}

// TestStartAheadForOtherLimitsIsReplaced: an init started ahead for other
// cgroup limits than the Exec's is not used: the Exec starts a fresh one,
// in its own limits' cgroups.
func TestStartAheadForOtherLimitsIsReplaced(t *testing.T) {
	b := newBackend(t, WithoutPrestart())
	if !b.cg.pids {
		t.Skip("no pids cgroup controller delegated here: both limits would need the same (no) cgroups")
	}
	starts := countStarts(b)
	b.StartAhead(policy.DenyAllNetwork(), policy.ResourceLimits{Pids: 200})
	req := &backend.Request{Workspace: t.TempDir(), Limits: policy.ResourceLimits{Pids: 150}}
	in := runInPulseCgroup(t, b, req, "pids")
	if n := starts.Load(); n != 2 {
		t.Fatalf("%d inits started, want 2 (the one started ahead, for other limits, and the Exec's)", n)
	}
	if !in {
		t.Fatal("the command is not in the run's pids cgroup")
	}
}

// TestStartAheadUnusedIsEndedByClose: an init started ahead and never used
// is ended by Close, with its run directory and its cgroups.
func TestStartAheadUnusedIsEndedByClose(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	b := newBackend(t, WithStateDir(state), WithoutPrestart())
	b.StartAhead(policy.DenyAllNetwork(), policy.ResourceLimits{Pids: 200})
	b.waitWarm()
	if n := idleInits(b); n != 1 {
		t.Fatalf("%d idle inits after StartAhead, want 1", n)
	}
	var cgDirs []string
	b.mu.Lock()
	for _, ps := range b.warm {
		for _, p := range ps {
			if p.cg != nil {
				cgDirs = append(cgDirs, p.cg.dirs...)
			}
		}
	}
	b.mu.Unlock()
	if b.cg.pids && len(cgDirs) == 0 {
		t.Fatal("the init started ahead has no cgroup, though pids limits can be held here")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(state); err != nil || len(ents) != 0 {
		t.Fatalf("run directories left after Close: %v (%v)", ents, err)
	}
	for _, d := range cgDirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("cgroup %s left after Close (%v)", d, err)
		}
	}
}

// TestRefillIsInTheLastExecsCgroups: the init the pool starts after an
// Exec is already in the cgroups of that Exec's limits, so that the next
// Exec with the same limits does not wait to move it there; the next Exec
// runs in it, in its run's cgroups.
func TestRefillIsInTheLastExecsCgroups(t *testing.T) {
	b := newBackend(t)
	if !b.cg.pids {
		t.Skip("no pids cgroup controller delegated here: the pool's inits need no cgroups")
	}
	b.waitWarm() // the probe's refill, for its own limits
	lim := policy.ResourceLimits{Pids: 180}
	req := &backend.Request{Workspace: t.TempDir(), Args: []string{"true"}, Limits: lim}
	if res, _, errs := runCmd(t, b, req); res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, errs)
	}
	b.waitWarm()
	want := b.cgroupKey(lim.WithDefaults().WithIsolationDefaults())
	b.mu.Lock()
	var keys []string
	for _, p := range b.warm[true] {
		if p.cg == nil {
			keys = append(keys, "(none)")
			continue
		}
		keys = append(keys, p.cg.key)
	}
	b.mu.Unlock()
	if len(keys) != 1 || keys[0] != want {
		t.Fatalf("idle inits' cgroups %q, want one in %q", keys, want)
	}
	starts := countStarts(b)
	in := runInPulseCgroup(t, b, req, "pids")
	b.waitWarm()
	if n := starts.Load(); n != 1 {
		t.Fatalf("%d inits started for an Exec with an idle init of its limits, want 1 (the refill)", n)
	}
	if !in {
		t.Fatal("the command is not in the run's pids cgroup")
	}
}

// TestInitIsBornInItsCgroups: an init is started in its run's cgroup v1
// directories (runCgroup.startBorn) rather than moved there afterwards,
// which waits for the kernel; seen from inside, the sandbox's cgroup
// namespace then has the run's cgroup as its root, so the command does
// not learn the host's cgroup path either.
func TestInitIsBornInItsCgroups(t *testing.T) {
	b := newBackend(t, WithoutPrestart())
	d, ok := b.cg.dirs["pids"]
	if !ok || d.v2 {
		t.Skip("no cgroup v1 pids controller delegated here")
	}
	for _, ahead := range []bool{false, true} {
		lim := policy.ResourceLimits{Pids: 190}
		if ahead {
			b.StartAhead(policy.DenyAllNetwork(), lim)
		}
		res, out, errs := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: "cat /proc/self/cgroup", Limits: lim})
		if res.ExitCode != 0 {
			t.Fatalf("exit %d: %s", res.ExitCode, errs)
		}
		var line string
		for _, l := range strings.Split(out, "\n") {
			if f := strings.SplitN(l, ":", 3); len(f) == 3 && strings.Contains(","+f[1]+",", ",pids,") {
				line = l
			}
		}
		if !strings.HasSuffix(line, ":/") {
			t.Fatalf("started ahead %v: the command's pids cgroup is %q, want the root of its cgroup namespace (the init born in the run's cgroup)", ahead, line)
		}
	}
}

// TestBirthLeavesTheBackendOutOfTheRunsMemoryCgroup: while an init is
// born in a run's cgroup v1 directories, the backend as a process (its
// first thread, the owner of its memory and the one the OOM killer goes
// by) stays in its own memory cgroup: the sandbox's limit counts none of
// the backend's memory and its OOM killer cannot pick the backend. The
// thread an init is born from is the runtime's choice: the test makes
// births several at a time, each holding its thread until all have one,
// so that the runtime's idle threads, the first among them, are used.
func TestBirthLeavesTheBackendOutOfTheRunsMemoryCgroup(t *testing.T) {
	b := newBackend(t, WithoutPrestart())
	d, ok := b.cg.dirs["memory"]
	if !ok || d.v2 {
		t.Skip("no cgroup v1 memory controller delegated here")
	}
	const births, touched = 4, 4 << 20
	for range 25 {
		var inside, faulted sync.WaitGroup
		inside.Add(births)
		faulted.Add(1)
		errs := make(chan error, births)
		for i := range births {
			go func() {
				cg, err := b.newCgroup(policy.ResourceLimits{MemoryBytes: 1 << 30})
				if err != nil {
					inside.Done()
					errs <- err
					return
				}
				defer cg.remove()
				errs <- cg.startBorn(func() (int, error) {
					inside.Done()
					inside.Wait()
					if i == 0 {
						// Memory the backend faults in meanwhile, on a
						// thread of no birth.
						go func() {
							defer faulted.Done()
							mem, err := unix.Mmap(-1, 0, touched, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
							if err != nil {
								return
							}
							for i := 0; i < len(mem); i += os.Getpagesize() {
								mem[i] = 1
							}
							unix.Munmap(mem)
						}()
					}
					faulted.Wait()
					// The process's cgroups are its first thread's.
					self, err := os.ReadFile("/proc/self/cgroup")
					if err != nil {
						return 0, err
					}
					for _, l := range strings.Split(string(self), "\n") {
						if f := strings.SplitN(l, ":", 3); len(f) == 3 && strings.Contains(","+f[1]+",", ",memory,") &&
							strings.HasSuffix(cg.memory, f[2]) {
							return 0, fmt.Errorf("the backend's first thread is in the run's memory cgroup (%s) while an init is born", l)
						}
					}
					usage, err := os.ReadFile(filepath.Join(cg.memory, "memory.usage_in_bytes"))
					if err != nil {
						return 0, err
					}
					if n, err := strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64); err != nil || n >= touched/2 {
						return 0, fmt.Errorf("the run's memory cgroup was charged %s bytes (%v) while the backend faulted in %d", usage, err, touched)
					}
					return 0, nil
				})
			}()
		}
		for range births {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRefillWaitsForBackgroundAfter: the init an Exec leaves for the next
// one is not started before the channel of backend.WithBackgroundAfter is
// closed (a daemon's reply to the client), then it is; a backend closed
// while a refill waits does not wait for the channel.
func TestRefillWaitsForBackgroundAfter(t *testing.T) {
	b := newBackend(t)
	b.waitWarm() // the probe's refill
	after := make(chan struct{})
	var early atomic.Bool
	var starts atomic.Int32
	b.o.phaseHook = func(name string, _ int64) {
		if name != "clone-exec" {
			return
		}
		starts.Add(1)
		select {
		case <-after:
		default:
			early.Store(true)
		}
	}
	ctx := backend.WithBackgroundAfter(context.Background(), after)
	req := &backend.Request{Workspace: t.TempDir(), Args: []string{"true"}, Limits: policy.ResourceLimits{Timeout: 30 * time.Second}}
	res, err := b.Exec(ctx, req)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec: %v, %+v", err, res)
	}
	// Room for a refill that does not wait to start, so that it shows.
	time.Sleep(200 * time.Millisecond)
	close(after)
	b.waitWarm()
	if early.Load() {
		t.Fatal("the next init was started before the channel was closed")
	}
	if n, idle := starts.Load(), idleInits(b); n != 1 || idle != 1 {
		t.Fatalf("%d inits started and %d idle after the channel closed, want 1 and 1", n, idle)
	}

	// Close with a refill waiting on a channel never closed.
	c := newBackend(t)
	c.waitWarm()
	ctx = backend.WithBackgroundAfter(context.Background(), make(chan struct{}))
	if res, err := c.Exec(ctx, &backend.Request{Workspace: t.TempDir(), Args: []string{"true"}, Limits: req.Limits}); err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec: %v, %+v", err, res)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a Close that waits for the channel, not a slow one
		t.Fatal("Close waits for the refill's channel")
	}
}

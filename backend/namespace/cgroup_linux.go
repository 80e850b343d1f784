package namespace

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/internal/randhex"
	"github.com/pulse-agent/pulse/policy"
)

// cgroupSupport says which limits a cgroup can enforce here. Each
// controller is looked for in cgroup v2 first (only when delegated: listed
// in the current cgroup's subtree_control) and then in a v1 hierarchy.
type cgroupSupport struct {
	memory, pids, cpu bool
	dirs              map[string]cgroupDir // by controller
}

type cgroupDir struct {
	base string // the directory children are made in
	v2   bool
}

func detectCgroups() cgroupSupport {
	s := cgroupSupport{dirs: map[string]cgroupDir{}}
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return s
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			for _, mnt := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
				var fs unix.Statfs_t
				if unix.Statfs(mnt, &fs) != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
					continue
				}
				base := filepath.Join(mnt, parts[2])
				sub, err := os.ReadFile(filepath.Join(base, "cgroup.subtree_control"))
				if err != nil || unix.Access(base, unix.W_OK) != nil {
					break
				}
				for _, c := range strings.Fields(string(sub)) {
					if c == "memory" || c == "pids" || c == "cpu" {
						s.dirs[c] = cgroupDir{base: base, v2: true}
					}
				}
				break
			}
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c != "memory" && c != "pids" && c != "cpu" {
				continue
			}
			if _, ok := s.dirs[c]; ok {
				continue
			}
			base := filepath.Join("/sys/fs/cgroup", parts[1], parts[2])
			if _, err := os.Stat(base); err != nil {
				base = filepath.Join("/sys/fs/cgroup", c, parts[2])
			}
			if unix.Access(base, unix.W_OK) == nil {
				s.dirs[c] = cgroupDir{base: base}
			}
		}
	}
	_, s.memory = s.dirs["memory"]
	_, s.pids = s.dirs["pids"]
	_, s.cpu = s.dirs["cpu"]
	return s
}

// runCgroup is the set of cgroup directories of one execution.
type runCgroup struct {
	dirs []string // distinct directories made, to add the pid to and remove
	// Per entry of dirs: the directory it was made in (where the
	// backend's own threads are) and whether it is of cgroup v1, and
	// whether the init was born in it (startBorn), so add need not move
	// it there.
	bases  []string
	v1     []bool
	born   []bool
	memory string
	v2mem  bool
	pids   string
	key    string // the limits it was made for (cgroupKey)
	// bornPid is the process startBorn started in the directories of
	// born.
	bornPid int
	added   int // the pid add put in it, 0 before
}

// initPidsSlack bounds how many tasks the init may hold before the backend
// has counted its threads: the pids limit is the command's, not the init's.
const initPidsSlack = 32

// tightenPids sets the pids limit to the command's own allowance plus the
// init's threads, counted once the init has started the command.
func (c *runCgroup) tightenPids(limit int64, initPid int) error {
	if c.pids == "" || limit <= 0 {
		return nil
	}
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(initPid), "task"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.pids, "pids.max"), []byte(strconv.FormatInt(limit+int64(len(ents)), 10)), 0)
}

type cgroupWrite struct{ ctrl, file, value string }

// cgroupKey names what newCgroup would make for lim: two limits with the
// same key get the same cgroups.
func (b *Backend) cgroupKey(lim policy.ResourceLimits) string {
	return fmt.Sprint(b.cgroupWrites(lim))
}

// newCgroup makes the cgroups a run's limits need; nil when it needs none.
func (b *Backend) newCgroup(lim policy.ResourceLimits) (*runCgroup, error) {
	writes := b.cgroupWrites(lim)
	if len(writes) == 0 {
		return nil, nil
	}
	cg := &runCgroup{key: fmt.Sprint(writes)}
	made := map[string]string{}
	// Named by the owner's pid (see reconcile) and a suffix of their
	// own: made before the run they will be used by is known, and a run
	// directory is reused (recycleRun) while the cgroups of its last use
	// may still be being removed.
	name := "pulse-" + strconv.Itoa(os.Getpid()) + "-" + randhex.String(8)
	for _, w := range writes {
		d := b.cg.dirs[w.ctrl]
		dir := filepath.Join(d.base, name)
		if _, ok := made[dir]; !ok {
			if err := os.Mkdir(dir, 0o755); err != nil {
				cg.remove()
				return nil, err
			}
			made[dir] = w.ctrl
			cg.dirs = append(cg.dirs, dir)
			cg.bases = append(cg.bases, d.base)
			cg.v1 = append(cg.v1, !d.v2)
			cg.born = append(cg.born, false)
		}
		switch w.ctrl {
		case "memory":
			cg.memory, cg.v2mem = dir, d.v2
		case "pids":
			cg.pids = dir
		}
		if err := os.WriteFile(filepath.Join(dir, w.file), []byte(w.value), 0); err != nil && w.file != "memory.swap.max" && w.file != "memory.memsw.limit_in_bytes" {
			cg.remove()
			return nil, fmt.Errorf("%s: %w", w.file, err)
		}
	}
	return cg, nil
}

// cgroupWrites lists the cgroup files, in order, that hold lim here.
func (b *Backend) cgroupWrites(lim policy.ResourceLimits) []cgroupWrite {
	type write = cgroupWrite
	var writes []write
	if lim.MemoryBytes > 0 && b.cg.memory {
		if b.cg.dirs["memory"].v2 {
			writes = append(writes, write{"memory", "memory.max", strconv.FormatInt(lim.MemoryBytes, 10)},
				write{"memory", "memory.swap.max", "0"})
		} else {
			// memsw (memory plus swap) exists only where swap accounting
			// is on; without it the limit alone lets a command swap past
			// it. Set after the memory limit, which it may not be below.
			writes = append(writes, write{"memory", "memory.limit_in_bytes", strconv.FormatInt(lim.MemoryBytes, 10)},
				write{"memory", "memory.memsw.limit_in_bytes", strconv.FormatInt(lim.MemoryBytes, 10)})
		}
	}
	if lim.Pids > 0 && b.cg.pids {
		// The init's threads count too; until tightenPids knows how many
		// there are, allow a bounded slack.
		writes = append(writes, write{"pids", "pids.max", strconv.FormatInt(lim.Pids+initPidsSlack, 10)})
	}
	if lim.CPUs > 0 && b.cg.cpu {
		const period = 100000
		quota := strconv.FormatInt(int64(lim.CPUs*period), 10)
		if b.cg.dirs["cpu"].v2 {
			writes = append(writes, write{"cpu", "cpu.max", quota + " " + strconv.Itoa(period)})
		} else {
			writes = append(writes, write{"cpu", "cpu.cfs_period_us", strconv.Itoa(period)}, write{"cpu", "cpu.cfs_quota_us", quota})
		}
	}
	return writes
}

// startBorn runs start, which starts a process and returns its pid, on
// a thread of its own that is in c's cgroup v1 directories for the time
// of the fork, so that the process is born in them (a new task starts in
// its parent thread's cgroups) instead of being moved there by add,
// which waits for an RCU grace period: a thread moving itself alone (the
// tasks file, pid 0) takes no such wait. cgroup v2 has no per-thread
// membership outside threaded subtrees; add moves the process into its
// v2 directories, and into any v1 one the thread could not enter.
//
// The thread goes back to the backend's own cgroups after the fork. The
// Go runtime makes no thread from a locked one (it hands that to a
// thread of its own), so no other thread of the backend's is born in
// the run's cgroups meanwhile; if the way back fails, the goroutine ends
// still locked, and the runtime ends the thread with it rather than let
// it run the backend's code from inside a sandbox's limits.
//
// The thread is never the process's first one (its pid): that thread is
// the owner of the process's memory in cgroup v1, whose memory cgroup
// every page any thread of the backend faults in is charged to, and the
// one by which the process is listed in a cgroup (cgroup.procs), which is
// where the memory controller's OOM killer looks for a victim. Born from
// it, an init would have the backend's memory counted against the
// sandbox's limit meanwhile, and the backend killed when it is reached.
func (c *runCgroup) startBorn(start func() (int, error)) error {
	type started struct {
		pid int
		err error
	}
	done := make(chan started, 1)
	var born func()
	born = func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Held, so that the goroutine below runs on another thread:
			// a locked thread runs no goroutine but its own.
			inner := make(chan struct{})
			go func() {
				defer close(inner)
				born()
			}()
			<-inner
			runtime.UnlockOSThread()
			return
		}
		var in []int
		for i, d := range c.dirs {
			// Only where the way back is open too: a thread that cannot
			// leave is ended (below), costing a thread per init.
			if c.v1[i] && unix.Access(filepath.Join(c.bases[i], "tasks"), unix.W_OK) == nil &&
				os.WriteFile(filepath.Join(d, "tasks"), []byte("0"), 0) == nil {
				in = append(in, i)
			}
		}
		pid, err := start()
		back := true
		for _, i := range in {
			if os.WriteFile(filepath.Join(c.bases[i], "tasks"), []byte("0"), 0) != nil {
				back = false
			}
		}
		if err == nil {
			for _, i := range in {
				c.born[i] = true
			}
			c.bornPid = pid
		}
		done <- started{pid, err}
		if back {
			runtime.UnlockOSThread()
		}
	}
	go born()
	r := <-done
	return r.err
}

// add moves the process pid into the cgroups. Moving a running process
// waits for an RCU grace period in the kernel (the cgroup_threadgroup_rwsem
// write side, unless the hierarchy is mounted favordynmods): milliseconds,
// tens of them on a busy machine, which is why StartAhead does it before
// the Exec rather than in it.
func (c *runCgroup) add(pid int) error {
	var errs []error
	for i, d := range c.dirs {
		if c.born[i] && pid == c.bornPid {
			continue
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		c.added = pid
	}
	return errors.Join(errs...)
}

func (c *runCgroup) oomKilled() bool {
	if c.memory == "" {
		return false
	}
	file := "memory.oom_control"
	if c.v2mem {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(c.memory, file))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "oom_kill" && f[1] != "0" {
			return true
		}
	}
	return false
}

// remove deletes the run's cgroups. They are empty once the namespace's
// pid 1 has been waited for, but the kernel may still be detaching the
// dying tasks: retry EBUSY for a moment.
func (c *runCgroup) remove() {
	for _, d := range c.dirs {
		for i := 0; i < 50; i++ {
			err := os.Remove(d)
			if err == nil || errors.Is(err, os.ErrNotExist) || !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// reconcileCgroups removes the cgroups of runs whose owner process is
// gone. The kernel refuses to remove a cgroup that still holds tasks, so
// this cannot break a live run even if a pid was reused.
func (s cgroupSupport) reconcile() error {
	var errs []error
	seen := map[string]bool{}
	for _, d := range s.dirs {
		if seen[d.base] {
			continue
		}
		seen[d.base] = true
		matches, _ := filepath.Glob(filepath.Join(d.base, "pulse-*"))
		for _, m := range matches {
			owner, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(m), "pulse-"), "-")
			pid, err := strconv.Atoi(owner)
			if !ok || err != nil || pid <= 0 {
				continue
			}
			if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
				continue // the owner is alive (or not ours to ask about)
			}
			if err := os.Remove(m); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EBUSY) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

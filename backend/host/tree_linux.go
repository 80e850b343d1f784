//go:build linux

package host

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A command and everything it starts are tracked in a cgroup of their own
// (a tree), because the process group does not hold them: a process that
// calls setsid leaves it, and one whose owner was SIGKILLed outlives
// everything that would have killed the group. Membership of a cgroup is
// inherited by every child and cannot be left without write access to
// another cgroup, which the command, run as the caller, has only when the
// caller is root (the cgroup is then as good as the process group, no
// worse). The v2 hierarchy is used where it is mounted (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified beside v1 controllers): membership alone is what
// is needed, so no controller has to be delegated. The command starts in
// its cgroup (clone3 CLONE_INTO_CGROUP), so not one of its forks escapes.
//
// The cgroup is named pulse-host-<owner pid>-<owner start>-<n>: Reconcile
// kills what is left in those whose owner is gone and removes them.
//
// Where no cgroup can be made, a child subreaper tracks the command's
// processes instead (reaper_linux.go).

// trackingNote is what Capabilities says of how a command's processes are
// held, base being treeBase's answer.
func trackingNote(base string) string {
	switch {
	case base != "":
		return "every process a command starts is tracked in a cgroup (v2, " + base + ") and killed when it ends, setsid or not; Reconcile kills what a killed owner left"
	case reaperAvailable():
		return "no cgroup (no writable v2 hierarchy, or " + NoCgroupEnv + "=1): a child subreaper adopts what leaves the command's process group (setsid) and kills it when the command ends, and when its owner dies; a command that kills its subreaper (its parent, the same user) first escapes it"
	}
	return "timeout and cancellation kill the command's process group; no writable cgroup v2 hierarchy and no subreaper here, so a process that leaves the group (setsid) escapes it, and commands of a killed owner keep running"
}

// treeBase finds the directory tree cgroups are made in: this process's
// own v2 cgroup, when it is writable. "" when there is none, or
// NoCgroupEnv says not to use one.
func treeBase() string {
	if !useCgroup() {
		return ""
	}
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rel, ok := strings.CutPrefix(sc.Text(), "0::")
		if !ok {
			continue
		}
		for _, mnt := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
			var st unix.Statfs_t
			if unix.Statfs(mnt, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
				continue
			}
			base := filepath.Join(mnt, rel)
			if unix.Access(base, unix.W_OK) != nil {
				return ""
			}
			return base
		}
	}
	return ""
}

// tree is the cgroup of one execution.
type tree struct {
	dir string
	fd  int // O_PATH descriptor of dir, for CLONE_INTO_CGROUP
}

var treeSeq atomic.Int64

// ownerTag names this process in its trees' names: pid and start time, so
// that a reused pid is not taken for a live owner.
func ownerTag(pid int) string {
	return strconv.Itoa(pid) + "-" + procStart(pid)
}

// selfTag is this process's ownerTag, read once: neither its pid nor its
// start time changes, and reading it from /proc cost every command about
// ten system calls. A read that failed (no start time) is not kept, so
// that the next command tries again.
func selfTag() string {
	if t := selfTagCache.Load(); t != nil {
		return *t
	}
	t := ownerTag(os.Getpid())
	if !strings.HasSuffix(t, "-") {
		selfTagCache.Store(&t)
	}
	return t
}

var selfTagCache atomic.Pointer[string]

// procStart is the start time of pid in clock ticks since boot, "" when it
// cannot be read.
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// newTree makes a cgroup for one execution under base.
func newTree(base string) (*tree, error) {
	dir := filepath.Join(base, fmt.Sprintf("pulse-host-%s-%d", selfTag(), treeSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = os.Remove(dir)
		return nil, err
	}
	return &tree{dir: dir, fd: fd}, nil
}

// add moves pid into the tree, for a start that could not use
// CLONE_INTO_CGROUP.
func (t *tree) add(pid int) error {
	return os.WriteFile(filepath.Join(t.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// kill kills every process in the tree and waits, a bounded time, until
// it is empty. A process forking meanwhile cannot leave a child behind:
// it is in the tree too, and killed on the next round. A tree already
// empty (the usual end of a command that left nothing behind) is left
// as it is: nothing can enter an empty tree but by a write to its
// cgroup.procs or a start into it, neither of which its commands can do.
func killTree(dir string) error {
	if populated(dir) == 0 {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
		return waitEmpty(dir)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids, err := treePids(dir)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			_ = unix.Kill(p, unix.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %d processes survive SIGKILL", dir, len(pids))
		}
		time.Sleep(time.Millisecond)
	}
}

// populated reads the tree's cgroup.events: 0 when it holds no process,
// 1 when it does, -1 when the file cannot be read (cgroup.kill is then
// tried, which says why).
func populated(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	switch {
	case err != nil:
		return -1
	case strings.Contains(string(b), "populated 0"):
		return 0
	}
	return 1
}

func waitEmpty(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "populated 0") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still populated after cgroup.kill", dir)
		}
		time.Sleep(time.Millisecond)
	}
}

func treePids(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, l := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(l); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// end kills what is left of the tree and removes it.
func (t *tree) end() error {
	err := killTree(t.dir)
	unix.Close(t.fd)
	return errors.Join(err, removeTree(t.dir))
}

// removeTree removes an emptied cgroup; the kernel may still be detaching
// the last dead tasks, so EBUSY is retried for a moment.
func removeTree(dir string) error {
	for i := 0; ; i++ {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || i >= 100 {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// reconcileTrees kills the processes left in trees whose owner process is
// gone (killed before it could end them) and removes the trees.
func reconcileTrees(base string) error {
	if base == "" {
		return nil
	}
	matches, _ := filepath.Glob(filepath.Join(base, "pulse-host-*"))
	var errs []error
	for _, m := range matches {
		f := strings.Split(strings.TrimPrefix(filepath.Base(m), "pulse-host-"), "-")
		if len(f) != 3 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil || pid <= 0 {
			continue
		}
		if procStart(pid) == f[1] && f[1] != "" {
			continue // the owner is alive: its executions are its own
		}
		if err := killTree(m); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := removeTree(m); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

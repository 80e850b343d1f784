package namespace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"
	"github.com/pulse-agent/pulse/policy"
)

// What a command writes lives in a tmpfs that its init mounts in the
// sandbox's mount namespace (nsinit.mountScratch), sized by
// limits.disk_bytes: the kernel refuses writes past it (ENOSPC) while the
// command runs, where an upper directory on the host's disk was bounded
// by nothing until staging, after the command ended, and a command could
// fill the filesystem under the state dir. A tmpfs, not a disk quota:
// project quotas and loop-mounted filesystems need privileges and
// support the backend cannot count on, and a tmpfs mount works for an
// unprivileged user in a user namespace. Its pages are memory, charged
// to the command's memory cgroup: writes count against limits.memory_bytes
// too, so the default bound takes no more than a share of the memory
// available (scratchBytes), and a command that writes more than its
// memory allows is ended as out of memory.

// scratchInodeBytes is the bytes of the bound per inode the tmpfs
// allows: a command that makes empty files is bounded too, with room for
// a source tree of small files (a 4 GiB bound allows 262144 entries).
const scratchInodeBytes = 16 << 10

// scratchPoll is how often a running command's scratch is checked for
// being full.
const scratchPoll = 100 * time.Millisecond

// maxScratch caps every scratch at the most the backend reads back,
// maxOverlayTotal (TestMaxScratchWithinWhatIsReadBack), so that a
// command stopped at the bound keeps its writes while one let past it
// would lose them all (ErrOverlayTooLarge). It is a value of its own so
// that the conformance suite's loss trigger, which lowers
// maxOverlayTotal, loses the overlay on reading it back rather than
// filling a scratch shrunk with it.
const maxScratch int64 = 4 << 30

// scratchBytes is the bound on what a command under lim writes: the
// policy's, or the default, policy.DiskDefault of the memory available;
// never more than maxScratch.
func scratchBytes(lim policy.ResourceLimits) int64 {
	n := lim.DiskBytes
	if n <= 0 {
		n = policy.DiskDefault(memAvailable())
	}
	return min(max(n, 4096), maxScratch) // tmpfs reads 0 as "no limit"
}

// scratchInodes is the inode bound of a scratch of n bytes.
func scratchInodes(n int64) int64 {
	return max(n/scratchInodeBytes, 1024)
}

// memAvailable is MemAvailable of /proc/meminfo in bytes, -1 when not
// known.
func memAvailable() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				return -1
			}
			return kb << 10
		}
	}
	return -1
}

// scratchKernel reports whether the kernel's tmpfs can be an overlay's
// upper layer in a user namespace: overlayfs marks opaque directories
// (a directory removed and made again) with user.overlay.* extended
// attributes there, which tmpfs stores since Linux 6.6. Before, the upper
// directory stays in the run directory on the host's disk, without the
// bound (Capabilities does not list disk_bytes, so a policy that sets it
// is refused).
func scratchKernel() bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	major, minor, ok := kernelVersion(unix.ByteSliceToString(u.Release[:]))
	return ok && (major > 6 || major == 6 && minor >= 6)
}

// kernelVersion parses the major and minor numbers of a kernel release
// ("6.18.44-fc-v1300").
func kernelVersion(release string) (major, minor int, ok bool) {
	a, rest, found := strings.Cut(release, ".")
	if !found {
		return 0, 0, false
	}
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	major, err1 := strconv.Atoi(a)
	minor, err2 := strconv.Atoi(rest[:end])
	return major, minor, err1 == nil && err2 == nil
}

// errNoScratch: the init did not hand over its scratch filesystem, so
// what the command writes could not be read back.
var errNoScratch = errors.New("the sandbox init did not hand over its scratch filesystem")

// takeScratch receives the scratch filesystem's root from the init (it
// is sent before the command starts) and starts watching it.
func (x *nsExec) takeScratch() error {
	f, err := x.p.dialer.receiveScratch(5 * time.Second)
	if err != nil {
		return err
	}
	// The watch gets a descriptor of its own: release closes x.scratch
	// while the watch may still be reading it, and an *os.File's Close
	// races with a concurrent Fd.
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		f.Close()
		return fmt.Errorf("namespace: scratch: %w", err)
	}
	x.scratch = f
	x.watched = make(chan struct{})
	go x.watchScratch(fd)
	return nil
}

// watchScratch ends the command once its scratch is full, until the init
// is reaped: the kernel has refused its writes past the bound, and the
// command is stopped there rather than left to go on without them (and
// perhaps exit 0 with a file cut short).
func (x *nsExec) watchScratch(fd int) {
	defer close(x.watched)
	defer unix.Close(fd)
	t := time.NewTicker(scratchPoll)
	defer t.Stop()
	for {
		select {
		case <-x.done:
			return
		case <-t.C:
			if full(fd) {
				x.kill(backend.DiskLimit)
				return
			}
		}
	}
}

// scratchFull reports whether the command's scratch has no block or no
// inode left.
func (x *nsExec) scratchFull() bool {
	return x.scratch != nil && full(int(x.scratch.Fd()))
}

// full reports whether the tmpfs fd is the root of has no block or no
// inode left.
func full(fd int) bool {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return false
	}
	return st.Bavail == 0 || st.Ffree == 0
}

// scratchUsed is the bytes the command's scratch holds, 0 when unknown.
func (x *nsExec) scratchUsed() int64 {
	if x.scratch == nil {
		return 0
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(x.scratch.Fd()), &st); err != nil {
		return 0
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// scratchPath is the path, in this process, of the scratch's root.
func scratchPath(f *os.File) string {
	return "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
}

// receiveScratch reads the init's scratch message, waiting up to wait:
// sent before the command starts, it is there by the time the init says
// the command started.
func (d *initDialer) receiveScratch(wait time.Duration) (*os.File, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_ = d.c.SetReadDeadline(time.Now().Add(wait))
	defer d.c.SetReadDeadline(time.Time{})
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := d.c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoScratch, err)
	}
	f := receivedFile(oob[:oobn])
	if string(buf[:n]) != nsinit.ScratchMessage || f == nil {
		if f != nil {
			f.Close()
		}
		return nil, fmt.Errorf("%w: got %q", errNoScratch, buf[:n])
	}
	return f, nil
}

// lateScratch is the scratch of a command ended before the init said it
// started (cancelled while the sandbox was being set up): the init may
// have handed it over already, and then what is in it is read as usual;
// an init ended before it mounted one ran no command, which wrote
// nothing.
func (x *nsExec) lateScratch() (ran bool) {
	if x.cfg.Scratch == "" {
		return true // no scratch: the upper directory is the run's
	}
	if x.scratch != nil || x.started {
		return x.started
	}
	if f, err := x.p.dialer.receiveScratch(200 * time.Millisecond); err == nil {
		x.scratch = f
		return true
	}
	return false
}

package boxrt

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// dropTo makes the calling process uid:gid with no supplementary group
// and no capability in any set, the bounding set included, ahead of an
// exec: the runtime is root in the box with a few capabilities, a process
// it starts inherits its bounding set, and setuid empties the effective
// and permitted sets but not that one. no-new-privileges already keeps a
// setuid or file-capability program from raising anything from it, but
// the bounding set is what the kernel would hand out, so a command gets
// an empty one, as on the namespace backend.
//
// Credentials and the bounding set are a thread's in Linux, and a
// process's only as far as its threads agree; the runtime is a Go
// program of several threads. So it locks its goroutine to the thread it
// is on and changes only that thread, with the raw system calls (Go's
// own Setuid changes every thread, through a mechanism a cgo build,
// such as a test binary under -race, does not have): the exec that must
// follow on the same goroutine is that thread's, and the new program has
// its credentials alone. The lock is never undone; on an error the
// caller reports it and exits.
func dropTo(uid, gid int) error {
	if uid <= 0 || gid <= 0 {
		return fmt.Errorf("dropping to %d:%d: %w", uid, gid, errNotAUser)
	}
	runtime.LockOSThread()
	for c := uintptr(0); ; c++ {
		if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); e != 0 {
			if e == unix.EINVAL && c > 0 {
				break // past the kernel's last capability
			}
			return fmt.Errorf("emptying the capability bounding set at %d: %w", c, e)
		}
	}
	if _, _, e := unix.RawSyscall(sysSetgroups, 0, 0, 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(sysSetresgid, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
		return fmt.Errorf("setresgid %d: %w", gid, e)
	}
	if _, _, e := unix.RawSyscall(sysSetresuid, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
		return fmt.Errorf("setresuid %d: %w", uid, e)
	}
	// From root to a user, setresuid clears the permitted and effective
	// sets; the inheritable one (and with it the ambient one) is emptied
	// here, and all of it read back rather than trusted.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, d := range data {
		if d.Effective != 0 || d.Permitted != 0 || d.Inheritable != 0 {
			return fmt.Errorf("capabilities left after the uid change: %+v", data)
		}
	}
	return nil
}

// errNotAUser: dropTo refuses root's ids, which would keep everything.
var errNotAUser = errors.New("not a user's ids")

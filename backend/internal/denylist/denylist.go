// Package denylist is the one list of what the isolating backends refuse
// a command at the system-call level, so that the namespace backend's
// seccomp filter and the Docker backend's seccomp profile cannot drift
// apart. It holds names and numbers only; each backend compiles them into
// its own form.
package denylist

// Syscalls fail with EPERM. They let a process leave or widen the sandbox
// (mounts, namespaces, ptrace and reading other processes' memory, kernel
// keyrings, BPF, modules, kexec, io_uring that bypasses seccomp,
// userfaultfd and perf that feed kernel exploits, handles that open files
// by inode outside the mount tree).
var Syscalls = []string{
	"mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
	"fsconfig", "fsmount", "fspick", "mount_setattr",
	"unshare", "setns",
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
	"kexec_load", "kexec_file_load", "reboot",
	"init_module", "finit_module", "delete_module",
	"bpf", "perf_event_open", "userfaultfd",
	"keyctl", "add_key", "request_key",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"open_by_handle_at", "name_to_handle_at",
	"swapon", "swapoff", "acct", "quotactl", "syslog",
	"iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"fanotify_init", "lookup_dcookie", "vhangup", "uselib",
}

// CloneNamespaceFlags may not be passed to clone: each creates a
// namespace, and a new user namespace would hand the command a fresh set
// of capabilities in it. clone3, whose flags live in memory a filter
// cannot read, fails with ENOSYS instead, so that libc falls back to
// clone. The values are the kernel's CLONE_NEW* bits, the same on every
// architecture.
var CloneNamespaceFlags = []uint64{
	0x10000000, // CLONE_NEWUSER
	0x00020000, // CLONE_NEWNS
	0x20000000, // CLONE_NEWPID
	0x40000000, // CLONE_NEWNET
	0x08000000, // CLONE_NEWIPC
	0x04000000, // CLONE_NEWUTS
	0x02000000, // CLONE_NEWCGROUP
	0x00000080, // CLONE_NEWTIME
}

// TerminalIoctls fail with EPERM: TIOCSTI pushes bytes into a terminal's
// input queue and TIOCLINUX (subcode 2, paste) does the same on a virtual
// console, so a command holding any terminal could type commands into it
// for whoever reads it next (CVE-2017-5226). Only the low 32 bits of the
// request are compared: the kernel truncates the argument to an int, so a
// filter that compared all 64 would miss TIOCSTI with high bits set
// (CVE-2019-10063). The values are the generic ones (x86, arm, riscv,
// s390); no other architecture is supported by the backends.
var TerminalIoctls = []uint32{
	0x5412, // TIOCSTI
	0x541C, // TIOCLINUX
}

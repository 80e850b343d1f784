package client

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrUntrusted: the daemon's directory, socket or process is not this
// user's own (or not this binary), so it is not used.
var ErrUntrusted = errors.New("daemon: not trusted")

// Dir is the directory the user's daemon sockets are in, by the rule the
// namespace backend's state dir follows: $XDG_RUNTIME_DIR/pulse-daemon;
// else pulse-daemon-UID in the temporary directory where that is this
// user's already (nobody else can take or replace it there); else the
// user's cache directory, where it can be made; else the name in the
// temporary directory, which CheckDir refuses should another user have
// made it first.
func Dir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "pulse-daemon")
	}
	tmp := filepath.Join(os.TempDir(), "pulse-daemon-"+strconv.Itoa(os.Getuid()))
	if CheckDir(tmp) == nil {
		return tmp
	}
	if c, err := os.UserCacheDir(); err == nil && filepath.IsAbs(c) {
		d := filepath.Join(c, "pulse", "daemon")
		if os.MkdirAll(d, 0o700) == nil {
			return d
		}
	}
	return tmp
}

// CheckDir reports an error (ErrUntrusted) unless dir is a directory,
// not a symlink, owned by this process's uid and closed to group and
// others: a socket in a directory someone else can write could be
// another user's listener.
func CheckDir(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || !ok || sys.Uid != uint32(os.Getuid()) || st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%w: %s is not a directory of uid %d closed to others", ErrUntrusted, dir, os.Getuid())
	}
	return nil
}

// volatileEnv are variables a shell changes between two commands of the
// same session (or bash between a command and one it starts in the
// background) without changing what pulse does, and PULSE_NO_DAEMON,
// which only a client reads: they do not pick another daemon.
var volatileEnv = []string{"_", "OLDPWD", "SHLVL", "PULSE_NO_DAEMON"}

// Name is the socket name (without ".sock") of the daemon for this
// executable, working directory and environment; "" when the executable
// cannot be told apart.
func Name(dir string, env []string) string {
	return NameFor("/proc/self/exe", dir, env)
}

// NameFor is Name for a daemon that runs the executable exe, from a
// client that is not that executable.
func NameFor(exe, dir string, env []string) string {
	id, err := exeIdentity(exe)
	if err != nil {
		return ""
	}
	h := sha256.New()
	fmt.Fprintf(h, "pulse daemon %d\nexe %s\ndir %q\n", Version, id, dir)
	env = slices.Clone(env)
	slices.Sort(env)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(volatileEnv, k) {
			continue
		}
		fmt.Fprintf(h, "env %q\n", kv)
	}
	return "daemon-" + hex.EncodeToString(h.Sum(nil)[:10])
}

// exeIdentity tells the executable exe apart from any other, a rebuild
// of it included.
func exeIdentity(exe string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(exe, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d:%d:%d.%d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec), nil
}

// SocketPath is the socket of the daemon name in dir; "" when the path
// is too long for a socket address.
func SocketPath(dir, name string) string {
	p := filepath.Join(dir, name+".sock")
	if len(p) >= len(unix.RawSockaddrUnix{}.Path) {
		return ""
	}
	return p
}

// CheckPeer checks that the process at the other end of fd is of this
// uid, in this process's user, pid and mount namespaces, and, unless exe
// is "", runs the executable exe. It returns the peer's pid.
func CheckPeer(fd int, exe string) (int, error) {
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0, fmt.Errorf("%w: peer credentials: %w", ErrUntrusted, err)
	}
	if cred.Uid != uint32(os.Getuid()) || cred.Pid <= 0 {
		return 0, fmt.Errorf("%w: peer is uid %d, not %d", ErrUntrusted, cred.Uid, os.Getuid())
	}
	proc := "/proc/" + strconv.Itoa(int(cred.Pid))
	for _, ns := range []string{"user", "pid", "mnt"} {
		own, err1 := os.Readlink("/proc/self/ns/" + ns)
		peer, err2 := os.Readlink(proc + "/ns/" + ns)
		if err1 != nil || err2 != nil || own != peer {
			return 0, fmt.Errorf("%w: peer %d is not in this %s namespace", ErrUntrusted, cred.Pid, ns)
		}
	}
	if exe != "" {
		own, err1 := os.Stat(exe)
		peer, err2 := os.Stat(proc + "/exe")
		if err1 != nil || err2 != nil || !os.SameFile(own, peer) {
			return 0, fmt.Errorf("%w: peer %d runs another executable", ErrUntrusted, cred.Pid)
		}
	}
	return int(cred.Pid), nil
}

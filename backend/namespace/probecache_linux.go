package namespace

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"
	"golang.org/x/sys/unix"
)

// probeCacheMax bounds what is read of a probe cache file; a real one is a
// few hundred bytes.
const probeCacheMax = 8 << 10

// probeKey is what a successful Probe depends on beyond the kernel's
// features that staticProbe reads every time: the kernel itself, the
// binary re-executed as the init, the caller's ids and the backend's
// configuration. Any change makes a cached result not match.
//
// refused is the key of a probe that passed only once the separate init
// program was dropped (initprog_linux.go).
func (b *Backend) probeKey(refused bool) (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	exe, err := exeIdentity()
	if err != nil {
		return "", err
	}
	var k strings.Builder
	fmt.Fprintf(&k, "pulse namespace probe %s\n", nsinit.Version)
	fmt.Fprintf(&k, "kernel %q %q %q\n", unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Version[:]), unix.ByteSliceToString(u.Machine[:]))
	fmt.Fprintf(&k, "%s\n", exe)
	if prog := b.foundInitProg(); prog != nil {
		how := "use"
		if refused {
			how = "refused"
		}
		// The identity of this build follows from the exe line.
		fmt.Fprintf(&k, "init %s %s\n", how, prog.key)
	} else {
		fmt.Fprintf(&k, "init self\n")
	}
	fmt.Fprintf(&k, "ids %d %d\n", os.Getuid(), os.Getgid())
	fmt.Fprintf(&k, "state %q\nhostname %q\nro %q\nrw %q\n", b.o.stateDir, b.o.hostname, b.o.readOnly, b.o.readWrite)
	return k.String(), nil
}

// probeCached reports whether the probe cache file records a successful
// Probe under key. Anything else — no file, a file that cannot be read,
// a torn or foreign one, another key — is a miss: the caller probes.
func (b *Backend) probeCached(key string) bool {
	if b.o.probeCache == "" || key == "" {
		return false
	}
	f, err := os.OpenFile(b.o.probeCache, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	got, err := io.ReadAll(io.LimitReader(f, probeCacheMax+1))
	return err == nil && len(got) <= probeCacheMax && bytes.Equal(got, []byte(key+"ok\n"))
}

// rememberProbe records a successful Probe under key: written to a
// temporary file and renamed over the cache, so that a reader sees the
// old record or the new one, never a mix. It is not fsynced: a record
// lost or torn by a crash only fails to match, and the next Probe runs
// in full.
func (b *Backend) rememberProbe(key string) {
	if b.o.probeCache == "" || key == "" {
		return
	}
	dir := filepath.Dir(b.o.probeCache)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return
	}
	_, err = f.WriteString(key + "ok\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), b.o.probeCache)
	}
	if err != nil {
		os.Remove(f.Name())
	}
}

// exeIdentity names the running executable by its path, device, inode,
// size and modification time: what the probe cache and the keeper's
// socket name go by, so that a rebuilt binary matches neither.
func exeIdentity() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	st, err := os.Stat(exe)
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("stat %s: no device and inode", exe)
	}
	return fmt.Sprintf("exe %q %d %d %d %d", exe, sys.Dev, sys.Ino, st.Size(), st.ModTime().UnixNano()), nil
}

package namespace

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"
	"golang.org/x/sys/unix"
)

// probeCacheMax bounds what is read of a probe cache file; a record is a
// few hundred bytes.
const probeCacheMax = 8 << 10

// probeCacheRecords is how many records a probe cache file keeps, newest
// first: one for each configuration a machine goes back and forth
// between (the CLI and a pulse-server, an installed build and `go run`'s,
// two policies' binds), each of which would otherwise find the other's
// record and run the full probe every time.
const probeCacheRecords = 8

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
// a torn or foreign one, only other keys — is a miss: the caller probes.
func (b *Backend) probeCached(key string) bool {
	if b.o.probeCache == "" || key == "" {
		return false
	}
	return slices.Contains(b.probeRecords(), key+"ok\n")
}

// probeRecords reads the probe cache file's records, newest first; nil
// when there is no file, or one that cannot be read or is too large.
func (b *Backend) probeRecords() []string {
	f, err := os.OpenFile(b.o.probeCache, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	got, err := io.ReadAll(io.LimitReader(f, probeCacheMax+1))
	if err != nil || len(got) > probeCacheMax {
		return nil
	}
	return splitProbeRecords(got)
}

// splitProbeRecords splits a cache file into its records: each the lines
// of a key and then a line "ok", which no key's line is (every one starts
// with its field's name). What follows the last "ok" line (a record torn
// by a crash) is not a record.
func splitProbeRecords(data []byte) []string {
	var recs []string
	start := 0
	for i := 0; i < len(data); {
		j := bytes.IndexByte(data[i:], '\n')
		if j < 0 {
			break
		}
		line := data[i : i+j]
		i += j + 1
		if string(line) == "ok" {
			recs = append(recs, string(data[start:i]))
			start = i
		}
	}
	return recs
}

// rememberProbe records a successful Probe under key, first, keeping the
// newest of the other records (up to probeCacheRecords in all, within
// probeCacheMax): written to a temporary file and renamed over the
// cache, so that a reader sees the old records or the new ones, never a
// mix. It is not fsynced: a record lost or torn by a crash only fails to
// match, and the next Probe runs in full; two processes remembering at
// once may keep only one's record, with the same effect.
func (b *Backend) rememberProbe(key string) {
	if b.o.probeCache == "" || key == "" {
		return
	}
	rec := key + "ok\n"
	recs := []string{rec}
	size := len(rec)
	for _, r := range b.probeRecords() {
		if len(recs) == probeCacheRecords || size+len(r) > probeCacheMax {
			break
		}
		if r != rec {
			recs = append(recs, r)
			size += len(r)
		}
	}
	dir := filepath.Dir(b.o.probeCache)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return
	}
	_, err = f.WriteString(strings.Join(recs, ""))
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

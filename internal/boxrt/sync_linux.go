package boxrt

import (
	"os"

	"golang.org/x/sys/unix"
)

// runSync is the sync step, run as the sandbox user with a tar on stdin:
// it brings base up to date from what the tar holds: del (NUL-separated
// paths to remove first), gone (the same, one a line, as the manifest
// names them), reset (base is made again from what came) and files/
// (entries to create, with the directories above them), under the lock
// the exec step takes, then updates base.manifest, which the exec step
// uses as each command's before (made again from all of base only after
// a reset). Its exit status says which part failed: 2 the tar, 3 the
// seed copy, 4 the removals, 5 the copy into base, 6 the manifest, 7 the
// reset.
func runSync(a []string) int {
	if len(a) != 1 || !hexID(a[0]) {
		return usage()
	}
	unix.Umask(0o077)
	s := &execStep{errw: os.Stderr}
	P := workDir
	S := P + "/sync-" + a[0]
	base := P + "/base"
	// files/ is made first, 0700: the tar need not hold it, and the copy
	// of files/. into base gives base its mode. umask 0 for the tar: base
	// must get the modes of the archive as they are.
	if os.Mkdir(S, 0o700) != nil || os.Mkdir(S+"/files", 0o700) != nil {
		return 2
	}
	tx := s.cmdAs(-1, -1, "", []string{"tar", "-x", "-f", "-", "-C", S})
	tx.Stdin = os.Stdin
	if s.runUmask(tx, 0) != nil {
		return 2
	}
	lock()
	rc := syncBase(s, S, base)
	unlock()
	_ = os.RemoveAll(S)
	return rc
}

func syncBase(s *execStep, S, base string) int {
	P := workDir
	full := false
	if exists(S + "/reset") {
		// What base holds is unknown: it is made again from what came.
		_ = s.as(-1, -1, -1, "", nil, nil, "chmod", "-R", "u+rwx", base, seedDir)
		if os.RemoveAll(base) != nil || os.RemoveAll(seedDir) != nil || os.Mkdir(base, 0o700) != nil {
			return 7
		}
		full = true
	}
	if !isDir(base) {
		// 0700, as the exec step makes it: commands (other uids) never
		// enter base.
		if s.as(-1, -1, -1, "", nil, nil, "cp", "-a", seedDir, P+"/base.tmp") != nil || os.Chmod(P+"/base.tmp", 0o700) != nil ||
			os.Rename(P+"/base.tmp", base) != nil || os.RemoveAll(seedDir) != nil {
			return 3
		}
		full = true
	}
	if nonEmpty(S + "/del") {
		del, err := os.Open(S + "/del")
		if err != nil {
			return 4
		}
		c := s.cmdAs(-1, -1, base, []string{"xargs", "-0", "rm", "-rf"})
		c.Stdin = del
		err = c.Run()
		del.Close()
		if err != nil {
			return 4
		}
	}
	if s.as(-1, -1, -1, "", nil, nil, "cp", "-a", S+"/files/.", base+"/") != nil || os.Chmod(base, 0o700) != nil {
		return 5
	}
	if !full && exists(P+"/base.manifest") {
		f, err := os.Create(S + "/new")
		if err == nil {
			err = manlines(S+"/files", f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err == nil && !exists(S+"/gone") {
			err = touch(S + "/gone")
		}
		if err != nil || mfupdate(P+"/base.manifest", S+"/gone", S+"/new", base) != nil {
			full = true
		}
	} else {
		full = true
	}
	if full && fullman(base, P+"/base.manifest") != nil {
		return 6
	}
	return 0
}

package boxrt

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The exec step runs one command in its own copy of the box's workspace,
// then writes a report of what that command changed after its output,
// and merges those changes into the box's base.
//
//	exec ID DIR FSIZE NONCE [NAME=VALUE...] ARG...
//
// FSIZE is the file size limit in 512-byte blocks (0: none); NAME=VALUE...
// is the command's whole environment; NONCE makes the markers ones the
// command's output cannot hit by chance. When the command has ended, the
// step writes \036PULSE-ERR-NONCE\036 to stderr, then
// \036PULSE-END-NONCE\036SIZE\n and a report of SIZE bytes (finish) to
// stdout; so the host can tell the command's output from the report even
// when one stream carries many commands in turn. With PULSE_TTY=1 in its
// environment the command runs on a terminal the host starts (see the
// Docker backend's tty.go): the step prints \036PULSE-TTY-NONCE\036UID\n
// once the copy is ready and reads the command's exit status from stdin.
//
// Layout. /pulse is a volume (the only place the engine copies into on a
// read-only root); the workspace arrives there as seed/. /work is a tmpfs,
// where metadata operations cost a fraction of a disk's:
//
//	/work/base/          the workspace as the next command will see it
//	/work/base.manifest  manifest of base, kept up to date by each change
//	/work/run/U/         the copy the commands of uid U run in, one at a
//	                     time; kept for the next command of U, which gets
//	                     it brought to base by changing only what differs
//	/work/run/U.man      manifest of run/U as its last command left it,
//	                     known to be so only while U.gen is not empty
//	/work/run/U.gen      the generation of base run/U equals ("x": none)
//	/work/run/ID.t/      command ID's pgid and time files
//	/work/run/ID.*       the step's own manifests and lists
//	/work/out/ID/        what goes back to the host: status, uid, time,
//	                     deleted, newline, warn, log, disk, nomerge,
//	                     basefail, batches, files-*.tar
//	/work/lock/          held (mkdir is atomic) while base changes
//	/work/reserve        room kept for the step's lists on a full tmpfs
//	/work/uid/U          held by the command running as uid U
//
// Who is who. The step runs as root with a few capabilities. Each command
// runs as a uid no running command shares (20000 and up, no
// capabilities), and its copy and ID.t are that uid's, mode 0700: so the
// kernel keeps concurrent commands from signalling, tracing or reading
// the memory of each other and of the runtime, and from entering each
// other's copies. A uid is taken again only by a later command, once
// every process of the earlier one is gone. Its group is the one all
// commands share (commandGID): caches are shared through it. base is the
// sandbox user's, mode 0700, and only ever changed as that user, so that
// a symlink a command merged into base cannot lead a later merge into
// another command's copy; a copy is only ever changed as its uid (or
// made anew by root), so that a symlink a command left in it leads
// nowhere that uid could not write anyway. Once the command has ended,
// every process of its uid is killed before root looks at its copy.
//
// Why a copy per command: concurrent commands on one box each get an
// overlay of their own writes only, measured against what they saw. Why
// copies are kept: a copy made anew costs a copy, an ownership change and
// a hash of every file, and gives every file a new inode and ctime, so
// that tools that cache what they saw by those (git's index, make) start
// from nothing each command.

const (
	workDir    = "/work"
	seedDir    = "/pulse/seed"
	toolsDir   = "/.pulse-tools"
	sandboxUID = 1000
	// commandGID is the group every command runs under.
	commandGID = 19999
	firstUID   = 20000
	endUID     = 60000
	// keptUIDs: copies are kept for the first uids only, which sequential
	// commands use; those of concurrent ones would hold memory for nothing.
	keptUIDs = 2
	// reserveBytes is room on the scratch tmpfs kept for the step's own
	// lists, freed when a command filled the tmpfs (its bound), so that
	// what it wrote is still listed and reported; allocating it costs
	// tens of milliseconds, so it is made once and again only once freed.
	reserveBytes = 8 << 20
)

// execStep is one command's run.
type execStep struct {
	id, dir, nonce string
	fsize          int64
	cmd            []string // NAME=VALUE... then ARG...
	tty            bool
	umask          int // the command's

	u       int
	o, q, t string // out dir, the step's prefix, ID.t
	r       string // the copy
	log     *os.File
	errw    io.Writer // where errors go without a log

	// keep: the uid (and its copy) may serve a later command; not when a
	// process of it outlived the kill. drop: the copy goes (it filled the
	// scratch tmpfs), the uid may serve again. stream: the changed
	// entries are read straight from the copy, not from files-*.tar.
	keep, drop, stream bool
	// baseGen is base's generation when the copy was made ready.
	baseGen string
}

func runExec(a []string) int {
	if len(a) < 5 || !hexID(a[0]) {
		return usage()
	}
	fsize, err := strconv.ParseInt(a[2], 10, 64)
	if err != nil || fsize < 0 {
		return usage()
	}
	s := &execStep{id: a[0], dir: a[1], fsize: fsize, nonce: a[3], cmd: a[4:], tty: os.Getenv("PULSE_TTY") == "1", keep: true}
	s.umask = unix.Umask(0o077)
	return s.run()
}

func hexID(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func (s *execStep) logf(format string, a ...any) {
	if s.log != nil {
		fmt.Fprintf(s.log, format+"\n", a...)
	}
}

// stderr is where the step's helpers write their errors: the log.
func (s *execStep) stderr() io.Writer {
	switch {
	case s.log != nil:
		return s.log
	case s.errw != nil:
		return s.errw
	}
	return io.Discard
}

func (s *execStep) run() int {
	P := workDir
	s.o = P + "/out/" + s.id
	s.q = P + "/run/" + s.id
	s.t = s.q + ".t"
	if _, err := os.Stat(P + "/uid"); err != nil {
		_ = os.MkdirAll(P+"/uid", 0o777)
	}
	u := firstUID
	for ; u < endUID; u++ {
		if os.Mkdir(fmt.Sprintf("%s/uid/%d", P, u), 0o777) == nil {
			break
		}
	}
	s.u = u
	s.r = fmt.Sprintf("%s/run/%d", P, u)
	if fi, err := os.Stat(P + "/run"); err != nil || !fi.IsDir() {
		if os.MkdirAll(P+"/run", 0o777) == nil {
			_ = os.Chmod(P+"/run", 0o711)
		}
	}
	if u >= endUID || os.MkdirAll(s.o, 0o777) != nil {
		_ = os.Remove(fmt.Sprintf("%s/uid/%d", P, u))
		fmt.Fprintf(os.Stderr, "\x1ePULSE-ERR-%s\x1e", s.nonce)
		fmt.Fprintf(os.Stdout, "\x1ePULSE-END-%s\x1e0\n", s.nonce)
		return 125
	}
	_ = os.WriteFile(s.o+"/uid", []byte(strconv.Itoa(u)+"\n"), 0o666)
	s.log, _ = os.Create(s.o + "/log")

	before, ok := s.prepare()
	if !ok {
		return s.finish("copy", 125)
	}
	if st, err := os.Stat(filepath.Join(s.r, s.dir)); err != nil || !st.IsDir() {
		return s.finish("nodir", 125)
	}
	rc := s.command()
	return s.after(rc, before)
}

// lock takes the box's lock on base.
func lock() {
	for os.Mkdir(workDir+"/lock", 0o777) != nil {
		time.Sleep(time.Millisecond)
	}
}

func unlock() { _ = os.Remove(workDir + "/lock") }

// prepare makes the command's copy ready and returns the manifest of the
// copy as the command finds it (before).
func (s *execStep) prepare() (before string, ok bool) {
	P := workDir
	lock()
	defer unlock()
	if !isDir(P + "/base") {
		// base.manifest is manifest(base) whenever the lock is free.
		if s.as(sandboxUID, sandboxUID, -1, "", nil, nil, "cp", "-a", seedDir, P+"/base.tmp") == nil &&
			os.Chmod(P+"/base.tmp", 0o700) == nil && s.baseman(P+"/base.tmp") == nil &&
			os.Rename(P+"/base.tmp", P+"/base") == nil {
			_ = os.RemoveAll(seedDir)
		}
	}
	// Repair: the copy the last command of this uid left is brought to
	// base. When base is of the generation the copy was equal to (R.gen),
	// nothing is to be done. When it is of the next one, and the step
	// between left what it changed (base.drop and base.fix, see
	// mfupdate), the copy gets that step: removed, as the uid, what it
	// removed or changed, and extracted, as the uid, what it made or
	// changed (read from base as the sandbox user). Else the copy's
	// manifest (R.man) and base's tell what differs. Anything odd, or a
	// step that fails (a directory the command made read-only), and the
	// copy is made anew. R.gen is emptied first: a copy is used again
	// only after a step wrote its manifest and then its generation.
	R := s.r
	bg := firstLine(P + "/base.manifest")
	s.baseGen = bg
	rg := firstLine(R + ".gen")
	_ = os.WriteFile(R+".gen", nil, 0o666)
	before = s.q + ".before"
	// .pulse/ at the top of the copy is pruned from every listing, so
	// what the last command wrote there was never reported nor merged: it
	// goes first, whatever the generations say.
	if rg != "" && exists(R+"/.pulse") {
		if s.as(s.u, s.u, -1, "", nil, nil, "rm", "-rf", R+"/.pulse") != nil {
			rg = ""
		}
	}
	kept := rg != "" && isDir(R) && nonEmpty(R+".man")
	fresh := true
	switch {
	case kept && bg != "" && rg == bg:
		fresh = false
		before = R + ".man"
	case kept && s.deltaFits(rg, bg):
		fresh = s.dropNames(tail(P+"/base.drop")) != nil ||
			s.fixNames(tail(P+"/base.fix")) != nil ||
			copyFile(P+"/base.manifest", s.q+".before") != nil
	case kept:
		fresh = mdiff(P+"/base.manifest", R+".man", s.q+".drop", s.q+".fix") != nil ||
			s.dropNames(names(s.q+".drop")) != nil ||
			s.fixNames(names(s.q+".fix")) != nil ||
			copyFile(P+"/base.manifest", s.q+".before") != nil
	}
	if fresh {
		_ = os.Remove(R + ".man")
		if os.RemoveAll(R) != nil ||
			s.as(-1, -1, -1, "", nil, nil, "cp", "-a", P+"/base", R) != nil ||
			s.as(-1, -1, -1, "", nil, nil, "chown", "-Rh", fmt.Sprintf("%d:%d", s.u, s.u), R) != nil ||
			os.Chmod(R, 0o700) != nil || copyFile(P+"/base.manifest", s.q+".before") != nil {
			return before, false
		}
	}
	if os.Mkdir(s.t, 0o777) != nil || os.Chown(s.t, s.u, s.u) != nil {
		return before, false
	}
	// The mark (capture): after a copy made anew, a few clock ticks
	// first, so that not every entry is at or after it.
	if fresh {
		time.Sleep(20 * time.Millisecond)
	}
	if !nonEmpty(P + "/reserve") {
		if f, err := os.OpenFile(P+"/reserve", os.O_WRONLY|os.O_CREATE, 0o600); err == nil {
			if unix.Fallocate(int(f.Fd()), 0, 0, reserveBytes) != nil {
				_, _ = f.Write(bytes.Repeat([]byte{' '}, 1<<20))
			}
			f.Close()
		}
	}
	return before, touch(s.q+".m0") == nil
}

// deltaFits: base's last step (base.drop, base.fix) went from the copy's
// generation rg to base's bg.
func (s *execStep) deltaFits(rg, bg string) bool {
	dh := firstLine(workDir + "/base.drop")
	fh := firstLine(workDir + "/base.fix")
	return dh != "" && dh == rg+" "+bg && fh == dh
}

// dropNames removes names (relative to the copy) from the copy, as the uid.
func (s *execStep) dropNames(names []string) error {
	if len(names) == 0 {
		return nil
	}
	return s.as(s.u, s.u, -1, s.r, nulJoin(names), nil, "xargs", "-r", "-0", "rm", "-rf")
}

// fixNames copies names (directories before what is in them) from base
// into the copy, read as the sandbox user and written as the uid, with
// the modes they have in base (umask 0: tar as a user other than root
// applies it).
func (s *execStep) fixNames(names []string) error {
	for _, b := range batches(names) {
		if err := s.pipe(
			s.cmdAs(sandboxUID, sandboxUID, workDir+"/base", append([]string{"tar", "-c", "-f", "-", "--no-recursion"}, b...)),
			s.cmdAs(s.u, s.u, "", []string{"tar", "-x", "-o", "-f", "-", "-C", s.r}), 0); err != nil {
			return err
		}
	}
	return nil
}

// command runs the command as its uid and returns its exit status; for a
// terminal, the one the host sends.
func (s *execStep) command() int {
	if s.tty {
		fmt.Fprintf(os.Stdout, "\x1ePULSE-TTY-%s\x1e%d\n", s.nonce, s.u)
		l, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil && l == "" {
			return 137
		}
		rc, err := strconv.Atoi(strings.TrimSpace(l))
		if err != nil || rc < 0 {
			return 126
		}
		return rc
	}
	// The runtime's own cmd step, in the command's process, empties the
	// capability bounding set and becomes the command's uid and group
	// (dropTo), sets the umask and the file size limit (a limit set here
	// could not be raised again), and execs env -i, which gives the
	// command its environment and finds its program. Every step execs
	// the next in the same process: the group leader (ID.t/pgid) is the
	// command.
	self, err := os.Executable()
	if err != nil {
		self = toolsDir + "/" + Name
	}
	argv := append([]string{self, "cmd", strconv.Itoa(s.u), strconv.Itoa(commandGID), strconv.FormatInt(s.fsize, 10), strconv.Itoa(s.umask), envProgram()}, s.cmd...)
	c := &exec.Cmd{Path: self, Args: argv, Dir: filepath.Join(s.r, s.dir), Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	c.Env = []string{}
	start := time.Now()
	old := unix.Umask(s.umask)
	err = c.Start()
	unix.Umask(old)
	if err != nil {
		s.logf("starting the command: %v", err)
		return 126
	}
	_ = os.WriteFile(s.t+"/pgid", []byte(strconv.Itoa(c.Process.Pid)+"\n"), 0o644)
	_ = c.Wait()
	rc, usage := exitAndUsage(c.ProcessState, time.Since(start))
	_ = os.WriteFile(s.o+"/time", []byte(usage), 0o666)
	return rc
}

// envProgram is the env that gives the command its environment and finds
// its program: the injected one, else the image's.
func envProgram() string {
	p := toolsDir + "/bin/env"
	if isExec(p) {
		return p
	}
	if p, err := exec.LookPath("env"); err == nil {
		return p
	}
	return "/usr/bin/env"
}

// exitAndUsage is how a command ended, as its exit status and as the
// lines time(1) wrote, whose form the report has always had: the status
// is the signal's number for a command a signal ended.
func exitAndUsage(ps *os.ProcessState, elapsed time.Duration) (int, string) {
	ws, _ := ps.Sys().(syscall.WaitStatus)
	rc := ws.ExitStatus()
	var tb strings.Builder
	if ws.Signaled() {
		rc = int(ws.Signal())
		fmt.Fprintf(&tb, "Command terminated by signal %d\n", rc)
	}
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		fmt.Fprintf(&tb, "usage %d %.2f %.2f %.2f\n", ru.Maxrss, elapsed.Seconds(),
			time.Duration(ru.Utime.Nano()).Seconds(), time.Duration(ru.Stime.Nano()).Seconds())
	}
	return rc, tb.String()
}

// runCmd is the cmd step, in the command's own process, still root's:
// UID GID FSIZE UMASK ENV-PROGRAM, then the command's environment and
// argv for env -i. It sets the umask and the file size limit (FSIZE
// 512-byte blocks; 0: none), becomes UID:GID with no capability
// (dropTo), and execs env -i. A step it cannot take runs nothing: 126.
func runCmd(a []string) int {
	if len(a) < 6 {
		return usage()
	}
	u, err1 := strconv.Atoi(a[0])
	g, err2 := strconv.Atoi(a[1])
	fsize, err3 := strconv.ParseInt(a[2], 10, 64)
	um, err4 := strconv.Atoi(a[3])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || fsize < 0 {
		return usage()
	}
	unix.Umask(um)
	if fsize > 0 {
		lim := &unix.Rlimit{Cur: uint64(fsize) * 512, Max: uint64(fsize) * 512}
		if err := unix.Setrlimit(unix.RLIMIT_FSIZE, lim); err != nil {
			fmt.Fprintf(os.Stderr, "%s: file size limit: %v\n", Name, err)
			return 126
		}
	}
	if err := dropTo(u, g); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", Name, err)
		return 126
	}
	err := unix.Exec(a[4], append([]string{"env", "-i"}, a[5:]...), []string{})
	fmt.Fprintf(os.Stderr, "%s: %s: %v\n", Name, a[4], err)
	return 126
}

// after is all that follows the command: the kill of its uid, the
// capture, the merge into base, and the report.
func (s *execStep) after(rc int, before string) int {
	P := workDir
	// Every process of the command's uid, as that uid, so nothing else
	// can be hit; until none is left: then nothing changes the copy while
	// root reads it. A zombie counts until it is reaped.
	for i := 0; uidLeft(s.u) && i < 1000; i++ {
		_ = s.as(s.u, s.u, -1, "", nil, nil, "kill", "-9", "-1")
		time.Sleep(time.Millisecond)
	}
	if uidLeft(s.u) {
		s.keep = false
	}
	// full: the tmpfs the command filled (no block left), found before
	// the reserve is freed: /work, whose size is limits.disk_bytes, or,
	// for a command that failed, /tmp. What it wrote is reported as
	// always (out/ID/disk says which); a full /work (wfull) has it
	// neither merged into base, which would not hold it, nor kept.
	var full []string
	wfull := false
	if os.WriteFile(s.q+".probe", []byte("x"), 0o666) != nil {
		full, wfull = append(full, "/work"), true
		_ = os.Truncate(P+"/reserve", 0)
	}
	if rc != 0 {
		var st unix.Statfs_t
		if unix.Statfs("/tmp", &st) == nil && st.Bavail == 0 {
			full = append(full, "/tmp")
		}
	}
	if len(full) > 0 {
		_ = os.WriteFile(s.o+"/disk", []byte(strings.Join(full, " ")+"\n"), 0o666)
	}
	if wfull {
		_ = touch(s.q + ".bad")
		s.drop = true
	}
	if s.tty {
		// ID.t is the uid's: read as the uid.
		var b bytes.Buffer
		if s.as(s.u, s.u, -1, "", nil, &b, "cat", s.t+"/time") == nil {
			_ = os.WriteFile(s.o+"/time", b.Bytes(), 0o666)
		}
	}
	if touch(s.q+".m1") != nil {
		return s.finish(fmt.Sprintf("manifest %d", rc), rc)
	}
	// What the command changed; a regular file of more than one link
	// (the command's ln): the links are broken and the copy captured again.
	for lk := false; ; {
		err := capture(s.r, s.q, s.o, before)
		if err == nil {
			break
		}
		s.logf("capture: %v", err)
		if errors.Is(err, errLinks) && !lk {
			if err := s.breakLinks(); err == nil {
				lk = true
				continue
			}
		}
		if errors.Is(err, errLinks) {
			_ = appendLine(s.o+"/warn", "a hard link the command made could not be broken")
		}
		return s.finish(fmt.Sprintf("manifest %d", rc), rc)
	}
	changed := names(s.q + ".changed")
	// The changed entries, in files-N.tar in the out directory, a batch
	// each; where the tmpfs has no room for them (the command filled it,
	// or what it wrote is large), they are read straight from the copy
	// instead, when merged and when reported (stream; finish).
	if len(changed) > 0 {
		if wfull {
			s.stream = true
		} else {
			var warn bytes.Buffer
			for i, b := range batches(changed) {
				f, err := os.Create(fmt.Sprintf("%s/files-%06d.tar", s.o, i))
				if err == nil {
					c := s.cmdAs(-1, -1, s.r, tarC(b))
					c.Stdout, c.Stderr = f, &warn
					err = s.runUmask(c, -1)
					if cerr := f.Close(); err == nil {
						err = cerr
					}
				}
				if err != nil {
					s.removeFilesTars()
					s.stream = true
					break
				}
			}
			if warn.Len() > 0 {
				_ = appendLine(s.o+"/warn", strings.TrimSpace(warn.String()))
			}
		}
	}
	removed := names(s.q + ".removed")
	man, gen := before, "x"
	bg := s.baseGen
	switch {
	case wfull && (len(changed) > 0 || len(removed) > 0):
		_ = touch(s.o + "/nomerge")
		man = ""
	case len(changed) > 0 || len(removed) > 0:
		if !exists(s.q + ".new") {
			_ = touch(s.q + ".new")
		}
		if !exists(s.q + ".removed") {
			_ = touch(s.q + ".removed")
		}
		man = s.merge(changed, removed, before)
		if man != "" && man == s.q+".after" {
			gen = firstLine(man)
		}
	default:
		// Read without the lock: base.manifest is replaced by rename.
		if ng := firstLine(P + "/base.manifest"); ng != "" && ng == bg {
			gen = ng
		}
	}
	// R.gen last: only a copy with its manifest is used again.
	if s.keep && !exists(s.q+".bad") && man != "" {
		if man == s.r+".man" || os.Rename(man, s.r+".man") == nil {
			_ = os.WriteFile(s.r+".gen", []byte(gen+"\n"), 0o666)
		}
	}
	return s.finish(fmt.Sprintf("exit %d", rc), rc)
}

// merge merges what the command changed into base, under the lock, and
// returns the manifest the copy is kept with ("": none): when base did
// not change while the command ran, base's after the merge (q.after, of
// base's generation); else the copy's own (before with the changes).
func (s *execStep) merge(changed, removed []string, before string) (man string) {
	P := workDir
	base := P + "/base"
	lock()
	defer unlock()
	ng := firstLine(P + "/base.manifest")
	mok := true
	// As in the repair: the sandbox user's rm and tar, base's modes as
	// the archive has them (umask 0).
	if len(removed) > 0 && s.as(sandboxUID, sandboxUID, -1, base, nulJoin(removed), nil, "xargs", "-0", "rm", "-rf") != nil {
		mok = false
	}
	if mok && !s.stream {
		tars, _ := filepath.Glob(s.o + "/files-*.tar")
		for _, t := range tars {
			f, err := os.Open(t)
			if err != nil {
				mok = false
				break
			}
			c := s.cmdAs(sandboxUID, sandboxUID, "", []string{"tar", "-x", "-f", "-", "-C", base})
			c.Stdin = f
			err = s.runUmask(c, 0)
			f.Close()
			if err != nil {
				mok = false
				break
			}
		}
	} else if mok {
		for _, b := range batches(changed) {
			if err := s.pipe(s.cmdAs(-1, -1, s.r, tarC(b)),
				s.cmdAs(sandboxUID, sandboxUID, "", []string{"tar", "-x", "-f", "-", "-C", base}), 0); err != nil {
				mok = false
				break
			}
		}
	}
	// A merge that failed part way (base would not hold what changed)
	// leaves base without the changed entries, room freed for the
	// report, and the host learns that base is not what it thinks
	// (basefail); the copy goes too.
	if !mok {
		_ = s.as(sandboxUID, sandboxUID, -1, base, nulJoin(changed), nil, "xargs", "-0", "rm", "-rf")
		_ = touch(s.o + "/basefail")
		_ = touch(s.q + ".bad")
		s.drop = true
	}
	if !mok || mfupdate(P+"/base.manifest", s.q+".removed", s.q+".new", base) != nil ||
		chownAll(sandboxUID, P+"/base.manifest", P+"/base.drop", P+"/base.fix") != nil {
		if err := s.baseman(base); err != nil {
			s.logf("base manifest: %v", err)
		}
	}
	if ng != "" && ng == s.baseGen && mok {
		if copyFile(P+"/base.manifest", s.q+".after") != nil {
			return ""
		}
		return s.q + ".after"
	}
	if mfupdate(before, s.q+".removed", s.q+".new", "") != nil {
		return ""
	}
	return before
}

// baseman writes the manifest of dir into base.manifest, the sandbox
// user's, as whom the sync step reads and replaces it.
func (s *execStep) baseman(dir string) error {
	p := workDir + "/base.manifest"
	if err := fullman(dir, p); err != nil {
		return err
	}
	return os.Chown(p, sandboxUID, sandboxUID)
}

// breakLinks makes every regular file of the copy with more than one
// link a file of its own, with its content, mode and mtime, as the uid
// (runtime step unlink): so the copy kept for the next command, the
// changes merged into base and those reported are separate files, as
// the pending stack holds them. Should that fail, the capture fails:
// what the command wrote is reported lost, not handed on with a copy
// that differs from it.
func (s *execStep) breakLinks() error {
	var linked []string
	err := walk(s.r, walkOpts{skipPulse: true}, func(n node) error {
		if n.mode&unix.S_IFMT == unix.S_IFREG && n.nlink > 1 {
			linked = append(linked, n.name)
		}
		return nil
	})
	if err != nil || len(linked) == 0 {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return s.as(s.u, s.u, -1, s.r, nulJoin(linked), nil, self, "unlink")
}

// runUnlink is the unlink step, as the command's uid in its copy: each
// NUL-separated name on stdin, a regular file, is replaced by a copy of
// itself (a directory made read-only, or a file made unreadable, is given
// the owner's right for that only, and it back after).
func runUnlink() int {
	b, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s unlink: %v\n", Name, err)
		return 1
	}
	for _, f := range strings.Split(string(b), "\x00") {
		if f == "" {
			continue
		}
		if err := unlinkOne(f); err != nil {
			fmt.Fprintf(os.Stderr, "%s unlink: %s: %v\n", Name, f, err)
			return 1
		}
	}
	return 0
}

func unlinkOne(f string) error {
	d := filepath.Dir(f)
	var dst, fst unix.Stat_t
	if err := unix.Lstat(d, &dst); err != nil {
		return err
	}
	if err := unix.Lstat(f, &fst); err != nil {
		return err
	}
	if fst.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("not a regular file")
	}
	if unix.Access(d, unix.W_OK|unix.X_OK) != nil {
		if err := unix.Chmod(d, dst.Mode&0o7777|0o300); err != nil {
			return err
		}
		defer unix.Chmod(d, dst.Mode&0o7777)
	}
	if unix.Access(f, unix.R_OK) != nil {
		if err := unix.Chmod(f, fst.Mode&0o7777|0o400); err != nil {
			return err
		}
	}
	mode := fst.Mode & 0o7777
	src, err := os.OpenFile(f, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		_ = unix.Chmod(f, mode)
		return err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(d, filepath.Base(f)+".")
	if err != nil {
		_ = unix.Chmod(f, mode)
		return err
	}
	_, err = io.Copy(tmp, src)
	if err == nil {
		err = tmp.Chmod(fs.FileMode(mode))
	}
	if err == nil {
		err = unix.Fchmod(int(tmp.Fd()), mode)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.UtimesNanoAt(unix.AT_FDCWD, tmp.Name(), []unix.Timespec{fst.Atim, fst.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err == nil {
		_ = unix.Chmod(f, mode)
		err = os.Rename(tmp.Name(), f)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		_ = unix.Chmod(f, mode)
	}
	return err
}

// finish hands the out directory to the host, cleans up and returns
// code. The report is the out directory's tar, with the changed entries
// in its files-*.tar; or, where the tmpfs had no room for those (stream,
// or none for the out directory's tar with them), the out directory's
// tar without them, then their tars read straight from the copy, then
// one byte, '0' when they all came out whole: then no copy of what the
// command wrote is made on the tmpfs it may have filled. The batches'
// sizes (measure) go in out/ID/batches, so the host knows the report's
// size before it comes and where each batch starts.
func (s *execStep) finish(status string, code int) int {
	P := workDir
	_ = os.WriteFile(s.o+"/status", []byte(status+"\n"), 0o666)
	if s.log != nil {
		s.log.Close()
		s.log = nil
	}
	var t int64
	changed := names(s.q + ".changed")
	ex := len(changed) > 0 && strings.HasPrefix(status, "exit ")
	var sizes []int64
	if s.stream && ex {
		sizes, t = s.measure(changed, code)
	}
	if err := writeDirTar(s.o+".tar", P+"/out", s.id); err != nil && !s.stream && ex {
		s.removeFilesTars()
		_ = os.Remove(s.o + ".tar")
		s.stream = true
		sizes, t = s.measure(changed, code)
		_ = writeDirTar(s.o+".tar", P+"/out", s.id)
	}
	fmt.Fprintf(os.Stderr, "\x1ePULSE-ERR-%s\x1e", s.nonce)
	var size int64
	if fi, err := os.Stat(s.o + ".tar"); err == nil {
		size = fi.Size()
	}
	w := bufio.NewWriterSize(os.Stdout, 64<<10)
	if t == 0 {
		fmt.Fprintf(w, "\x1ePULSE-END-%s\x1e%d\n", s.nonce, size)
		copyInto(w, s.o+".tar", size)
	} else {
		fmt.Fprintf(w, "\x1ePULSE-END-%s\x1e%d\n", s.nonce, size+t+1)
		copyInto(w, s.o+".tar", size)
		// Exactly t bytes whatever happens, so that a pooled stream stays
		// in step; a short or failed batch says 1.
		ok := true
		for i, b := range batches(changed) {
			cw := &exactWriter{w: w, n: sizes[i]}
			c := s.cmdAs(-1, -1, s.r, tarC(b))
			c.Stdout = cw
			if s.runUmask(c, -1) != nil || cw.n != 0 {
				ok = false
			}
			cw.pad()
		}
		if ok {
			w.WriteByte('0')
		} else {
			w.WriteByte('1')
		}
	}
	_ = w.Flush()
	// The uid is given back last, once its copy is what R.man says or gone.
	junk, _ := filepath.Glob(s.q + ".*")
	junk = append(junk, s.o, s.o+".tar")
	if !s.keep || s.drop || s.u >= firstUID+keptUIDs {
		junk = append(junk, s.r, s.r+".man", s.r+".gen")
	}
	for _, j := range junk {
		_ = os.RemoveAll(j)
	}
	if s.keep {
		_ = os.Remove(fmt.Sprintf("%s/uid/%d", P, s.u))
	}
	return code
}

// measure writes the sizes of the tars of changed's batches, read
// straight from the copy, to out/ID/batches and returns them and their
// sum; the copy cannot change between this and the reading, every
// process of its uid being gone (else, !keep, it is not read: status
// manifest CODE, as for a measure that fails).
func (s *execStep) measure(changed []string, code int) ([]int64, int64) {
	if s.keep {
		var sizes []int64
		var t int64
		var sb strings.Builder
		ok := true
		for _, b := range batches(changed) {
			cw := &countWriter{}
			c := s.cmdAs(-1, -1, s.r, tarC(b))
			c.Stdout = cw
			if s.runUmask(c, -1) != nil {
				ok = false
				break
			}
			sizes = append(sizes, cw.n)
			t += cw.n
			fmt.Fprintf(&sb, "%d\n", cw.n)
		}
		if ok && os.WriteFile(s.o+"/batches", []byte(sb.String()), 0o666) == nil {
			return sizes, t
		}
		_ = os.Remove(s.o + "/batches")
	} else {
		_ = appendLine(s.o+"/warn", "a process of the command outlived it: what it changed is not read back")
	}
	_ = os.WriteFile(s.o+"/status", []byte(fmt.Sprintf("manifest %d\n", code)), 0o666)
	return nil, 0
}

func (s *execStep) removeFilesTars() {
	tars, _ := filepath.Glob(s.o + "/files-*.tar")
	for _, t := range tars {
		_ = os.Remove(t)
	}
}

// writeDirTar writes a tar of the directory top/name (its regular files,
// a flat directory) to p, names as name/FILE. The header is written here
// (ustar, the names being short): archive/tar links os/user, which needs
// cgo, and the runtime must be static whatever builds it.
func writeDirTar(p, top, name string) (err error) {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := bufio.NewWriterSize(f, 64<<10)
	dir := top + "/" + name
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	now := time.Now().Unix()
	if err := ustarHeader(w, name+"/", '5', 0o700, 0, now); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if err := addFile(w, dir+"/"+e.Name(), name+"/"+e.Name()); err != nil {
			return err
		}
	}
	if _, err := w.Write(make([]byte, 1024)); err != nil {
		return err
	}
	return w.Flush()
}

func addFile(w io.Writer, p, name string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := ustarHeader(w, name, '0', 0o600, fi.Size(), fi.ModTime().Unix()); err != nil {
		return err
	}
	if _, err := io.CopyN(w, f, fi.Size()); err != nil {
		return err
	}
	_, err = w.Write(make([]byte, (512-fi.Size()%512)%512))
	return err
}

// ustarHeader writes a ustar header block for an entry of root's.
func ustarHeader(w io.Writer, name string, typ byte, mode, size, mtime int64) error {
	if len(name) > 100 || size >= 1<<33 {
		return fmt.Errorf("%s: does not fit a ustar header", name)
	}
	var h [512]byte
	copy(h[0:], name)
	octal := func(b []byte, v int64) { copy(b, fmt.Sprintf("%0*o", len(b)-1, v)) }
	octal(h[100:108], mode)
	octal(h[108:116], 0)
	octal(h[116:124], 0)
	octal(h[124:136], size)
	octal(h[136:148], mtime)
	h[156] = typ
	copy(h[257:], "ustar\x0000")
	copy(h[148:156], "        ")
	var sum int64
	for _, c := range h {
		sum += int64(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	_, err := w.Write(h[:])
	return err
}

func copyInto(w io.Writer, p string, n int64) {
	cw := &exactWriter{w: w, n: n}
	if f, err := os.Open(p); err == nil {
		_, _ = io.Copy(cw, f)
		f.Close()
	}
	cw.pad()
}

// exactWriter passes at most n bytes on; pad makes up the rest in zeros.
type exactWriter struct {
	w io.Writer
	n int64
}

func (e *exactWriter) Write(p []byte) (int, error) {
	k := len(p)
	if int64(len(p)) > e.n {
		p = p[:e.n]
	}
	_, err := e.w.Write(p)
	e.n -= int64(len(p))
	if err != nil {
		return 0, err
	}
	return k, nil
}

func (e *exactWriter) pad() {
	var zero [4096]byte
	for e.n > 0 {
		k := min(e.n, int64(len(zero)))
		_, _ = e.w.Write(zero[:k])
		e.n -= k
	}
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// cmdAs is argv run in dir as uid:gid (no supplementary groups; -1: the
// runtime's own), its errors into the log.
func (s *execStep) cmdAs(uid, gid int, dir string, argv []string) *exec.Cmd {
	prog := argv[0]
	if t := toolsDir + "/bin/" + prog; !strings.Contains(prog, "/") && isExec(t) {
		prog = t // the injected tools, whose options the steps use
	}
	c := exec.Command(prog, argv[1:]...)
	c.Dir = dir
	c.Stderr = s.stderr()
	if uid >= 0 {
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	}
	return c
}

// as runs argv as uid:gid in dir with stdin and stdout given (nil:
// none), umask (-1: the runtime's own).
func (s *execStep) as(uid, gid, umask int, dir string, stdin []byte, stdout io.Writer, argv ...string) error {
	c := s.cmdAs(uid, gid, dir, argv)
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	c.Stdout = stdout
	return s.runUmask(c, umask)
}

// runUmask runs c with umask (-1: the runtime's): the umask is the
// process's, and the runtime starts one program at a time.
func (s *execStep) runUmask(c *exec.Cmd, umask int) error {
	if umask >= 0 {
		old := unix.Umask(umask)
		err := c.Start()
		unix.Umask(old)
		if err != nil {
			return err
		}
		return c.Wait()
	}
	return c.Run()
}

// pipe runs a | b, b with umask.
func (s *execStep) pipe(a, b *exec.Cmd, umask int) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	a.Stdout, b.Stdin = pw, pr
	if err := a.Start(); err != nil {
		pr.Close()
		pw.Close()
		return err
	}
	pw.Close()
	berr := s.runUmask(b, umask)
	pr.Close()
	aerr := a.Wait()
	if berr != nil {
		return berr
	}
	return aerr
}

// tarC is the argv of a tar of the named entries, each alone, to stdout.
func tarC(names []string) []string {
	return append([]string{"tar", "-c", "-f", "-", "--no-recursion"}, names...)
}

// batches splits names into lists that fit one argv each.
func batches(names []string) [][]string {
	const maxBytes, maxNames = 96 << 10, 2048
	var out [][]string
	var cur []string
	n := 0
	for _, nm := range names {
		if len(cur) > 0 && (n+len(nm)+1 > maxBytes || len(cur) == maxNames) {
			out = append(out, cur)
			cur, n = nil, 0
		}
		cur = append(cur, nm)
		n += len(nm) + 1
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func nulJoin(names []string) []byte {
	var b bytes.Buffer
	for _, n := range names {
		b.WriteString(n)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// names is the list of names in p, one a line (none when p is missing).
func names(p string) []string {
	n, _ := readNames(p)
	return n
}

// tail is names after p's first line.
func tail(p string) []string {
	n := names(p)
	if len(n) == 0 {
		return nil
	}
	return n[1:]
}

// firstLine is p's first line, "" when there is none.
func firstLine(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	l, _ := bufio.NewReader(f).ReadString('\n')
	return strings.TrimSuffix(l, "\n")
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func nonEmpty(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Size() > 0
}

func isExec(p string) bool { return unix.Access(p, unix.X_OK) == nil && !isDir(p) }

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o666)
}

func chownAll(id int, ps ...string) error {
	for _, p := range ps {
		if err := os.Chown(p, id, id); err != nil {
			return err
		}
	}
	return nil
}

// uidLeft reports whether a process of real uid u exists.
func uidLeft(u int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	want := strconv.Itoa(u)
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		i := bytes.Index(b, []byte("\nUid:\t"))
		if i < 0 {
			continue
		}
		l, _, _ := bytes.Cut(b[i+6:], []byte("\n"))
		if f := strings.Fields(string(l)); len(f) > 0 && f[0] == want {
			return true
		}
	}
	return false
}

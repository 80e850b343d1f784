package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/fsmode"
	"github.com/pulse-agent/pulse/pathguard"
)

// The container's /work/base is what the next command starts from. Before
// each command it is brought to exactly the workspace as it is on disk
// now plus the pending stack (backend.Pending), by sending only what
// differs from what base holds: the backend keeps, per container, a model
// of base (one signature per path), filled by the seed copy, by each sync
// and by each command's overlay (the wrapper merges a command's writes
// into base). So a discarded or refused write, or a host edit, costs one
// file's bytes the next time, never a copy of the workspace.
//
// A command that ran while another was running in the same container may
// have merged in either order: the paths it wrote are marked unknown in
// the model, and the next sync sends them again.
//
// When what base holds is unknown but nothing can change it any more (a
// sync script that failed, a wrapper whose report could not be read), the
// model is nil and the next sync rebuilds base from scratch. When
// something may still change it (an exec that was abandoned or whose end
// was not seen), the container is poisoned: no later command runs in it,
// and it is removed once the commands running in it have ended.

// syncState is the model of one container's base.
type syncState struct {
	mu    sync.Mutex        // held by a sync from diff to model update
	model map[string]string // nil: unknown, base is rebuilt by the next sync
	// saved is the id of the warm slot's N.model when that file holds
	// model exactly (it was read from it, and nothing changed since),
	// else "": the release then need not write it again (warm.go).
	saved   string
	running int
	seq     uint64
}

// merged says what is known of what a command's wrapper merged into base.
type merged int

const (
	// mergedKnown: the overlay (none: nothing) is exactly what was merged.
	mergedKnown merged = iota
	// mergedUnknown: the wrapper has ended, but what it merged is not
	// known; base is rebuilt before the next command.
	mergedUnknown
	// mergedUnsettled: the wrapper may still be running and change base;
	// the container is never used again.
	mergedUnsettled
	// mergedNone: the wrapper merged nothing (the command filled the
	// scratch tmpfs): base is what it was, and the next sync sends what
	// the stack holds of the command's writes.
	mergedNone
)

// signature of a workspace entry: what changes when its content may have.
// For a file that is its mode, size, mtime, ctime and inode: no write
// leaves all of them as they were, since the kernel sets ctime on every
// change and nothing else can, except one in the same tick of the
// filesystem's clock as the stat that read them. So a file whose times
// are within racyWindow of since (when the walk that stats it began) gets
// a signature no later one equals, and is sent again by the next sync,
// when it has aged (git's rule for "racy" index entries).
func wsSig(info fs.FileInfo, target string, since time.Time) string {
	m := info.Mode()
	switch {
	case m.IsDir():
		return dirSig(tarMode(m))
	case m&fs.ModeSymlink != 0:
		return "l|" + target
	case m.IsRegular():
		var ino uint64
		var ctime int64
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			ino = st.Ino
			ctime = statCtime(st)
		}
		return fileSig(nil, tarMode(m), info.Size(), info.ModTime().UnixNano(), ctime, ino, since)
	}
	return ""
}

// fileSig is wsSig of a regular file, appended to buf (which may be nil)
// for a caller that signs many with one buffer.
func fileSig(buf []byte, mode int64, size, mtime, ctime int64, ino uint64, since time.Time) string {
	window := racyWindow
	if ctime%int64(time.Second) != 0 {
		window = racyWindowFine
	}
	cut := since.Add(-window).UnixNano()
	if ctime >= cut || mtime >= cut {
		return racySig(buf)
	}
	buf = append(buf[:0], "w|"...)
	buf = strconv.AppendInt(buf, mode, 8)
	buf = append(buf, '|')
	buf = strconv.AppendInt(buf, size, 10)
	buf = append(buf, '|')
	buf = strconv.AppendInt(buf, mtime, 10)
	buf = append(buf, '|')
	buf = strconv.AppendInt(buf, ctime, 10)
	buf = append(buf, '|')
	buf = strconv.AppendUint(buf, ino, 10)
	return string(buf)
}

// racySig is a signature no other equals: "r|RUN.N".
func racySig(buf []byte) string {
	buf = append(buf[:0], "r|"...)
	buf = append(buf, unhashedRun()...)
	buf = append(buf, '.')
	buf = strconv.AppendUint(buf, unhashed.Add(1), 10)
	return string(buf)
}

// dirSig is the signature of a directory of mode bits mode.
func dirSig(mode int64) string {
	if mode == 0o755 {
		return "d|755" // most are: one string for all of them
	}
	return "d|" + strconv.FormatInt(mode, 8)
}

// racyWindow is longer than any filesystem's timestamp granularity (FAT's
// two seconds being the coarsest), plus the lag of the kernel's coarse
// clock behind time.Now.
const racyWindow = 2*time.Second + 100*time.Millisecond

// racyWindowFine is the window for a file whose ctime has a fraction of a
// second: its filesystem keeps sub-second times, and every such one ticks
// in 10 ms or less (exFAT's 10 ms being the coarsest; ext4, xfs, btrfs and
// tmpfs take the kernel's coarse clock, a jiffy), while one that keeps
// whole seconds (FAT, ext4 with small inodes, HFS+) reports none. A write
// after the stat then gets a ctime at most a tick plus the coarse clock's
// lag (a jiffy, at most 10 ms) before since: outside this window, so it
// changes the signature. A whole-second ctime on a fine filesystem (one
// tick in a few hundred) only takes the long window: the safe side. Without
// it, every command within two seconds of an edit re-sent the edited files
// (a commit's, a host editor's): ~35 ms a command for one small file.
const racyWindowFine = 250 * time.Millisecond

func contentSig(mode fs.FileMode, sha string) string {
	return fmt.Sprintf("f|%o|%s", tarMode(mode), sha)
}

func tarMode(m fs.FileMode) int64 {
	return int64(fsmode.ToUnix(m))
}

// want is one entry base should hold.
type want struct {
	sig  string
	kind byte // '-' file from the workspace, 'p' pending file, 'd', 'l'
	mode fs.FileMode
	pend *backend.PendingEntry
	tgt  string
}

// unhashed numbers the pending files that come without a SHA; with
// unhashedRun, which tells this process's numbers from those of another
// whose model a warm container carries over (warm.go). Drawn on first
// use: at package init it was the first crypto/rand read of every pulse
// process, Docker or not.
var (
	unhashed    atomic.Uint64
	unhashedRun = sync.OnceValue(randomID)
)

// desired computes what base should hold: the workspace now, with the
// pending view over it, without the hidden paths (and what is beneath
// them), whichever of the two holds them, nor the unlisted ones. since is
// when the walk of the workspace begins (for wsSig).
func desired(ws string, pend *backend.Pending, hiddenList []string, since time.Time) (map[string]want, error) {
	out := map[string]want{}
	hidden := map[string]bool{}
	for _, h := range hiddenList {
		hidden[h] = true
	}
	buf := make([]byte, 0, 96) // room for most signatures (fileSig)
	err := pend.ScanBase(ws, hidden, func(e *backend.BaseEntry) error {
		if unlisted(e.Rel) {
			return nil // nor is what is beneath it: its Rel holds the newline too
		}
		var w want
		switch e.Type() {
		case unix.S_IFDIR:
			mode := fsmode.FromUnix(e.Mode)
			w = want{kind: 'd', mode: fs.ModeDir | mode, sig: dirSig(tarMode(mode))}
		case unix.S_IFLNK:
			t, err := e.Readlink()
			if err != nil {
				return err
			}
			w = want{kind: 'l', tgt: t, sig: "l|" + t}
		case unix.S_IFREG:
			mode := fsmode.FromUnix(e.Mode)
			w = want{kind: '-', mode: mode, sig: fileSig(buf, tarMode(mode), e.Size, e.Mtime, e.Ctime, e.Ino, since)}
		default:
			return nil
		}
		out[e.Rel] = w
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("docker: reading workspace: %w", err)
	}
	for _, e := range pend.Shown(hidden) {
		if unlisted(e.Path) {
			continue
		}
		switch e.Kind {
		case backend.PendingDir:
			out[e.Path] = want{kind: 'd', mode: fs.ModeDir | e.Mode, sig: dirSig(tarMode(e.Mode))}
		case backend.PendingSymlink:
			out[e.Path] = want{kind: 'l', tgt: e.Target, sig: "l|" + e.Target}
		case backend.PendingFile:
			// Without a content hash nothing says base holds these
			// bytes (another stack's file of the same size may be
			// there): a signature no model entry equals, so it is sent.
			sig := fmt.Sprintf("p|%s|%d|%s.%d", e.Path, e.Size, unhashedRun(), unhashed.Add(1))
			if e.SHA != "" {
				sig = contentSig(e.Mode, e.SHA)
			}
			out[e.Path] = want{kind: 'p', mode: e.Mode, pend: e, sig: sig}
		}
	}
	return out, nil
}

// unlisted reports whether the path rel holds a newline (in its own name
// or a directory's above it). Such an entry is never put in the
// container: the manifests and lists of the wrapper and the sync script
// are one name a line, and they split "p\nq" into "./p" and "q", so that
// the wrapper took ./p for an entry every command had removed (and staged
// its deletion, losing a real p on commit). Left out of the seed copy,
// of every sync and so of base, such an entry reads as absent to the
// command, like a hidden path, and no listing holds a part of one. What a
// command itself writes under such a name is reported apart (the
// wrapper's O/newline, parseNewline).
func unlisted(rel string) bool { return strings.IndexByte(rel, '\n') >= 0 }

// The sync is the in-box runtime's sync step (internal/boxrt,
// sync_linux.go), run as the sandbox user with a tar on stdin: del,
// gone, reset and files/, which it applies to base under the lock the
// exec step takes, then brings base.manifest up to date.
var syncCmd = []string{runtimePath, "sync"}

// wantWalk is desired run in the background while the container is made
// ready (box: the engine's answers, the warm slot's files): the walk reads
// only the workspace and the request, so it need not wait for them, and
// what it finds is still the workspace as it was after the command was
// asked for, as a walk within the sync found it. Each sync still makes
// base exactly what its own walk found, whatever the order of two syncs.
type wantWalk struct {
	done chan struct{}
	want map[string]want
	err  error
}

func startDesired(ws string, req *backend.Request) *wantWalk {
	w := &wantWalk{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.want, w.err = desired(ws, req.Pending, req.Hidden, time.Now())
	}()
	return w
}

// wait returns the walk's result once it has ended.
func (w *wantWalk) wait() (map[string]want, error) {
	<-w.done
	return w.want, w.err
}

// syncBase makes the container's base hold the workspace ws plus req's
// pending stack, as walk found them. It returns the sequence number of
// the command about to run, for finishSync.
func (b *Backend) syncBase(ctx context.Context, bx *box, ws string, req *backend.Request, walk *wantWalk) (uint64, error) {
	want, err := walk.wait()
	if err != nil {
		return 0, err
	}
	ss := &bx.sync
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if bx.poisoned {
		return 0, fmt.Errorf("docker: the sandbox container's state is unknown after an earlier failure: %w", backend.ErrUnavailable)
	}
	have := ss.model
	reset := have == nil
	var del []string
	var put []string
	for p, w := range want {
		if h, ok := have[p]; !ok || h != w.sig {
			put = append(put, p)
			if ok && (h[0] != 'd' || w.kind != 'd') {
				del = append(del, p) // a type change, or a non-directory rewritten
			}
		}
	}
	for p := range have {
		if _, ok := want[p]; !ok {
			del = append(del, p)
		}
	}
	if len(put) == 0 && len(del) == 0 && !reset {
		return b.startSeq(ss), nil
	}
	// The directories above what is sent go with it, so that extracting
	// it does not make them with modes of its own (which the copy into
	// base would then give base's).
	inPut := make(map[string]bool, len(put))
	for _, p := range put {
		inPut[p] = true
	}
	for _, p := range put {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if inPut[d] {
				break
			}
			if w, ok := want[d]; ok && w.kind == 'd' {
				inPut[d] = true
				put = append(put, d)
			}
		}
	}
	sort.Strings(put)
	// Only the topmost of the paths removed: rm -r takes the rest.
	del = pathguard.Topmost(del)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	// "./" in front: a name may begin with "-", which rm would take for
	// an option.
	var dl strings.Builder
	for i, p := range del {
		if i > 0 {
			dl.WriteByte(0)
		}
		dl.WriteString("./" + p)
	}
	delList := dl.String()
	if err := tw.WriteHeader(&tar.Header{Name: "del", Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(delList)), ModTime: now, Format: tar.FormatPAX}); err != nil {
		return 0, err
	}
	if _, err := io.WriteString(tw, delList); err != nil {
		return 0, err
	}
	// gone: the same paths as the manifest names them, for its update.
	var gone strings.Builder
	for _, p := range del {
		gone.WriteString("./" + p + "\n")
	}
	if err := tw.WriteHeader(&tar.Header{Name: "gone", Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(gone.Len()), ModTime: now, Format: tar.FormatPAX}); err != nil {
		return 0, err
	}
	if _, err := io.WriteString(tw, gone.String()); err != nil {
		return 0, err
	}
	if reset {
		if err := tw.WriteHeader(&tar.Header{Name: "reset", Typeflag: tar.TypeReg, Mode: 0o600, ModTime: now, Format: tar.FormatPAX}); err != nil {
			return 0, err
		}
	}
	for _, p := range put {
		w := want[p]
		h := &tar.Header{Name: "files/" + p, Uid: sandboxUID, Gid: sandboxGID, ModTime: now, Format: tar.FormatPAX}
		var body io.Reader
		switch w.kind {
		case 'd':
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", tarMode(w.mode)
		case 'l':
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, w.tgt, 0o777
		case '-':
			data, err := readRegular(filepath.Join(ws, filepath.FromSlash(p)))
			if err != nil {
				return 0, fmt.Errorf("docker: reading %s: %w", p, err)
			}
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, tarMode(w.mode), int64(len(data))
			body = bytes.NewReader(data)
		case 'p':
			data, err := w.pend.ReadAll()
			if err != nil {
				return 0, fmt.Errorf("docker: pending %s: %w", p, err)
			}
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, tarMode(w.mode), int64(len(data))
			body = bytes.NewReader(data)
		}
		if err := tw.WriteHeader(h); err != nil {
			return 0, err
		}
		if body != nil {
			if _, err := io.Copy(tw, body); err != nil {
				return 0, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	if err := b.runSync(ctx, bx, &buf); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			// The script ended, part way: rebuild base next time.
			ss.model, ss.saved = nil, ""
		} else {
			// It may still run and change base later.
			b.poisonLocked(bx)
		}
		if strings.Contains(err.Error(), "No space left on device") {
			// The scratch holds the workspace and the stack once, and
			// once more in each running command's copy.
			return 0, fmt.Errorf("docker: bringing the container up to date with the workspace and the pending stack: %w (the container's workspace space, limits.disk_bytes, holds them once and again in each running command's copy; raise limits.disk_bytes in the policy)", err)
		}
		return 0, fmt.Errorf("docker: bringing the container up to date with the workspace and the pending stack: %w", err)
	}
	model := make(map[string]string, len(want))
	for p, w := range want {
		model[p] = w.sig
	}
	ss.model, ss.saved = model, ""
	return b.startSeq(ss), nil
}

// runSync runs the sync script with the tar r on its stdin: on the
// container's request channel when it has one that is free (channel.go),
// else, or when the channel does not take it, in an exec.
func (b *Backend) runSync(ctx context.Context, bx *box, r *bytes.Buffer) error {
	id := randomID()
	if bx.takeChan() {
		err := b.chanSync(ctx, bx, id, bytes.NewReader(r.Bytes()))
		bx.putChan()
		if !errors.Is(err, errChanRefused) {
			return err
		}
		b.log.Debug("request channel did not take the sync; running an exec", "container", bx.id)
	}
	return b.execWithStdin(ctx, bx.id, append(slices.Clip(syncCmd), id), r)
}

func (b *Backend) startSeq(ss *syncState) uint64 {
	ss.running++
	ss.seq++
	return ss.seq
}

// finishSync records what the command's wrapper merged into base.
func (b *Backend) finishSync(bx *box, seq uint64, ov *backend.Overlay, m merged) {
	ss := &bx.sync
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.running--
	switch m {
	case mergedUnsettled:
		b.poisonLocked(bx)
		return
	case mergedUnknown:
		ss.model, ss.saved = nil, ""
		return
	case mergedNone:
		return
	}
	if ov == nil || ss.model == nil || len(ov.Deleted) == 0 && len(ov.Files) == 0 {
		return // nothing merged, or base is rebuilt anyway
	}
	ss.saved = ""
	applyToModel(ss.model, ov, ss.seq != seq || ss.running > 0)
}

// applyToModel brings a model up to date with what a command's overlay
// merged. concurrent: another command ran meanwhile, so what its paths now
// hold is unknown ("?"), to be read again.
func applyToModel(model map[string]string, ov *backend.Overlay, concurrent bool) {
	var st subtrees
	if len(ov.Deleted)+len(ov.Files) > subtreesFrom {
		st = newSubtrees(model)
	}
	set := func(p, sig string) {
		model[p] = sig
		st.add(p)
	}
	for _, p := range ov.Deleted {
		st.removeTree(model, p)
		if concurrent {
			set(p, "?")
		}
	}
	for _, f := range ov.Files {
		if f.Mode&fs.ModeIrregular != 0 {
			// A name the wrapper could not carry (it holds a newline):
			// not merged into base, nor one the sync's line-based lists
			// could name.
			continue
		}
		if concurrent {
			set(f.Path, "?")
			continue
		}
		switch {
		case f.Mode&fs.ModeDir != 0:
			set(f.Path, dirSig(tarMode(f.Mode)))
		case f.Mode&fs.ModeSymlink != 0:
			st.removeTree(model, f.Path)
			set(f.Path, "l|"+string(f.Data))
		case f.Special():
			// A FIFO or device node the command left in base, which no
			// workspace entry matches: the next sync replaces or removes
			// it, so a later command does not find it there.
			st.removeTree(model, f.Path)
			set(f.Path, "?")
		default:
			st.removeTree(model, f.Path)
			sum := sha256.Sum256(f.Data)
			set(f.Path, contentSig(f.Mode, hex.EncodeToString(sum[:])))
		}
	}
}

// subtreesFrom is how many overlay entries make applyToModel index the
// model's directories first: below it, a scan of the model per entry
// costs less than the index.
const subtreesFrom = 16

// subtrees holds every path of a model that has an entry beneath it, so
// that dropping a file's path from the model does not scan the whole
// model: per entry of an overlay, that made a command writing thousands
// of files in a large workspace quadratic. It may hold a path with
// nothing left beneath (removeTree then scans and finds nothing), never
// miss one with something: add is called for every path put in the
// model. A nil subtrees knows nothing, and removeTree always scans.
type subtrees map[string]bool

func newSubtrees(model map[string]string) subtrees {
	st := subtrees{}
	for p := range model {
		st.add(p)
	}
	return st
}

// add records p's ancestors. Once one is recorded, so are all of its
// own (they were recorded with it), and the walk up stops.
func (st subtrees) add(p string) {
	if st == nil {
		return
	}
	for i := strings.LastIndexByte(p, '/'); i > 0; i = strings.LastIndexByte(p[:i], '/') {
		d := p[:i]
		if st[d] {
			return
		}
		st[d] = true
	}
}

// removeTree drops p and everything beneath it from model.
func (st subtrees) removeTree(model map[string]string, p string) {
	delete(model, p)
	if st != nil && !st[p] {
		return
	}
	prefix := p + "/"
	for q := range model {
		if strings.HasPrefix(q, prefix) {
			delete(model, q)
		}
	}
}

// poisonLocked (bx.sync.mu held) marks bx unusable: no new command
// starts in it, and its container is removed when the last running one
// has ended (retire).
func (b *Backend) poisonLocked(bx *box) {
	if !bx.poisoned {
		b.log.Warn("sandbox container state unknown; it will be replaced", "container", bx.id)
	}
	bx.poisoned = true
	b.mu.Lock()
	if b.boxes[bx.key] == bx {
		delete(b.boxes, bx.key)
	}
	b.mu.Unlock()
}

// retire removes a poisoned box's container once nothing runs in it.
func (b *Backend) retire(bx *box) {
	bx.sync.mu.Lock()
	gone := bx.poisoned && bx.sync.running == 0 && !bx.retired
	if gone {
		bx.retired = true
	}
	bx.sync.mu.Unlock()
	if !gone {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.remove(ctx, bx.id); err != nil {
		b.log.Warn("removing a sandbox container whose state is unknown", "container", bx.id, "err", err)
	}
	bx.trust.remove()
	if bx.slot != nil {
		bx.slot.release()
	}
}

func readRegular(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is no longer a regular file", path.Base(p))
	}
	return io.ReadAll(f)
}

// execWithStdin runs cmd in the container as the sandbox user with stdin
// fed from r, and waits for it; a non-zero exit is an error carrying its
// output.
func (b *Backend) execWithStdin(ctx context.Context, id string, cmd []string, r io.Reader) error {
	ec, err := b.cli.ContainerExecCreate(ctx, id, container.ExecOptions{
		User:         fmt.Sprintf("%d:%d", sandboxUID, sandboxGID),
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		Env:          b.scriptEnv(),
		WorkingDir:   "/pulse",
		Cmd:          cmd,
	})
	if err != nil {
		return fmt.Errorf("creating exec: %v: %w", err, backend.ErrUnavailable)
	}
	hj, err := b.cli.ContainerExecAttach(ctx, ec.ID, container.ExecAttachOptions{})
	if err != nil {
		return fmt.Errorf("starting exec: %v: %w", err, backend.ErrUnavailable)
	}
	defer hj.Close()
	go func() {
		_, _ = io.Copy(hj.Conn, r)
		_ = hj.CloseWrite()
	}()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, hj.Reader); err != nil {
		return fmt.Errorf("exec output: %w", err)
	}
	code, err := b.execExit(ctx, ec.ID, 1000, 2*time.Millisecond)
	if err != nil {
		return err
	}
	if code != 0 {
		return &exitError{code: code, out: strings.TrimSpace(out.String())}
	}
	return nil
}

// exitError is a script that ended with a non-zero status.
type exitError struct {
	code int
	out  string
}

func (e *exitError) Error() string { return fmt.Sprintf("exit %d: %s", e.code, e.out) }

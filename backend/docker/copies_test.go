package docker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// A command's copy is kept for the next command of its uid, which gets it
// brought to exactly the workspace: what the earlier command wrote is
// gone when it is not pending (here: never), and an entry nobody changed
// keeps its inode, so that tools that cache by inode and ctime (git's
// index) find their cache valid. A copy that cannot be brought back as
// its uid (a directory the command made read-only) is made anew.
func TestDockerKeptCopyIsBroughtToTheWorkspace(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"README": "hello\n", "dir/x": "x\n"})
	b := newDocker(t)
	r1 := execShell(t, b, ws, `stat -c %i dir/x; echo w > new.txt; echo changed > README; ln -s README link`)
	if r1.res.ExitCode != 0 || r1.res.Overlay == nil || len(r1.res.Overlay.Files) != 3 {
		t.Fatalf("first command: exit %d, overlay %+v, stderr %q", r1.res.ExitCode, r1.res.Overlay, r1.stderr)
	}
	r2 := execShell(t, b, ws, `stat -c %i dir/x; ls; cat README`)
	if r2.res.ExitCode != 0 || r2.stdout != r1.stdout+"README\ndir\nhello\n" {
		t.Fatalf("second command: exit %d, stdout %q (first %q), stderr %q; want the same inode of dir/x and the workspace as it is",
			r2.res.ExitCode, r2.stdout, r1.stdout, r2.stderr)
	}
	if ov := r2.res.Overlay; ov == nil || len(ov.Files)+len(ov.Deleted) != 0 {
		t.Errorf("second command wrote nothing, overlay %+v", r2.res.Overlay)
	}
	r3 := execShell(t, b, ws, `mkdir -p made/deep && echo in > made/deep/f && chmod 0555 made`)
	if r3.res.ExitCode != 0 {
		t.Fatalf("third command: exit %d, stderr %q", r3.res.ExitCode, r3.stderr)
	}
	r4 := execShell(t, b, ws, `ls; cat README dir/x`)
	if r4.res.ExitCode != 0 || r4.stdout != "README\ndir\nhello\nx\n" {
		t.Fatalf("after a read-only directory: exit %d, stdout %q, stderr %q", r4.res.ExitCode, r4.stdout, r4.stderr)
	}
}

// A command that rewrites a file and gives it back its size and times
// (touch -r) is still seen to have changed it: the wrapper goes by ctime,
// which no process can set.
func TestDockerRewriteKeepingSizeAndMtimeIsCaptured(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"f.txt": "aaaa\n"})
	b := newDocker(t)
	execShell(t, b, ws, `true`) // the copy the next command gets repaired
	r := execShell(t, b, ws, `cp -p f.txt /tmp/ref && printf 'bbbb\n' >f.txt && touch -r /tmp/ref f.txt && rm /tmp/ref`)
	if r.res.ExitCode != 0 {
		t.Fatalf("exit %d, stderr %q", r.res.ExitCode, r.stderr)
	}
	if r.res.Overlay == nil || len(r.res.Overlay.Files) != 1 || string(r.res.Overlay.Files[0].Data) != "bbbb\n" {
		t.Fatalf("overlay %+v; want f.txt with bbbb", r.res.Overlay)
	}
}

// A host edit that keeps the file's size, mtime and inode is seen by the
// next command.
func TestDockerHostEditKeepingSizeAndMtimeIsSeen(t *testing.T) {
	ws := t.TempDir()
	f := filepath.Join(ws, "f.txt")
	writeFiles(t, ws, map[string]string{"f.txt": "aaaa\n"})
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(f, old, old); err != nil {
		t.Fatal(err)
	}
	b := newDocker(t)
	if r := execShell(t, b, ws, `cat f.txt`); r.stdout != "aaaa\n" {
		t.Fatalf("first command: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	rewriteKeepingStat(t, f, "bbbb\n")
	if r := execShell(t, b, ws, `cat f.txt`); r.stdout != "bbbb\n" {
		t.Fatalf("after the host edit: stdout %q, stderr %q", r.stdout, r.stderr)
	}
}

// rewriteKeepingStat writes data (of the file's size) in place and gives
// the file back its times.
func rewriteKeepingStat(t *testing.T, f, data string) {
	t.Helper()
	st, err := os.Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != int64(len(data)) {
		t.Fatalf("rewriteKeepingStat: %d bytes for a file of %d", len(data), st.Size())
	}
	h, err := os.OpenFile(f, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.WriteAt([]byte(data), 0); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(f, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
}

// wsSig tells apart two states of a file with the same size, mtime and
// inode (by ctime), and trusts no stat made within racyWindow of the
// file's last change: such a file may change again in the same clock
// tick, leaving every time as it was.
func TestWsSigCtimeAndRacyFiles(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, []byte("aaaa"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(f, old, old); err != nil {
		t.Fatal(err)
	}
	sig := func(since time.Time) string {
		st, err := os.Lstat(f)
		if err != nil {
			t.Fatal(err)
		}
		return wsSig(st, "", since)
	}
	later := time.Now().Add(time.Minute) // a walk long after the change
	s1 := sig(later)
	if !strings.HasPrefix(s1, "w|") || s1 != sig(later) {
		t.Fatalf("an aged file: signatures %q and %q, want one stable w| signature", s1, sig(later))
	}
	now := time.Now()
	if a, b := sig(now), sig(now); strings.HasPrefix(a, "w|") || a == b {
		t.Errorf("a file changed just now got the signatures %q and %q, want two that match nothing", a, b)
	}
	time.Sleep(10 * time.Millisecond) // a ctime apart from the first on a coarse clock
	rewriteKeepingStat(t, f, "bbbb")
	if s2 := sig(later.Add(time.Minute)); s2 == s1 {
		t.Errorf("rewritten with the same size, mtime and inode: signature %q unchanged", s2)
	}

	// On a filesystem with sub-second times (t.TempDir's, here) a change
	// is trusted once it is racyWindowFine old, not only after the two
	// seconds a whole-second filesystem needs; a whole-second ctime takes
	// the long window.
	st, err := os.Lstat(f)
	if err != nil {
		t.Fatal(err)
	}
	ctime := statCtime(st.Sys().(*syscall.Stat_t))
	changed := time.Unix(0, ctime)
	aged := changed.Add(racyWindowFine + 50*time.Millisecond)
	young := changed.Add(racyWindowFine - 50*time.Millisecond)
	if ctime%int64(time.Second) == 0 {
		if a := sig(aged); strings.HasPrefix(a, "w|") {
			t.Errorf("a whole-second ctime %v past the fine window only: signature %q, want the long window's", changed, a)
		}
		return
	}
	if a, b := sig(aged), sig(aged); !strings.HasPrefix(a, "w|") || a != b {
		t.Errorf("sub-second ctime, stat %v after the change: signatures %q and %q, want one stable w| signature", aged.Sub(changed), a, b)
	}
	if a, b := sig(young), sig(young); strings.HasPrefix(a, "w|") || a == b {
		t.Errorf("sub-second ctime, stat %v after the change: signatures %q and %q, want two that match nothing", young.Sub(changed), a, b)
	}
}

// After a sync that sent files (a host edit), base is still the sandbox
// user's alone: a command can neither list it nor read or write in it.
func TestDockerBaseStaysPrivateAfterASync(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"f.txt": "one\n"})
	b := newDocker(t)
	execShell(t, b, ws, `true`)
	writeFiles(t, ws, map[string]string{"f.txt": "two\n", "d/new.txt": "new\n"})
	r := execShell(t, b, ws, `cat f.txt; ls /work/base >/dev/null 2>&1 && echo BREACH list; cat /work/base/f.txt 2>/dev/null && echo BREACH read; echo x 2>/dev/null >/work/base/planted && echo BREACH write; true`)
	if r.stdout != "two\n" {
		t.Fatalf("stdout %q, stderr %q; want the host edit and no breach", r.stdout, r.stderr)
	}
}

// A directory renamed onto a new name brings what is in it with the
// ctimes it had, from before the command's mark: it all comes back under
// the new name, and the old name is deleted.
func TestDockerRenamedDirectoryComesBackWhole(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"a/b/f": "x\n", "a/g": "y\n"})
	b := newDocker(t)
	execShell(t, b, ws, `true`) // the copy the next command gets repaired
	r := execShell(t, b, ws, `mv a c`)
	if r.res.ExitCode != 0 || r.res.Overlay == nil {
		t.Fatalf("exit %d, overlay %+v, stderr %q", r.res.ExitCode, r.res.Overlay, r.stderr)
	}
	got := map[string]string{}
	for _, f := range r.res.Overlay.Files {
		got[f.Path] = string(f.Data)
		if f.Mode.IsDir() {
			got[f.Path] = "dir"
		}
	}
	want := map[string]string{"c": "dir", "c/b": "dir", "c/b/f": "x\n", "c/g": "y\n"}
	for p, d := range want {
		if got[p] != d {
			t.Errorf("overlay %s = %q, want %q (overlay files %v)", p, got[p], d, got)
		}
	}
	del := map[string]bool{}
	for _, p := range r.res.Overlay.Deleted {
		del[p] = true
		if p == "c" || strings.HasPrefix(p, "c/") {
			t.Errorf("deleted %s, which the command made", p)
		}
	}
	if !del["a"] {
		t.Errorf("deleted %q, want a among them", r.res.Overlay.Deleted)
	}
}

// A command that only removes entries changes no ctime but its
// directory's (the copy's top for a top-level entry): the removals are
// still seen.
func TestDockerRemovalAloneIsSeen(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"top.txt": "t\n", "dir/x": "x\n", "dir/y": "y\n"})
	b := newDocker(t)
	execShell(t, b, ws, `true`) // the copy the next commands get repaired
	for _, c := range []struct{ cmd, gone string }{{"rm top.txt", "top.txt"}, {"rm dir/x", "dir/x"}} {
		r := execShell(t, b, ws, c.cmd)
		if r.res.ExitCode != 0 || r.res.Overlay == nil || strings.Join(r.res.Overlay.Deleted, ",") != c.gone || len(r.res.Overlay.Files) != 0 {
			t.Errorf("%s: exit %d, overlay %+v, stderr %q; want %s deleted, nothing else", c.cmd, r.res.ExitCode, r.res.Overlay, r.stderr, c.gone)
		}
	}
}

// pendingFiles is a pending stack of one layer holding files (0644).
func pendingFiles(files map[string]string) *backend.Pending {
	var es []backend.PendingEntry
	for p, data := range files {
		sum := sha256.Sum256([]byte(data))
		es = append(es, backend.PendingEntry{
			Path: p, Kind: backend.PendingFile, Mode: 0o644, Size: int64(len(data)),
			SHA:  hex.EncodeToString(sum[:]),
			Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(data)), nil },
		})
	}
	sort.Slice(es, func(i, j int) bool { return es[i].Path < es[j].Path })
	return &backend.Pending{Layers: []backend.PendingLayer{{ID: "links", Entries: es}}, View: es}
}

// A hard link a command makes (ln c d) is staged as two files, so the
// next commands, shown them pending, must see two files too: not the
// kept copy's link, nor one base got from the merge (a fresh copy of
// base, here that of a second command running meanwhile), where writing
// c changed d as well and the overlay reported d as written.
func TestDockerHardLinkIsNotKeptWhilePending(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	r := execShell(t, b, ws, `echo n1 > c && ln c d`)
	if r.res.ExitCode != 0 || r.res.Overlay == nil || len(r.res.Overlay.Files) != 2 {
		t.Fatalf("ln: exit %d, overlay %+v; stderr %q", r.res.ExitCode, r.res.Overlay, r.stderr)
	}
	pend := pendingFiles(map[string]string{"c": "n1\n", "d": "n1\n"})
	withPending := func(req *backend.Request) { req.Pending = pend }
	const script = `stat -c %h c d | tr '\n' ' '; echo changed > c; cat d`
	check := func(what string, r run) {
		t.Helper()
		if r.stdout != "1 1 n1\n" {
			t.Errorf("%s: links of c, d and d after writing c: %q, want %q; stderr %q", what, r.stdout, "1 1 n1\n", r.stderr)
		}
		if o := r.res.Overlay; o == nil || len(o.Files) != 1 || o.Files[0].Path != "c" || len(o.Deleted) != 0 {
			t.Errorf("%s: overlay %+v, want c alone", what, o)
		}
	}
	// Two at once: one in the kept copy, one in a copy made from base.
	var wg sync.WaitGroup
	var slow run
	var slowErr error
	var out, errb bytes.Buffer
	wg.Add(1)
	go func() {
		defer wg.Done()
		slow.res, slowErr = b.Exec(context.Background(), &backend.Request{
			ExecutionID: "slow", Workspace: ws, Shell: "sleep 1; " + script, Pending: pend,
			Stdout: &out, Stderr: &errb, Network: policy.DenyAllNetwork(),
		})
	}()
	time.Sleep(300 * time.Millisecond)
	check("concurrent", execShell(t, b, ws, script, withPending))
	wg.Wait()
	if slowErr != nil {
		t.Fatalf("the slow command: %v", slowErr)
	}
	slow.stdout, slow.stderr = out.String(), errb.String()
	check("slow", slow)
	check("next", execShell(t, b, ws, script, withPending))
}

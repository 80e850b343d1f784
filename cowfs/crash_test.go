package cowfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestHelperProcess is not a test: the crash and concurrency tests
// re-execute the test binary with PULSE_COWFS_HELPER set, and this
// function then commits one transaction, optionally SIGKILLing itself at
// a numbered failpoint. Exit codes: 0 committed, 3 conflict, 4 other error.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv("PULSE_COWFS_HELPER")
	if mode != "commit" && mode != "stage" && mode != "batch" && mode != "undo" {
		t.Skip("helper process for the crash tests; runs only when re-executed by them")
	}
	// The kill at a failpoint is set up by the package itself, from
	// FailpointEnv, as for any program using cowfs.
	code := func() int {
		f, err := Open(t.Context(), os.Getenv("PULSE_COWFS_WS"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 4
		}
		defer f.Close()
		if mode == "undo" {
			if _, err := f.Undo(context.Background()); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 4
			}
			return 0
		}
		tx, err := f.Tx(t.Context(), os.Getenv("PULSE_COWFS_TX"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 4
		}
		if mode == "batch" {
			errs, err := tx.Stage(context.Background(), helperBatch())
			if err == nil {
				err = errors.Join(errs...)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 4
			}
			return 0
		}
		if mode == "stage" {
			for i := 0; i < 10; i++ {
				if err := tx.Write(t.Context(), fmt.Sprintf("s%02d", i), []byte(fmt.Sprint("staged ", i)), 0); err != nil {
					fmt.Fprintln(os.Stderr, err)
					return 4
				}
			}
			return 0
		}
		if os.Getenv("PULSE_COWFS_GO") != "" {
			// Start line for the concurrency test: wait until the file
			// appears so both processes commit at the same moment.
			for {
				if _, err := os.Stat(os.Getenv("PULSE_COWFS_GO")); err == nil {
					break
				}
			}
		}
		_, err = tx.Commit(context.Background())
		switch {
		case err == nil:
			return 0
		case errors.Is(err, ErrConflict):
			return 3
		default:
			fmt.Fprintln(os.Stderr, err)
			return 4
		}
	}()
	os.Exit(code)
}

// failpointEnv is the FailpointEnv setting that kills at the hit-th
// pass of failpoint fp.
func failpointEnv(fp, hit int) string {
	return FailpointEnv + "=" + failpointName(fp) + ":" + strconv.Itoa(hit)
}

func helperCmd(ws, id string, extra ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PULSE_COWFS_HELPER=commit", "PULSE_COWFS_WS="+ws, "PULSE_COWFS_TX="+id)
	// A later PULSE_COWFS_HELPER in extra wins: exec keeps the last one.
	cmd.Env = append(cmd.Env, extra...)
	return cmd
}

// crashFixture is a workspace and a staged 50-change transaction: 25
// files rewritten, 15 created (10 in a new directory), 10 deleted.
type crashFixture struct {
	ws       string
	id       string
	old, new map[string]*string // nil: absent
}

func str(s string) *string { return &s }

func newCrashFixture(t *testing.T) *crashFixture {
	t.Helper()
	fx := &crashFixture{ws: newWS(t), old: map[string]*string{}, new: map[string]*string{}}
	for i := 0; i < 35; i++ {
		p := fmt.Sprintf("f%02d.txt", i)
		c := strings.Repeat(fmt.Sprintf("old %d\n", i), 50+i)
		writeFile(t, fx.ws, p, c, 0o644)
		fx.old[p] = str(c)
		fx.new[p] = str(c)
	}
	f, err := Open(t.Context(), fx.ws)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tx, err := f.Begin(t.Context(), "fifty")
	if err != nil {
		t.Fatal(err)
	}
	fx.id = tx.ID()
	for i := 0; i < 25; i++ {
		p := fmt.Sprintf("f%02d.txt", i)
		c := strings.Repeat(fmt.Sprintf("new %d\n", i), 70+i)
		if err := tx.Write(t.Context(), p, []byte(c), 0); err != nil {
			t.Fatal(err)
		}
		fx.new[p] = str(c)
	}
	for i := 0; i < 15; i++ {
		p := fmt.Sprintf("n%02d.bin", i)
		if i >= 5 {
			p = "newdir/" + p
		}
		c := fmt.Sprintf("\x00binary %d\xff", i)
		if err := tx.Write(t.Context(), p, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
		fx.old[p], fx.new[p] = nil, str(c)
	}
	for i := 25; i < 35; i++ {
		p := fmt.Sprintf("f%02d.txt", i)
		if err := tx.Delete(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		fx.new[p] = nil
	}
	if n := len(tx.Changes()); n != 51 { // 50 files and the implicit newdir
		t.Fatalf("staged %d changes", n)
	}
	return fx
}

func (fx *crashFixture) read(t *testing.T, p string) *string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fx.ws, p))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return str(string(b))
}

func same(a, b *string) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

// checkEach asserts every file is wholly its old or wholly its new
// content, and returns how many are new.
func (fx *crashFixture) checkEach(t *testing.T) (nNew int) {
	t.Helper()
	for p := range fx.old {
		got := fx.read(t, p)
		switch {
		case same(got, fx.new[p]):
			if !same(fx.old[p], fx.new[p]) {
				nNew++
			}
		case same(got, fx.old[p]):
		default:
			t.Fatalf("%s is torn: neither old nor new", p)
		}
	}
	return nNew
}

func (fx *crashFixture) checkAllNew(t *testing.T) {
	t.Helper()
	for p := range fx.old {
		if !same(fx.read(t, p), fx.new[p]) {
			t.Fatalf("%s does not hold its new content", p)
		}
	}
	if _, ok := fx.new["newdir/n05.bin"]; !ok {
		return
	}
	if fi, err := os.Stat(filepath.Join(fx.ws, "newdir/n05.bin")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode of a new file: %v %v", fi, err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(fx.ws, ".pulse-cow-*"))
	more, _ := filepath.Glob(filepath.Join(fx.ws, "newdir", ".pulse-cow-*"))
	if len(leftovers)+len(more) > 0 {
		t.Fatalf("temp files left: %v %v", leftovers, more)
	}
}

func (fx *crashFixture) crashAt(t *testing.T, fp, hit int) {
	t.Helper()
	cmd := helperCmd(fx.ws, fx.id, failpointEnv(fp, hit))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("helper was not killed at failpoint %d hit %d: %v\n%s", fp, hit, err, out)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v, not SIGKILL, at failpoint %d hit %d\n%s", err, fp, hit, out)
	}
}

func TestCrashAtEveryFailpoint(t *testing.T) {
	type point struct{ fp, hit int }
	var points []point
	for fp := 1; fp <= numFailpoints; fp++ {
		switch fp {
		case fpApplyRemoved:
			points = append(points, point{fp, 1}, point{fp, 10})
		case fpApplyTemp, fpApplyRenamed:
			points = append(points, point{fp, 1}, point{fp, 20}, point{fp, 40})
		default:
			points = append(points, point{fp, 1})
		}
	}
	for _, pt := range points {
		t.Run(fmt.Sprintf("fp%d-hit%d", pt.fp, pt.hit), func(t *testing.T) {
			t.Parallel()
			fx := newCrashFixture(t)
			fx.crashAt(t, pt.fp, pt.hit)
			fx.checkEach(t)
			f := openFS(t, fx.ws)
			if err := f.RecoveryErr(); err != nil {
				t.Fatalf("recovery: %v", err)
			}
			if pt.fp <= fpWALTemp {
				// Killed before the commit point: nothing applied, the
				// transaction is still open and commits normally.
				if n := fx.checkEach(t); n != 0 {
					t.Fatalf("%d files changed before the commit point", n)
				}
				tx, err := f.Tx(t.Context(), fx.id)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Commit(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			fx.checkAllNew(t)
			infos, err := f.List(t.Context())
			if err != nil || len(infos) != 1 || infos[0].State != StateCommitted || infos[0].ID != fx.id {
				t.Fatalf("List after recovery = %+v, %v", infos, err)
			}
			// The rolled-forward commit can be undone like any other.
			if _, err := f.Undo(context.Background()); err != nil {
				t.Fatal(err)
			}
			for p := range fx.old {
				if !same(fx.read(t, p), fx.old[p]) {
					t.Fatalf("undo after recovery: %s not restored", p)
				}
			}
		})
	}
}

func TestCorruptWALIsQuarantined(t *testing.T) {
	corruptions := map[string]func(b []byte) []byte{
		"truncate": func(b []byte) []byte { return b[:len(b)/2] },
		"truncate at a frame boundary": func(b []byte) []byte {
			_, good, _ := decodeFrames(b)
			frames, _, _ := decodeFrames(b)
			last := frameHeader + len(frames[len(frames)-1])
			return b[:good-last]
		},
		"zero a sector": func(b []byte) []byte {
			off := 512
			if off >= len(b) {
				off = 0
			}
			for i := off; i < off+512 && i < len(b); i++ {
				b[i] = 0
			}
			return b
		},
		"flip a byte": func(b []byte) []byte { b[len(b)/3] ^= 0x20; return b },
		"empty":       func(b []byte) []byte { return nil },
	}
	for name, corrupt := range corruptions {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fx := newCrashFixture(t)
			fx.crashAt(t, fpWALSynced, 1)
			walPath := filepath.Join(fx.ws, StateDir, "tx", fx.id, "wal")
			b, err := os.ReadFile(walPath)
			if err != nil {
				t.Fatal(err)
			}
			bad := corrupt(b)
			if err := os.WriteFile(walPath, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			fx.checkQuarantined(t, bad)
		})
	}
}

// checkQuarantined opens the workspace and asserts the transaction was
// refused cleanly: ErrRecovery, listed as quarantined, its WAL kept as
// it was, no file touched, and Commit and Discard refused.
func (fx *crashFixture) checkQuarantined(t *testing.T, wal []byte) {
	t.Helper()
	applied := fx.checkEach(t)           // what the interrupted commit did before it died
	for round := 0; round < 2; round++ { // and again on the next Open
		f := openFS(t, fx.ws)
		if err := f.RecoveryErr(); !errors.Is(err, ErrRecovery) {
			t.Fatalf("RecoveryErr = %v, want ErrRecovery", err)
		}
		if n := fx.checkEach(t); n != applied {
			t.Fatalf("a refused recovery changed files: %d new, %d before", n, applied)
		}
		infos, err := f.List(t.Context())
		if err != nil || len(infos) != 1 || infos[0].State != StateQuarantined || infos[0].Reason == "" {
			t.Fatalf("List = %+v, %v", infos, err)
		}
		got, err := os.ReadFile(filepath.Join(fx.ws, StateDir, "tx", fx.id, "wal"))
		if err != nil || string(got) != string(wal) {
			t.Fatalf("quarantined WAL was changed or removed: %v", err)
		}
		tx, err := f.Tx(t.Context(), fx.id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Commit(context.Background()); !errors.Is(err, ErrRecovery) {
			t.Fatalf("Commit of a quarantined tx: %v", err)
		}
		if err := tx.Discard(t.Context()); !errors.Is(err, ErrRecovery) {
			t.Fatalf("Discard of a quarantined tx: %v", err)
		}
	}
}

func TestRecoveryQuarantinesChangedTargets(t *testing.T) {
	fx := newCrashFixture(t)
	fx.crashAt(t, fpApplyRenamed, 20)
	// Someone edits a file the interrupted commit has not reached yet.
	var victim string
	for i := 0; i < 25; i++ {
		p := fmt.Sprintf("f%02d.txt", i)
		if same(fx.read(t, p), fx.old[p]) {
			victim = p
			break
		}
	}
	if victim == "" {
		t.Fatal("every file already new at hit 20")
	}
	writeFile(t, fx.ws, victim, "someone else\n", 0o644)
	fx.old[victim] = str("someone else\n")
	wal, _ := os.ReadFile(filepath.Join(fx.ws, StateDir, "tx", fx.id, "wal"))
	fx.checkQuarantined(t, wal)
	// The entries the interrupted commit had beside its targets are gone.
	fx.checkNoTemps(t)
}

func TestRecoveryRefusesEscapingWAL(t *testing.T) {
	for _, p := range []string{"../escaped", ".pulse/cow/lock", "/abs"} {
		t.Run(p, func(t *testing.T) {
			fx := newCrashFixture(t)
			fx.crashAt(t, fpWALSynced, 1)
			walPath := filepath.Join(fx.ws, StateDir, "tx", fx.id, "wal")
			b, _ := os.ReadFile(walPath)
			w, err := decodeWAL(b)
			if err != nil {
				t.Fatal(err)
			}
			w.Ops[0].Path = p
			bad, err := encodeWAL(w)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(walPath, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			fx.checkQuarantined(t, bad)
			if _, err := os.Lstat(filepath.Join(filepath.Dir(fx.ws), "escaped")); err == nil {
				t.Fatal("a WAL path escaped the workspace")
			}
		})
	}
}

func TestTwoProcessesCommitOverlapping(t *testing.T) {
	ws := newWS(t)
	for i := 0; i < 20; i++ {
		writeFile(t, ws, fmt.Sprintf("f%02d", i), "base\n", 0o644)
	}
	f := openFS(t, ws)
	var ids [2]string
	for k := range ids {
		tx, err := f.Begin(t.Context(), fmt.Sprintf("writer %d", k))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 20; i++ {
			if err := tx.Write(t.Context(), fmt.Sprintf("f%02d", i), []byte(strings.Repeat(fmt.Sprintf("writer %d\n", k), 100)), 0); err != nil {
				t.Fatal(err)
			}
		}
		ids[k] = tx.ID()
	}
	start := filepath.Join(t.TempDir(), "go")
	var cmds [2]*exec.Cmd
	for k := range cmds {
		cmds[k] = helperCmd(ws, ids[k], "PULSE_COWFS_GO="+start)
		if err := cmds[k].Start(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(start, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var codes [2]int
	for k, c := range cmds {
		c.Wait()
		codes[k] = c.ProcessState.ExitCode()
	}
	winner := -1
	switch codes {
	case [2]int{0, 3}:
		winner = 0
	case [2]int{3, 0}:
		winner = 1
	default:
		t.Fatalf("exit codes %v, want exactly one 0 (committed) and one 3 (conflict)", codes)
	}
	want := strings.Repeat(fmt.Sprintf("writer %d\n", winner), 100)
	for i := 0; i < 20; i++ {
		if got := readFile(t, ws, fmt.Sprintf("f%02d", i)); got != want {
			t.Fatalf("f%02d is not wholly the winner's: %q", i, got[:20])
		}
	}
	infos, _ := f.List(t.Context())
	var open int
	for _, in := range infos {
		if in.State == StateOpen && in.ID == ids[1-winner] {
			open++
		}
	}
	if open != 1 {
		t.Fatalf("the loser's transaction was not kept: %+v", infos)
	}
}

// TestCrashWhileStaging kills a process in the middle of staging: the
// transaction survives it, holds exactly the writes that returned (or
// that one too, if its record reached the log), and commits later.
func TestCrashWhileStaging(t *testing.T) {
	for _, tc := range []struct {
		fp, hit, want int
	}{
		{fpStageBlob, 5, 4},     // fifth write's record never appended
		{fpStageAppended, 5, 5}, // fifth write's record durable, Write did not return
	} {
		t.Run(fmt.Sprint("fp", tc.fp), func(t *testing.T) {
			t.Parallel()
			ws := newWS(t)
			f := openFS(t, ws)
			tx, err := f.Begin(t.Context(), "staging crash")
			if err != nil {
				t.Fatal(err)
			}
			cmd := helperCmd(ws, tx.ID(), "PULSE_COWFS_HELPER=stage", failpointEnv(tc.fp, tc.hit))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
				t.Fatalf("helper not killed: %v\n%s", err, out)
			}
			f2 := openFS(t, ws)
			infos, err := f2.List(t.Context())
			if err != nil || len(infos) != 1 || infos[0].ID != tx.ID() || infos[0].State != StateOpen || infos[0].Changes != tc.want {
				t.Fatalf("after the crash List = %+v, %v", infos, err)
			}
			tx2, err := f2.Tx(t.Context(), tx.ID())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx2.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < tc.want; i++ {
				if got := readFile(t, ws, fmt.Sprintf("s%02d", i)); got != fmt.Sprint("staged ", i) {
					t.Fatalf("s%02d = %q", i, got)
				}
			}
			if _, err := os.Lstat(filepath.Join(ws, fmt.Sprintf("s%02d", tc.want))); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a write that never reached the log was committed: %v", err)
			}
		})
	}
}

// TestCrashDuringUndo kills a process in the middle of an Undo: recovery
// must finish it (every file back to its old bytes) and drop the undone
// entry from the journal, so the next Undo does not revert it twice.
func TestCrashDuringUndo(t *testing.T) {
	for _, pt := range [][2]int{{fpWALSynced, 1}, {fpApplyRenamed, 10}, {fpAfterWritten, 1}} {
		t.Run(fmt.Sprintf("fp%d-hit%d", pt[0], pt[1]), func(t *testing.T) {
			t.Parallel()
			fx := newCrashFixture(t)
			f := openFS(t, fx.ws)
			tx, err := f.Tx(t.Context(), fx.id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			f.Close()
			cmd := helperCmd(fx.ws, "", "PULSE_COWFS_HELPER=undo", failpointEnv(pt[0], pt[1]))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
				t.Fatalf("helper not killed: %v\n%s", err, out)
			}
			fx.checkEach(t)
			f2 := openFS(t, fx.ws)
			if err := f2.RecoveryErr(); err != nil {
				t.Fatal(err)
			}
			for p := range fx.old {
				if !same(fx.read(t, p), fx.old[p]) {
					t.Fatalf("%s not restored by the recovered undo", p)
				}
			}
			if infos, err := f2.List(t.Context()); err != nil || len(infos) != 0 {
				t.Fatalf("List after recovered undo = %+v, %v", infos, err)
			}
			if _, err := f2.Undo(context.Background()); !errors.Is(err, ErrNotFound) {
				t.Fatalf("second undo: %v", err)
			}
		})
	}
}

// TestUndoKilledBeforeItsCommitPoint kills an Undo before its commit
// point (after validation, after writing wal.tmp), and kills one past it
// whose workspace then changes, so that recovery finds it has written
// nothing and rolls it back. Each time the undo did not happen, and it
// must leave nothing behind: no pending transaction reverting the commit
// (commands would run on it, commit --all would apply it with their
// changes, and once Undo had been run again it could never commit and
// would make every commit --all refuse). The commit stays in the
// journal, and Undo can be run again.
func TestUndoKilledBeforeItsCommitPoint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fp      int
		touched bool // a file of the commit is edited before recovery
	}{
		{"validated", fpValidated, false},
		{"wal-temp", fpWALTemp, false},
		{"wal-synced-then-edited", fpWALSynced, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fx := newCrashFixture(t)
			f := openFS(t, fx.ws)
			tx, err := f.Tx(t.Context(), fx.id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			f.Close()
			cmd := helperCmd(fx.ws, "", "PULSE_COWFS_HELPER=undo", failpointEnv(tc.fp, 1))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
				t.Fatalf("helper not killed: %v\n%s", err, out)
			}
			for p := range fx.old {
				if !same(fx.read(t, p), fx.new[p]) {
					t.Fatalf("%s changed by an undo killed before it wrote anything", p)
				}
			}
			if tc.touched {
				writeFile(t, fx.ws, "f00.txt", "edited meanwhile\n", 0o644)
			}
			f2 := openFS(t, fx.ws)
			if err := f2.RecoveryErr(); (err != nil) != tc.touched {
				t.Fatalf("RecoveryErr = %v", err)
			}
			infos, err := f2.List(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(infos) != 1 || infos[0].ID != fx.id || infos[0].State != StateCommitted {
				t.Fatalf("after the killed undo List = %+v, want only the commit, still in the journal", infos)
			}
			st, err := f2.Stack(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if n := len(st.Txs) + len(st.Damaged); n != 0 {
				t.Fatalf("the pending stack holds %d transactions after a killed undo", n)
			}
			if tc.touched {
				return
			}
			if _, err := f2.Undo(context.Background()); err != nil {
				t.Fatalf("undo run again: %v", err)
			}
			for p := range fx.old {
				if !same(fx.read(t, p), fx.old[p]) {
					t.Fatalf("%s not restored by the undo run again", p)
				}
			}
			// New work commits with commit --all, and is all it commits.
			tx2, err := f2.Begin(t.Context(), "after")
			if err != nil {
				t.Fatal(err)
			}
			if err := tx2.Write(t.Context(), "after.txt", []byte("after\n"), 0); err != nil {
				t.Fatal(err)
			}
			if _, _, err := f2.CommitAll(context.Background()); err != nil {
				t.Fatalf("commit --all after the undo: %v", err)
			}
			for p := range fx.old {
				if !same(fx.read(t, p), fx.old[p]) {
					t.Fatalf("%s changed by commit --all", p)
				}
			}
		})
	}
}

// failpointName returns the FailpointEnv name of failpoint fp.
func failpointName(fp int) string {
	for _, n := range FailpointNames {
		if n.Number == fp {
			return n.Name
		}
	}
	return strconv.Itoa(fp)
}

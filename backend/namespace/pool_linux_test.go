package namespace

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

// initChildren lists the sandbox inits this process started and has not
// reaped: children whose command line is the init's.
func initChildren(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	me := strconv.Itoa(os.Getpid())
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil || !strings.Contains(string(st), "\nPPid:\t"+me+"\n") {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.HasPrefix(cl, []byte("pulse-runtime\x00ns-init\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// idleInits counts the inits the backend holds started ahead.
func idleInits(b *Backend) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, ps := range b.warm {
		n += len(ps)
	}
	return n
}

func burst(t *testing.T, b *Backend, n int, script string) []string {
	t.Helper()
	outs := make([]string, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out, errb bytes.Buffer
			res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(),
				Shell: strings.ReplaceAll(script, "ID", strconv.Itoa(i)), Stdout: &out, Stderr: &errb})
			if err != nil || res.ExitCode != 0 {
				t.Errorf("Exec %d: %v %+v %s", i, err, res, errb.String())
			}
			outs[i] = out.String()
		}()
	}
	wg.Wait()
	return outs
}

// TestPoolGrowsWithBurstsAndCloseEndsIt: one command at a time keeps one
// init ready; a burst of 4 grows the pool to 4 (its size), never more;
// Close ends every idle init and removes their run directories.
func TestPoolGrowsWithBurstsAndCloseEndsIt(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	b := newBackend(t, WithStateDir(state), WithPoolSize(4))
	for i := 0; i < 3; i++ {
		runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: "true"})
	}
	b.waitWarm()
	if n := idleInits(b); n != 1 {
		t.Fatalf("%d idle inits after serial Execs, want 1", n)
	}
	burst(t, b, 8, "true")
	b.waitWarm()
	if n := idleInits(b); n != 4 {
		t.Fatalf("%d idle inits after a burst of 8 with pool size 4, want 4", n)
	}
	// Those are live processes: at least that many inits are children of
	// this process (more while the inits of finished Execs are exiting).
	if n := len(initChildren(t)); n < 4 {
		t.Fatalf("%d init processes, want at least the 4 idle ones", n)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if pids := initChildren(t); len(pids) != 0 {
		t.Fatalf("inits left after Close: %v", pids)
	}
	ents, err := os.ReadDir(state)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("run directories left after Close: %v", ents)
	}
}

// TestPoolSharesNothing: commands of one burst, each in an init from the
// pool, see nothing of each other: not /tmp, not home, not processes, not
// the workspace of another.
func TestPoolSharesNothing(t *testing.T) {
	b := newBackend(t, WithPoolSize(6))
	burst(t, b, 6, "true") // grow the pool to 6
	b.waitWarm()
	outs := burst(t, b, 6, `echo ID > /tmp/mark; echo ID > ~/mark; echo ID > mark; (sleep 30 &)
sleep 0.2
echo "marks=$(cat /tmp/mark ~/mark mark | sort -u | tr '\n' ' ')"
n=0; for d in /proc/[0-9]*; do n=$((n+1)); done; echo procs=$n`)
	for i, out := range outs {
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != 2 || lines[0] != "marks="+strconv.Itoa(i)+" " {
			t.Fatalf("command %d saw marks %q, want only its own", i, out)
		}
		// init, bash, its sleep, the command substitution's subshell at
		// most: never another command's processes.
		n, _ := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(lines[1]), "procs="))
		if n < 2 || n > 5 {
			t.Fatalf("command %d saw %d processes: %q", i, n, out)
		}
	}
}

// waitWarm waits until no init is being started ahead; benchmarks use it
// so that the references they time do not share the CPU with it.
func (b *Backend) waitWarm() {
	for {
		b.mu.Lock()
		busy := b.filling[true] || b.filling[false]
		b.mu.Unlock()
		if !busy {
			return
		}
		time.Sleep(200 * time.Microsecond)
	}
}

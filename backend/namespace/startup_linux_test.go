package namespace

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"
)

// startupSteps are the steps of a cold Exec in the order they happen: the
// backend's (plain names) and the init's ("init:" names), each timed when
// it ends.
var startupSteps = []string{
	"prepare", "clone-exec",
	"init:init", "init:static-config", "init:system-binds", "init:masks-tmp-home", "init:dev",
	"init:proc", "init:hostname-lo", "init:signals", "init:static-setup", "init:request-config",
	"init:request-mounts", "init:resolve", "init:restrict", "init:fork-exec", "init:command",
	"status-eof", "init-reaped", "output-copied", "overlay-read",
}

// TestStartupPhases is the start-up profile: it traces cold Execs of
// `true` step by step (the init reports its steps over the status pipe)
// and logs the mean time of each step (go test -v -run StartupPhases).
// It asserts that every step is reported, once, in order.
func TestStartupPhases(t *testing.T) {
	nb := newBackend(t, WithoutPrestart())
	ws := t.TempDir()
	type mark struct {
		name string
		ns   int64
	}
	var (
		mu    sync.Mutex
		marks []mark
	)
	nb.o.phaseHook = func(name string, ns int64) {
		mu.Lock()
		marks = append(marks, mark{name, ns})
		mu.Unlock()
	}
	const n = 10
	sum := map[string]time.Duration{}
	var total time.Duration
	for i := 0; i < n; i++ {
		mu.Lock()
		marks = marks[:0]
		mu.Unlock()
		t0 := monoNow()
		res, _, _ := runCmd(t, nb, &backend.Request{Workspace: ws, Args: []string{"true"}})
		if res.ExitCode != 0 {
			t.Fatalf("true: %+v", res)
		}
		mu.Lock()
		got := slices.Clone(marks)
		mu.Unlock()
		// Both clocks are CLOCK_MONOTONIC, shared by the init and the
		// backend, so the marks interleave by time.
		sort.SliceStable(got, func(a, b int) bool { return got[a].ns < got[b].ns })
		// Each side reports its own steps in order; how the two sides
		// interleave is up to the scheduler (the init may report its first
		// step before the backend, back from the clone, stamps its own).
		var names []string
		for _, m := range got {
			names = append(names, m.name)
		}
		if !slices.Equal(side(names, true), side(startupSteps, true)) || !slices.Equal(side(names, false), side(startupSteps, false)) {
			t.Fatalf("steps\n%s\nwant\n%s", strings.Join(names, " "), strings.Join(startupSteps, " "))
		}
		prev := t0
		for _, m := range got {
			sum[m.name] += time.Duration(m.ns - prev)
			prev = m.ns
		}
		total += time.Duration(prev - t0)
	}
	var b strings.Builder
	for _, s := range startupSteps {
		d := sum[s] / n
		b.WriteString(strings.Repeat(" ", 22-len(s)) + s + " " + d.Round(time.Microsecond).String() + "\n")
	}
	t.Logf("mean of %d cold Execs of true, %v each; time spent up to the end of each step:\n%s", n, (total / n).Round(time.Microsecond), b.String())
}

// TestInitSurvivesSignals sends every signal to the sandbox's pid 1 from
// inside: the init must survive all of them, or the command, which waits
// after sending them, would be killed with it.
func TestInitSurvivesSignals(t *testing.T) {
	nb := newBackend(t)
	ws := t.TempDir()
	res, out, errs := runCmd(t, nb, &backend.Request{Workspace: ws, Shell: `
for s in $(seq 1 64); do kill -$s 1 2>/dev/null; done
sleep 0.3
kill -0 1 && echo alive`})
	if res.Termination != backend.Exited || res.ExitCode != 0 || out != "alive\n" {
		t.Fatalf("after signalling pid 1: %s %d, stdout %q stderr %q", res.Termination, res.ExitCode, out, errs)
	}
}

// TestSeccompProgramRequired: the backend has a filter program for every
// init (one given none refuses to go on: nsinit's TestSeccompProgramRequired).
func TestSeccompProgramRequired(t *testing.T) {
	prog, err := compiledSeccomp()
	if err != nil || len(prog) < len(deniedSyscalls) {
		t.Fatalf("compiled filter: %d instructions, %v", len(prog), err)
	}
}

// side is the steps the init reports (init true) or the backend's own.
func side(steps []string, init bool) []string {
	var out []string
	for _, s := range steps {
		if strings.HasPrefix(s, "init:") == init {
			out = append(out, s)
		}
	}
	return out
}

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// TestExecReturnsWithNamespaceEmpty: the init ends the namespace's other
// processes before it reports the command's end, so when Exec returns,
// a background process the command left (detached, its output elsewhere)
// is already gone, though the init itself may still be exiting.
func TestExecReturnsWithNamespaceEmpty(t *testing.T) {
	nb := newBackend(t)
	// A duration of this run's own, so the scan below sees only its
	// processes, not those of the same test running elsewhere on the machine.
	mark := fmt.Sprintf("31.%d%d", os.Getpid(), time.Now().UnixNano()%1000000)
	res, _, _ := runCmd(t, nb, &backend.Request{Workspace: t.TempDir(),
		Shell: `setsid sleep ` + mark + ` >/dev/null 2>&1 < /dev/null & (sleep ` + mark + ` >/dev/null 2>&1 &) ; exit 3`})
	if res.Termination != backend.Exited || res.ExitCode != 3 {
		t.Fatalf("%s %d, want exited 3", res.Termination, res.ExitCode)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cl), mark) {
			t.Fatalf("process %s (%q) outlived Exec", e.Name(), cl)
		}
	}
}

// TestMetricsCountTheCommand: the resources reported are those of the
// command and everything it started, reported by the init.
func TestMetricsCountTheCommand(t *testing.T) {
	nb := newBackend(t)
	res, out, _ := runCmd(t, nb, &backend.Request{Workspace: t.TempDir(),
		Shell: `x=$(head -c 20000000 /dev/zero | tr '\0' a); echo ${#x}`})
	if res.ExitCode != 0 || out != "20000000\n" {
		t.Fatalf("exit %d out %q", res.ExitCode, out)
	}
	if res.Metrics.MaxRSSBytes < 16<<20 || res.Metrics.UserCPU+res.Metrics.SystemCPU <= 0 {
		t.Fatalf("metrics %+v, want a max RSS of at least 16 MiB and some CPU time", res.Metrics)
	}
}

// FuzzParseStatus: the status lines come from the sandbox's side of a
// pipe. Whatever they hold, parsing does not panic, "ended" is believed
// only with three non-negative numbers, and a well-formed report
// appended after arbitrary lines is read back exactly.
func FuzzParseStatus(f *testing.F) {
	f.Add([]byte("started 7\nexit 768\nended 2048 150 300\n"))
	f.Add([]byte("phase init 123\nerror bad thing\n"))
	f.Add([]byte("ended -1 2 3\nended 1 2\nended a b c\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st := parseStatus(data)
		if st.ended {
			for _, v := range st.endedRU {
				if v < 0 {
					t.Fatalf("ended with a negative value: %v", st.endedRU)
				}
			}
		}
		st = parseStatus(append(append(data, '\n'), "started 5\nexit 256\nended 10 20 30\n"...))
		if !st.started || st.pid != 5 || !st.exited || st.status.ExitStatus() != 1 || !st.ended || st.endedRU != [3]int64{10, 20, 30} {
			t.Fatalf("well-formed report after %q read as %+v", data, st)
		}
	})
}

// TestSeccompProgramTravels: the program the init loads is the one the
// backend compiled, instruction for instruction, and a truncated one is
// refused.
func TestSeccompProgramTravels(t *testing.T) {
	prog, err := compiledSeccomp()
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(childConfig{Config: nsinit.Config{Seccomp: prog}})
	if err != nil {
		t.Fatal(err)
	}
	var got childConfig
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Seccomp, nsinit.BPFProgram(prog)) {
		t.Fatalf("program changed in transit: %d instructions, want %d", len(got.Seccomp), len(prog))
	}
	var bad nsinit.BPFProgram
	if err := json.Unmarshal([]byte(`"AAAAAAAAAA=="`), &bad); err == nil {
		t.Fatal("accepted a program of 7 bytes")
	}
}

// TestCommandSignalsDefault: whatever the init does with signals, the
// command starts with no more signals ignored than the same command
// started directly from this process (an ignored signal inherited from
// whoever ran the tests, as nohup leaves one, passes through exec either
// way), and ends on a signal it sends itself.
func TestCommandSignalsDefault(t *testing.T) {
	nb := newBackend(t)
	direct, err := exec.Command("grep", "SigIgn", "/proc/self/status").Output()
	if err != nil {
		t.Fatal(err)
	}
	_, out, _ := runCmd(t, nb, &backend.Request{Workspace: t.TempDir(), Args: []string{"grep", "SigIgn", "/proc/self/status"}})
	if strings.TrimSpace(out) != strings.TrimSpace(string(direct)) {
		t.Fatalf("command's ignored signals: %q, want %q as when run directly", out, direct)
	}
	res, _, _ := runCmd(t, nb, &backend.Request{Workspace: t.TempDir(), Shell: "kill -TERM $$; echo survived"})
	if res.Termination != backend.Signaled {
		t.Fatalf("kill -TERM $$: %s %d, want signaled", res.Termination, res.ExitCode)
	}
}

package server

import (
	"bufio"
	"context"
	"fmt"
	"github.com/pulse-agent/pulse/backend/namespace"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/internal/testenv/testproc"
	"github.com/pulse-agent/pulse/protocol"
)

// 200 clients submit at once against a limit of 10. Every submission ends
// either accepted and completed or cleanly refused for capacity, no more
// than 10 commands ever run together, and the store holds exactly the
// accepted ones.
func TestLoadTwoHundredClientsLimitTen(t *testing.T) {
	const clients, limit = 200, 10
	h := startServer(t, t.TempDir(), hostExecutor(t), WithMaxConcurrent(limit))
	slots := t.TempDir()
	// Each command leaves a marker while it runs and records how many
	// markers it saw: an upper bound of what ran at the same time.
	cmd := `touch "$SLOTS/$ID"; ls "$SLOTS" | wc -l; sleep 0.3; rm "$SLOTS/$ID"`

	type outcome struct {
		accepted  bool
		completed bool
		seen      int
		err       string
	}
	outcomes := make([]outcome, clients)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("load-%03d", i)
			o := &outcomes[i]
			ws, err := dialToken(h.url, tokenA)
			if err != nil {
				o.err = err.Error()
				return
			}
			defer ws.CloseNow()
			c := &client{t: t, ws: ws}
			<-start
			rid := c.send(protocol.ActionSubmit, map[string]any{"execution_id": id, "command": cmd,
				"env": map[string]any{"SLOTS": slots, "ID": id}})
			var early []msg
			for {
				m, err := c.tryRecv(60 * time.Second)
				if err != nil {
					o.err = err.Error()
					return
				}
				if m.Payload["request_id"] == rid {
					if m.Type == protocol.TypeError && m.str("code") == protocol.CodeCapacity && m.str("message") == protocol.MsgCapacity {
						return
					}
					if m.Type != protocol.TypeResponse || m.str("status") != protocol.StatusStarting {
						o.err = "unexpected reply " + m.raw
						return
					}
					o.accepted = true
					break
				}
				early = append(early, m)
			}
			for _, m := range early {
				if m.Type == protocol.TypeResult {
					o.completed, o.seen = m.num("exit_code") == 0, atoiTrim(m.str("stdout"))
					return
				}
			}
			for {
				m, err := c.tryRecv(60 * time.Second)
				if err != nil {
					o.err = err.Error()
					return
				}
				if m.Type == protocol.TypeResult {
					o.completed, o.seen = m.num("exit_code") == 0, atoiTrim(m.str("stdout"))
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()

	accepted, refused, maxSeen := 0, 0, 0
	for i, o := range outcomes {
		if o.err != "" {
			t.Fatalf("client %d: %s", i, o.err)
		}
		if !o.accepted {
			refused++
			continue
		}
		accepted++
		if !o.completed {
			t.Fatalf("client %d accepted but did not complete", i)
		}
		maxSeen = max(maxSeen, o.seen)
	}
	if accepted < limit || accepted+refused != clients {
		t.Fatalf("accepted %d, refused %d", accepted, refused)
	}
	if maxSeen > limit || maxSeen < 1 {
		t.Fatalf("a command saw %d running at once, limit %d", maxSeen, limit)
	}
	ctx := context.Background()
	counts, err := h.st.CountByStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts[store.StatusCompleted] != accepted || len(counts) != 1 {
		t.Fatalf("store %v, clients saw %d accepted", counts, accepted)
	}
	for i, o := range outcomes {
		if ok, _ := h.st.Exists(ctx, fmt.Sprintf("load-%03d", i)); ok != o.accepted {
			t.Fatalf("client %d: accepted %v, in store %v", i, o.accepted, ok)
		}
	}
	t.Logf("accepted %d, refused %d, max concurrent seen %d", accepted, refused, maxSeen)
}

func atoiTrim(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}

const childEnv = "PULSE_SERVER_TEST_CHILD"

func TestMain(m *testing.M) {
	// A pulse-worker child boxes executions with the namespace backend,
	// which re-runs this binary as each box's init.
	namespace.Init()
	testenv.RunIfChild("pulse-worker", testproc.Worker)
	if dir := os.Getenv(childEnv); dir != "" {
		runChildServer(dir)
		return
	}
	// goleak fails the run when a goroutine outlives the tests: a leak
	// the race detector does not see, since nothing races.
	goleak.VerifyTestMain(m)
}

// runChildServer is the server process that TestCrashMarksRunningUnknown
// kills: it serves dir on 127.0.0.1 and prints its address.
func runChildServer(dir string) {
	fail := func(err error) { fmt.Fprintln(os.Stderr, err); os.Exit(1) }
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "db.sqlite3"))
	if err != nil {
		fail(err)
	}
	b, err := host.New()
	if err != nil {
		fail(err)
	}
	srv, err := New(ctx, NewLocal(b, 0, nil), st, WithTokens(tokenA), WithWorkspaceRoot(filepath.Join(dir, "workspaces")), hostPolicies())
	if err != nil {
		fail(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	fmt.Printf("ADDR %s\n", lis.Addr())
	fail(http.Serve(lis, srv.Handler()))
}

// A server killed while a command runs leaves it RUNNING in the store; the
// next server reports it UNKNOWN, replays the output that was persisted,
// and never runs it again.
func TestCrashMarksRunningUnknown(t *testing.T) {
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+dir)
	child.Stderr = os.Stderr
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child server: %v", err)
	}
	addr := strings.TrimSpace(strings.TrimPrefix(line, "ADDR "))

	ws, err := dialToken("ws://"+addr, tokenA)
	if err != nil {
		t.Fatal(err)
	}
	c := &client{t: t, ws: ws}
	marker := filepath.Join(dir, "runs")
	c.submit("doomed", `echo run >> "$MARK"; echo before-crash; echo $$ > "$MARK.pid"; exec sleep 60`,
		map[string]any{"env": map[string]any{"MARK": marker}})
	for {
		if m := c.recv(); m.Type == protocol.TypeStream {
			break
		}
	}
	st, err := store.Open(context.Background(), filepath.Join(dir, "db.sqlite3"))
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the child persisted the event (it does so in batches).
	for deadline := time.Now().Add(time.Minute); ; {
		ev, err := st.Events(context.Background(), "doomed", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(ev) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server process never persisted the command's first output")
		}
		time.Sleep(10 * time.Millisecond)
	}
	st.Close()
	syscall.Kill(-child.Process.Pid, syscall.SIGKILL)
	child.Wait()
	// The command runs in its own process group, which the crash left
	// behind; end it as an operator would.
	if pid, err := os.ReadFile(marker + ".pid"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(pid))); err == nil {
			syscall.Kill(-n, syscall.SIGKILL)
			syscall.Kill(n, syscall.SIGKILL)
		}
	}

	h := startServer(t, dir, hostExecutor(t))
	c2 := h.dial(tokenA)
	if r, _ := c2.do(protocol.ActionStatus, map[string]any{"execution_id": "doomed"}); r.str("status") != protocol.StatusUnknown {
		t.Fatalf("status after crash: %s", r.raw)
	}
	r, replayed := c2.do(protocol.ActionAttach, map[string]any{"execution_id": "doomed"})
	if r.str("status") != protocol.StatusUnknown || len(replayed) != 1 || replayed[0].str("data") != "before-crash\n" || replayed[0].num("seq") != 1 {
		t.Fatalf("attach after crash: %s, replayed %v", r.raw, replayed)
	}
	if r, _ := c2.do(protocol.ActionCancel, map[string]any{"execution_id": "doomed"}); r.str("code") != protocol.CodeNotRunning {
		t.Fatalf("cancel after crash: %s", r.raw)
	}
	time.Sleep(100 * time.Millisecond)
	if runs, _ := os.ReadFile(marker); string(runs) != "run\n" {
		t.Fatalf("command ran %q times", runs)
	}
}

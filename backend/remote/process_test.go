package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// serverProcess is a pulse-server on the host backend running as its own
// process (serverMain: this test binary, re-executed), on a database and
// a port that outlive it.
type serverProcess struct {
	t    *testing.T
	dir  string
	port string
	cmd  *exec.Cmd
}

func (p *serverProcess) start() {
	p.t.Helper()
	cmd := testenv.Command(p.t, "pulse-server")
	cmd.Env = append(cmd.Env, "HOME="+p.dir, serverDirEnv+"="+p.dir, serverPortEnv+"="+p.port)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.cmd = cmd
	testenv.Eventually(p.t, 30*time.Second, func() error {
		resp, err := http.Get("http://127.0.0.1:" + p.port + "/healthz")
		if err != nil {
			return fmt.Errorf("pulse-server did not become healthy: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("pulse-server did not become healthy: /healthz answers %s", resp.Status)
		}
		return nil
	})
}

// kill ends the server's whole process group at once, as a crash or an
// OOM kill would: nothing gets to record how executions ended.
func (p *serverProcess) kill() {
	if p.cmd == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
	p.cmd = nil
}

// TestRealServerProcess runs against a server process: a command
// runs end to end, then the process is killed while a command runs and
// restarted on the same database, and the client reports the execution as
// lost, not hung and not invented.
func TestRealServerProcess(t *testing.T) {
	// Mostly waiting on timeouts and processes: run beside the rest.
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a pulse-server process; skipped with -short")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	p := &serverProcess{t: t, dir: t.TempDir(), port: port}
	p.start()
	t.Cleanup(p.kill)
	url := fmt.Sprintf("ws://127.0.0.1:%s/", port)

	b := newBackend(t, url, WithReconnectWindow(20*time.Second))
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "Makefile"), []byte("test:\n\t@echo tests pass > result.txt\n\t@cat result.txt\n"), 0o644)
	var out buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Args: []string{"make", "test"}, Network: allowAll, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if _, lerr := exec.LookPath("make"); lerr == nil {
		if res.ExitCode != 0 || out.String() != "tests pass\n" || len(res.Overlay.Files) != 1 || res.Overlay.Files[0].Path != "result.txt" {
			t.Errorf("make test: exit %d, stdout %q, overlay %+v", res.ExitCode, out.String(), res.Overlay)
		}
	}

	var out2 buffer
	started := out2.when("started")
	done := make(chan error, 1)
	go func() {
		_, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Shell: "echo started; sleep 3", Network: allowAll, Stdout: &out2})
		done <- err
	}()
	awaitStart(t, started, done)
	p.kill()
	p.start()
	err = testenv.Recv(t, done, endWithin, "Exec's return")
	if !errors.Is(err, ErrExecutionLost) || !strings.Contains(err.Error(), "UNKNOWN") {
		t.Fatalf("after a killed and restarted server: %v; want ErrExecutionLost (UNKNOWN)", err)
	}
}

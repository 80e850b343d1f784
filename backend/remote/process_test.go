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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

var (
	serverOnce sync.Once
	serverBin  string
	serverErr  error
)

// buildServer builds the real pulse-server command once per test binary.
func buildServer(t *testing.T) string {
	t.Helper()
	serverOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			serverErr = err
			return
		}
		dir, err := os.MkdirTemp("", "pulse-server-bin")
		if err != nil {
			serverErr = err
			return
		}
		serverBin = filepath.Join(dir, "pulse-server")
		if out, err := exec.Command(goBin, "build", "-o", serverBin, "github.com/pulse-agent/pulse/cmd/pulse-server").CombinedOutput(); err != nil {
			serverErr = err
			serverBin = string(out)
		}
	})
	if serverErr != nil {
		t.Skipf("cannot build pulse-server: %v\n%s", serverErr, serverBin)
	}
	return serverBin
}

// serverProcess is pulse-server running as its own process, started the
// way its README says for a local try.
type serverProcess struct {
	t    *testing.T
	bin  string
	dir  string
	port string
	cmd  *exec.Cmd
}

func (p *serverProcess) start() {
	p.t.Helper()
	cmd := exec.Command(p.bin, "--development", "--backend", "host", "--unsafe-host",
		"--host", "127.0.0.1", "--port", p.port,
		"--workspace-root", filepath.Join(p.dir, "ws"), "--database", filepath.Join(p.dir, "db.sqlite3"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + p.dir, "PULSE_REMOTE_TOKEN=" + testToken}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.cmd = cmd
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://127.0.0.1:" + p.port + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("pulse-server did not become healthy: %v", err)
		}
	}
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

// TestRealServerProcess runs against the pulse-server binary: a command
// runs end to end, then the process is killed while a command runs and
// restarted on the same database, and the client reports the execution as
// lost, not hung and not invented.
func TestRealServerProcess(t *testing.T) {
	// Mostly waiting on timeouts and processes: run beside the rest.
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the pulse-server binary; skipped with -short")
	}
	bin := buildServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	p := &serverProcess{t: t, bin: bin, dir: t.TempDir(), port: port}
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
	<-started
	p.kill()
	p.start()
	err = <-done
	if !errors.Is(err, ErrExecutionLost) || !strings.Contains(err.Error(), "UNKNOWN") {
		t.Fatalf("after a killed and restarted server: %v; want ErrExecutionLost (UNKNOWN)", err)
	}
}

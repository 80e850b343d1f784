package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// TestExposeHTTPServerRemote is issue 19's done-when on the remote
// backend (remoteExposeDoneWhen) behind a pulse-server whose executor is
// the namespace backend, deny-all network.
func TestExposeHTTPServerRemote(t *testing.T) {
	if _, err := osexec.LookPath("busybox"); err != nil {
		t.Skip("busybox (httpd) not installed")
	}
	nb, err := namespace.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nb.Close() })
	testenv.MustHaveNamespace(t, nb.Probe)
	remoteExposeDoneWhen(t, nb, 8001, false)
}

// TestExposeRangeHTTPServerRemote is the same with the port in a range
// of the policy's, not listed: the range travels to pulse-server, which
// checks each dial against it.
func TestExposeRangeHTTPServerRemote(t *testing.T) {
	if _, err := osexec.LookPath("busybox"); err != nil {
		t.Skip("busybox (httpd) not installed")
	}
	nb, err := namespace.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nb.Close() })
	testenv.MustHaveNamespace(t, nb.Probe)
	remoteExposeDoneWhen(t, nb, 8003, true)
}

// TestExposeHTTPServerRemoteDocker is the same behind a pulse-server on
// the Docker backend (network none; the image has busybox).
func TestExposeHTTPServerRemoteDocker(t *testing.T) {
	db := newDockerBackend(t)
	remoteExposeDoneWhen(t, db, 8002, false)
}

// remoteExposeDoneWhen: through a real pulse-server on 127.0.0.1 whose
// executor is exec, an HTTP server started in the sandbox on port is
// reached through Expose (an unlisted port refused), every connection
// between the client and the server is cut while it runs and the client
// reconnects, its log is read from offset 0 — each byte once — Kill
// leaves nothing of it running, Watch sees the file it wrote join the
// pending stack, the files are listed and read, and a file written
// through the files API reaches the next remote command.
func remoteExposeDoneWhen(t *testing.T, exec backend.Backend, port int, byRange bool) {
	// The site directory carries a mark of this run, so the check for a
	// surviving httpd sees only this one.
	site := fmt.Sprintf("site-%d-%d", os.Getpid(), time.Now().UnixNano())
	httpd := fmt.Sprintf("httpd -f -v -p 127.0.0.1:%d -h %s", port, site)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dl := &testenv.Listener{Listener: ln}
	rb := startRemoteOn(t, dl, exec, 0, policy.DenyAllNetwork(), secrets.DenyAllSecrets())
	pol := policy.Default()
	pol.Network = &policy.NetworkPolicy{Mode: policy.NetworkDenyAll, Expose: []int{port}}
	if byRange {
		pol.Network = &policy.NetworkPolicy{Mode: policy.NetworkDenyAll, ExposeRanges: []policy.PortRange{{From: port - 1, To: port + 1}}}
	}
	sb, err := New(context.Background(), t.TempDir(), withGetenv(noEnv), WithBackend(rb), WithPolicy(pol))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })

	ctx := context.Background()
	if _, err := sb.Execute(ctx, Command{Shell: "mkdir -p " + site + " && echo hello from the sandbox > " + site + "/index.html"}); err != nil {
		t.Fatal(err)
	}
	p, err := sb.Start(ctx, Command{Shell: "echo serving; echo up > served.txt; exec busybox " + httpd,
		Limits: &policy.ResourceLimits{Timeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Output(0)
	readUntil(t, r, "serving\n")
	r.Close()
	if _, err := sb.Expose(ctx, 9000); !errors.Is(err, ErrPortNotExposed) {
		t.Fatalf("unlisted port: err = %v, want ErrPortNotExposed", err)
	}
	addr, err := sb.Expose(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	get := func() {
		t.Helper()
		if body := getOK(t, "http://"+addr+"/index.html"); body != "hello from the sandbox\n" {
			t.Errorf("body %q", body)
		}
	}
	get()
	readUntil(t, p.Output(0), "response:200")
	// Cut every connection to the server: the process runs on, and the
	// client reattaches from the last event it had.
	if n := dl.DropAll(); n == 0 {
		t.Fatal("no connection to cut")
	}
	get()
	// The second response's log line arrives over the new connection.
	var log string
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(log, "response:200") < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		log = readAvailable(t, p, p.OutputSize())
	}
	if !strings.HasPrefix(log, "serving\n") || strings.Count(log, "serving\n") != 1 || strings.Count(log, "response:200") != 2 {
		t.Errorf("log from offset 0 after reconnecting = %q, want serving once and two responses", log)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	events, err := sb.Watch(wctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	// The process's writes join the pending stack when it ends.
	timeout := time.After(20 * time.Second)
	for seen := false; !seen; {
		select {
		case ev := <-events:
			seen = ev.Path == "served.txt" && ev.Op == FileCreated
		case <-timeout:
			t.Fatal("Watch saw no served.txt created after the process ended")
		}
	}
	if left := processesMatching(t, httpd); len(left) != 0 {
		t.Errorf("httpd left running after Kill: %q", left)
	}
	if _, err := http.Get("http://" + addr + "/index.html"); err == nil {
		t.Error("the exposed address still answers with no process behind it")
	}
	ents, err := sb.List(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	if got := names(ents); !slices.Equal(got, []string{"served.txt", site + "/"}) {
		t.Errorf("List(.) = %v, want served.txt and %s/", got, site)
	}
	if got, err := sb.ReadFile(ctx, "served.txt"); err != nil || string(got) != "up\n" {
		t.Errorf("served.txt = %q, %v", got, err)
	}
	// A file written through the files API reaches the next remote
	// command with the pending stack.
	if _, err := sb.WriteFile(ctx, "note.txt", []byte("from the client\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Execute(ctx, Command{Shell: "cat note.txt served.txt"}); err != nil || res.Stdout != "from the client\nup\n" {
		t.Errorf("a remote command after WriteFile: %+v, %v", res, err)
	}
	var allowed, denied int
	for _, e := range verifyAudit(t, sb) {
		if e.Action == "expose" && e.Decision == "allow" {
			allowed++
		}
		if e.Action == "expose" && e.Decision == "deny" {
			denied++
		}
	}
	if allowed != 1 || denied != 1 {
		t.Errorf("expose events: %d allowed, %d denied; want 1, 1", allowed, denied)
	}
}

// readAvailable reads the first n bytes of p's log.
func readAvailable(t *testing.T, p *Process, n int64) string {
	t.Helper()
	r := p.Output(0)
	defer r.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// getOK GETs url until it answers 200 (the server inside the sandbox may
// not listen yet) and returns the body.
func getOK(t *testing.T, url string) string {
	t.Helper()
	var last error
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return string(body)
			}
			err = fmt.Errorf("HTTP %d, %v", resp.StatusCode, rerr)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not answer: %v", url, last)
	return ""
}

// Package egresstest measures what the egress proxy costs a command in a
// backend's sandbox: the same download, by the same client, inside the
// sandbox through the proxy and on the host straight from the server.
// The backends' benchmarks call it; everything it serves is on 127.0.0.1.
package egresstest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/internal/syncio"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// Size is what each download fetches.
const Size = 64 << 20

// BenchmarkCurlDownload runs, in each round, one script twice: on the
// host, with no proxy, and in a sandbox of be, whose only way out is the
// egress proxy (allowlist naming the two servers). The script is curl
// fetching Size bytes over plain HTTP through a CONNECT tunnel (-p: curl
// tunnels plain HTTP when a proxy is set, and ignores it without one)
// and over HTTPS (which always tunnels); curl's own clock
// (%{time_total}) times each download, so the sandbox's start is on
// neither side, while everything the download's bytes pass through
// (the bridge into the sandbox, the proxy, its checks) is on the measured
// side. The order alternates between rounds. Metrics: the medians of the
// rounds' ratios, x-vs-host-http and x-vs-host-https.
//
// c is the capability a missing curl on the host is reported against.
// The host's curl must be the sandbox's too (the namespace backend runs
// the host's programs; a Docker image should carry the same curl
// version, which the benchmark logs).
func BenchmarkCurlDownload(b *testing.B, be backend.Backend, c testenv.Capability) {
	curl := testenv.MustHaveCommand(b, c, "curl", "scripts/testenv.sh installs it")
	chunk := bytes.Repeat([]byte("pulse-egress-download\n"), 1<<20/22+1)[:1<<20]
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(Size))
		for range Size / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	plain := httptest.NewServer(h)
	defer plain.Close()
	tls := httptest.NewTLSServer(h)
	defer tls.Close()
	hostPort := func(s *httptest.Server) string { return s.Listener.Addr().String() }

	p, err := egress.New(egress.Config{Policy: policy.NetworkPolicy{Mode: policy.NetworkAllowlist,
		Allow: []string{hostPort(plain), hostPort(tls)}}})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	sock := filepath.Join(dir, "proxy.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	go p.Serve(l)
	defer p.Close()

	get := func(url string, k string) string {
		return fmt.Sprintf("curl -sS -p %s -o /dev/null -w '%%{time_total}\\n' %s || echo failed", k, url)
	}
	script := get(plain.URL+"/download", "") + "; " + get(tls.URL+"/download", "-k")
	if v, err := exec.Command(curl, "--version").Output(); err == nil {
		b.Logf("host: %s", firstLine(string(v)))
	}
	ver, err := run(be, dir, "curl --version", sock, p.ServeConn)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("sandbox: %s", firstLine(ver))

	host := func() ([]float64, error) {
		cmd := exec.Command("sh", "-c", script)
		cmd.Env = noProxy(os.Environ())
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("host: %w", err)
		}
		return times(string(out))
	}
	sandbox := func() ([]float64, error) {
		out, err := run(be, dir, script, sock, p.ServeConn)
		if err != nil {
			return nil, err
		}
		return times(out)
	}
	var httpR, httpsR []float64
	round := 0
	b.SetBytes(2 * Size)
	for b.Loop() {
		first, second := host, sandbox
		if round%2 == 1 {
			first, second = sandbox, host
		}
		a, err := first()
		if err != nil {
			b.Fatal(err)
		}
		c, err := second()
		if err != nil {
			b.Fatal(err)
		}
		if round%2 == 1 {
			a, c = c, a
		}
		round++
		httpR, httpsR = append(httpR, c[0]/a[0]), append(httpsR, c[1]/a[1])
	}
	b.ReportMetric(testenv.Median(httpR), "x-vs-host-http")
	b.ReportMetric(testenv.Median(httpsR), "x-vs-host-https")
}

// run runs script in a sandbox of be whose only way out is the proxy on
// sock (served in this process by serve, as the sandbox package sets
// it up), and returns its output.
func run(be backend.Backend, dir, script, sock string, serve func(net.Conn)) (string, error) {
	out := &syncio.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ws := filepath.Join(dir, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return "", err
	}
	req := &backend.Request{
		Workspace: ws,
		Shell:     script,
		Stdout:    out,
		Stderr:    out,
		Limits:    policy.ResourceLimits{Timeout: time.Minute},
		// The servers' addresses are allowed at the proxy; this entry
		// only makes the request allowlist (an explicit port of
		// 127.0.0.1 would also be forwarded inside, which curl does not
		// need: it uses the proxy).
		Network: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{"example.com"}},
		// As the sandbox package sets it up.
		Egress: &backend.Egress{Socket: sock, ServeConn: serve},
	}
	res, err := be.Exec(ctx, req)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("sandbox: exit %d: %s", res.ExitCode, out.String())
	}
	return out.String(), nil
}

// times parses one curl time_total (seconds) per line, two lines.
func times(out string) ([]float64, error) {
	var ts []float64
	for _, f := range strings.Fields(out) {
		t, err := strconv.ParseFloat(f, 64)
		if err != nil || t <= 0 {
			return nil, fmt.Errorf("a download failed: %q", out)
		}
		ts = append(ts, t)
	}
	if len(ts) != 2 {
		return nil, fmt.Errorf("want two download times: %q", out)
	}
	return ts, nil
}

// noProxy is env without proxy variables, so the host's curl goes
// straight to the server.
func noProxy(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return strings.HasSuffix(strings.ToLower(k), "_proxy")
	})
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

package namespace

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/egress/bypass"
	"github.com/pulse-agent/pulse/egress/egresstest"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// TestEgressBypassSuite runs every attack of the egress bypass suite in
// this backend's sandboxes: allowed destinations work through the proxy
// bridged into the empty network namespace, nothing else is reachable.
func TestEgressBypassSuite(t *testing.T) {
	b := newBackend(t)
	results, err := bypass.Run(context.Background(), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		switch {
		case r.Skipped != "" && testenv.Required(testenv.Namespace):
			// The test environment brings what the checks need
			// (scripts/testenv.sh: curl on the host and in the image).
			t.Errorf("SKIPPED %s where nothing may skip: %s", r.Name, r.Skipped)
		case r.Skipped != "":
			t.Logf("SKIP %s: %s", r.Name, r.Skipped)
		case !r.Held:
			t.Errorf("FAILED %s: %s", r.Name, r.Detail)
		default:
			t.Logf("held %s: %s", r.Name, r.Detail)
		}
	}
}

// The CA bundle reaches the command both where the variables point and
// in place of the system trust store, for tools that read only that.
func TestEgressCABundleIsTheTrustStore(t *testing.T) {
	if _, err := os.Stat("/etc/ssl/certs/ca-certificates.crt"); err != nil {
		t.Skip("no /etc/ssl/certs/ca-certificates.crt on this machine to stand in for")
	}
	b := newBackend(t)
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, "proxy.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("system roots\nsandbox-ca-marker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Stdout: &out,
		Shell:   `cat /etc/ssl/certs/ca-certificates.crt "$SSL_CERT_FILE" "$NODE_EXTRA_CA_CERTS" "$REQUESTS_CA_BUNDLE" "$GIT_SSL_CAINFO"; echo "$HTTPS_PROXY $https_proxy $ALL_PROXY"`,
		Network: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{"example.com"}},
		Egress:  &backend.Egress{Socket: l.Addr().String(), CAFile: ca}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out.String(), "sandbox-ca-marker"); res.ExitCode != 0 || got != 5 {
		t.Errorf("exit %d, the bundle seen %d times, want 5: %q", res.ExitCode, got, out.String())
	}
	if !strings.Contains(out.String(), "http://127.0.0.1:3128 http://127.0.0.1:3128 http://127.0.0.1:3128") {
		t.Errorf("proxy variables: %q", out.String())
	}
}

// BenchmarkEgressDownload64MiB: curl's 64 MiB downloads (plain HTTP
// through a CONNECT tunnel, and HTTPS) in a sandbox whose only way out is
// the egress proxy, against the same curl on the host going straight to
// the server (egresstest).
func BenchmarkEgressDownload64MiB(b *testing.B) {
	egresstest.BenchmarkCurlDownload(b, newBackend(b), testenv.Namespace)
}

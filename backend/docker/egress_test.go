package docker

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/egress/bypass"
	"github.com/pulse-agent/pulse/egress/egresstest"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// TestDockerEgressBypassSuite runs every attack of the egress bypass suite
// in this backend's containers: network=none, with the proxy bridged into
// the container's namespace on 127.0.0.1.
//
// The suite hands the proxy's ServeConn over, as the sandbox package does,
// so the bridge gives connections to the proxy in process; it runs again
// with only the proxy's socket (a proxy elsewhere, as pulse-server's
// local executor sets it up), which the bridge relays to.
func TestDockerEgressBypassSuite(t *testing.T) {
	testenv.MustHaveRoot(t, "the egress bridge enters the container's network namespace")
	b := newDocker(t)
	t.Run("in process", func(t *testing.T) { runBypassSuite(t, b) })
	t.Run("through the socket", func(t *testing.T) { runBypassSuite(t, socketOnly{b}) })
}

// socketOnly passes requests on without Egress.ServeConn.
type socketOnly struct{ backend.Backend }

func (s socketOnly) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	r := *req
	if req.Egress != nil {
		e := *req.Egress
		e.ServeConn = nil
		r.Egress = &e
	}
	return s.Backend.Exec(ctx, &r)
}

func runBypassSuite(t *testing.T, b backend.Backend) {
	results, err := bypass.Run(context.Background(), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		switch {
		case r.Skipped != "" && testenv.Required(testenv.Docker):
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

// Two sandbox CAs given to commands of one allowlist container are both in
// its trust store, beside this machine's roots, and the file holding them
// on the host goes with the container.
func TestDockerTrustStoreHoldsEachCAAndGoesWithTheContainer(t *testing.T) {
	testenv.MustHaveRoot(t, "the egress bridge enters the container's network namespace")
	roots := backend.SystemRoots()
	if len(roots) == 0 {
		t.Skip("this machine has no CA bundle, so allowlist containers get no trust store")
	}
	b, err := New()
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			b.Close()
		}
	})
	testenv.MustHaveDocker(t, b.Probe)
	ws := t.TempDir()
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, "proxy.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var cas [][]byte
	for range 2 {
		ca, err := egress.NewCA()
		if err != nil {
			t.Fatal(err)
		}
		cas = append(cas, ca.CertPEM())
	}
	var out strings.Builder
	for _, ca := range cas {
		out.Reset()
		res, err := b.Exec(context.Background(), &backend.Request{
			Workspace: ws,
			Args:      []string{"cat", "/etc/ssl/certs/ca-certificates.crt"},
			Stdout:    &out,
			Network:   policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{"127.0.0.1:1"}},
			Egress:    &backend.Egress{Socket: l.Addr().String(), CA: ca},
		})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %v %+v", err, res)
		}
	}
	got := out.String()
	for i, ca := range cas {
		if !strings.Contains(got, string(ca)) {
			t.Errorf("CA %d is not in the container's trust store", i)
		}
	}
	if !strings.Contains(got, string(roots[:min(len(roots), 2000)])) {
		t.Error("this machine's roots are not in the container's trust store")
	}
	var files []string
	b.mu.Lock()
	for _, bx := range b.boxes {
		if bx.trust != nil {
			files = append(files, bx.trust.file)
		}
	}
	b.mu.Unlock()
	if len(files) != 1 {
		t.Fatalf("%d trust store files for one container", len(files))
	}
	closed = true
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(files[0]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the trust store file outlived its container: %v", err)
	}
}

// BenchmarkDockerEgressDownload64MiB: curl's 64 MiB downloads (plain
// HTTP through a CONNECT tunnel, and HTTPS) in a container whose only way
// out is the egress proxy, against the host's curl going straight to the
// server (egresstest; the image's curl is the host's version in the test
// image, which the benchmark logs).
func BenchmarkDockerEgressDownload64MiB(b *testing.B) {
	testenv.MustHaveRoot(b, "the egress bridge enters the container's network namespace")
	egresstest.BenchmarkCurlDownload(b, newDocker(b), testenv.Docker)
}

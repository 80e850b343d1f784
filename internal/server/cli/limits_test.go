package cli

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend/remote"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
	"github.com/pulse-agent/pulse/secrets"
)

// The server's upload and output limits are flags, and a client's upload
// limit reaches the remote backend through sandbox.WithRemoteOptions.
func TestUploadAndOutputLimitsAreFlags(t *testing.T) {
	dir := t.TempDir()
	s := start(t, []string{"--development", "--backend", "host", "--unsafe-host", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3"),
		"--max-upload-bytes", "8192", "--max-unpacked-bytes", "1048576", "--max-output-bytes", "2048"},
		map[string]string{"PULSE_REMOTE_TOKEN": "dev-token"})
	t.Setenv("PULSE_REMOTE_URL", "ws://"+s.api)
	t.Setenv("PULSE_REMOTE_TOKEN", "dev-token")

	// The server runs commands unisolated, so only allow-all network and
	// secrets are enforced there; the policy says so explicitly.
	pol := policy.Default()
	pol.Defaults[policy.Network], pol.Defaults[policy.Secrets] = policy.Allow, policy.Allow
	open := func(t *testing.T, ws string, opts ...sandbox.Option) *sandbox.Sandbox {
		t.Helper()
		opts = append([]sandbox.Option{sandbox.WithBackendName("remote"), sandbox.WithPolicy(pol),
			sandbox.WithNetworkPolicy(policy.NetworkPolicy{Mode: policy.NetworkAllowAll}),
			sandbox.WithSecretPolicy(secrets.AllowAllSecrets())}, opts...)
		sb, err := sandbox.New(context.Background(), ws, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Close() })
		return sb
	}
	ctx := context.Background()

	// The output cap: each stream is cut at the server's 2048 bytes.
	res, err := open(t, t.TempDir()).Execute(ctx, sandbox.Command{Shell: "head -c 100000 /dev/zero | tr '\\0' x"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Truncated || len(res.Stdout) > 2048 {
		t.Errorf("output: truncated=%v, %d bytes; want cut at 2048", res.Truncated, len(res.Stdout))
	}

	// A workspace over the server's upload limit, which the client was
	// told it may send, is refused by the server.
	big := t.TempDir()
	data := make([]byte, 64<<10)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(big, "noise.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = open(t, big, sandbox.WithRemoteOptions(remote.WithWorkspaceLimits(1<<20, 0, 0))).Execute(ctx, sandbox.Command{Shell: "true"})
	if err == nil || !strings.Contains(err.Error(), "over the server's limits") {
		t.Errorf("upload over the server's --max-upload-bytes: %v", err)
	}
	// The client's own limit refuses it before anything is sent.
	_, err = open(t, big, sandbox.WithRemoteOptions(remote.WithWorkspaceLimits(4096, 0, 0))).Execute(ctx, sandbox.Command{Shell: "true"})
	if !errors.Is(err, remote.ErrTooLarge) {
		t.Errorf("upload over the client's limit: %v, want remote.ErrTooLarge before sending", err)
	}
}

package cli

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/backend/remote"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
)

// A path the read policy hides never reaches pulse-server (the client
// leaves it out of the upload), and nothing on the server's side brings
// it back: the command cannot read it, and what comes back does not
// delete the client's copy.
func TestRemoteCommandsDoNotSeeHiddenPaths(t *testing.T) {
	// Probed and closed: the server opens its own.
	testenv.MustHaveNamespace(t, func(ctx context.Context) error {
		b, err := namespace.New()
		if err != nil {
			return err
		}
		defer b.Close()
		return b.Probe(ctx)
	})
	dir := t.TempDir()
	s := start(t, []string{"--development", "--backend", "namespace", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3")},
		map[string]string{"PULSE_REMOTE_TOKEN": "dev-token"})

	const secret = "remote-dotenv-secret-5521"
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	for rel, data := range map[string]string{".env": "TOKEN=" + secret + "\n", "secrets/key": secret, "app.txt": "hello\n"} {
		p := filepath.Join(ws, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rb, err := remote.New(remote.WithURL("ws://"+s.api), remote.WithToken("dev-token"))
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	if err := rb.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	pol := policy.Default()
	pol.Rules = []policy.Rule{{Action: policy.Read, Target: ".env", Decision: policy.Deny},
		{Action: policy.Read, Target: "secrets/*", Decision: policy.Deny}}
	sb, err := sandbox.New(context.Background(), ws, sandbox.WithBackend(rb), sandbox.WithPolicy(pol))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if !sb.Capabilities().HidesPaths {
		t.Fatal("the remote backend does not say it hides paths")
	}
	res, err := sb.Execute(context.Background(), sandbox.Command{
		Shell: "cat .env secrets/key 2>/dev/null; ls -a . secrets 2>/dev/null; cat app.txt; rm -rf .env secrets; echo new > new.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Stdout, secret) || strings.Contains(res.Stdout, ".env") || strings.Contains(res.Stdout, "key") {
		t.Fatalf("the remote command saw a hidden path:\n%s", res.Stdout)
	}
	if !strings.Contains(res.Stdout, "hello") {
		t.Fatalf("an allowed file was not readable remotely: %q %q", res.Stdout, res.Stderr)
	}
	if !slices.Contains(res.Staged, "new.txt") {
		t.Fatalf("staged %v, want new.txt", res.Staged)
	}
	for _, p := range res.Staged {
		if p == ".env" || strings.HasPrefix(p, "secrets") {
			t.Fatalf("a hidden path came back from the server as a change: %v", res.Staged)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, ".env")); err != nil || !strings.Contains(string(b), secret) {
		t.Fatalf("the client's .env changed: %q %v", b, err)
	}
}

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// echoErrBackend fails every Exec with an error quoting the command, as
// a backend reporting what it could not start does.
type echoErrBackend struct{ ovBackend }

func (e *echoErrBackend) Exec(_ context.Context, r *backend.Request) (*backend.Result, error) {
	return nil, fmt.Errorf("%w: cannot start %q", backend.ErrUnavailable, r.Shell)
}

// scrubSecret is a value no built-in detector knows, so that only the
// configured secret can redact it.
const scrubSecret = "zq7-plain-configured-value-0042"

func secretSandbox(t *testing.T, be backend.Backend, opts ...Option) *Sandbox {
	t.Helper()
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	opts = append([]Option{WithBackend(be), WithSecrets([]secrets.Secret{{Name: "API_KEY", Value: scrubSecret}})}, opts...)
	sb, err := New(context.Background(), ws, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb
}

func TestResultCommandAndErrorsAreScrubbed(t *testing.T) {
	ctx := context.Background()
	script := "curl -H 'Authorization: " + scrubSecret + "' http://x; echo > out.txt"

	t.Run("result", func(t *testing.T) {
		be := &ovBackend{ov: &backend.Overlay{Files: []backend.File{{Path: "out.txt", Mode: 0o644, Data: []byte("x\n")}}}}
		sb := secretSandbox(t, be)
		res, err := sb.Execute(ctx, Command{Shell: script, ExecutionID: "run-" + scrubSecret})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(res.Command, scrubSecret) || !strings.Contains(res.Command, "[REDACTED:API_KEY]") {
			t.Errorf("Result.Command = %q, want the secret redacted", res.Command)
		}
		if strings.Contains(res.ExecutionID, scrubSecret) {
			t.Errorf("Result.ExecutionID = %q", res.ExecutionID)
		}
		if be.req.Shell != script {
			t.Errorf("the backend got %q: scrubbing must not change what runs", be.req.Shell)
		}
		infos, err := sb.Transactions(ctx)
		if err != nil || len(infos) != 1 {
			t.Fatalf("transactions = %v, %v", infos, err)
		}
		if strings.Contains(infos[0].Description, scrubSecret) {
			t.Errorf("transaction description = %q", infos[0].Description)
		}
	})

	t.Run("policy denial", func(t *testing.T) {
		pol := policy.Default()
		pol.Rules = []policy.Rule{{Action: policy.Shell, Target: "curl *", Decision: policy.Deny}}
		sb := secretSandbox(t, &ovBackend{}, WithPolicy(pol))
		_, err := sb.Execute(ctx, Command{Shell: script})
		if !errors.Is(err, ErrPolicyDenied) {
			t.Fatalf("err = %v, want ErrPolicyDenied", err)
		}
		if strings.Contains(err.Error(), scrubSecret) {
			t.Errorf("error leaks the secret: %v", err)
		}
	})

	t.Run("backend error", func(t *testing.T) {
		sb := secretSandbox(t, &echoErrBackend{})
		_, err := sb.Execute(ctx, Command{Shell: script})
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("err = %v, want the backend's class kept", err)
		}
		if strings.Contains(err.Error(), scrubSecret) {
			t.Errorf("error leaks the secret: %v", err)
		}
	})

	t.Run("git", func(t *testing.T) {
		pol := policy.Default()
		pol.Defaults[policy.Git] = policy.Deny
		sb := secretSandbox(t, &ovBackend{}, WithPolicy(pol))
		_, err := sb.Git().Commit(ctx, "add key "+scrubSecret)
		if !errors.Is(err, ErrPolicyDenied) || strings.Contains(err.Error(), scrubSecret) {
			t.Errorf("err = %v, want a scrubbed ErrPolicyDenied", err)
		}
	})

	t.Run("read", func(t *testing.T) {
		sb := secretSandbox(t, &ovBackend{})
		_, err := sb.ReadFile(ctx, "missing-"+scrubSecret)
		if err == nil || strings.Contains(err.Error(), scrubSecret) {
			t.Errorf("err = %v, want a scrubbed error", err)
		}
	})
}

func TestPassedOverReasonsAreScrubbed(t *testing.T) {
	env := func(k string) string {
		switch k {
		case "PULSE_REMOTE_URL":
			// Nothing listens on port 1; the reason quotes the URL.
			return "ws://127.0.0.1:1/" + scrubSecret
		case "PULSE_REMOTE_TOKEN":
			return "dev"
		}
		return ""
	}
	sb, err := New(context.Background(), t.TempDir(), withGetenv(env), WithBackendName("remote"),
		WithSecrets([]secrets.Secret{{Name: "API_KEY", Value: scrubSecret}}))
	if err == nil {
		sb.Close()
		t.Fatal("an unreachable remote was chosen")
	}
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("err = %v, want *UnavailableError", err)
	}
	if !strings.Contains(err.Error(), "remote") || strings.Contains(err.Error(), scrubSecret) {
		t.Errorf("error = %v, want the remote's reason with the secret redacted", err)
	}
}

func TestListDirIsScrubbed(t *testing.T) {
	sb := secretSandbox(t, &ovBackend{})
	writeFile(t, sb.Workspace(), "key-"+scrubSecret+".txt", "x")
	ents, err := sb.ListDir(context.Background(), ".")
	if err != nil || len(ents) != 1 {
		t.Fatalf("ListDir = %v, %v", ents, err)
	}
	if strings.Contains(ents[0].Name, scrubSecret) || strings.Contains(ents[0].Path, scrubSecret) {
		t.Errorf("entry leaks the secret: %+v", ents[0])
	}
	if _, err := sb.ListDir(context.Background(), "no-"+scrubSecret); err == nil || strings.Contains(err.Error(), scrubSecret) {
		t.Errorf("err = %v, want a scrubbed error", err)
	}
}

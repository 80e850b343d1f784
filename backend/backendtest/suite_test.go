package backendtest_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
	"github.com/pulse-agent/pulse/backend/host"
)

// brokenEnv tells the test binary, re-run as a child, which broken
// backend TestBrokenBackendHelper must put through the suite.
const brokenEnv = "PULSE_BACKENDTEST_BROKEN"

// broken wraps the host backend and breaks one promise of the contract.
type broken struct {
	*host.Backend
	how string
}

func (b *broken) Capabilities() backend.Capabilities {
	c := b.Backend.Capabilities()
	if b.how == "fake-capture" {
		c.CapturesWrites = true
	}
	return c
}

func (b *broken) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	r := *req
	switch b.how {
	case "leak-env":
		env := map[string]string{"LEAKED": "1"}
		for k, v := range r.Env {
			env[k] = v
		}
		r.Env = env
	case "ignore-dir":
		r.Dir = ""
	case "merge-streams":
		r.Stderr = r.Stdout
	case "keep-stdin-open":
		if r.Stdin != nil {
			r.Stdin = io.MultiReader(r.Stdin) // hides Close from the backend
		}
	}
	res, err := b.Backend.Exec(ctx, &r)
	if err == nil && b.how == "lie-timeout" && res.Termination == backend.Timeout {
		res.Termination, res.TimedOut = backend.Exited, false
	}
	return res, err
}

func factory(how string) backendtest.Factory {
	return func(t *testing.T) backend.Backend {
		h, err := host.New()
		if err != nil {
			t.Fatal(err)
		}
		if how == "" {
			return h
		}
		return &broken{Backend: h, how: how}
	}
}

// TestBrokenBackendHelper is not a test of its own: the child process of
// TestSuiteCatchesBrokenBackends runs it to put one broken backend through
// the suite, where it must fail.
func TestBrokenBackendHelper(t *testing.T) {
	how, ok := os.LookupEnv(brokenEnv)
	if !ok {
		t.Skip("helper process for TestSuiteCatchesBrokenBackends; runs only as its child")
	}
	backendtest.Run(t, factory(how))
}

// TestSuiteCatchesBrokenBackends proves the suite can fail: each broken
// variant of a backend that passes must fail the case that checks the
// promise it breaks, and the intact backend must pass that same case.
func TestSuiteCatchesBrokenBackends(t *testing.T) {
	if _, ok := os.LookupEnv(brokenEnv); ok {
		t.Skip("running as the helper child")
	}
	breaks := []struct{ how, kase string }{
		{"leak-env", "Env"},
		{"ignore-dir", "Cwd"},
		{"merge-streams", "StdoutStderrSplit"},
		{"fake-capture", "Writes"},
		{"lie-timeout", "TimeoutKillsGroup"},
		{"keep-stdin-open", "StdinRoundTrip"},
	}
	var kases []string
	for _, c := range breaks {
		kases = append(kases, c.kase)
	}
	t.Run("intact", func(t *testing.T) {
		t.Parallel()
		out, err := child(t, "", strings.Join(kases, "|"))
		for _, k := range kases {
			if err != nil || !strings.Contains(out, "--- PASS: TestBrokenBackendHelper/"+k) {
				t.Errorf("the intact backend did not pass %s (%v):\n%s", k, err, out)
			}
		}
	})
	for _, c := range breaks {
		t.Run(c.how, func(t *testing.T) {
			t.Parallel()
			if out, err := child(t, c.how, c.kase); err == nil || !strings.Contains(out, "--- FAIL: TestBrokenBackendHelper/"+c.kase) {
				t.Errorf("the suite did not fail %s for a backend that breaks it (%v):\n%s", c.kase, err, out)
			}
		})
	}
}

func child(t *testing.T, how, kase string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenBackendHelper$/^("+kase+")$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), brokenEnv+"="+how)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

package relay

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

func TestNewRefusesABadConfiguration(t *testing.T) {
	for name, c := range map[string]struct {
		tokens []string
		opts   []Option
	}{
		"no tokens":         {nil, nil},
		"zero liveness":     {[]string{"t"}, []Option{WithWorkerLiveness(0)}},
		"negative liveness": {[]string{"t"}, []Option{WithWorkerLiveness(-time.Second)}},
		"zero stdin piece":  {[]string{"t"}, []Option{WithStdinPiece(0)}},
	} {
		if _, err := New(c.tokens, c.opts...); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", name, err)
		}
	}
	if _, err := New([]string{"t"}, WithStdinPiece(4096), WithWorkerLiveness(time.Second)); err != nil {
		t.Fatal(err)
	}
}

// The run script is what a worker's bash runs: it must hand every
// argument over as it is and build the environment from scratch. Run
// here with the local bash, as a worker would.
func TestRunScriptPassesArgumentsAndEnvironmentAsTheyAre(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("needs bash on PATH")
	}
	dir := t.TempDir()
	req := &backend.Request{
		Args: []string{"printf", "%s|", "A=1", "it's", "$HOME", "a b"},
		Env:  map[string]string{"ONLY": "x'y"},
	}
	out, err := exec.Command(bash, "-c", runScript(dir, req, "")).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got, want := string(out), "A=1|it's|$HOME|a b|"; got != want {
		t.Errorf("argv came out as %q, want %q", got, want)
	}
	req = &backend.Request{Shell: `printf '%s %s %s' "$ONLY" "$HOME" "${SECRET-unset}"`, Env: map[string]string{"ONLY": "x'y"}}
	t.Setenv("SECRET", "leaked")
	out, err = exec.Command(bash, "-c", runScript(dir, req, "")).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got, want := string(out), "x'y "+dir+" unset"; got != want {
		t.Errorf("environment came out as %q, want %q", got, want)
	}
}

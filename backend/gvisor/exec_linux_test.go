//go:build linux

package gvisor

import (
	"bytes"
	"context"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// TestArgs: an argv runs as given, arguments byte-exact, and a program
// that is not there is exit status 127, as a shell says it.
func TestArgs(t *testing.T) {
	b := newBackend(t)
	for _, tt := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"printf", "%s|", "a b", "$HOME", "'q'"}, 0, "a b|$HOME|'q'|"},
		{[]string{"nonexistent-program-of-the-test"}, 127, ""},
	} {
		var out bytes.Buffer
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Args: tt.args, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != tt.code || out.String() != tt.out {
			t.Errorf("%q: exit %d, stdout %q; want %d, %q", tt.args, res.ExitCode, out.String(), tt.code, tt.out)
		}
	}
}

package namespace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

func TestSandboxPathKeepsWhatTheSandboxShows(t *testing.T) {
	for _, tc := range []struct {
		host     string
		readOnly []string
		want     string
	}{
		{"", nil, basePath},
		{"/usr/local/go/bin:/root/go/bin:/usr/bin", nil, basePath + ":/usr/local/go/bin"},
		{"/opt/tools/bin:relative:/usr/../etc:/bin", []string{"/opt/tools"}, basePath + ":/opt/tools/bin"},
		{"/usrx/bin:/usr/lib/jvm/bin:/usr/lib/jvm/bin", nil, basePath + ":/usr/lib/jvm/bin"},
	} {
		if got := sandboxPath(tc.host, tc.readOnly); got != tc.want {
			t.Errorf("sandboxPath(%q, %q) = %q, want %q", tc.host, tc.readOnly, got, tc.want)
		}
	}
}

// A program installed under /usr outside the standard directories (as Go
// is, in /usr/local/go/bin) is found by name inside the sandbox when the
// caller's PATH has it.
func TestToolchainOnCallersPathIsFound(t *testing.T) {
	dir, err := os.MkdirTemp("/usr/local", "pulse-path-test-")
	if err != nil {
		t.Skipf("cannot create a directory under /usr/local (needs root): %v", err)
	}
	defer os.RemoveAll(dir)
	tool := filepath.Join(dir, "pulse-path-probe")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\necho found-it\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", os.Getenv("PATH")+":"+dir)
	nb := newBackend(t)
	res, out, _ := runCmd(t, nb, &backend.Request{Workspace: t.TempDir(), Args: []string{"pulse-path-probe"}})
	if res.ExitCode != 0 || strings.TrimSpace(out) != "found-it" {
		t.Fatalf("exit %d, output %q", res.ExitCode, out)
	}
}

//go:build linux

package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// TestEscapeProbes tries, as a command would, to reach what the sandbox
// must keep from it; each probe prints what it got, and the host checks
// it was refused.
func TestEscapeProbes(t *testing.T) {
	b := newBackend(t)
	port := hostListener(t)
	for _, tt := range []struct {
		name, script string
		bad          string // in the output, the probe got through
	}{
		{"host loopback", fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d && cat <&3", port), "host-listener"},
		{"shadow", "cat /etc/shadow; echo end", "root:"},
		{"host processes", "ls /proc | grep -c '^[0-9]' | awk '$1 > 10 {print \"many\"}'", "many"},
		{"write the root", "echo x > /usr/pulse-probe && echo wrote", "wrote"},
		{"mount", "mount -t tmpfs t /tmp 2>&1 && echo mounted", "mounted"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if _, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "/bin/bash -c '" + strings.ReplaceAll(tt.script, "'", `'\''`) + "'",
				Stdout: &out, Stderr: &out}); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out.String(), tt.bad) {
				t.Errorf("probe got through: %q", out.String())
			}
		})
	}
	if _, err := os.Stat("/usr/pulse-probe"); err == nil {
		t.Error("a command wrote the host's /usr")
	}
}

// TestCaptureDoesNotFollowReplacedSymlink: a workspace symlink to a host
// directory, replaced by the command with a directory of its own, must
// not lead the capture into the host directory: a file the command made
// there with a host file's content is its write, reported as such.
func TestCaptureDoesNotFollowReplacedSymlink(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(ws, "d")); err != nil {
		t.Fatal(err)
	}
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Shell: "rm d && mkdir d && cp /etc/hostname d/hostname"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v %+v", err, res)
	}
	want, err := os.ReadFile("/etc/hostname")
	if err != nil {
		t.Skipf("no /etc/hostname here: %v", err)
	}
	for _, f := range res.Overlay.Files {
		if f.Path == "d/hostname" {
			if !bytes.Equal(f.Data, want) {
				t.Fatalf("d/hostname = %q, want %q", f.Data, want)
			}
			return
		}
	}
	t.Fatalf("the command's d/hostname is missing from the overlay %+v", res.Overlay)
}

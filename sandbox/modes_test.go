package sandbox

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/policy"
)

// checkWriteBitsNotWidened: a command opens directories (0777, 2777) and
// files (0666) to everyone, git's refs and objects among them; what an
// auto-commit puts in the workspace is writable by group and other only
// where the workspace entry already was. Setgid on a directory stays.
func checkWriteBitsNotWidened(t *testing.T, newSB func(t *testing.T, ws string, opts ...Option) *Sandbox) {
	t.Helper()
	ws := t.TempDir()
	for _, d := range []string{".git/objects", ".git/refs/heads", "shared"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, m := range map[string]fs.FileMode{".git/objects": 0o755, ".git/refs/heads": 0o755, "shared": 0o775} {
		if err := os.Chmod(filepath.Join(ws, p), m); err != nil {
			t.Fatal(err)
		}
	}
	for p, m := range map[string]fs.FileMode{"group.txt": 0o664, "plain.txt": 0o644} {
		if err := os.WriteFile(filepath.Join(ws, p), []byte(p+"\n"), m); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(ws, p), m); err != nil {
			t.Fatal(err)
		}
	}
	sb := newSB(t, ws, WithAutoCommit())
	res, err := sb.Execute(context.Background(), Command{Shell: `umask 0
chmod 0777 .git/objects .git/refs/heads shared &&
mkdir -p newdir .git/objects/ab && chmod 2777 newdir && chmod 0777 .git/objects/ab &&
echo new > newdir/f && echo obj > .git/objects/ab/cd && echo ref > .git/refs/heads/main &&
echo open > open.txt && chmod 0666 newdir/f .git/objects/ab/cd .git/refs/heads/main open.txt group.txt plain.txt &&
echo more >> plain.txt`})
	if err != nil {
		t.Fatalf("command: %v", err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("command: exit %d, stderr %s", res.ExitCode, res.Stderr)
	}
	if res.CommitErr != nil {
		t.Fatalf("auto-commit: %v", res.CommitErr)
	}
	want := map[string]fs.FileMode{
		".git/objects":         fs.ModeDir | 0o755,
		".git/objects/ab":      fs.ModeDir | 0o755,
		".git/objects/ab/cd":   0o644,
		".git/refs/heads":      fs.ModeDir | 0o755,
		".git/refs/heads/main": 0o644,
		"shared":               fs.ModeDir | 0o775, // group write was there already; other's is not
		"newdir":               fs.ModeDir | fs.ModeSetgid | 0o755,
		"newdir/f":             0o644,
		"open.txt":             0o644,
		"group.txt":            0o664,
		"plain.txt":            0o644,
	}
	for p, m := range want {
		fi, err := os.Lstat(filepath.Join(ws, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if fi.Mode() != m {
			t.Errorf("%s: mode %v in the workspace, want %v", p, fi.Mode(), m)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, "plain.txt")); err != nil || string(b) != "plain.txt\nmore\n" {
		t.Errorf("plain.txt: %q %v", b, err)
	}
}

// TestGroupWritePolicyNamespace: a policy with group_write lets a
// command's new files and directories keep group write; other write is
// still never given.
func TestGroupWritePolicyNamespace(t *testing.T) {
	ws := t.TempDir()
	pol := policy.Default()
	pol.GroupWrite = true
	sb := newIsolated(t, ws, WithPolicy(pol), WithAutoCommit())
	res, err := sb.Execute(context.Background(), Command{Shell: `umask 0; mkdir d && chmod 0777 d && echo x > d/f && chmod 0666 d/f`})
	if err != nil || res.ExitCode != 0 || res.CommitErr != nil {
		t.Fatalf("command: %v, exit %d, commit %v, stderr %s", err, res.ExitCode, res.CommitErr, res.Stderr)
	}
	for p, m := range map[string]fs.FileMode{"d": fs.ModeDir | 0o775, "d/f": 0o664} {
		if fi, err := os.Lstat(filepath.Join(ws, p)); err != nil || fi.Mode() != m {
			t.Errorf("%s: %v %v, want %v", p, fi.Mode(), err, m)
		}
	}
}

func TestWriteBitsNotWidenedNamespace(t *testing.T) {
	checkWriteBitsNotWidened(t, newIsolated)
}

func TestWriteBitsNotWidenedDocker(t *testing.T) {
	checkWriteBitsNotWidened(t, newDocker)
}

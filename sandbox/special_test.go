package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// checkSpecialFiles: a FIFO a command makes, new or where a file was, is
// reported as not kept (not "no file changed"); the workspace keeps the
// file, and the next command sees the file and no FIFO, on a backend
// that reuses what the command ran in as on one that does not.
func checkSpecialFiles(t *testing.T, sb *Sandbox) {
	t.Helper()
	ctx := context.Background()
	ws := sb.Workspace()
	if err := os.WriteFile(filepath.Join(ws, "a"), []byte("file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(ctx, Command{Shell: "rm a && mkfifo a && mkfifo new"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("making FIFOs: %v, exit %d, stderr %s", err, res.ExitCode, res.Stderr)
	}
	var refused []string
	for _, r := range res.Refused {
		refused = append(refused, r.Path)
		if !strings.Contains(r.Reason, "named pipe") {
			t.Errorf("%s refused for %q, want it named a named pipe", r.Path, r.Reason)
		}
	}
	if slices.Sort(refused); !slices.Equal(refused, []string{"a", "new"}) {
		t.Errorf("refused %v, want [a new] (staged %v)", refused, res.Staged)
	}
	if res.Transaction != "" || len(res.Staged) != 0 {
		t.Errorf("a transaction %q staging %v for FIFOs alone", res.Transaction, res.Staged)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "a")); err != nil || string(b) != "file\n" {
		t.Errorf("the workspace's a: %q %v", b, err)
	}
	next, err := sb.Execute(ctx, Command{Shell: "test -f a && cat a; test -e new || echo no-new"})
	if err != nil || next.Stdout != "file\nno-new\n" {
		t.Errorf("the next command sees %q (%v), want the file and no FIFO", next.Stdout, err)
	}
}

func TestSpecialFilesReportedNamespace(t *testing.T) {
	checkSpecialFiles(t, newIsolated(t, t.TempDir()))
}

func TestSpecialFilesReportedDocker(t *testing.T) {
	checkSpecialFiles(t, newDocker(t, t.TempDir()))
}

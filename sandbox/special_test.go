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
// reported as not kept (not "no file changed"), and the file it removed
// to make one is staged as removed, as any removal is (and as the remote
// backend reports it); the next command sees neither the file nor a FIFO,
// on a backend that reuses what the command ran in as on one that does
// not.
// Over the wire (remote), whose overlay archive carries content only,
// the FIFOs are not listed (listed false), and the removal still is.
func checkSpecialFiles(t *testing.T, sb *Sandbox, listed bool) {
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
	if slices.Sort(refused); listed && !slices.Equal(refused, []string{"a", "new"}) || !listed && len(refused) != 0 {
		t.Errorf("refused %v, want [a new] (staged %v)", refused, res.Staged)
	}
	if res.Transaction == "" || !slices.Equal(res.Staged, []string{"a"}) {
		t.Errorf("transaction %q staging %v, want the removal of a", res.Transaction, res.Staged)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "a")); err != nil || string(b) != "file\n" {
		t.Errorf("the workspace's a before any commit: %q %v", b, err)
	}
	next, err := sb.Execute(ctx, Command{Shell: "test -e a || echo no-a; test -e new || echo no-new"})
	if err != nil || next.Stdout != "no-a\nno-new\n" {
		t.Errorf("the next command sees %q (%v), want neither a nor a FIFO", next.Stdout, err)
	}
}

func TestSpecialFilesReportedNamespace(t *testing.T) {
	checkSpecialFiles(t, newIsolated(t, t.TempDir()), true)
}

func TestSpecialFilesReportedDocker(t *testing.T) {
	checkSpecialFiles(t, newDocker(t, t.TempDir()), true)
}

// Through a real pulse-server on 127.0.0.1 whose executor is the
// namespace backend.
func TestSpecialFilesReportedRemote(t *testing.T) {
	checkSpecialFiles(t, newRemoteNamespace(t), false)
}

// A file whose name holds a newline, which the Docker backend cannot
// carry back, is listed as not staged with the reason, not left out of
// the result as though the command had not written it.
func TestDockerNewlineNameListedNotStaged(t *testing.T) {
	sb := newDocker(t, t.TempDir())
	res, err := sb.Execute(context.Background(), Command{Shell: `echo x > "$(printf 'a\nb')"; echo y > ok.txt`})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Execute: %v, exit %d, stderr %s", err, res.ExitCode, res.Stderr)
	}
	if len(res.Refused) != 1 || res.Refused[0].Path != "a\nb" || !strings.Contains(res.Refused[0].Reason, "newline") {
		t.Errorf("refused %+v, want a\\nb, for its newline", res.Refused)
	}
	if !slices.Equal(res.Staged, []string{"ok.txt"}) {
		t.Errorf("staged %v, want [ok.txt]", res.Staged)
	}
}

package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// hidingBackend is ovBackend with Capabilities.HidesPaths: it records
// what it was asked to hide.
type hidingBackend struct{ ovBackend }

func (h *hidingBackend) Capabilities() backend.Capabilities {
	c := h.ovBackend.Capabilities()
	c.HidesPaths = true
	return c
}

const hiddenSecret = "s3cr3t-value-in-dotenv-7781"

// readDenyPolicy is docs/policy.md's read-denial example and its globs.
func readDenyPolicy() *policy.Policy {
	p := policy.Default()
	p.Rules = []policy.Rule{
		{Action: policy.Read, Target: ".env.example", Decision: policy.Allow},
		{Action: policy.Read, Target: ".env*", Decision: policy.Deny},
		{Action: policy.Read, Target: "secrets/*", Decision: policy.Deny},
		{Action: policy.Read, Target: "*.pem", Decision: policy.Deny},
	}
	return p
}

func secretWorkspace(t *testing.T) string {
	t.Helper()
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	for rel, data := range map[string]string{
		".env": "TOKEN=" + hiddenSecret + "\n", ".env.local": "x", ".env.example": "TOKEN=\n",
		"secrets/a": "a", "secrets/sub/b": "b", "key.pem": "k", "deep/dir/x.pem": "x",
		"public.txt": "hello\n", "deep/dir/y.txt": "y",
	} {
		writeFile(t, ws, rel, data)
	}
	return ws
}

func TestReadDenyRulesExpandIntoHiddenPaths(t *testing.T) {
	ws := secretWorkspace(t)
	be := &hidingBackend{}
	sb, err := New(context.Background(), ws, WithBackend(be), WithPolicy(readDenyPolicy()))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"cat", ".env"}}); err != nil {
		t.Fatal(err)
	}
	// secrets/sub and everything in it are denied, so it is hidden whole;
	// secrets itself is not (the glob needs something after the slash).
	want := []string{".env", ".env.local", "deep/dir/x.pem", "key.pem", "secrets/a", "secrets/sub"}
	if !slices.Equal(be.req.Hidden, want) {
		t.Fatalf("Hidden = %q, want %q", be.req.Hidden, want)
	}

	// What exists now is what is hidden: a new secret file is hidden on
	// the next command.
	writeFile(t, ws, "new.pem", "n")
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(be.req.Hidden, "new.pem") {
		t.Fatalf("Hidden = %q, want new.pem too", be.req.Hidden)
	}
}

func TestNoReadRulesHideNothing(t *testing.T) {
	be := &hidingBackend{}
	sb, err := New(context.Background(), secretWorkspace(t), WithBackend(be))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if be.req.Hidden != nil {
		t.Fatalf("Hidden = %q under the default policy", be.req.Hidden)
	}
}

func TestReadDenyDefaultHidesEverythingButTheAllowed(t *testing.T) {
	ws := secretWorkspace(t)
	p := policy.Default()
	p.Defaults[policy.Read] = policy.Deny
	p.Rules = []policy.Rule{{Action: policy.Read, Target: "deep/dir/y.txt", Decision: policy.Allow}}
	be := &hidingBackend{}
	sb, err := New(context.Background(), ws, WithBackend(be), WithPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	want := []string{".env", ".env.example", ".env.local", "deep/dir/x.pem", "key.pem", "public.txt", "secrets"}
	if !slices.Equal(be.req.Hidden, want) {
		t.Fatalf("Hidden = %q, want %q", be.req.Hidden, want)
	}
}

// A backend that cannot hide paths would let `cat .env` print the
// secret: the command is refused, audited, and never starts.
func TestReadDenyOnABackendThatCannotHideIsRefused(t *testing.T) {
	ws := secretWorkspace(t)
	be := &ovBackend{}
	sb, err := New(context.Background(), ws, WithBackend(be), WithPolicy(readDenyPolicy()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.Execute(context.Background(), Command{Args: []string{"cat", ".env"}})
	if !errors.Is(err, ErrUnsupportedPolicy) || !strings.Contains(err.Error(), ".env") {
		t.Fatalf("err = %v, want ErrUnsupportedPolicy naming .env", err)
	}
	if be.req != nil {
		t.Fatal("the command ran on a backend that cannot hide what the policy denies")
	}
	evs := verifyAudit(t, sb)
	if !hasEvent(evs, func(e audit.Event) bool {
		return e.Decision == "deny" && e.Reason == "unsupported_policy" && strings.Contains(e.Detail, "cannot hide")
	}) {
		t.Fatal("the refusal is not audited")
	}
}

// The unsafe host cannot hide anything; its opt-in for reads accepts
// that, audited.
func TestUnsafeHostAcceptsReadDenyAudited(t *testing.T) {
	ws := secretWorkspace(t)
	sb := newHost(t, ws, WithPolicy(readDenyPolicy()), WithUnsafeHostExecution(UnsafeReads))
	if _, err := sb.Execute(context.Background(), Command{Shell: "true"}); err != nil {
		t.Fatal(err)
	}
	evs := verifyAudit(t, sb)
	if !hasEvent(evs, func(e audit.Event) bool { return e.Action == "read" && e.Reason == "UNSAFE_HOST" }) {
		t.Fatal("the accepted downgrade is not audited")
	}
}

// A command cannot delete what it was not allowed to see.
func TestHiddenPathsAreNotDeleted(t *testing.T) {
	ws := secretWorkspace(t)
	be := &hidingBackend{ovBackend{ov: &backend.Overlay{Deleted: []string{".env", "secrets/sub/b", "secrets", "public.txt"}}}}
	sb, err := New(context.Background(), ws, WithBackend(be), WithPolicy(readDenyPolicy()), WithAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(context.Background(), Command{Shell: "rm -rf .env secrets public.txt"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".env", "secrets/sub/b", "secrets/a"} {
		if _, err := os.Stat(filepath.Join(ws, p)); err != nil {
			t.Errorf("%s, hidden from the command, was deleted: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, "public.txt")); err == nil {
		t.Errorf("public.txt, which the command could see, was not deleted (committed %v)", res.Committed)
	}
	if len(res.Refused) != 3 {
		t.Fatalf("Refused = %+v, want the two hidden paths and the directory holding them", res.Refused)
	}
}

// `cat .env` on the isolating backends does not print what the read
// policy denies, a command cannot delete it, and what it writes at a
// hidden path is staged as usual.
func TestIsolatedCatOfADeniedFileDoesNotPrintIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(*testing.T, string, ...Option) *Sandbox
	}{{"namespace", newIsolated}, {"docker", newDockerSandbox}} {
		t.Run(tc.name, func(t *testing.T) {
			ws := secretWorkspace(t)
			sb := tc.open(t, ws, WithPolicy(readDenyPolicy()), WithAutoCommit())
			if !sb.Capabilities().HidesPaths {
				t.Fatalf("%s does not hide paths", tc.name)
			}
			res, err := sb.Execute(context.Background(), Command{Shell: "cat .env secrets/a key.pem deep/dir/x.pem 2>&1; cat public.txt .env.example; " +
				"rm -rf .env secrets deep; echo mine > key.pem"})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(res.Stdout, hiddenSecret) || strings.Contains(res.Stdout, "TOKEN="+hiddenSecret) {
				t.Fatalf("the command read .env: %q", res.Stdout)
			}
			if !strings.Contains(res.Stdout, "hello") || !strings.Contains(res.Stdout, "TOKEN=\n") {
				t.Fatalf("an allowed file was not readable: %q %q", res.Stdout, res.Stderr)
			}
			for _, p := range []string{".env", "secrets/a", "secrets/sub/b", "deep/dir/x.pem"} {
				if _, err := os.Stat(filepath.Join(ws, p)); err != nil {
					t.Errorf("%s, hidden from the command, was deleted: %v", p, err)
				}
			}
			if got := readFile(t, ws, "key.pem"); got != "mine\n" {
				t.Errorf("key.pem = %q: the command's own write to a hidden path was not applied (refused %v, err %v)", got, res.Refused, res.CommitErr)
			}
		})
	}
}

// A denied name spelled through a link to a directory hides the link: a
// backend hides paths, and "secrets/a" would otherwise be read as
// "real/a".
func TestALinkToADeniedTreeIsHidden(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	writeFile(t, ws, "real/a", "secret")
	writeFile(t, ws, "pub/readme", "hi")
	for link, target := range map[string]string{"secrets": "real", "docs": "pub", "conf": "."} {
		if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
			t.Fatal(err)
		}
	}
	p := policy.Default()
	p.Rules = []policy.Rule{{Action: policy.Read, Target: "secrets/*", Decision: policy.Deny},
		{Action: policy.Read, Target: "conf/secrets/*", Decision: policy.Deny}}
	be := &hidingBackend{}
	sb, err := New(context.Background(), ws, WithBackend(be), WithPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"conf", "secrets"}; !slices.Equal(be.req.Hidden, want) {
		t.Fatalf("Hidden = %q, want %q", be.req.Hidden, want)
	}
}

// A link whose denied names are hidden under their own names anyway is
// left alone, cycles included.
func TestALinkToHiddenNamesStaysVisible(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	writeFile(t, ws, "key.pem", "k")
	writeFile(t, ws, "src/main.go", "package main")
	for link, target := range map[string]string{"loop": ".", "code": "src"} {
		if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
			t.Fatal(err)
		}
	}
	p := policy.Default()
	p.Rules = []policy.Rule{{Action: policy.Read, Target: "*.pem", Decision: policy.Deny}}
	be := &hidingBackend{}
	sb, err := New(context.Background(), ws, WithBackend(be), WithPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"key.pem"}; !slices.Equal(be.req.Hidden, want) {
		t.Fatalf("Hidden = %q, want %q", be.req.Hidden, want)
	}
}

// A path a read rule denies by its full name is hidden even when it does
// not exist when the command starts: on namespace the overlay's lower
// layer is the live workspace, and a .env written there while the
// command runs (an editor, a background process) showed through. The
// command's own write there is staged as usual.
func TestAFileDeniedByNameMadeWhileACommandRunsStaysHidden(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	writeFile(t, ws, "public.txt", "hello\n")
	writeFile(t, ws, "config/app.yaml", "a: 1\n")
	p := policy.Default()
	p.Rules = []policy.Rule{
		{Action: policy.Read, Target: ".env", Decision: policy.Deny},
		{Action: policy.Read, Target: "config/key", Decision: policy.Deny},
	}
	sb := newIsolated(t, ws, WithPolicy(p))
	type out struct {
		res *Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		// Nothing is looked up before the sleep (a name looked up and
		// missing would stay missing in the overlay's cache): what the
		// workspace gains meanwhile shows through, as new.txt does.
		res, err := sb.Execute(context.Background(), Command{Shell: `sleep 3; cat new.txt .env config/key 2>/dev/null; echo end`})
		done <- out{res, err}
	}()
	time.Sleep(500 * time.Millisecond) // the command is in its sleep
	writeFile(t, ws, ".env", "TOKEN="+hiddenSecret+"\n")
	writeFile(t, ws, "config/key", hiddenSecret+"\n")
	writeFile(t, ws, "new.txt", "shows through\n")
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.res.ExitCode != 0 {
		t.Fatalf("exit %d: %q %q", o.res.ExitCode, o.res.Stdout, o.res.Stderr)
	}
	if strings.Contains(o.res.Stdout, hiddenSecret) {
		t.Fatalf("the command read a denied file made while it ran: %q", o.res.Stdout)
	}
	if o.res.Stdout != "shows through\nend\n" || len(o.res.Staged) != 0 {
		t.Fatalf("stdout %q, staged %q", o.res.Stdout, o.res.Staged)
	}
	if got := readFile(t, ws, ".env"); got != "TOKEN="+hiddenSecret+"\n" {
		t.Fatalf(".env in the workspace = %q", got)
	}

	// Its own .env is its to write: staged as usual.
	os.Remove(filepath.Join(ws, ".env"))
	res, err := sb.Execute(context.Background(), Command{Shell: "echo mine > .env"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Staged, ".env") {
		t.Fatalf("the command's own .env was not staged: staged %q refused %v", res.Staged, res.Refused)
	}
}

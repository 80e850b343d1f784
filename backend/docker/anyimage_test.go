package docker

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// buildShellOnlyImage imports an image holding nothing but the host's
// dash, its libraries and its loader, from host files: no busybox, no
// bash, no coreutils — not even cat or ls. It returns its tag.
func buildShellOnlyImage(t *testing.T, b *Backend) string {
	t.Helper()
	dash := "/usr/bin/dash"
	if _, err := os.Stat(dash); err != nil {
		// Part of the Docker test environment: required where Docker is.
		testenv.Missing(t, testenv.Docker, fmt.Sprintf("this host has no %s to build a shell-only image from: %v", dash, err))
	}
	r := newRootFS()
	if err := r.addDynamic(dash, "bin/sh"); err != nil {
		t.Fatal(err)
	}
	r.dir("tmp", 0o1777, 0)
	for _, d := range []string{"proc", "sys", "dev", "etc"} {
		r.dir(d, 0o755, 0)
	}
	tag := "pulse-shell-only-test:" + randomID()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(r.write(pw)) }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc, err := b.cli.ImageImport(ctx, image.ImportSource{Source: pr, SourceName: "-"}, tag, image.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(rc)
	rc.Close()
	if strings.Contains(string(body), "errorDetail") {
		t.Fatalf("import: %s", body)
	}
	t.Cleanup(func() {
		_, _ = b.cli.ImageRemove(context.Background(), tag, image.RemoveOptions{Force: true})
	})
	return tag
}

// TestDockerShellOnlyImage: an image with a POSIX shell and nothing else
// runs commands, captures their writes and reports their exit codes; the
// backend's own tools are injected, out of the command's PATH and not
// writable by it.
func TestDockerShellOnlyImage(t *testing.T) {
	probe := newDocker(t)
	if probe.tools == "" {
		testenv.Missing(t, testenv.Busybox, "no static busybox on this host to inject (Debian: busybox-static)")
	}
	tag := buildShellOnlyImage(t, probe)
	b := newDocker(t, WithImage(tag))
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "in.txt"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := execShell(t, b, ws, `read x < in.txt; echo "got $x"; echo made > out.txt; echo "$PATH"; test -x /bin/bash || echo no-bash; command -v cat || echo no-cat; (: > `+toolsDir+`/busybox) 2>/dev/null || echo tools-read-only; exit 3`)
	want := "got hello\n" + basePath + "\nno-bash\nno-cat\ntools-read-only\n"
	if r.stdout != want || r.res.ExitCode != 3 {
		t.Fatalf("exit %d, stdout %q (stderr %q), want exit 3 and %q", r.res.ExitCode, r.stdout, r.stderr, want)
	}
	if len(r.res.Overlay.Files) != 1 || r.res.Overlay.Files[0].Path != "out.txt" || string(r.res.Overlay.Files[0].Data) != "made\n" {
		t.Fatalf("overlay %+v", r.res.Overlay)
	}
	// A second command, pooled on the warm container, works as well.
	r = execShell(t, b, ws, `echo second`)
	if r.stdout != "second\n" || r.res.ExitCode != 0 {
		t.Fatalf("second command: exit %d, stdout %q, stderr %q", r.res.ExitCode, r.stdout, r.stderr)
	}
}

// TestDockerImageWithoutShell: with the tools injected, even an image
// with no shell at all runs a Shell command (under the injected sh).
func TestDockerImageWithoutShell(t *testing.T) {
	probe := newDocker(t)
	if probe.tools == "" {
		testenv.Missing(t, testenv.Busybox, "no static busybox on this host to inject (Debian: busybox-static)")
	}
	r := newRootFS()
	r.file("etc/motd", 0o644, []byte("no shell here\n"))
	tag := "pulse-no-shell-test:" + randomID()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(r.write(pw)) }()
	rc, err := probe.cli.ImageImport(context.Background(), image.ImportSource{Source: pr, SourceName: "-"}, tag, image.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(rc)
	rc.Close()
	t.Cleanup(func() { _, _ = probe.cli.ImageRemove(context.Background(), tag, image.RemoveOptions{Force: true}) })
	b := newDocker(t, WithImage(tag))
	res := execShell(t, b, t.TempDir(), `read m < /etc/motd; echo "$m" > seen.txt; echo ok`)
	if res.stdout != "ok\n" || len(res.res.Overlay.Files) != 1 || string(res.res.Overlay.Files[0].Data) != "no shell here\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q, overlay %+v", res.res.ExitCode, res.stdout, res.stderr, res.res.Overlay)
	}
}

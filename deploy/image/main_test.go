package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/docker/docker/client"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestWorkerImageKeepsItsTagOnlyWhereItWouldAttach builds the worker
// image twice in the real engine: on busybox alone (its tar lacks the
// relay's options), the worker's -check fails inside the image and the
// tag is never given; with GNU tar and gzip brought in, the image gets
// its tag, runs as uid 10001 with the worker as entrypoint, and holds
// two layers, the imported root and the binary's: no base was pulled.
func TestWorkerImageKeepsItsTagOnlyWhereItWouldAttach(t *testing.T) {
	if testing.Short() {
		t.Skip("builds pulse-worker and images in the Docker engine; skipped with -short")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skipf("needs a static busybox at /bin/busybox (Debian: busybox-static): %v", err)
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	testenv.MustHaveDocker(t, func(ctx context.Context) error { _, err := cli.Ping(ctx); return err })

	ctx := t.Context()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
	bin, err := buildBinary(ctx, t.TempDir(), "pulse-worker", "test")
	if err != nil {
		t.Fatal(err)
	}
	tag := "pulse-worker-image-test:" + filepath.Base(t.TempDir())
	t.Cleanup(func() { removeImage(cli, tag) })
	worker := spec{tag: tag, cmd: "pulse-worker", bash: true, check: []string{"-check"},
		env: []string{"HOME=/tmp"}, workdir: "/tmp"}

	err = buildImage(ctx, cli, worker, bin, "/bin/busybox", io.Discard)
	if !errors.Is(err, errCheck) || !strings.Contains(err.Error(), "GNU tar") {
		t.Fatalf("worker image on busybox tar: %v, want errCheck naming GNU tar", err)
	}
	if _, err := cli.ImageInspect(ctx, tag); err == nil {
		t.Fatal("an image whose worker would refuse to start got its tag")
	}

	worker.tools = []string{"tar", "gzip"}
	if err := buildImage(ctx, cli, worker, bin, "/bin/busybox", io.Discard); err != nil {
		t.Fatal(err)
	}
	insp, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	if insp.Config.User != "10001:10001" || len(insp.Config.Entrypoint) != 1 || insp.Config.Entrypoint[0] != "/usr/local/bin/pulse-worker" {
		t.Errorf("image config: user %q, entrypoint %q", insp.Config.User, insp.Config.Entrypoint)
	}
	if n := len(insp.RootFS.Layers); n != 2 {
		t.Errorf("image has %d layers, want 2 (the imported root, the binary)", n)
	}
	out, err := runIn(ctx, cli, tag, []string{"-version"})
	if err != nil || strings.TrimSpace(out) != "pulse-worker test" {
		t.Errorf("pulse-worker -version in the image: %q, %v", out, err)
	}
}

package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
)

func TestImageUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"image"},
		{"image", "push"},
		{"image", "build", "extra"},
		{"image", "build", "--no-such-flag"},
	} {
		code, _, stderr := runCLI(t, args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, exitUsage, stderr)
		}
	}
}

// TestDockerImageBuild builds an image under a throwaway tag on the real
// engine and runs a container from it.
func TestDockerImageBuild(t *testing.T) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		if os.Getenv("PULSE_REQUIRE_DOCKER") == "1" {
			t.Fatalf("PULSE_REQUIRE_DOCKER=1 but no Docker engine answers: %v", err)
		}
		t.Skipf("needs a Docker engine (run scripts/testenv.sh as root): %v", err)
	}
	tag := "pulse-image-build-test:" + time.Now().Format("150405.000000")
	tag = strings.ReplaceAll(tag, ".", "")
	args := []string{"image", "build", "--tag", tag}
	wantMake := ""
	if _, err := exec.LookPath("make"); err == nil {
		args = append(args, "--with", "make")
		wantMake = "GNU Make\n"
	}
	code, stdout, stderr := runCLI(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	defer cli.ImageRemove(context.Background(), tag, image.RemoveOptions{Force: true})
	if !strings.Contains(stdout, "built "+tag) {
		t.Fatalf("stdout %q", stdout)
	}
	created, err := cli.ContainerCreate(ctx, &container.Config{Image: tag,
		Cmd: []string{"/bin/bash", "-c", `id -un; echo "$BASH_VERSION" | cut -c1; ls -ldn /pulse | awk '{print $3}'; ! command -v make >/dev/null || make --version | head -n1 | cut -d' ' -f1,2`}}, nil, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.ContainerRemove(context.Background(), created.ID, container.RemoveOptions{Force: true})
	if err := cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	waitC, errC := cli.ContainerWait(ctx, created.ID, container.WaitConditionNotRunning)
	select {
	case w := <-waitC:
		if w.StatusCode != 0 {
			t.Errorf("container exit %d", w.StatusCode)
		}
	case err := <-errC:
		t.Fatal(err)
	}
	logs, err := cli.ContainerLogs(ctx, created.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb strings.Builder
	stdcopy.StdCopy(&out, &errb, logs)
	logs.Close()
	// The image's user is the non-root sandbox user; bash runs; /pulse
	// belongs to that user; a program asked for with --with runs.
	if out.String() != "pulse\n5\n1000\n"+wantMake {
		t.Fatalf("container printed %q (stderr %q)", out.String(), errb.String())
	}
}

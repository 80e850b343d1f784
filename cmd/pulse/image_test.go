package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/pulse-agent/pulse/internal/testenv"
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
		testenv.Missing(t, testenv.Docker, fmt.Sprintf("no Docker engine answers (run scripts/testenv.sh as root): %v", err))
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

// toolchainTag is the image TestDockerToolchainImage builds, once per
// test binary run: it copies a Go toolchain (~250 MB) and takes about
// ten seconds. The tag is this process's own, so that test binaries
// running at once on one engine neither use nor remove each other's
// image, and TestMain removes it at the end (removeToolchainImage):
// under a shared tag each run left the last run's image behind,
// untagged.
var toolchainTag = fmt.Sprintf("pulse-sandbox-toolchain:test-%d", os.Getpid())

var toolchainOnce struct {
	sync.Once
	stderr string
	code   int
	built  bool
}

// removeToolchainImage removes the image buildToolchainImage built, if
// it built one. Containers still using it keep it until they go.
func removeToolchainImage() {
	if !toolchainOnce.built {
		return
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cli.ImageRemove(ctx, toolchainTag, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil {
		fmt.Fprintf(os.Stderr, "removing the test image %s: %v\n", toolchainTag, err)
	}
}

// buildToolchainImage builds toolchainTag with git, go, python3 and make
// from this host, or skips when the host lacks one of them.
func buildToolchainImage(t *testing.T) {
	t.Helper()
	requireDockerEngine(t)
	for _, p := range []string{"git", "go", "python3", "make"} {
		if _, err := exec.LookPath(p); err != nil {
			// Part of the Docker test environment: required where Docker is.
			testenv.Missing(t, testenv.Docker, fmt.Sprintf("this host has no %s to build the toolchain image from: %v", p, err))
		}
	}
	toolchainOnce.Do(func() {
		toolchainOnce.built = true // a failed build may have tagged it all the same
		toolchainOnce.code, _, toolchainOnce.stderr = runCLI(t, "image", "build", "--tag", toolchainTag,
			"--with", "git", "--with", "go", "--with", "python3", "--with", "make")
	})
	if toolchainOnce.code != exitOK {
		t.Fatalf("pulse image build: exit %d, stderr %q", toolchainOnce.code, toolchainOnce.stderr)
	}
}

func requireDockerEngine(t *testing.T) {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		testenv.Missing(t, testenv.Docker, fmt.Sprintf("no Docker engine answers (run scripts/testenv.sh as root): %v", err))
	}
}

// TestDockerToolchainImage: `pulse image build --with git --with go
// --with python3 --with make` gives an image in which each of them runs
// through `pulse exec --image`, offline: git, a go build of a module
// (with an empty build cache: it compiles the standard library, some 15
// CPU-seconds),
// python's standard library, make. The build checked each program inside
// the image and said so on stderr.
func TestDockerToolchainImage(t *testing.T) {
	buildToolchainImage(t)
	for _, want := range []string{"GOROOT", "checked go in the image: go version", "checked python3 in the image", "checked git in the image: git version", "checked make in the image: GNU Make", "checked bash"} {
		if !strings.Contains(toolchainOnce.stderr, want) {
			t.Errorf("progress lacks %q:\n%s", want, toolchainOnce.stderr)
		}
	}
	ws := t.TempDir()
	for name, body := range map[string]string{
		"go.mod":   "module example.com/hello\n\ngo 1.22\n",
		"main.go":  "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from go\") }\n",
		"Makefile": "all:\n\t@echo made\n",
	} {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := `set -e
git --version | cut -d' ' -f1,2
go version | cut -d' ' -f1,2
go build -o /tmp/hello . && /tmp/hello
python3 -c 'import json, sys; print(json.dumps({"py": sys.version_info[0]}))'
make --version | head -n1 | cut -d' ' -f1,2
make -s`
	code, stdout, stderr := runCLI(t, "exec", "--backend", "docker", "--image", toolchainTag, "--workspace", ws, "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit %d\nstdout %q\nstderr %q", code, stdout, stderr)
	}
	want := "git version\ngo version\nhello from go\n{\"py\": 3}\nGNU Make\nmade\n"
	if !strings.HasPrefix(stdout, want) {
		t.Fatalf("stdout %q, want it to start with %q (stderr %q)", stdout, want, stderr)
	}
}

// TestImageBuildRefusesWhatItCannotBring: a missing program, a launcher
// script it cannot see through and a file that is no program are errors
// naming the program and why, before anything reaches the engine.
func TestImageBuildRefusesWhatItCannotBring(t *testing.T) {
	dir := t.TempDir()
	launcher := filepath.Join(dir, "tool")
	if err := os.WriteFile(launcher, []byte("#!/bin/sh\nexec /opt/tool/bin/tool \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.WriteFile(data, []byte("not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	for prog, want := range map[string]string{
		"no-such-program-pulse": "not found on this host",
		launcher:                "is a launcher script (#!/bin/sh)",
		data:                    "is not an ELF program",
	} {
		code, _, stderr := runCLI(t, "image", "build", "--tag", "pulse-never-built:test", "--with", prog)
		if code != exitFailure || !strings.Contains(stderr, prog) || !strings.Contains(stderr, want) {
			t.Errorf("--with %s: exit %d, stderr %q; want exit %d naming it and %q", prog, code, stderr, exitFailure, want)
		}
	}
}

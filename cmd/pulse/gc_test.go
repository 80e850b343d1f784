package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/pulse-agent/pulse/backend/docker"
)

// TestDockerGCRemovesLeftovers: `pulse gc` removes a sandbox container
// whose owning process has ended, and leaves one of a live process alone.
func TestDockerGCRemovesLeftovers(t *testing.T) {
	requireDockerEngine(t)
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	// A leftover: labelled like a sandbox container of this host whose
	// process (pid 1 started at a time it never had) is gone; and one
	// labelled as owned by this live test process.
	mk := func(pid, start string) string {
		t.Helper()
		c, err := cli.ContainerCreate(ctx, &container.Config{Image: docker.DefaultImage, Cmd: []string{"/bin/true"},
			Labels: map[string]string{docker.LabelSandbox: "gc-test", docker.LabelHost: host, docker.LabelPID: pid, docker.LabelPIDStart: start}},
			nil, nil, nil, "")
		if err != nil {
			t.Fatalf("creating a container from %s: %v", docker.DefaultImage, err)
		}
		t.Cleanup(func() { _ = cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true}) })
		return c.ID
	}
	dead := mk("1", "no-such-start-time")
	alive := mk(strconv.Itoa(os.Getpid()), selfStart(t))
	code, stdout, stderr := runCLI(t, "gc")
	if code != exitOK || !strings.Contains(stdout, "removed "+dead[:12]) || strings.Contains(stdout, alive[:12]) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want %.12s removed and %.12s kept", code, stdout, stderr, dead, alive)
	}
	if _, err := cli.ContainerInspect(ctx, dead); !cerrdefs.IsNotFound(err) {
		t.Errorf("the leftover container is still there: %v", err)
	}
	if _, err := cli.ContainerInspect(ctx, alive); err != nil {
		t.Errorf("the live process's container was removed: %v", err)
	}
}

// selfStart is this process's start time as the backend labels it (field
// 22 of /proc/self/stat).
func selfStart(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skipf("needs /proc: %v", err)
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return f[19]
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/pulse-agent/pulse/backend/docker"
)

// pulseProc is this test binary started as a separate pulse process.
func pulseProc(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	must(t, err)
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), asPulseEnv+"=1", "PULSE_DOCKER_IDLE=3m", "XDG_CACHE_HOME="+filepath.Join(t.TempDir(), "cache"))
	return cmd
}

// pulseJSON runs `pulse exec --json` in a process of its own and returns
// its result.
func pulseJSON(t *testing.T, ws string, args ...string) (stdout, tx string) {
	t.Helper()
	cmd := pulseProc(t, append([]string{"exec", "--json", "--backend", "docker", "--workspace", ws, "--"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("pulse exec %q: %v\n%s\n%s", args, err, out.String(), errb.String())
	}
	var r struct {
		Stdout      string `json:"stdout"`
		Stderr      string `json:"stderr"`
		ExitCode    int    `json:"exit_code"`
		Transaction string `json:"transaction"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.ExitCode != 0 {
		t.Fatalf("pulse exec %q: %v, %s\n%s", args, err, out.String(), errb.String())
	}
	return r.Stdout, r.Transaction
}

// warmContainers lists the warm containers of workspace ws.
func warmContainers(t *testing.T, cli *client.Client, ws string) []string {
	t.Helper()
	list, err := cli.ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", docker.LabelWarm))})
	must(t, err)
	var ids []string
	for _, c := range list {
		if strings.HasPrefix(c.Labels[docker.LabelWarm], ws+"/") {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// TestDockerWarmReuseAcrossProcesses: separate pulse processes in one
// workspace run in one container, and each command sees exactly the
// workspace plus the pending stack: the first command's pending write,
// not a write that was discarded, and a host edit. A process SIGKILLed
// while its command runs leaves a container that is never reused: what
// that command went on to write after the kill is not seen.
func TestDockerWarmReuseAcrossProcesses(t *testing.T) {
	requireDockerEngine(t)
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	must(t, err)
	defer cli.Close()
	ws := t.TempDir()
	must(t, os.WriteFile(filepath.Join(ws, "README"), []byte("hello\n"), 0o644))
	t.Cleanup(func() {
		for _, id := range warmContainers(t, cli, ws) {
			_ = cli.ContainerRemove(context.Background(), id, container.RemoveOptions{Force: true, RemoveVolumes: true})
		}
	})

	pulseJSON(t, ws, "sh", "-c", "echo one > a.txt")
	first := warmContainers(t, cli, ws)
	if len(first) != 1 {
		t.Fatalf("warm containers after the first process: %v, want one", first)
	}
	_, tx := pulseJSON(t, ws, "sh", "-c", "echo two > b.txt")
	if tx == "" {
		t.Fatal("the second command staged nothing")
	}
	if code, _, stderr := runCLI(t, "cow", "discard", "--workspace", ws, tx); code != exitOK {
		t.Fatalf("cow discard: exit %d: %s", code, stderr)
	}
	must(t, os.WriteFile(filepath.Join(ws, "host.txt"), []byte("edit\n"), 0o644))
	out, _ := pulseJSON(t, ws, "sh", "-c", "cat a.txt; cat b.txt 2>/dev/null || echo no-b; cat host.txt")
	if out != "one\nno-b\nedit\n" {
		t.Errorf("third command saw %q, want the pending a.txt, no discarded b.txt, the host edit", out)
	}
	if now := warmContainers(t, cli, ws); len(now) != 1 || now[0] != first[0] {
		t.Fatalf("warm containers %v, want the first process's %.12s reused", now, first[0])
	}

	// Killed mid-command: its command writes late.txt after the kill,
	// which its wrapper merges into the container's base.
	cmd := pulseProc(t, "exec", "--backend", "docker", "--workspace", ws, "--", "sh", "-c", "echo started; sleep 2; echo late > late.txt")
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "started\n" {
		_ = cmd.Process.Kill()
		t.Fatalf("did not start: %q %v", line, err)
	}
	must(t, cmd.Process.Kill())
	_ = cmd.Wait()
	// Wait until the abandoned command has merged late.txt, so that a
	// reused container would show it. A Reconcile elsewhere on the engine
	// (any sandbox opening on Docker: another test package running at the
	// same time, `pulse gc`) may remove the container of the dead holder
	// first, as it should: then it cannot be reused either, which the
	// checks below see.
	deadline := time.Now().Add(time.Minute)
	for {
		if merged(t, cli, first[0]) {
			break
		}
		if _, err := cli.ContainerInspect(context.Background(), first[0]); cerrdefs.IsNotFound(err) {
			t.Logf("the killed holder's container %.12s was collected before its command merged late.txt", first[0])
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed process's command never merged late.txt")
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, _ = pulseJSON(t, ws, "ls")
	if strings.Contains(out, "late.txt") || !strings.Contains(out, "a.txt") {
		t.Errorf("after a SIGKILLed holder: ls = %q, want a.txt and no late.txt", out)
	}
	if _, err := cli.ContainerInspect(context.Background(), first[0]); !cerrdefs.IsNotFound(err) {
		t.Errorf("the killed holder's container %.12s is still there (%v)", first[0], err)
	}
	if now := warmContainers(t, cli, ws); len(now) != 1 || now[0] == first[0] {
		t.Errorf("warm containers %v, want one new one", now)
	}
}

// merged says whether late.txt is in the container's base.
func merged(t *testing.T, cli *client.Client, id string) bool {
	t.Helper()
	ctx := context.Background()
	ec, err := cli.ContainerExecCreate(ctx, id, container.ExecOptions{User: "0:0",
		Env: []string{"PATH=/.pulse-tools/bin:/usr/bin:/bin"}, Cmd: []string{"sh", "-c", "test -e /work/base/late.txt"}})
	if err != nil {
		return false
	}
	if err := cli.ContainerExecStart(ctx, ec.ID, container.ExecStartOptions{}); err != nil {
		return false
	}
	for range 100 {
		insp, err := cli.ContainerExecInspect(ctx, ec.ID)
		if err != nil {
			return false
		}
		if !insp.Running {
			return insp.ExitCode == 0
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// TestDockerGCRemovesExpiredWarmContainer: `pulse gc` leaves a warm
// container released a moment ago, and removes it once its idle lifetime
// is over.
func TestDockerGCRemovesExpiredWarmContainer(t *testing.T) {
	requireDockerEngine(t)
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	must(t, err)
	defer cli.Close()
	ws := t.TempDir()
	pulseJSON(t, ws, "true")
	ids := warmContainers(t, cli, ws)
	if len(ids) != 1 {
		t.Fatalf("warm containers %v, want one", ids)
	}
	t.Cleanup(func() {
		_ = cli.ContainerRemove(context.Background(), ids[0], container.RemoveOptions{Force: true, RemoveVolumes: true})
	})
	code, stdout, stderr := runCLI(t, "gc", "--json")
	if code != exitOK || strings.Contains(stdout, ids[0]) {
		t.Fatalf("gc of a fresh warm container: exit %d, %s %s", code, stdout, stderr)
	}
	states, _ := filepath.Glob(filepath.Join(ws, ".pulse", "docker", "*", "*.json"))
	if len(states) != 1 {
		t.Fatalf("released states %v, want one", states)
	}
	data, err := os.ReadFile(states[0])
	must(t, err)
	var st map[string]any
	must(t, json.Unmarshal(data, &st))
	st["last_used"] = time.Now().Add(-time.Hour).Format(time.RFC3339Nano)
	data, _ = json.Marshal(st)
	must(t, os.WriteFile(states[0], data, 0o600))
	code, stdout, stderr = runCLI(t, "gc", "--json")
	if code != exitOK {
		t.Fatalf("gc of an expired warm container: exit %d, %s %s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, ids[0]) {
		// Any Reconcile on the engine (a Docker sandbox opening in another
		// test package at the same time) removes an expired container too,
		// and may have come first: then it is gone all the same.
		if _, err := cli.ContainerInspect(context.Background(), ids[0]); !cerrdefs.IsNotFound(err) {
			t.Fatalf("gc of an expired warm container left it (%v): %s %s", err, stdout, stderr)
		}
		t.Logf("the expired container %.12s was collected before this gc", ids[0])
	}
}

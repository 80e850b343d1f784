// Command image builds the pulse-worker and pulse-server images offline,
// from the static binaries, with no base image pulled and no registry
// contacted:
//
//	go run ./deploy/image [-worker pulse-worker:demo] [-server pulse-server:demo]
//
// Each image starts as the project's own sandbox image
// (backend/docker.BuildImage: a static busybox with its applets, for the
// worker bash, GNU tar and gzip, and the CA bundle, all from this host
// with their libraries), gets the binary
// built here with CGO_ENABLED=0 at /usr/local/bin, and is committed with
// its entrypoint, user (10001, as the manifests run it) and environment.
// Before an image keeps its tag, the binary runs in it, with no network:
// the worker's -check (the relay's exec path runs there, else the worker
// would refuse to start; whether boxes can be made, which in a plain
// container they cannot) and the server's -version. deploy/k8s/pulse.yaml names
// these tags.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/pulse-agent/pulse/backend/docker"
)

// uid is the user the images run as, as deploy/k8s runs them.
const uid = 10001

// errCheck: the binary did not pass its check in the image.
var errCheck = errors.New("image: the binary's check failed in the image")

// spec is one image to build.
type spec struct {
	tag     string
	cmd     string   // ./cmd/NAME, the binary's name too
	bash    bool     // bring bash (the worker's commands run under it)
	tools   []string // host programs put at /usr/local/bin, with their libraries
	check   []string // the binary's arguments that prove the image
	env     []string
	dirs    []string // made in the image, owned by uid
	workdir string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, progress io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	workerTag := fs.String("worker", "pulse-worker:demo", "tag of the pulse-worker image (\"\" for none)")
	serverTag := fs.String("server", "pulse-server:demo", "tag of the pulse-server image (\"\" for none)")
	busybox := fs.String("busybox", "/bin/busybox", "static busybox binary the images are built around")
	version := fs.String("version", "dev", "version the binaries report (-X main.version)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var specs []spec
	if *workerTag != "" {
		specs = append(specs, spec{
			tag: *workerTag, cmd: "pulse-worker", bash: true, check: []string{"-check"},
			// The relay's exec path packs and unpacks workspaces with
			// GNU tar's options, which BusyBox's tar lacks.
			tools:   []string{"tar", "gzip"},
			env:     []string{"SANDBOX_IMAGE=" + *workerTag, "SANDBOX_TRUST=untrusted", "HOME=/tmp"},
			workdir: "/tmp",
		})
	}
	if *serverTag != "" {
		specs = append(specs, spec{
			tag: *serverTag, cmd: "pulse-server", check: []string{"-version"},
			env: []string{"PULSE_REMOTE_HOST=0.0.0.0", "PULSE_REMOTE_PORT=8080",
				"PULSE_REMOTE_WORKSPACE_ROOT=/var/lib/pulse-server/workspaces",
				"PULSE_REMOTE_DB=/var/lib/pulse-server/executions.sqlite3",
				"PULSE_SERVER_EXECUTOR=relay", "PULSE_WORKER_LISTEN=0.0.0.0:8443", "HOME=/tmp"},
			dirs:    []string{"var/lib/pulse-server"},
			workdir: "/var/lib/pulse-server",
		})
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return fmt.Errorf("docker client: %w", err)
	}
	defer cli.Close()
	dir, err := os.MkdirTemp("", "pulse-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, s := range specs {
		bin, err := buildBinary(ctx, dir, s.cmd, *version)
		if err != nil {
			return err
		}
		if err := buildImage(ctx, cli, s, bin, *busybox, progress); err != nil {
			return fmt.Errorf("%s: %w", s.tag, err)
		}
	}
	return nil
}

// buildBinary builds ./cmd/NAME static into dir, as the images ship it.
func buildBinary(ctx context.Context, dir, name, version string) (string, error) {
	out := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+version, "-o", out, "./cmd/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/%s: %w\n%s", name, err, b)
	}
	return out, nil
}

// buildImage makes s's image from the sandbox image of BuildImage and the
// binary at bin, checks it and tags it s.tag. A failed check leaves no
// tag behind.
func buildImage(ctx context.Context, cli client.APIClient, s spec, bin, busybox string, progress io.Writer) error {
	say := func(format string, args ...any) { fmt.Fprintf(progress, s.tag+": "+format+"\n", args...) }
	base := s.tag + "-base"
	if !strings.Contains(base[strings.LastIndex(base, "/")+1:], ":") {
		base = s.tag + ":base"
	}
	bash := "-"
	if s.bash {
		bash = "/bin/bash"
	}
	if _, err := docker.BuildImage(ctx, cli, docker.ImageSpec{Tag: base, Busybox: busybox, Bash: bash, Progress: prefixed{say}}); err != nil {
		return err
	}
	defer removeImage(cli, base)

	layer, err := binaryLayer(ctx, bin, s)
	if err != nil {
		return err
	}
	c, err := cli.ContainerCreate(ctx, &container.Config{Image: base, Cmd: []string{"/bin/true"}}, nil, nil, nil, "")
	if err != nil {
		return fmt.Errorf("creating the build container: %w", err)
	}
	defer removeContainer(cli, c.ID)
	if err := cli.CopyToContainer(ctx, c.ID, "/", layer, container.CopyToContainerOptions{}); err != nil {
		return fmt.Errorf("copying %s in: %w", s.cmd, err)
	}
	candidate := base + "-candidate"
	changes := []string{
		fmt.Sprintf(`ENTRYPOINT ["/usr/local/bin/%s"]`, s.cmd),
		"CMD []",
		fmt.Sprintf("USER %d:%d", uid, uid),
		"WORKDIR " + s.workdir,
		"LABEL pulse.fleet=" + s.cmd,
	}
	for _, e := range s.env {
		changes = append(changes, "ENV "+e)
	}
	if _, err := cli.ContainerCommit(ctx, c.ID, container.CommitOptions{Reference: candidate, Changes: changes,
		Comment: s.cmd + " from its static binary, built offline"}); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	defer removeImage(cli, candidate)
	out, err := runIn(ctx, cli, candidate, s.check)
	if err != nil {
		return err
	}
	say("%s %s in the image: %s", s.cmd, strings.Join(s.check, " "), strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
	if err := cli.ImageTag(ctx, candidate, s.tag); err != nil {
		return fmt.Errorf("tagging: %w", err)
	}
	say("built")
	return nil
}

// binaryLayer is a tar of the binary and s's tools at usr/local/bin (a
// tool with the shared libraries ldd names for it, at their paths), and
// s's directories, owned by uid. The tools are not BuildImage's Programs:
// there a program whose path is also a busybox applet's (/usr/bin/tar)
// stays the applet.
func binaryLayer(ctx context.Context, bin string, s spec) (io.Reader, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	for _, d := range s.dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, Uid: uid, Gid: uid, ModTime: now}); err != nil {
			return nil, err
		}
	}
	files := map[string]string{"usr/local/bin/" + s.cmd: bin} // image path → host file
	for _, t := range s.tools {
		p, err := exec.LookPath(t)
		if err != nil {
			return nil, fmt.Errorf("%s: not on this host: %w", t, err)
		}
		files["usr/local/bin/"+t] = p
		out, err := exec.CommandContext(ctx, "ldd", p).Output()
		if err != nil {
			return nil, fmt.Errorf("ldd %s: %w", p, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			// "libacl.so.1 => /lib/x86_64-linux-gnu/libacl.so.1 (0x...)",
			// or the interpreter alone: "/lib64/ld-linux-x86-64.so.2 (0x...)".
			f := strings.Fields(l)
			for i, w := range f {
				if strings.HasPrefix(w, "/") && (i == 0 || f[i-1] == "=>") {
					files[strings.TrimPrefix(w, "/")] = w
				}
			}
		}
	}
	for name, src := range files {
		data, err := os.ReadFile(src) // follows a library's soname link
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: now}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	return &buf, tw.Close()
}

// runIn runs the image's entrypoint with args, with no network, and
// returns its output; an exit other than 0 is errCheck with the output.
func runIn(ctx context.Context, cli client.APIClient, ref string, args []string) (string, error) {
	c, err := cli.ContainerCreate(ctx, &container.Config{Image: ref, Cmd: args, NetworkDisabled: true},
		&container.HostConfig{NetworkMode: "none", CapDrop: []string{"ALL"}, SecurityOpt: []string{"no-new-privileges"}}, nil, nil, "")
	if err != nil {
		return "", fmt.Errorf("creating the check container: %w", err)
	}
	defer removeContainer(cli, c.ID)
	if err := cli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
		return "", fmt.Errorf("starting the check container: %w", err)
	}
	var code int64
	waitC, errC := cli.ContainerWait(ctx, c.ID, container.WaitConditionNotRunning)
	select {
	case w := <-waitC:
		code = w.StatusCode
	case err := <-errC:
		return "", fmt.Errorf("waiting for the check container: %w", err)
	}
	logs, err := cli.ContainerLogs(ctx, c.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		return "", fmt.Errorf("reading the check's output: %w", err)
	}
	defer logs.Close()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, logs); err != nil {
		return "", fmt.Errorf("reading the check's output: %w", err)
	}
	if code != 0 {
		return out.String(), fmt.Errorf("%w: %s exited %d: %s", errCheck, strings.Join(args, " "), code, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

func removeContainer(cli client.APIClient, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
}

func removeImage(cli client.APIClient, ref string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = cli.ImageRemove(ctx, ref, image.RemoveOptions{})
}

// prefixed turns BuildImage's progress lines into say's.
type prefixed struct{ say func(string, ...any) }

func (p prefixed) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		p.say("%s", l)
	}
	return len(b), nil
}

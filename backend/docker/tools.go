package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/pulse-agent/pulse/backend/internal/rtprog"
	"github.com/pulse-agent/pulse/internal/boxrt"
)

// The in-container side of the backend is the in-box runtime (runtime.go),
// which is always injected here, and the programs it and the small
// scripts left (the pooled exec loop, the kill and sync scripts) run:
// tar, cp, xargs, rm, kill, env, usleep. So that any image works — one without bash,
// busybox or coreutils, one whose tools take other flags, one with no
// shell at all — the backend brings those tools itself: a static busybox
// from this host, injected into each container at toolsDir before it
// starts, with a link per applet in toolsDir/bin. The backend's own
// scripts run under it with toolsDir/bin first on their PATH; the command
// runs with the image's PATH and programs only (env -i), so the image's
// tools, not ours, are what it sees, and a Shell command runs under the
// image's bash or sh, falling back to ours only when the image has
// neither.
//
// The tools are owned by root and not writable by the sandbox user, so a
// command cannot change what later commands' wrappers run. They live in
// an anonymous volume, removed with the container: the root filesystem
// is read-only, and a tmpfs volume would lose what was copied before the
// container starts.
//
// A host without a static busybox (WithTools("-"), or none found) injects
// no busybox: the backend then runs the image's own /bin/sh and tools,
// which the image pulse image build makes has. The runtime, which starts
// each command with an empty capability bounding set, is injected there
// either way.
const toolsDir = "/.pulse-tools"

// toolsCandidates are where a static busybox is looked for on the host.
var toolsCandidates = []string{"/bin/busybox", "/usr/bin/busybox"}

// WithTools sets the static busybox binary on the host that is injected
// into every container to run the backend's own scripts (see toolsDir);
// "-" injects nothing and relies on the image's tools. By default the
// first static busybox of /bin/busybox and /usr/bin/busybox is used, or
// none.
func WithTools(busybox string) Option {
	return func(o *options) error {
		if busybox == "" {
			return fmt.Errorf("docker: WithTools: empty path (\"-\" for none)")
		}
		if busybox != "-" {
			if interp, ok := elfInterp(busybox); !ok || interp != "" {
				return fmt.Errorf("docker: WithTools: %s is not a static ELF program", busybox)
			}
		}
		o.tools = busybox
		return nil
	}
}

// findTools is the static busybox to inject, "" for none.
func findTools(choice string) string {
	if choice == "-" {
		return ""
	}
	if choice != "" {
		return choice
	}
	for _, p := range toolsCandidates {
		if interp, ok := elfInterp(p); ok && interp == "" {
			return p
		}
	}
	return ""
}

// toolsTar is the tar injected at toolsDir: busybox and its applet links,
// all root's and read-only. It is made once per busybox.
type toolsArchive struct {
	once sync.Once
	data []byte
	err  error
}

var toolsArchives sync.Map // busybox path, NUL, runtime choice → *toolsArchive

func toolsTar(busybox, runtimeChoice string) ([]byte, error) {
	v, _ := toolsArchives.LoadOrStore(busybox+"\x00"+runtimeChoice, &toolsArchive{})
	ta := v.(*toolsArchive)
	ta.once.Do(func() { ta.data, ta.err = makeToolsTar(busybox, runtimeChoice) })
	return ta.data, ta.err
}

func makeToolsTar(busybox, runtimeChoice string) ([]byte, error) {
	rt, err := rtprog.Bytes(runtimeChoice)
	if err != nil {
		return nil, err
	}
	var bin, out []byte
	if busybox != "" {
		var err error
		if bin, err = os.ReadFile(busybox); err != nil {
			return nil, fmt.Errorf("reading %s: %w", busybox, err)
		}
		if out, err = exec.Command(busybox, "--list").Output(); err != nil {
			return nil, fmt.Errorf("listing the applets of %s: %w", busybox, err)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Unix(0, 0)
	put := func(h *tar.Header, data []byte) error {
		h.ModTime, h.Format, h.Uid, h.Gid = now, tar.FormatPAX, 0, 0
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := put(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}, nil); err != nil {
		return nil, err
	}
	if err := put(&tar.Header{Name: boxrt.Name, Typeflag: tar.TypeReg, Mode: 0o555, Size: int64(len(rt))}, rt); err != nil {
		return nil, err
	}
	if busybox == "" {
		if err := tw.Close(); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	}
	if err := put(&tar.Header{Name: "busybox", Typeflag: tar.TypeReg, Mode: 0o555, Size: int64(len(bin))}, bin); err != nil {
		return nil, err
	}
	if err := put(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil); err != nil {
		return nil, err
	}
	for _, a := range strings.Fields(string(out)) {
		if strings.ContainsAny(a, "/.") || a == "busybox" {
			continue
		}
		if err := put(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "../busybox", Mode: 0o777}, nil); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// toolsMount is the volume the tools are injected into: the runtime
// program is, always.
func (b *Backend) toolsMounts() []mount.Mount {
	return []mount.Mount{{Type: mount.TypeVolume, Target: toolsDir}}
}

// injectTools copies the tools into the created, not yet started,
// container id.
func (b *Backend) injectTools(ctx context.Context, id string) error {
	data, err := toolsTar(b.tools, b.o.runtime)
	if err != nil {
		return fmt.Errorf("docker: the tools to inject: %w", err)
	}
	if err := b.cli.CopyToContainer(ctx, id, toolsDir, bytes.NewReader(data), container.CopyToContainerOptions{}); err != nil {
		return fmt.Errorf("docker: injecting the tools into the container: %w", err)
	}
	return nil
}

// shell is the in-container shell the backend's scripts run under.
func (b *Backend) shell() string {
	if b.tools == "" {
		return "/bin/sh"
	}
	return toolsDir + "/bin/sh"
}

// scriptEnv is the environment of the backend's own scripts (not of the
// command, which env -i gives its own).
func (b *Backend) scriptEnv() []string {
	if b.tools == "" {
		return []string{"PATH=" + basePath}
	}
	return []string{"PATH=" + toolsDir + "/bin:" + basePath}
}

// idleCmd is the container's main process: it only keeps it running.
func (b *Backend) idleCmd() []string {
	if b.tools == "" {
		return []string{"/bin/sleep", "2147483647"}
	}
	return []string{toolsDir + "/busybox", "sleep", "2147483647"}
}

// shellDispatch is the argv that runs a Shell command: under the image's
// bash, as the backend contract says, else the image's sh, else (an
// image with no shell) under sh, the shell the backend's scripts run
// under.
func shellDispatch(sh, script string) []string {
	fallback := ""
	if sh != "/bin/sh" {
		fallback = `if [ ! -x /bin/sh ]; then exec ` + sh + ` -c "$1"; fi; `
	}
	return []string{sh, "-c", `if [ -x /bin/bash ]; then exec /bin/bash -c "$1"; fi; ` + fallback + `exec /bin/sh -c "$1"`, "sh", script}
}

package docker

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/fsmode"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// box is one warm container: created on first use, reused by every later
// command on the same workspace and network mode.
type box struct {
	ready chan struct{} // closed when id or err is set
	id    string
	err   error

	mu       sync.Mutex
	idle     []*worker // pooled execs waiting for a command
	chanBusy bool      // a command runs on the channel

	channel string // the host directory of the request channel (channel.go), "" for none

	sync syncState // what the container's base holds (sync.go)

	trust *trustStore // allowlist containers' trust store (egress.go)

	key      boxKey
	slot     *warmSlot // held while a warm container is this process's (warm.go)
	started  string    // the container's State.StartedAt, for a warm one
	poisoned bool      // guarded by sync.mu: what base holds is unknowable; never reuse
	retired  bool      // guarded by sync.mu: its container was removed
}

// box returns the warm container for key, creating it the first time.
// Concurrent first callers wait for one creation.
func (b *Backend) box(ctx context.Context, key boxKey) (*box, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, backend.ErrClosed
	}
	bx, ok := b.boxes[key]
	if !ok {
		bx = &box{ready: make(chan struct{}), key: key}
		b.boxes[key] = bx
		b.mu.Unlock()
		bx.id, bx.err = b.open(ctx, key, bx)
		if bx.err != nil {
			b.mu.Lock()
			if b.boxes[key] == bx {
				delete(b.boxes, key) // let a later call try again
			}
			b.mu.Unlock()
		}
		close(bx.ready)
	} else {
		b.mu.Unlock()
	}
	select {
	case <-bx.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return bx, bx.err
}

// open readies bx's container: without reuse a new one; with it the
// released container of a free slot, or a new one in that slot, or, when
// every slot is held, a new one of this process's only.
func (b *Backend) open(ctx context.Context, key boxKey, bx *box) (string, error) {
	// An allowlist container's trust store is a file of this process's
	// (egress.go), bound in when it is made: such containers are not
	// handed on.
	if b.o.reuseIdle == 0 || key.network == policy.NetworkAllowlist {
		return b.create(ctx, key, bx, nil)
	}
	s, st, err := b.acquireWarm(ctx, key)
	if err != nil {
		return "", err
	}
	if s == nil {
		return b.create(ctx, key, bx, nil)
	}
	bx.slot = s
	if st != nil {
		bx.sync.model, bx.started = st.Model, st.Started
		if st.Model != nil {
			bx.sync.saved = st.ModelID
		}
		if b.chanUsable() {
			bx.channel = chanDir(s) // the warm key says it has one
		}
		b.log.Debug("reusing warm sandbox container", "container", st.Container, "slot", s.path)
		return st.Container, nil
	}
	id, err := b.create(ctx, key, bx, s)
	if err != nil {
		bx.slot = nil
		s.release()
	}
	return id, err
}

// wrapperCaps are what the wrapper, root in the container, needs to give
// each command a working copy owned by the command's own uid and to drop
// to that uid, and SETPCAP to empty the command's bounding set (the
// runtime's cmd step, internal/boxrt drop_linux.go); the command itself
// keeps none of them, in any set.
var wrapperCaps = []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "SETPCAP"}

// tmpfsBytes is the size of the container's /tmp (a variable so that a
// test can fill it without filling the machine's memory).
var tmpfsBytes int64 = 512 << 20

// defaultScratch is the most the scratch tmpfs gets by default.
const defaultScratch = 2 << 30

// scratchBytes is the size of the container's scratch tmpfs (/work): the
// workspace's baseline, the commands' working copies and all they write
// there, which the kernel holds to it as they write (ENOSPC, an error the
// command sees and the report names: the runtime's exec step, disk). Files on a tmpfs
// are memory charged to the container, so the size must be reached
// before the container's memory limit, where the OOM killer would end
// the wrapper and lose all the command wrote. asked: it is the policy's
// limits.disk_bytes (WithContainerLimits), else WithScratchSize, and the
// container's memory limit is limits.memory_bytes plus it. Else it is
// half the memory limit, at most defaultScratch, within that limit: a
// container nobody gave a disk bound holds no more memory than before.
func (b *Backend) scratchBytes() (n int64, asked bool) {
	if d := b.o.limits.DiskBytes; d > 0 {
		return d, true
	}
	if b.o.scratchSize > 0 {
		return b.o.scratchSize, true
	}
	n = int64(defaultScratch)
	if m := b.o.limits.MemoryBytes; m > 0 {
		n = min(n, m/2)
	}
	return n, false
}

// create makes, starts and seeds a container for key; with a slot, a warm
// one that outlives this process (warm.go).
func (b *Backend) create(ctx context.Context, key boxKey, bx *box, slot *warmSlot) (string, error) {
	netMode := container.NetworkMode("none")
	if key.network == policy.NetworkAllowAll {
		netMode = "bridge"
	}
	l := b.o.limits
	scratch, asked := b.scratchBytes()
	res := container.Resources{Memory: l.MemoryBytes, NanoCPUs: int64(l.CPUs * 1e9)}
	if l.MemoryBytes > 0 {
		if asked {
			// A scratch size asked for is memory on top of the
			// processes' (scratchBytes).
			res.Memory += scratch
		}
		res.MemorySwap = res.Memory // no swap on top of the memory limit
	}
	if l.Pids > 0 {
		p := l.Pids
		res.PidsLimit = &p
	}
	if key.network == policy.NetworkAllowlist {
		t, err := newTrustStore() // egress.go
		if err != nil {
			return "", err
		}
		bx.trust = t
	}
	yes := true
	labels, idleCmd := b.labels, b.idleCmd() // tools.go
	var chanMounts []mount.Mount
	if slot != nil {
		labels, idleCmd = b.warmLabels(slot), b.warmIdleCmd()
		if b.chanUsable() {
			m, err := makeChan(slot) // channel.go
			if err != nil {
				return "", fmt.Errorf("docker: the warm container's request channel: %w", err)
			}
			chanMounts = append(chanMounts, m)
			idleCmd = b.chanIdleCmd()
			bx.channel = chanDir(slot)
		}
	}
	cfg := &container.Config{
		Image: b.o.image,
		// root, so that the wrapper's exec (User 0) holds the few
		// capabilities below: it copies each command's working copy to a
		// uid of the command's own and drops to it (internal/boxrt, exec_linux.go). Every
		// command runs under such a uid with no capabilities; the sleep
		// that keeps the container up is no command's.
		User:            "0:0",
		Cmd:             idleCmd,
		Env:             b.scriptEnv(),
		WorkingDir:      "/pulse",
		Labels:          labels,
		NetworkDisabled: key.network != policy.NetworkAllowAll,
	}
	hc := &container.HostConfig{
		NetworkMode:    netMode,
		CapDrop:        []string{"ALL"},
		CapAdd:         wrapperCaps,
		SecurityOpt:    []string{"no-new-privileges", "seccomp=" + seccompJSON()},
		ReadonlyRootfs: true,
		// exec: the engine mounts a tmpfs noexec unless told otherwise,
		// and noexec is no boundary here (any interpreter reads a script),
		// only a broken ./script.sh.
		Tmpfs: map[string]string{
			"/tmp": fmt.Sprintf("rw,exec,nosuid,nodev,size=%d", tmpfsBytes),
			// The commands' working copies: tmpfs, because creating and
			// copying files on the engine's disk costs milliseconds each.
			// 0711: a command reaches its own copy below, lists nothing.
			"/work": fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,uid=%d,gid=%d,mode=0711", scratch, sandboxUID, sandboxGID),
		},
		// An anonymous volume where the workspace is copied in: a valid
		// CopyToContainer target although the root filesystem is
		// read-only, removed with the container. It is a tmpfs of the
		// scratch size rather than a directory on the engine's disk, where
		// a command could write without bound.
		Mounts: append([]mount.Mount{{
			Type:   mount.TypeVolume,
			Target: "/pulse",
			VolumeOptions: &mount.VolumeOptions{DriverConfig: &mount.Driver{Name: "local", Options: map[string]string{
				"type":   "tmpfs",
				"device": "tmpfs",
				"o":      fmt.Sprintf("size=%d,uid=%d,gid=%d,mode=0755,nosuid,nodev", scratch, sandboxUID, sandboxGID),
			}}},
		}}, append(append(append(b.toolsMounts(), cacheMounts(key.caches)...), bx.trust.mounts()...), chanMounts...)...),
		Init:      &yes,
		Resources: res,
		// A warm container ends itself when idle; the engine then
		// removes it with its volumes.
		AutoRemove: slot != nil,
	}
	created, err := b.cli.ContainerCreate(ctx, cfg, hc, nil, nil, "")
	if err != nil {
		bx.trust.remove()
		return "", fmt.Errorf("docker: creating container from %s: %v: %w", b.o.image, err, backend.ErrUnavailable)
	}
	id := created.ID
	fail := func(err error) (string, error) {
		rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = b.remove(rctx, id)
		bx.trust.remove()
		return "", err
	}
	if err := b.injectTools(ctx, id); err != nil {
		return fail(fmt.Errorf("%v: %w", err, backend.ErrUnavailable))
	}
	if err := b.cli.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		return fail(fmt.Errorf("docker: starting container: %v: %w", err, backend.ErrUnavailable))
	}
	if slot != nil {
		// A later holder checks the container was not restarted, which
		// would have emptied its tmpfs.
		insp, err := b.cli.ContainerInspect(ctx, id)
		if err != nil || insp.State == nil {
			return fail(fmt.Errorf("docker: inspecting the new container: %v: %w", err, backend.ErrUnavailable))
		}
		bx.started = insp.State.StartedAt
	}
	pr, pw := io.Pipe()
	var hidden map[string]bool
	if key.hidden != "" {
		hidden = map[string]bool{}
		for _, h := range strings.Split(key.hidden, "\x00") {
			hidden[h] = true
		}
	}
	bx.sync.model = map[string]string{}
	go func() { pw.CloseWithError(writeWorkspaceTar(pw, key.workspace, hidden, bx.sync.model)) }()
	err = b.cli.CopyToContainer(ctx, id, "/pulse", pr, container.CopyToContainerOptions{})
	pr.CloseWithError(errors.New("copy ended"))
	if err != nil {
		return fail(fmt.Errorf("docker: copying workspace %s into the container: %w", key.workspace, err))
	}
	b.log.Debug("sandbox container ready", "container", id, "workspace", key.workspace, "network", string(netMode))
	return id, nil
}

// basePath is PATH for commands in the container.
const basePath = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"

// writeWorkspaceTar writes the workspace as seed/..., owned by the
// sandbox user, so the engine creates it with that owner. .pulse/ is left
// out, and so is every hidden path (a hidden directory with all below
// it): what is never copied in cannot be read in the container. So is
// every name holding a newline, with all below it (unlisted). So are
// sockets, devices and fifos, which cannot be meaningfully copied.
// model, when not nil, gets the signature of every entry written
// (sync.go).
func writeWorkspaceTar(w io.Writer, ws string, hidden map[string]bool, model map[string]string) error {
	root, err := os.OpenRoot(ws)
	if err != nil {
		return err
	}
	defer root.Close()
	tw := tar.NewWriter(w)
	now := time.Now()
	hdr := func(name string, typ byte, mode int64) *tar.Header {
		return &tar.Header{Name: name, Typeflag: typ, Mode: mode, Uid: sandboxUID, Gid: sandboxGID, ModTime: now, Format: tar.FormatPAX}
	}
	// The workspace root itself is the seed directory, with its mode
	// and time; WalkWorkspace visits only what is beneath it.
	top, err := os.Lstat(ws)
	if err != nil {
		return fmt.Errorf("reading workspace: %w", err)
	}
	add := func(rel, p string, d fs.DirEntry) error {
		if hidden[rel] || unlisted(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		name := "seed"
		if rel != "." {
			name = "seed/" + rel
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		perm := int64(fsmode.ToUnix(info.Mode()))
		switch {
		case d.IsDir():
			h := hdr(name+"/", tar.TypeDir, perm)
			h.ModTime = info.ModTime()
			if model != nil && rel != "." {
				model[rel] = wsSig(info, "", now)
			}
			return tw.WriteHeader(h)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h := hdr(name, tar.TypeSymlink, 0o777)
			h.Linkname = target
			h.ModTime = info.ModTime()
			if model != nil {
				model[rel] = wsSig(info, target, now)
			}
			return tw.WriteHeader(h)
		case d.Type().IsRegular():
			f, err := root.Open(rel)
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			if !st.Mode().IsRegular() {
				return fmt.Errorf("%s changed type while being copied", rel)
			}
			h := hdr(name, tar.TypeReg, perm)
			h.Size = st.Size()
			h.ModTime = st.ModTime()
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			n, err := io.Copy(tw, io.LimitReader(f, st.Size()))
			if err != nil {
				return err
			}
			if n != st.Size() {
				return fmt.Errorf("%s shrank while being copied", rel)
			}
			if model != nil {
				model[rel] = wsSig(st, "", now)
			}
			return nil
		default:
			return nil
		}
	}
	if err := add(".", ws, fs.FileInfoToDirEntry(top)); err != nil {
		return fmt.Errorf("reading workspace: %w", err)
	}
	err = pathguard.WalkWorkspace(ws, func(rel, p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return add(rel, p, d)
	})
	if err != nil {
		return fmt.Errorf("reading workspace: %w", err)
	}
	return tw.Close()
}

package docker

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/docker/docker/api/types/mount"
	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/internal/cacheshare"
)

// cacheView is where the command sees the workspace: a cache there, or
// above it, would mix unreviewed writes into the captured ones.
const cacheView = "/work"

// commandGID is the group every command runs under (the runtime's exec step sets it
// with the command's own uid). Commands of one container, and of every
// container mounting the same cache, have different uids, so a cache is
// shared through this group (the model of package cacheshare, which the
// namespace backend's commands share through their owner's entry). It
// opens nothing else: the kernel lets a process signal, trace or read the
// memory of another only when their uids match, and working copies are
// their uid's, mode 0700.
const commandGID = cacheshare.GID

// checkCaches validates req.Caches and gives each host directory the
// caches' ownership model (cacheshare). Mounts are fixed when a container is
// created, so the caches are part of the box key: a request with another
// cache list gets a container of its own.
func checkCaches(req *backend.Request) (string, error) {
	if len(req.Caches) == 0 {
		return "", nil
	}
	if err := backend.CheckCaches(req.Caches, cacheView); err != nil {
		return "", fmt.Errorf("docker: %w", err)
	}
	ws, _ := filepath.EvalSymlinks(req.Workspace)
	parts := make([]string, 0, len(req.Caches))
	for _, c := range req.Caches {
		src, err := filepath.EvalSymlinks(c.HostDir)
		if err != nil {
			return "", fmt.Errorf("docker: cache %s: %v: %w", c.Name, err, backend.ErrInvalidRequest)
		}
		if ws != "" && (within(src, ws) || within(ws, src)) {
			return "", fmt.Errorf("docker: cache %s: host directory %s overlaps the workspace: %w", c.Name, src, backend.ErrInvalidRequest)
		}
		if strings.ContainsAny(src, ",\x00") {
			return "", fmt.Errorf("docker: cache %s: host directory %q cannot be bind-mounted: %w", c.Name, src, backend.ErrInvalidRequest)
		}
		if err := cacheshare.Share(src); err != nil {
			return "", fmt.Errorf("docker: cache %s: %w", c.Name, err)
		}
		// The directory's identity too: a cache removed and made again
		// (pulse cache prune) is another directory, and a container's
		// bind of the old one (a warm container's, warm.go) would show
		// it deleted.
		var st unix.Stat_t
		if err := unix.Stat(src, &st); err != nil {
			return "", fmt.Errorf("docker: cache %s: %v: %w", c.Name, err, backend.ErrInvalidRequest)
		}
		parts = append(parts, src+"\x00"+c.Path+"\x00"+fmt.Sprintf("%d.%d", st.Dev, st.Ino))
	}
	sort.Strings(parts)
	return strings.Join(parts, "\x00\x00"), nil
}

func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// cacheMounts turns a box key's cache list back into bind mounts.
func cacheMounts(key string) []mount.Mount {
	if key == "" {
		return nil
	}
	var out []mount.Mount
	for _, p := range strings.Split(key, "\x00\x00") {
		f := strings.SplitN(p, "\x00", 3)
		src, dst := f[0], f[1]
		out = append(out, mount.Mount{Type: mount.TypeBind, Source: src, Target: dst,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate, NonRecursive: true}})
	}
	return out
}

package docker

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/docker/docker/api/types/mount"

	"github.com/pulse-agent/pulse/backend"
)

// cacheView is where the command sees the workspace: a cache there, or
// above it, would mix unreviewed writes into the captured ones.
const cacheView = "/work"

// checkCaches validates req.Caches and makes each host directory
// writable by the sandbox user. Mounts are fixed when a container is
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
		if err := ownForSandbox(src); err != nil {
			return "", fmt.Errorf("docker: cache %s: %w", c.Name, err)
		}
		parts = append(parts, src+"\x00"+c.Path)
	}
	sort.Strings(parts)
	return strings.Join(parts, "\x00\x00"), nil
}

func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// ownForSandbox gives the cache's top directory to the sandbox user when
// this process may (root, the usual engine user), so commands can create
// entries in it. Entries other users made inside stay theirs: a cache is
// best filled by one kind of backend.
func ownForSandbox(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) == sandboxUID || os.Geteuid() != 0 {
		return nil
	}
	return os.Lchown(dir, sandboxUID, sandboxGID)
}

// cacheMounts turns a box key's cache list back into bind mounts.
func cacheMounts(key string) []mount.Mount {
	if key == "" {
		return nil
	}
	var out []mount.Mount
	for _, p := range strings.Split(key, "\x00\x00") {
		src, dst, _ := strings.Cut(p, "\x00")
		out = append(out, mount.Mount{Type: mount.TypeBind, Source: src, Target: dst,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate, NonRecursive: true}})
	}
	return out
}

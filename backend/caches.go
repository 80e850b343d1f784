package backend

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/pulse-agent/pulse/policy"
)

// Cache is a persistent host directory a command sees read-write at
// Path, outside the workspace: a module or build cache shared by every
// command and sandbox of the user. What a command writes there is not
// captured, reviewed or part of any transaction; the facade audits every
// command that mounts one.
type Cache struct {
	// Name is the cache's name (policy.ValidCacheName), for audit events
	// and error messages.
	Name string `json:"name"`
	// HostDir is the absolute host directory, which exists.
	HostDir string `json:"host_dir"`
	// Path is where the command sees it (policy.ValidCachePath), never
	// inside or around the workspace view.
	Path string `json:"path"`
	// Env is the variable the facade has already pointed at Path in
	// Request.Env ("" for none); backends need not set it.
	Env string `json:"env,omitempty"`
}

// CheckCaches refuses (ErrInvalidRequest) caches a backend must not
// mount: a bad name or path, a host directory that is not an absolute
// existing directory, two caches at overlapping paths, or a path that
// overlaps the workspace as the command sees it (view, which is
// workspace's host path on the namespace backend).
func CheckCaches(caches []Cache, view string) error {
	for i, c := range caches {
		if err := policy.ValidCacheName(c.Name); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		if err := policy.ValidCachePath(c.Path); err != nil {
			return fmt.Errorf("%w: cache %s: %w", ErrInvalidRequest, c.Name, err)
		}
		if view != "" && (policy.PathWithin(c.Path, view) || policy.PathWithin(view, c.Path)) {
			return fmt.Errorf("%w: cache %s at %s overlaps the workspace %s", ErrInvalidRequest, c.Name, c.Path, view)
		}
		if !filepath.IsAbs(c.HostDir) || filepath.Clean(c.HostDir) != c.HostDir {
			return fmt.Errorf("%w: cache %s: host directory %q is not a clean absolute path", ErrInvalidRequest, c.Name, c.HostDir)
		}
		if st, err := os.Lstat(c.HostDir); err != nil || !st.IsDir() {
			return fmt.Errorf("%w: cache %s: host directory %q is not a directory", ErrInvalidRequest, c.Name, c.HostDir)
		}
		for _, o := range caches[:i] {
			if policy.PathWithin(c.Path, o.Path) || policy.PathWithin(o.Path, c.Path) {
				return fmt.Errorf("%w: caches %s and %s overlap", ErrInvalidRequest, o.Name, c.Name)
			}
		}
	}
	return nil
}

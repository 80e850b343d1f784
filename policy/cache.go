package policy

import (
	"fmt"
	"path"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Cache is a named persistent directory outside the workspace (the file's
// caches:), mounted read-write into every command and shared by every
// sandbox of the same user: module and build caches. What a command
// writes there is not reviewed and is no part of any transaction.
type Cache struct {
	// Name names the cache's host directory: [a-z0-9._-], at most 64
	// bytes, not "." or "..".
	Name string `json:"name" yaml:"name"`
	// Env, when set, is the variable the command finds Path in
	// (GOMODCACHE, GOCACHE, npm_config_cache, PIP_CACHE_DIR).
	Env string `json:"env,omitempty" yaml:"env,omitempty"`
	// Path is where the command sees the cache; empty means
	// DefaultCachePath(Name). It is absolute and clean, and not under
	// /work, a system directory or another cache.
	Path string `json:"path,omitempty" yaml:"path,omitempty"`
	// MaxBytes caps the cache's size (0: no cap). It is checked after
	// each command; a cache over its cap loses its oldest files.
	MaxBytes int64 `json:"max_bytes,omitempty" yaml:"max_bytes,omitempty"`
}

// CacheRoot is the in-sandbox directory DefaultCachePath puts caches in.
const CacheRoot = "/cache"

// DefaultCachePath is where a cache declared without a path is mounted.
func DefaultCachePath(name string) string { return CacheRoot + "/" + name }

// MountPath is c.Path, or the default path for c.Name.
func (c Cache) MountPath() string {
	if c.Path == "" {
		return DefaultCachePath(c.Name)
	}
	return c.Path
}

// reservedCachePrefixes may not hold a cache: the workspace views of the
// backends (/work, /pulse), the system directories every sandbox shares
// read-only, and the kernel's and the sandbox's own mounts.
var reservedCachePrefixes = []string{"/work", "/pulse", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
	"/etc", "/proc", "/sys", "/dev", "/run", "/boot", "/tmp", "/var/run", "/.pulse"}

// ValidCacheName reports whether name can name a cache directory.
func ValidCacheName(name string) error {
	if name == "" || len(name) > 64 || name == "." || name == ".." {
		return fmt.Errorf(`%w: cache name %q: want 1 to 64 of [a-z0-9._-], other than "." and ".."`, ErrInvalid, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: cache name %q holds %q (want [a-z0-9._-])", ErrInvalid, name, c)
		}
	}
	return nil
}

// ValidCachePath reports whether p can be where a command sees a cache:
// absolute, clean, of plain characters (it travels in mount options), not
// the root and not under a reserved directory.
func ValidCachePath(p string) error {
	if p == "" || len(p) > 256 || !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" {
		return fmt.Errorf("%w: cache path %q: want a clean absolute path below /", ErrInvalid, p)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-/", c) >= 0) {
			return fmt.Errorf("%w: cache path %q holds %q (want [A-Za-z0-9._-/])", ErrInvalid, p, c)
		}
	}
	for _, r := range reservedCachePrefixes {
		if PathWithin(p, r) || PathWithin(r, p) {
			return fmt.Errorf("%w: cache path %q overlaps %s", ErrInvalid, p, r)
		}
	}
	return nil
}

// PathWithin reports whether the clean absolute path p is dir or below it.
func PathWithin(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// validEnvVar accepts a portable environment variable name.
func validEnvVar(s string) bool {
	if s == "" || len(s) > 128 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Validate reports a malformed cache with an error wrapping ErrInvalid.
func (c Cache) Validate() error {
	if err := ValidCacheName(c.Name); err != nil {
		return err
	}
	if c.Env != "" && !validEnvVar(c.Env) {
		return fmt.Errorf("%w: cache %s: env %q is not a variable name", ErrInvalid, c.Name, c.Env)
	}
	if err := ValidCachePath(c.MountPath()); err != nil {
		return fmt.Errorf("cache %s: %w", c.Name, err)
	}
	if c.MaxBytes < 0 {
		return fmt.Errorf("%w: cache %s: negative max_bytes", ErrInvalid, c.Name)
	}
	return nil
}

// ValidateCaches checks each cache and that no two share a name, an
// environment variable or overlapping paths.
func ValidateCaches(cs []Cache) error {
	for i, c := range cs {
		if err := c.Validate(); err != nil {
			return err
		}
		for _, o := range cs[:i] {
			switch {
			case o.Name == c.Name:
				return fmt.Errorf("%w: cache %s declared twice", ErrInvalid, c.Name)
			case c.Env != "" && o.Env == c.Env:
				return fmt.Errorf("%w: caches %s and %s both set %s", ErrInvalid, o.Name, c.Name, c.Env)
			case PathWithin(c.MountPath(), o.MountPath()) || PathWithin(o.MountPath(), c.MountPath()):
				return fmt.Errorf("%w: caches %s and %s overlap (%s, %s)", ErrInvalid, o.Name, c.Name, o.MountPath(), c.MountPath())
			}
		}
	}
	return nil
}

func decodeCaches(n *yaml.Node, field string) ([]Cache, error) {
	var out []Cache
	err := sequence(n, field, func(i int, e *yaml.Node) error {
		en := fmt.Sprintf("%s[%d]", field, i)
		var c Cache
		got := false
		err := mapping(e, en, []string{"name", "env", "path", "max_bytes"}, func(k string, v *yaml.Node) error {
			kn := join(en, k)
			var err error
			switch k {
			case "name":
				got = true
				c.Name, err = scalarString(v, kn)
			case "env":
				c.Env, err = scalarString(v, kn)
			case "path":
				c.Path, err = scalarString(v, kn)
			case "max_bytes":
				c.MaxBytes, err = byteSize(v, kn)
			}
			return err
		})
		if err != nil {
			return err
		}
		if !got {
			return fieldErr(e, join(en, "name"), "missing")
		}
		if err := c.Validate(); err != nil {
			return fieldErr(e, en, "%s", strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
		}
		out = append(out, c)
		if err := ValidateCaches(out); err != nil {
			return fieldErr(e, en, "%s", strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
		}
		return nil
	})
	return out, err
}

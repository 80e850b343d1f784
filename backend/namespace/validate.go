package namespace

import (
	"fmt"
	"path"
	"strings"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// cleanDir turns Request.Dir into a slash path relative to the workspace,
// refusing anything that would leave it. "" and "." are the root.
func cleanDir(dir string) (string, error) {
	if strings.ContainsRune(dir, 0) {
		return "", fmt.Errorf("%w: dir contains NUL", backend.ErrInvalidRequest)
	}
	if dir == "" {
		return ".", nil
	}
	if strings.HasPrefix(dir, "/") {
		return "", fmt.Errorf("%w: dir %q is absolute", backend.ErrInvalidRequest, dir)
	}
	c := path.Clean(dir)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%w: dir %q leaves the workspace", backend.ErrInvalidRequest, dir)
	}
	if pathguard.IsReserved(c) {
		return "", fmt.Errorf("%w: dir %q is inside .pulse", backend.ErrInvalidRequest, dir)
	}
	return c, nil
}

// networkNamespace says whether the command gets its own empty network
// namespace. An unset mode is deny-all: fail closed.
func networkNamespace(p policy.NetworkPolicy) (bool, error) {
	switch p.Mode {
	case "", policy.NetworkDenyAll:
		return true, nil
	case policy.NetworkAllowAll:
		return false, nil
	case policy.NetworkAllowlist:
		// The empty namespace, with the egress proxy bridged in.
		return true, nil
	default:
		return false, fmt.Errorf("%w: unknown network mode %q", backend.ErrInvalidRequest, p.Mode)
	}
}

// overlayPathOK reports whether p can be written into an overlayfs mount
// option string: the legacy option parser splits on ',' and lowerdir on ':'.
func overlayPathOK(p string) bool {
	return !strings.ContainsAny(p, ",:\\\n") && !strings.ContainsRune(p, 0)
}

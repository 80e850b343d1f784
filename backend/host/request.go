package host

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// plan is a validated request turned into what the process needs.
type plan struct {
	path   string   // absolute program path
	argv   []string // argv[0] is the name the program sees
	dir    string   // absolute working directory
	env    []string // KEY=VALUE, sorted
	limits policy.ResourceLimits
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("host: %w: "+format, append([]any{backend.ErrInvalidRequest}, args...)...)
}

// prepare checks req against the contract and builds the plan. Nothing is
// started here, so every failure is a request the caller can fix.
func (b *Backend) prepare(req *backend.Request) (*plan, error) {
	if req == nil {
		return nil, invalid("nil request")
	}
	if len(req.Caches) > 0 {
		// Pointing the variables at the host directories would work, but
		// Path would be a lie; the facade refuses first anyway.
		return nil, fmt.Errorf("host: caches: %w", backend.ErrUnsupported)
	}
	switch req.Network.Mode {
	case "", policy.NetworkAllowAll:
		// The empty mode asks for no restriction, which is all the host
		// can give; the facade always resolves a mode before it calls.
	case policy.NetworkDenyAll, policy.NetworkAllowlist:
		return nil, fmt.Errorf("host: %w: network mode %q: the host backend cannot restrict the network", backend.ErrUnsupported, req.Network.Mode)
	default:
		return nil, fmt.Errorf("host: %w: unknown network mode %q", backend.ErrUnsupported, req.Network.Mode)
	}
	switch req.Secrets.Mode {
	case "", secrets.DenyAll, secrets.AllowAll, secrets.Allowlist:
		// Secrets reach the command only through Env, which the caller
		// filled according to the policy; the base environment holds none.
	default:
		return nil, fmt.Errorf("host: %w: unknown secret mode %q", backend.ErrUnsupported, req.Secrets.Mode)
	}
	if err := backend.CheckCommand(req); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	p := &plan{limits: req.Limits.WithDefaults()}

	dir, err := workDir(req.Workspace, req.Dir)
	if err != nil {
		return nil, err
	}
	p.dir = dir

	p.env = b.environ(req.Env)

	if req.Shell != "" {
		p.path = b.shell
		p.argv = []string{filepath.Base(b.shell), "-c", req.Shell}
		return p, nil
	}
	name := req.Args[0]
	// The program is found with the command's own PATH, not the caller's,
	// and a relative path with a slash is relative to the working
	// directory, as a shell would do it.
	if strings.Contains(name, "/") {
		path := name
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, path)
		}
		if err := checkExecutable(path); err != nil {
			return nil, invalid("%v", err)
		}
		p.path = path
	} else {
		path, err := lookPath(name, envValue(p.env, "PATH"))
		if err != nil {
			return nil, invalid("%v", err)
		}
		p.path = path
	}
	p.argv = append([]string(nil), req.Args...)
	return p, nil
}

// workDir resolves rel inside workspace, refusing anything that leaves it,
// lexically or through a symlink.
func workDir(workspace, rel string) (string, error) {
	if workspace == "" || !filepath.IsAbs(workspace) {
		return "", invalid("workspace %q is not an absolute path", workspace)
	}
	root, err := filepath.EvalSymlinks(workspace)
	if err != nil {
		return "", invalid("workspace: %v", err)
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return "", invalid("workspace %q is not a directory", workspace)
	}
	if rel == "" || rel == "." {
		return root, nil
	}
	if filepath.IsAbs(rel) || !filepath.IsLocal(rel) {
		return "", invalid("dir %q leaves the workspace", rel)
	}
	dir, err := filepath.EvalSymlinks(filepath.Join(root, rel))
	if err != nil {
		return "", invalid("dir %q: %v", rel, err)
	}
	if r, err := filepath.Rel(root, dir); err != nil || !filepath.IsLocal(r) && r != "." {
		return "", invalid("dir %q leaves the workspace through a symlink", rel)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", invalid("dir %q is not a directory", rel)
	}
	return dir, nil
}

// environ builds the command's environment from scratch: the base, then
// the request's variables over it.
func (b *Backend) environ(extra map[string]string) []string {
	base := map[string]string{
		"PATH": DefaultPath,
		"HOME": b.home,
		"LANG": "C.UTF-8",
		"TERM": "dumb",
	}
	if b.user != "" {
		base["USER"] = b.user
	}
	return backend.Environ(base, extra)
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v
		}
	}
	return ""
}

// lookPath finds name in the colon-separated path list, as execvp would,
// skipping relative entries so that the working directory never supplies a
// program by accident.
func lookPath(name, path string) (string, error) {
	for _, d := range filepath.SplitList(path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in PATH %q", name, path)
}

var errNotExecutable = errors.New("not an executable file")

func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return &fs.PathError{Op: "exec", Path: path, Err: errNotExecutable}
	}
	return nil
}

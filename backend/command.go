package backend

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// CheckCommand checks what every local backend refuses alike, before
// anything is started: exactly one of Args and Shell, a program name,
// no NUL byte in the argv, the script or the environment (execve would cut
// the string there), environment names that survive NAME=value whole (not
// empty, no '='), and no negative limit. Errors wrap ErrInvalidRequest;
// the backend puts its name in front. The rest of a request (workspace,
// Dir, network and secret modes, hidden paths) depends on how the backend
// runs the command, so each checks it itself.
func CheckCommand(req *Request) error {
	if req == nil {
		return fmt.Errorf("%w: nil request", ErrInvalidRequest)
	}
	if (len(req.Args) == 0) == (req.Shell == "") {
		return fmt.Errorf("%w: exactly one of Args and Shell must be set", ErrInvalidRequest)
	}
	if len(req.Args) > 0 && req.Args[0] == "" {
		return fmt.Errorf("%w: empty program name", ErrInvalidRequest)
	}
	for _, a := range req.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("%w: argument contains a NUL byte", ErrInvalidRequest)
		}
	}
	if strings.IndexByte(req.Shell, 0) >= 0 {
		return fmt.Errorf("%w: shell script contains a NUL byte", ErrInvalidRequest)
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("%w: bad environment variable name %q", ErrInvalidRequest, k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("%w: environment variable %s holds a NUL byte", ErrInvalidRequest, k)
		}
	}
	l := req.Limits
	if l.Timeout < 0 || l.OutputBytes < 0 || l.FileSizeBytes < 0 || l.DiskBytes < 0 || l.MemoryBytes < 0 || l.Pids < 0 || l.CPUs < 0 {
		return fmt.Errorf("%w: negative resource limit", ErrInvalidRequest)
	}
	return nil
}

// Environ is a command's whole environment as execve takes it: base (the
// backend's minimal PATH, HOME, LANG, TERM, USER), then env (Request.Env,
// checked by CheckCommand) over it, sorted so that the same request gives
// the same list.
func Environ(base, env map[string]string) []string {
	m := maps.Clone(base)
	if m == nil {
		m = map[string]string{}
	}
	maps.Copy(m, env)
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

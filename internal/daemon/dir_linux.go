package daemon

import (
	"os"

	"github.com/pulse-agent/pulse/internal/daemon/client"
)

// ErrUntrusted: the daemon's directory, socket or process is not this
// user's own (or not this binary), so it is not used.
var ErrUntrusted = client.ErrUntrusted

// Dir is client.Dir: the directory the user's daemon sockets are in.
func Dir() string { return client.Dir() }

// CheckDir is client.CheckDir.
func CheckDir(dir string) error { return client.CheckDir(dir) }

// Name is client.Name: the socket name of the daemon for this
// executable, working directory and environment.
func Name(dir string, env []string) string { return client.Name(dir, env) }

// NameFor is client.NameFor.
func NameFor(exe, dir string, env []string) string { return client.NameFor(exe, dir, env) }

// makeDir makes dir, if missing, and checks it.
func makeDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return client.CheckDir(dir)
}

func socketPath(dir, name string) string { return client.SocketPath(dir, name) }

func checkPeer(fd int, exe string) (int, error) { return client.CheckPeer(fd, exe) }

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"github.com/pulse-agent/pulse/sandbox"
)

// sessionName is what --session accepts: a file name of its own under
// .pulse/shell, never a path.
var sessionName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

func checkSessionName(n string) error {
	if !sessionName.MatchString(n) {
		return fmt.Errorf("--session wants a name of letters, digits, '_', '.' and '-' (at most 64, not starting with '.' or '-'), got %q", n)
	}
	return nil
}

// sessionFile is where a shell session's state lives between pulse
// processes: in the workspace's .pulse, which no command sees and no
// review stages, readable by the workspace's owner only.
func sessionFile(sb *sandbox.Sandbox, name string) string {
	return filepath.Join(sb.Workspace(), ".pulse", "shell", name+".json")
}

// runInSession runs cmd in the shell session name (sandbox.Shell): its
// state is read before and written after, whatever the command's exit.
// Two commands of one session at once leave the state of the one that
// ends last.
func runInSession(ctx context.Context, sb *sandbox.Sandbox, name string, cmd sandbox.Command, warn func(string)) (*sandbox.Result, error) {
	file := sessionFile(sb, name)
	var st sandbox.ShellState
	switch data, err := os.ReadFile(file); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("session %s: %w", name, err)
	default:
		if err := json.Unmarshal(data, &st); err != nil {
			return nil, fmt.Errorf("session %s: %s is damaged (remove it to start the session afresh): %w", name, file, err)
		}
	}
	sh, err := sb.ResumeShell(st)
	if err != nil {
		return nil, fmt.Errorf("session %s: %s: %w", name, file, err)
	}
	res, err := sh.Run(ctx, cmd)
	if res == nil {
		return res, err
	}
	if sh.Lost() {
		warn(fmt.Sprintf("session %s: the command left no state (it exec'd another program, or the output cap cut it off); the session keeps its directory and variables from before", name))
	}
	if serr := saveSession(file, sh.State()); serr != nil {
		return res, errors.Join(err, fmt.Errorf("session %s: keeping its state: %w", name, serr))
	}
	return res, err
}

// saveSession writes the state whole (temp file, rename), so that a
// crash leaves the old state or the new one.
func saveSession(file string, st sandbox.ShellState) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".new-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), file)
}

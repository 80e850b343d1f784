package docker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// wrapperParent is a command that prints how the wrapper that runs it
// was started (command → time → wrapper → its parent): "chan" when its
// parent is the container's main process (the request channel), "exec"
// otherwise; then how many commands have run it so far.
const wrapperParent = `t=$(awk '/^PPid/ {print $2}' /proc/$PPID/status); w=$(awk '/^PPid/ {print $2}' /proc/$t/status)
if tr '\0' '\n' </proc/$w/cmdline | grep -qx pulse-idle; then echo chan; else echo exec; fi
echo x >> /tmp/chan-count; chmod 666 /tmp/chan-count 2>/dev/null; wc -l < /tmp/chan-count`

// A warm container's commands come through its request channel, not an
// exec; a request its main process does not claim in time is taken back
// and runs through an exec, and only there: it is never run a second
// time by the main process once that is free again.
func TestDockerWarmChannelRunsEachCommandOnce(t *testing.T) {
	ws := t.TempDir()
	b := newDocker(t, WithReuse(2*time.Minute))
	if !b.chanUsable() {
		t.Skip("no request channel here: it needs Linux, a local engine, the injected busybox and a CLI uid no container process has")
	}
	fields := func(r run) []string { return strings.Fields(r.stdout) }
	// Long enough that a claim under any load comes first.
	defer func(d time.Duration) { chanClaimWait = d }(chanClaimWait)
	chanClaimWait = 5 * time.Minute

	r := execShell(t, b, ws, wrapperParent)
	if f := fields(r); r.res.ExitCode != 0 || len(f) != 2 || f[0] != "chan" || f[1] != "1" {
		t.Fatalf("first command: exit %d, stdout %q, stderr %q; want a wrapper started by the main process, run once", r.res.ExitCode, r.stdout, r.stderr)
	}
	b.mu.Lock()
	var dir string
	for _, bx := range b.boxes {
		dir = bx.channel
	}
	b.mu.Unlock()
	if dir == "" {
		t.Fatal("the warm container has no channel directory")
	}

	// Keep the main process busy: a request whose stdin nobody opens
	// holds it in the redirection until the test opens it.
	const busy = "b0"
	for _, ext := range []string{"in", "out", "err"} {
		if err := unix.Mkfifo(filepath.Join(dir, busy+"."+ext), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, busy+".req"), []byte("exit 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl, err := os.OpenFile(filepath.Join(dir, "ctl"), os.O_WRONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.WriteString(busy + "\n"); err != nil {
		t.Fatal(err)
	}
	ctl.Close()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, busy+".run")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the main process did not claim the busy request")
		}
	}

	// The main process cannot claim it, however soon it is taken back.
	chanClaimWait = 100 * time.Millisecond
	r = execShell(t, b, ws, wrapperParent)
	if f := fields(r); r.res.ExitCode != 0 || len(f) != 2 || f[0] != "exec" || f[1] != "2" {
		t.Fatalf("command while the main process is busy: exit %d, stdout %q, stderr %q; want it through an exec, run once", r.res.ExitCode, r.stdout, r.stderr)
	}

	// Free the main process: the busy request's ends, in its order.
	for _, f := range []struct {
		ext  string
		flag int
	}{{"in", os.O_WRONLY}, {"out", os.O_RDONLY}, {"err", os.O_RDONLY}} {
		fd, err := os.OpenFile(filepath.Join(dir, busy+"."+f.ext), f.flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
	}
	chanClaimWait = 5 * time.Minute
	r = execShell(t, b, ws, wrapperParent)
	if f := fields(r); r.res.ExitCode != 0 || len(f) != 2 || f[0] != "chan" || f[1] != "3" {
		t.Fatalf("command after: exit %d, stdout %q, stderr %q; want it through the channel, and the taken-back one not run again", r.res.ExitCode, r.stdout, r.stderr)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "[0-9a-f]*[0-9a-f].*")); len(left) > 0 {
		var own []string
		for _, p := range left {
			if !strings.HasPrefix(filepath.Base(p), busy+".") {
				own = append(own, p)
			}
		}
		if len(own) > 0 {
			t.Errorf("request files left behind: %v", own)
		}
	}
}

package docker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/pkg/stdcopy"
	"golang.org/x/sys/unix"
)

// wrapperParent is a command that prints how the runtime's exec step
// that runs it was started (command → exec step → its parent): "chan"
// when its parent is the container's main process, the runtime's idle
// step (the request channel), "exec" otherwise; then how many commands
// have run it so far.
const wrapperParent = `t=$(awk '/^PPid/ {print $2}' /proc/$PPID/status)
if [ "$(tr '\0' '\n' </proc/$t/cmdline 2>/dev/null | sed -n 2p)" = idle ]; then echo chan; else echo exec; fi
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
	// holds it in the open of its FIFOs until the test opens them (the
	// request itself is no request, and runs nothing then).
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

// execCreates lists the commands of the execs the engine made in
// container id between since and until (its exec_create events).
func execCreates(t *testing.T, b *Backend, id string, since, until time.Time) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, errs := b.cli.Events(ctx, events.ListOptions{
		Since:   strconv.FormatInt(since.Unix()-1, 10),
		Until:   strconv.FormatInt(until.Unix()+1, 10),
		Filters: filters.NewArgs(filters.Arg("container", id), filters.Arg("type", "container")),
	})
	var out []string
	for {
		select {
		case m := <-msgs:
			if strings.HasPrefix(string(m.Action), "exec_create") {
				out = append(out, string(m.Action))
			}
		case err := <-errs:
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("engine events: %v", err)
			}
			return out
		}
	}
}

// rootShell runs script in bx's container as the wrapper's user and
// returns its output.
func rootShell(t *testing.T, b *Backend, bx *box, script string) string {
	t.Helper()
	_, hj, err := b.attachScript(bx, []string{script, "pulse-test"}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer hj.Close()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, hj.Reader); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// The sync that brings base to a changed workspace goes through a warm
// container's request channel, not an exec; it runs as the sandbox user
// without a capability, as the exec ran it, and its exit status comes
// back: a failed sync is an exitError, not taken for a success.
func TestDockerWarmChannelRunsTheSync(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"a": "one"})
	b := newDocker(t, WithReuse(2*time.Minute))
	if !b.chanUsable() {
		t.Skip("no request channel here: it needs Linux, a local engine, the injected busybox and a CLI uid no container process has")
	}
	defer func(d time.Duration) { chanClaimWait = d }(chanClaimWait)
	chanClaimWait = 5 * time.Minute

	if r := execShell(t, b, ws, "cat a"); r.res.ExitCode != 0 || r.stdout != "one" {
		t.Fatalf("first command: exit %d, stdout %q, stderr %q", r.res.ExitCode, r.stdout, r.stderr)
	}
	var bx *box
	b.mu.Lock()
	for _, x := range b.boxes {
		bx = x
	}
	b.mu.Unlock()
	if bx == nil || bx.channel == "" {
		t.Fatal("the warm container has no channel")
	}

	// A host edit (a new size: sent for certain) and a new file.
	writeFiles(t, ws, map[string]string{"a": "two!", "d/b": "bee"})
	since := time.Now()
	r := execShell(t, b, ws, "cat a d/b")
	until := time.Now()
	if r.res.ExitCode != 0 || r.stdout != "two!bee" {
		t.Fatalf("after a host edit: exit %d, stdout %q, stderr %q; want the edit seen", r.res.ExitCode, r.stdout, r.stderr)
	}
	for _, a := range execCreates(t, b, bx.id, since, until) {
		if strings.Contains(a, runtimePath+" sync ") {
			t.Fatalf("the sync ran through an exec (%s), not the request channel", a)
		}
	}

	// Who the sync step is: held in its tar's read by a stdin that has
	// not ended.
	pr, pw := io.Pipe()
	res := make(chan error, 1)
	go func() {
		if !bx.takeChan() {
			res <- errors.New("the channel is busy")
			return
		}
		defer bx.putChan()
		res <- b.chanSync(context.Background(), bx, randomID(), pr)
	}()
	var who string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		who = rootShell(t, b, bx, `for p in /proc/[0-9]*; do
	[ "$( (tr '\0' ' ' <$p/cmdline) 2>/dev/null | cut -d' ' -f1-2)" = "`+runtimePath+` sync" ] && grep -E '^(Uid|Gid|CapEff|CapPrm):' $p/status 2>/dev/null
done; true`)
		if who != "" || time.Now().After(deadline) {
			break
		}
	}
	f := strings.Fields(who)
	want := []string{"Uid:", "1000", "1000", "1000", "1000", "Gid:", "1000", "1000", "1000", "1000", "CapPrm:", "0000000000000000", "CapEff:", "0000000000000000"}
	if strings.Join(f, " ") != strings.Join(want, " ") {
		t.Errorf("the sync step on the channel runs as\n%s\nwant the sandbox user without capabilities", who)
	}
	// Not a tar: the step's extraction fails, and says so.
	if _, err := pw.Write(bytes.Repeat([]byte("x"), 1024)); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	var ee *exitError
	if err := <-res; !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("sync of a stdin that is no tar: %v; want its exit status 2", err)
	}
}

func TestParseSyncStatus(t *testing.T) {
	for in, want := range map[string]int{"rc 0\n": 0, "rc 2\n": 2, "rc 137\n": 137} {
		if got, ok := parseSyncStatus([]byte(in)); !ok || got != want {
			t.Errorf("parseSyncStatus(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "rc \n", "rc 0", "rc 1000\n", "rc -1\n", "rc 0\nrc 1\n", "RC 0\n", "rc 0 \n", " rc 0\n"} {
		if got, ok := parseSyncStatus([]byte(in)); ok {
			t.Errorf("parseSyncStatus(%q) = %d, true; want it refused", in, got)
		}
	}
}

// fakeChan is a channel directory with a stand-in for the main process:
// serve is called with each request id it claims.
func fakeChan(t *testing.T, serve func(dir, id string)) *box {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(dir, "ctl"), 0o600); err != nil {
		t.Fatal(err)
	}
	if serve != nil {
		ctl, err := os.OpenFile(filepath.Join(dir, "ctl"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ctl.Close() })
		go func() {
			buf := make([]byte, 17)
			for {
				if _, err := io.ReadFull(ctl, buf); err != nil {
					return
				}
				id := strings.TrimSpace(string(buf))
				if os.Rename(filepath.Join(dir, id+".req"), filepath.Join(dir, id+".run")) == nil {
					serve(dir, id)
				}
			}
		}()
	}
	return &box{channel: dir}
}

// The host's side of a sync on the channel: its status line is the
// script's exit status; no listener is a refusal (an exec runs it); a
// claim whose ends never open (a main process that died after it) ends
// with the context, as an error that is neither, so that the container
// is not used again.
func TestChanSyncHostSide(t *testing.T) {
	b := &Backend{}
	var ends = func(dir, id string) []*os.File {
		var fs []*os.File
		for _, f := range []struct {
			ext  string
			flag int
		}{{"in", os.O_RDONLY}, {"out", os.O_WRONLY}, {"err", os.O_WRONLY}} {
			fd, err := os.OpenFile(filepath.Join(dir, id+"."+f.ext), f.flag, 0)
			if err != nil {
				t.Error(err)
				return nil
			}
			fs = append(fs, fd)
		}
		return fs
	}
	status := func(line string) func(dir, id string) {
		return func(dir, id string) {
			fs := ends(dir, id)
			if fs == nil {
				return
			}
			_, _ = io.Copy(io.Discard, fs[0])
			_, _ = fs[2].WriteString("said something\n")
			_, _ = fs[1].WriteString(line)
			for _, f := range fs {
				f.Close()
			}
		}
	}
	ctx := context.Background()

	if err := b.chanSync(ctx, fakeChan(t, status("rc 0\n")), "00000000000000a1", strings.NewReader("tar")); err != nil {
		t.Errorf("status 0: %v", err)
	}
	var ee *exitError
	if err := b.chanSync(ctx, fakeChan(t, status("rc 5\n")), "00000000000000a2", strings.NewReader("tar")); !errors.As(err, &ee) || ee.code != 5 || ee.out != "said something" {
		t.Errorf("status 5: %v; want an exitError of 5 with the script's output", err)
	}
	for _, line := range []string{"", "rc\n", "garbage"} {
		err := b.chanSync(ctx, fakeChan(t, status(line)), "00000000000000a3", strings.NewReader("tar"))
		if err == nil || errors.As(err, &ee) || errors.Is(err, errChanRefused) {
			t.Errorf("status line %q: %v; want an error of an unknown end", line, err)
		}
	}
	if err := b.chanSync(ctx, fakeChan(t, nil), "00000000000000a4", strings.NewReader("tar")); !errors.Is(err, errChanRefused) {
		t.Errorf("no listener: %v; want errChanRefused", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	claimed := make(chan struct{})
	bx := fakeChan(t, func(dir, id string) { close(claimed) })
	go func() { <-claimed; cancel() }()
	err := b.chanSync(cctx, bx, "00000000000000a5", strings.NewReader("tar"))
	if err == nil || errors.As(err, &ee) || errors.Is(err, errChanRefused) {
		t.Errorf("claimed, never opened: %v; want an error of an unknown end", err)
	}
	if left, _ := filepath.Glob(filepath.Join(bx.channel, "00000000000000a5.*")); len(left) > 0 {
		t.Errorf("request files left behind: %v", left)
	}
}

package namespace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

// helperBackend returns a backend that shows this test binary read-only in
// the sandbox, and the script prefix that runs it as a helper. The helper
// runs as a child of bash (the trailing "; true" stops bash from exec'ing
// it), like any command an agent would start.
func helperBackend(t *testing.T, opts ...Option) (*Backend, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe, err = filepath.EvalSymlinks(exe)
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, append(opts, WithReadOnlyBind(filepath.Dir(exe)))...)
	return b, exe
}

func runHelperIn(t *testing.T, b *Backend, exe, helper string, args ...string) string {
	t.Helper()
	q := []string{strconv.Quote(exe)}
	for _, a := range args {
		q = append(q, strconv.Quote(a))
	}
	res, out, errs := runCmd(t, b, &backend.Request{
		Workspace: t.TempDir(),
		Shell:     strings.Join(q, " ") + "; true",
		// The race runtime sleeps a second at exit unless told not to.
		Env: map[string]string{helperEnv: helper, "GORACE": "atexit_sleep_ms=0"},
	})
	if res.ExitCode != 0 {
		t.Fatalf("helper %s: exit %d: %s%s", helper, res.ExitCode, out, errs)
	}
	return out
}

func TestEscapeForbiddenSyscalls(t *testing.T) {
	b, exe := helperBackend(t)
	for _, h := range []string{"mount", "ptrace", "userns", "clone3", "bpf", "keyctl", "caps"} {
		t.Run(h, func(t *testing.T) {
			out := runHelperIn(t, b, exe, h)
			if !strings.HasPrefix(out, "refused:") {
				t.Fatalf("%s was allowed inside the sandbox: %q", h, out)
			}
		})
	}
}

func TestEscapeHostLoopbackFromGoDialer(t *testing.T) {
	b, exe := helperBackend(t)
	addr := listen(t)
	out := runHelperIn(t, b, exe, "dial", addr)
	if !strings.HasPrefix(out, "refused:") {
		t.Fatalf("reached host listener %s: %q", addr, out)
	}
}

func TestEscapeSeeHostProcesses(t *testing.T) {
	b := newBackend(t)
	marker := "31.4159" + strconv.Itoa(os.Getpid())
	host := exec.Command("sleep", marker)
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	res, out, errs := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: `
n=0; for d in /proc/[0-9]*; do n=$((n+1)); done; echo "procs=$n"
cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' '; echo
kill -0 ` + strconv.Itoa(host.Process.Pid) + ` 2>/dev/null && echo SIG""NALLED; true`})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, errs)
	}
	if strings.Contains(out, marker) || strings.Contains(out, "SIGNALLED") {
		t.Fatalf("host process visible inside: %q", out)
	}
	// bash, and at most the subshells of the script itself.
	if !strings.Contains(out, "procs=1\n") && !strings.Contains(out, "procs=2\n") && !strings.Contains(out, "procs=3\n") {
		t.Fatalf("more processes than the script's own: %q", out)
	}
}

func TestEscapeWriteOutsideOverlay(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	hostTmp := filepath.Join(os.TempDir(), "pulse-escape-"+strconv.Itoa(os.Getpid()))
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: ws, Shell: `
for p in /usr/pulse-escape /etc/pulse-escape /pulse-escape /bin/pulse-escape /proc/sys/kernel/hostname /dev/pulse-escape; do
  if echo x > "$p" 2>/dev/null; then echo "WROTE $p"; fi
done
echo x > ` + hostTmp + ` && echo tmp-ok
echo x > "$HOME/pulse-escape" && echo home-ok`})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if strings.Contains(out, "WROTE") {
		t.Fatalf("wrote outside the overlay: %q", out)
	}
	// /tmp and home are writable, but private tmpfs: nothing reaches the host.
	if !strings.Contains(out, "tmp-ok") || !strings.Contains(out, "home-ok") {
		t.Fatalf("/tmp or home not writable inside: %q", out)
	}
	for _, p := range []string{"/usr/pulse-escape", "/etc/pulse-escape", "/pulse-escape", hostTmp, filepath.Join(sandboxHome(), "pulse-escape")} {
		if _, err := os.Lstat(p); err == nil {
			os.Remove(p)
			t.Errorf("host path %s was written", p)
		}
	}
	if !res.Overlay.Empty() {
		t.Errorf("writes outside the workspace reached the overlay: %+v", res.Overlay)
	}
}

func TestEscapeReadShadowAndCallerSSH(t *testing.T) {
	home := t.TempDir()
	writeFile(t, filepath.Join(home, ".ssh/id_ed25519"), "PRIVATE-KEY-MATERIAL")
	t.Setenv("HOME", home)
	b := newBackend(t)
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: `
cat /etc/shadow /etc/gshadow 2>&1
cat "$HOME/.ssh/id_ed25519" ` + home + `/.ssh/id_ed25519 2>&1
ls -A "$HOME"; echo home=$HOME; true`})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if strings.Contains(out, "root:") || strings.Contains(out, "PRIVATE-KEY-MATERIAL") {
		t.Fatalf("secret readable inside: %q", out)
	}
	if !strings.Contains(out, "home="+home) {
		t.Fatalf("HOME is not the caller's home path: %q", out)
	}
	if os.Getuid() == 0 {
		if b, err := os.ReadFile("/etc/shadow"); err == nil && strings.Contains(string(b), "root:") {
			t.Log("host /etc/shadow is readable by the caller and was hidden inside")
		}
	}
}

func TestEscapePlantedSymlink(t *testing.T) {
	b := newBackend(t)
	secretDir := t.TempDir()
	secret := filepath.Join(secretDir, "secret")
	writeFile(t, secret, "TOP-SECRET")
	ws := t.TempDir()
	for name, target := range map[string]string{"abs": secret, "rel": "../" + filepath.Base(secretDir) + "/secret", "shadow": "/etc/shadow", "dir": secretDir} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: ws, Shell: `
cat abs rel shadow dir/secret 2>&1
echo overwrite > abs 2>&1; echo overwrite > dir/secret 2>&1; ls dir 2>&1; true`})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if strings.Contains(out, "TOP-SECRET") || strings.Contains(out, "root:") {
		t.Fatalf("followed a planted symlink to a host file: %q", out)
	}
	if b, _ := os.ReadFile(secret); string(b) != "TOP-SECRET" {
		t.Fatalf("host file behind a symlink was changed: %q", b)
	}
	for _, f := range res.Overlay.Files {
		if strings.Contains(string(f.Data), "TOP-SECRET") {
			t.Fatalf("overlay carries host content: %+v", f)
		}
	}
}

func TestEscapeNoProcessOutlivesTimeout(t *testing.T) {
	beat := t.TempDir()
	b := newBackend(t, WithReadWriteBind(beat))
	script := `(while :; do echo x >> ` + beat + `/beat; sleep 0.05; done) &
(setsid sh -c 'while :; do echo y >> ` + beat + `/beat2; sleep 0.05; done' &) 
sleep 100`
	ran := func() bool {
		_, errA := os.Stat(filepath.Join(beat, "beat"))
		_, errB := os.Stat(filepath.Join(beat, "beat2"))
		return errA == nil && errB == nil
	}
	for _, how := range []string{"timeout", "cancel"} {
		t.Run(how, func(t *testing.T) {
			// The limit must outlast the writers' start, which takes longer
			// the busier the machine: a run in which they never wrote is
			// repeated with twice the limit (up to half a minute). A cancel
			// comes once both have written (or after a minute, and then the
			// check below fails saying they never ran).
			run := func(limit time.Duration) *backend.Result {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req := &backend.Request{Workspace: t.TempDir(), Shell: script, Limits: policyTimeout(30 * time.Second)}
				if how == "timeout" {
					req.Limits = policyTimeout(limit)
				} else {
					go func() {
						for deadline := time.Now().Add(time.Minute); !ran() && time.Now().Before(deadline); {
							time.Sleep(10 * time.Millisecond)
						}
						cancel()
					}()
				}
				res, err := b.Exec(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			limit := 400 * time.Millisecond
			res := run(limit)
			for how == "timeout" && !ran() && limit < 30*time.Second {
				t.Logf("the writers did not start within the %v limit; again with %v", limit, 2*limit)
				limit *= 2
				res = run(limit)
			}
			want := backend.Timeout
			if how == "cancel" {
				want = backend.Cancelled
			}
			if res.Termination != want || res.ExitCode != -1 || res.TimedOut != (how == "timeout") {
				t.Fatalf("termination %s exit %d timedOut %v, want %s -1", res.Termination, res.ExitCode, res.TimedOut, want)
			}
			sizes := func() (int64, int64) {
				a, _ := os.Stat(filepath.Join(beat, "beat"))
				c, _ := os.Stat(filepath.Join(beat, "beat2"))
				if a == nil || c == nil {
					t.Fatal("background writers never ran")
				}
				return a.Size(), c.Size()
			}
			a1, c1 := sizes()
			time.Sleep(300 * time.Millisecond)
			a2, c2 := sizes()
			if a1 != a2 || c1 != c2 {
				t.Fatalf("a process outlived Exec: beat %d->%d, beat2 %d->%d", a1, a2, c1, c2)
			}
			os.Remove(filepath.Join(beat, "beat"))
			os.Remove(filepath.Join(beat, "beat2"))
		})
	}
}

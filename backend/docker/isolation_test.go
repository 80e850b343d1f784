package docker

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// firstCommandUID is where the wrapper's per-command uids start.
const firstCommandUID = 20000

// commandUID reports whether s, an `id -u`, is a uid of a command's own.
func commandUID(s string) bool {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	return err == nil && n >= firstCommandUID && n < 60000
}

// Two commands run at the same time in one container. The second knows
// the first's pid, its wrapper's pid and its working copy, and tries
// what a command may not do to another: signal, read the environment or
// the memory, write the copy (or base, what the next command starts
// from). All of it must fail, and the first must end as it would alone.
// The container mounts a cache, so both run under the group commands
// share for caches: that group must open none of this.
func TestDockerConcurrentCommandsCannotReachEachOther(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"shared.txt": "base\n"})
	withCache := withCacheAt(t.TempDir(), "/cache/c")
	execShell(t, b, ws, "true", withCache) // one warm container for both

	// The victim publishes "PID WRAPPER-PID DIR" in /tmp (mode 0644), then
	// waits until the attacker says it is done, a bounded time.
	victim := `umask 022; w=$(awk '{print $4}' /proc/$PPID/stat)
echo "$$ $w $(pwd)" >/tmp/victim.tmp && mv /tmp/victim.tmp /tmp/victim
i=0; while [ ! -e /tmp/attacked ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
[ -e /tmp/attacked ] || echo victim-timed-out
echo mine >victim.txt; cat shared.txt; echo victim-done`
	attacker := `i=0; while [ ! -e /tmp/victim ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
read -r p w d </tmp/victim || { echo no-victim; touch /tmp/attacked; exit 1; }
echo "victim $p wrapper $w dir $d"
[ -n "$p" ] && [ -n "$w" ] && [ -n "$d" ] || { echo no-victim; touch /tmp/attacked; exit 1; }
for q in $p $w; do
	kill -0 "$q" 2>/dev/null && echo "BREACH signal $q"
	head -c 1 /proc/$q/environ >/dev/null 2>&1 && echo "BREACH environ $q"
	(exec 3</proc/$q/mem) 2>/dev/null && echo "BREACH mem $q"
	a=$(head -n 1 /proc/$q/maps 2>/dev/null | cut -d- -f1)
	[ -n "$a" ] && dd if=/proc/$q/mem bs=1 count=1 skip=$((0x$a)) 2>/dev/null | wc -c | grep -q 1 && echo "BREACH mem-read $q"
done
echo x >"$d/planted" 2>/dev/null && echo "BREACH write-copy"
ls "$d" >/dev/null 2>&1 && echo "BREACH list-copy"
echo x >"$d/shared.txt" 2>/dev/null && echo "BREACH overwrite-copy"
echo x >/work/base/planted 2>/dev/null && echo "BREACH write-base"
cat /work/base/shared.txt >/dev/null 2>&1 && echo "BREACH read-base"
# Where kill -0 got through the breach is reported; a real kill of the
# wrapper would only leave the victim's exec hanging.
for q in $p $w; do
	kill -0 "$q" 2>/dev/null && continue
	kill -TERM "$q" 2>/dev/null && echo "BREACH term $q"; kill -KILL "$q" 2>/dev/null && echo "BREACH kill $q"
done
echo probed; touch /tmp/attacked`

	var wg sync.WaitGroup
	var v run
	wg.Go(func() { v = execShell(t, b, ws, victim, withCache) })
	a := execShell(t, b, ws, attacker, withCache)
	wg.Wait()

	if !strings.Contains(a.stdout, "probed") {
		t.Fatalf("the attacker did not get to the end: stdout %q stderr %q", a.stdout, a.stderr)
	}
	if strings.Contains(a.stdout, "BREACH") {
		t.Errorf("one command reached another:\n%s", a.stdout)
	}
	if v.res.ExitCode != 0 || v.stdout != "base\nvictim-done\n" {
		t.Fatalf("victim: exit %d (%s), stdout %q stderr %q", v.res.ExitCode, v.res.Termination, v.stdout, v.stderr)
	}
	ov := v.res.Overlay
	if ov == nil || len(ov.Files) != 1 || ov.Files[0].Path != "victim.txt" || string(ov.Files[0].Data) != "mine\n" || len(ov.Deleted) != 0 {
		t.Fatalf("victim's overlay %+v, want only victim.txt", ov)
	}
	// Nothing the attacker tried reached base either.
	r := execShell(t, b, ws, `ls; cat shared.txt`, withCache)
	if r.stdout != "shared.txt\nbase\n" {
		t.Fatalf("the next command sees %q", r.stdout)
	}
}

func withCacheAt(hostDir, path string) func(*backend.Request) {
	return func(r *backend.Request) {
		r.Caches = []backend.Cache{{Name: "c", HostDir: hostDir, Path: path}}
	}
}

// A cache is shared by commands of different uids: what one makes in
// it, files and directories, whatever its umask, the next can change,
// add to and remove. The two run at the same time so that their uids
// differ.
func TestDockerCacheSharedBetweenCommandUIDs(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	cache := t.TempDir()
	withCache := withCacheAt(cache, "/cache/c")
	first := `umask 077; mkdir -p /cache/c/sub && echo one >/cache/c/sub/a && id -u >/cache/c/first
i=0; while [ ! -e /cache/c/second ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; cat /cache/c/sub/b`
	second := `umask 077; i=0; while [ ! -e /cache/c/first ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
echo two >/cache/c/sub/b && echo changed >/cache/c/sub/a && mkdir /cache/c/sub/d && rm /cache/c/first && id -u >/cache/c/second`
	var wg sync.WaitGroup
	var r1 run
	wg.Go(func() { r1 = execShell(t, b, ws, first, withCache) })
	r2 := execShell(t, b, ws, second, withCache)
	wg.Wait()
	if r2.res.ExitCode != 0 || r1.res.ExitCode != 0 || r1.stdout != "two\n" {
		t.Fatalf("first: exit %d %q %q; second: exit %d %q %q", r1.res.ExitCode, r1.stdout, r1.stderr, r2.res.ExitCode, r2.stdout, r2.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(cache, "sub", "a")); err != nil || string(b) != "changed\n" {
		t.Errorf("host cache sub/a: %q %v", b, err)
	}
	if !r1.res.Overlay.Empty() || !r2.res.Overlay.Empty() {
		t.Errorf("cache writes were captured: %+v %+v", r1.res.Overlay, r2.res.Overlay)
	}
}

// A process that leaves the command's process group (setsid) dies when
// the command ends; a command running beside it in the same container
// is not touched.
func TestDockerSetsidDiesWithItsCommandOnly(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	execShell(t, b, ws, "true")
	count := `n=0; for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f" 2>/dev/null | grep -q '^sleep 3[0-9][0-9] $' && n=$((n+1)); done; echo $n`
	var wg sync.WaitGroup
	var bystander run
	wg.Go(func() {
		bystander = execShell(t, b, ws, `sleep 300 & i=0; while [ ! -e /tmp/escaped ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; sleep 0.5; kill -0 $! && echo alive; kill $!`)
	})
	r := execShell(t, b, ws, `setsid sh -c 'sleep 301 & sleep 302 &' </dev/null >/dev/null 2>&1; sleep 0.2; touch /tmp/escaped`)
	wg.Wait()
	if r.res.ExitCode != 0 {
		t.Fatalf("exit %d %q", r.res.ExitCode, r.stderr)
	}
	if bystander.stdout != "alive\n" {
		t.Errorf("the command beside it was hit: %q %q", bystander.stdout, bystander.stderr)
	}
	if left := execShell(t, b, ws, count); left.stdout != "0\n" {
		t.Errorf("%s processes left running after their command ended", strings.TrimSpace(left.stdout))
	}
}

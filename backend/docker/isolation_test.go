package docker

import (
	"strconv"
	"strings"
	"sync"
	"testing"
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
func TestDockerConcurrentCommandsCannotReachEachOther(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"shared.txt": "base\n"})
	execShell(t, b, ws, "true") // one warm container for both

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
	wg.Go(func() { v = execShell(t, b, ws, victim) })
	a := execShell(t, b, ws, attacker)
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
	r := execShell(t, b, ws, `ls; cat shared.txt`)
	if r.stdout != "shared.txt\nbase\n" {
		t.Fatalf("the next command sees %q", r.stdout)
	}
}

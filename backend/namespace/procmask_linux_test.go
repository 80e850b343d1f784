package namespace

import (
	"os"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// TestEscapeProcKernelInfo: the sandbox's /proc hides what tells of the
// host kernel's memory layout and state (page flags and counts, slab and
// vmalloc lists, timers, the scheduler's and the key lists), as Docker
// masks them, and keeps the kernel's knobs under /proc read-only. For a
// root caller those files are otherwise readable, and /proc/irq and
// /proc/sysrq-trigger writable, from the sandbox: the command runs as the
// caller's uid, and root owns them. The mounts are checked for every
// caller: the reads show a leak only for root, and landlock, where the
// kernel has it, refuses the writes too.
func TestEscapeProcKernelInfo(t *testing.T) {
	b := newBackend(t)
	masked := []string{"kpageflags", "kpagecount", "kpagecgroup", "slabinfo", "vmallocinfo",
		"pagetypeinfo", "keys", "timer_list", "sched_debug", "kcore", "latency_stats", "timer_stats",
		"interrupts", "acpi", "scsi", "asound"}
	readOnly := []string{"bus", "fs", "irq", "sys", "sysrq-trigger"}
	// Each line: the path, the bytes a read got (a directory: its
	// entries) and whether it opened for writing; then the mount table.
	script := `for p in "$@"; do
  [ -e "/proc/$p" ] || continue
  if [ -d "/proc/$p" ]; then n=$(ls -A "/proc/$p" | wc -l); else n=$(head -c1 "/proc/$p" 2>/dev/null | wc -c); fi
  w=ro; [ -f "/proc/$p" ] && ( : >> "/proc/$p" ) 2>/dev/null && w=WRITABLE
  echo "/proc/$p $n $w"
done
echo ---
cat /proc/self/mountinfo`
	args := append([]string{"bash", "-c", script, "bash"}, masked...)
	args = append(args, readOnly...)
	args = append(args, "irq/default_smp_affinity")
	res, out, errs := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Args: args})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s%s", res.ExitCode, out, errs)
	}
	report, mountinfo, _ := strings.Cut(out, "---\n")
	seen := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(report), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			seen[f[0]] = f[1:]
		}
	}
	// Mount point -> its options and filesystem type; the last mount at a
	// point is the one seen.
	mounts := map[string][2]string{}
	for _, l := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 6 && len(g) >= 1 {
			mounts[f[4]] = [2]string{f[5], g[0]}
		}
	}
	readOnlyMount := func(p string) bool {
		m, ok := mounts[p]
		return ok && strings.HasPrefix(m[0], "ro")
	}
	isRoot := os.Geteuid() == 0
	for _, name := range masked {
		p := "/proc/" + name
		st, err := os.Stat(p)
		if err != nil {
			continue // this kernel has none
		}
		if !readOnlyMount(p) {
			t.Errorf("%s is not masked (mount %q)", p, mounts[p])
		}
		if st.IsDir() && mounts[p][1] != "tmpfs" {
			t.Errorf("%s is not behind a tmpfs (mount %q)", p, mounts[p])
		}
		if got := seen[p]; got == nil || got[0] != "0" {
			t.Errorf("%s shows %v inside the sandbox, want nothing", p, got)
		}
	}
	for _, name := range append(readOnly, "irq/default_smp_affinity") {
		p := "/proc/" + name
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if !strings.Contains(name, "/") && !readOnlyMount(p) {
			t.Errorf("%s is not mounted read-only (mount %q)", p, mounts[p])
		}
		if got := seen[p]; got == nil || got[1] != "ro" {
			t.Errorf("%s opened for writing inside the sandbox (%v)", p, got)
		}
	}
	if !isRoot {
		t.Log("not root: the files were unreadable and unwritable anyway; only the mounts were tested")
	}
}

package docker

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// reuseFor is WithReuse without its one-minute floor, so that a test can
// watch a container's idle end.
func reuseFor(d time.Duration) Option {
	return func(o *options) error { o.reuseIdle = d; return nil }
}

// warmOf lists the warm containers whose slot is under ws, running or not.
func warmOf(t *testing.T, b *Backend, ws string) []string {
	t.Helper()
	list, err := b.cli.ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelWarm))})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range list {
		if strings.HasPrefix(c.Labels[LabelWarm], ws+"/") {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// gone says whether the container no longer exists.
func gone(b *Backend, id string) bool {
	_, err := b.cli.ContainerInspect(context.Background(), id)
	return cerrdefs.IsNotFound(err)
}

// slotFiles are the released states under ws.
func slotFiles(t *testing.T, ws string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(ws, ".pulse", "docker", "*", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// releasedState is the one released state under ws, and its path.
func releasedState(t *testing.T, ws string) (string, warmState) {
	t.Helper()
	states := slotFiles(t, ws)
	if len(states) != 1 {
		t.Fatalf("released states %v, want one", states)
	}
	data, err := os.ReadFile(states[0])
	if err != nil {
		t.Fatal(err)
	}
	var st warmState
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return states[0], st
}

// A later Backend takes over the container an earlier one released, and
// its command sees exactly the workspace as it is now: not what the
// earlier command wrote (no pending stack here), but a host edit made in
// between.
func TestDockerWarmTakeOverSyncsToTheWorkspaceNow(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"README": "hello\n"})
	b1 := newDocker(t, WithReuse(2*time.Minute))
	r := execShell(t, b1, ws, `echo one > a.txt; echo changed > README`)
	if r.res.ExitCode != 0 || r.res.Overlay == nil || len(r.res.Overlay.Files) != 2 {
		t.Fatalf("first command: exit %d, overlay %+v, stderr %q", r.res.ExitCode, r.res.Overlay, r.stderr)
	}
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	first := warmOf(t, b1, ws)
	if len(first) != 1 || len(slotFiles(t, ws)) != 1 {
		t.Fatalf("after Close: warm containers %v, released states %v; want one of each", first, slotFiles(t, ws))
	}
	writeFiles(t, ws, map[string]string{"host.txt": "edit\n"})

	b2 := newDocker(t, WithReuse(2*time.Minute))
	r = execShell(t, b2, ws, `ls; cat README host.txt`)
	if r.res.ExitCode != 0 || r.stdout != "README\nhost.txt\nhello\nedit\n" {
		t.Fatalf("second command: exit %d, stdout %q, stderr %q", r.res.ExitCode, r.stdout, r.stderr)
	}
	if len(slotFiles(t, ws)) != 0 {
		t.Errorf("the slot is held but its state is still on disk: %v", slotFiles(t, ws))
	}
	if now := warmOf(t, b2, ws); len(now) != 1 || now[0] != first[0] {
		t.Errorf("warm containers %v, want the first one (%.12s) taken over", now, first[0])
	}
}

// A collector (Collect, which every sandbox opening on the engine runs,
// in any process) holds a released slot's lock while it looks at the
// container: a holder coming just then waits for the look to end and
// takes the container over, rather than passing the slot over and
// starting a container of its own.
func TestDockerWarmTakeOverWaitsOutACollectorsLook(t *testing.T) {
	ws := t.TempDir()
	b1 := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, b1, ws, `true`)
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	first, states := warmOf(t, b1, ws), slotFiles(t, ws)
	if len(first) != 1 || len(states) != 1 {
		t.Fatalf("after Close: warm containers %v, released states %v; want one of each", first, states)
	}
	// The wait's bound out of reach, so that a loaded machine cannot make
	// the look outlast it by luck; the look itself is far shorter.
	old := releasedLockWait
	releasedLockWait = time.Minute
	defer func() { releasedLockWait = old }()
	look, err := os.OpenFile(strings.TrimSuffix(states[0], ".json")+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(look.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		look.Close()
		t.Fatal(err)
	}
	looked := make(chan struct{})
	go func() {
		defer close(looked)
		time.Sleep(50 * time.Millisecond) // a look
		look.Close()                      // drops the lock
	}()
	defer func() { <-looked }()
	b2 := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, b2, ws, `true`)
	if now := warmOf(t, b2, ws); len(now) != 1 || now[0] != first[0] {
		t.Errorf("warm containers %v, want the released one (%.12s) taken over", now, first[0])
	}
}

// A holder that lost its slot without releasing it (as a process killed
// mid-command does: the lock goes with it, the state was never written
// back) leaves a container nobody reuses: the next holder removes it and
// makes a new one.
func TestDockerWarmUnreleasedContainerIsReplaced(t *testing.T) {
	ws := t.TempDir()
	b1 := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, b1, ws, `echo left > left.txt`)
	old := warmOf(t, b1, ws)
	if len(old) != 1 {
		t.Fatalf("warm containers %v, want one", old)
	}
	b1.mu.Lock()
	for _, bx := range b1.boxes {
		bx.slot.release() // the lock is gone, nothing written back
		bx.slot = nil     // and Close will not release it
		bx.id = ""
	}
	b1.mu.Unlock()

	b2 := newDocker(t, WithReuse(2*time.Minute))
	r := execShell(t, b2, ws, `ls`)
	if r.res.ExitCode != 0 || r.stdout != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want an empty workspace", r.res.ExitCode, r.stdout, r.stderr)
	}
	if !gone(b2, old[0]) {
		t.Errorf("the unreleased container %.12s is still there", old[0])
	}
	if now := warmOf(t, b2, ws); len(now) != 1 || now[0] == old[0] {
		t.Errorf("warm containers %v, want one new one", now)
	}
}

// Two Backends at once in one workspace (two CLI processes) get two
// containers; each released one is taken over again later.
func TestDockerWarmConcurrentHoldersGetTheirOwn(t *testing.T) {
	ws := t.TempDir()
	b1 := newDocker(t, WithReuse(2*time.Minute))
	b2 := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, b1, ws, `true`)
	execShell(t, b2, ws, `true`)
	both := warmOf(t, b1, ws)
	if len(both) != 2 {
		t.Fatalf("warm containers %v, want two", both)
	}
	for _, b := range []*Backend{b1, b2} {
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b3 := newDocker(t, WithReuse(2*time.Minute))
	b4 := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, b3, ws, `true`)
	execShell(t, b4, ws, `true`)
	if now := warmOf(t, b3, ws); len(now) != 2 || !(now[0] == both[0] && now[1] == both[1] || now[0] == both[1] && now[1] == both[0]) {
		t.Errorf("warm containers %v, want the two released ones %v", now, both)
	}
}

// A warm container ends itself after its idle lifetime, and the engine
// removes it.
func TestDockerWarmIdleContainerEndsItself(t *testing.T) {
	ws := t.TempDir()
	b := newDocker(t, reuseFor(6*time.Second))
	execShell(t, b, ws, `true`)
	ids := warmOf(t, b, ws)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 {
		t.Fatalf("warm containers %v, want one", ids)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !gone(b, ids[0]) {
		if time.Now().After(deadline) {
			t.Fatalf("container %.12s still there long after its idle lifetime", ids[0])
		}
		time.Sleep(time.Second)
	}
}

// Collect (Reconcile, `pulse gc`) leaves a held and a fresh released
// container alone, and removes one whose idle lifetime is over and one
// whose holder went away without releasing it.
func TestDockerWarmCollect(t *testing.T) {
	ws := t.TempDir()
	held := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, held, ws, `true`)
	fresh := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, fresh, ws, `true`)
	if err := fresh.Close(); err != nil {
		t.Fatal(err)
	}
	gc := newDocker(t)
	removed, err := gc.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range removed {
		for _, w := range warmOf(t, gc, ws) {
			if id == w {
				t.Fatalf("Collect removed %.12s, held or fresh", id)
			}
		}
	}
	if n := len(warmOf(t, gc, ws)); n != 2 {
		t.Fatalf("%d warm containers, want 2", n)
	}

	// The released one's last use an hour ago: expired.
	state, st := releasedState(t, ws)
	st.LastUsed = time.Now().Add(-time.Hour)
	data, _ := json.Marshal(&st)
	if err := os.WriteFile(state, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// The held one's holder goes away without releasing it.
	var heldID string
	held.mu.Lock()
	for _, bx := range held.boxes {
		heldID = bx.id
		bx.slot.release()
		bx.slot, bx.id = nil, ""
	}
	held.mu.Unlock()

	removed, err = gc.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Collectors of other processes on this engine (other packages'
	// tests, CLI runs) may look at these containers too: one takes a
	// slot's lock while it does, so this Collect may take it for a live
	// holder's and leave the container to that one, which removes it. So
	// the check is that both go, by whichever collector, in a bound.
	deadline := time.Now().Add(30 * time.Second)
	for !(gone(gc, st.Container) && gone(gc, heldID)) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		if _, err := gc.Collect(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if !gone(gc, st.Container) || !gone(gc, heldID) || len(warmOf(t, gc, ws)) != 0 {
		t.Errorf("first Collect removed %v; want %.12s (expired) and %.12s (unreleased) gone; left %v", removed, st.Container, heldID, warmOf(t, gc, ws))
	}
}

// A command whose report cannot be read leaves base in a state the
// backend does not know: the next command's sync rebuilds base, so what
// the lost command wrote is not seen (the sessions contract), in the
// same process and after a takeover.
func TestDockerLostOverlayDoesNotLeakIntoTheNextCommand(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"keep.txt": "kept\n"})
	b := newDocker(t, WithReuse(2*time.Minute))
	old := maxOverlayBytes
	maxOverlayBytes = 1 << 10
	var out strings.Builder
	r, err := b.Exec(context.Background(), shellReq(ws, `head -c 4096 /dev/zero > big.bin`, &out))
	maxOverlayBytes = old
	if err == nil || r == nil || r.Overlay != nil {
		t.Fatalf("want the overlay lost: result %+v, err %v", r, err)
	}
	got := execShell(t, b, ws, `ls`)
	if got.stdout != "keep.txt\n" {
		t.Fatalf("after a lost overlay: ls = %q, want only keep.txt", got.stdout)
	}
	maxOverlayBytes = 1 << 10
	_, _ = b.Exec(context.Background(), shellReq(ws, `head -c 4096 /dev/zero > big2.bin`, &out))
	maxOverlayBytes = old
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2 := newDocker(t, WithReuse(2*time.Minute))
	got = execShell(t, b2, ws, `ls`)
	if got.stdout != "keep.txt\n" {
		t.Fatalf("after a takeover: ls = %q, want only keep.txt", got.stdout)
	}
}

func shellReq(ws, script string, out *strings.Builder) *backend.Request {
	return &backend.Request{ExecutionID: "test", Workspace: ws, Shell: script, Stdout: out, Stderr: out, Network: policy.DenyAllNetwork()}
}

// A cache directory removed and made again (pulse cache prune) between
// two processes is another directory: the later command gets a container
// that binds the new one, not the warm one whose bind shows it deleted.
func TestDockerWarmCacheMadeAgainIsMountedAgain(t *testing.T) {
	ws := t.TempDir()
	dir := filepath.Join(t.TempDir(), "c")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	withCache := func(r *backend.Request) {
		r.Caches = []backend.Cache{{Name: "c", HostDir: dir, Path: "/cache/c"}}
	}
	b1 := newDocker(t, WithReuse(2*time.Minute))
	if r := execShell(t, b1, ws, `echo one > /cache/c/a`, withCache); r.res.ExitCode != 0 {
		t.Fatalf("first: exit %d: %s", r.res.ExitCode, r.stderr)
	}
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b2 := newDocker(t, WithReuse(2*time.Minute))
	if r := execShell(t, b2, ws, `echo two > /cache/c/b`, withCache); r.res.ExitCode != 0 {
		t.Fatalf("after the cache was made again: exit %d: %s", r.res.ExitCode, r.stderr)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "b")); err != nil || string(data) != "two\n" {
		t.Errorf("the new cache directory holds %q, %v", data, err)
	}
}

// A model file that is not the one the released state names (another
// release's, or a torn write) is not trusted: base is made again from the
// workspace, so what the earlier command wrote is not seen.
func TestDockerWarmModelOfAnotherReleaseIsNotTrusted(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"README": "hello\n"})
	b1 := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, b1, ws, `echo one > a.txt`)
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	models, _ := filepath.Glob(filepath.Join(ws, ".pulse", "docker", "*", "*.model"))
	if len(models) != 1 {
		t.Fatalf("model files %v, want one", models)
	}
	// An empty model would say base holds nothing, so that a.txt, which
	// base does hold, would never be removed.
	if err := os.WriteFile(models[0], encodeWarmModel("other", map[string]string{}), 0o600); err != nil {
		t.Fatal(err)
	}
	b2 := newDocker(t, WithReuse(2*time.Minute))
	if r := execShell(t, b2, ws, `ls`); r.stdout != "README\n" {
		t.Fatalf("after a foreign model: stdout %q, stderr %q", r.stdout, r.stderr)
	}
}

// A holder whose model did not change (no sync sent anything, the
// command changed nothing) releases with the model file it read, not
// written again; the next holder still syncs from it exactly (a host edit
// is seen), and a model that changed is written under a new id.
func TestDockerWarmUnchangedModelIsNotWrittenAgain(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"README": "hello\n"})
	released := func(b *Backend) (string, os.FileInfo) {
		t.Helper()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		state, st := releasedState(t, ws)
		if st.ModelID == "" {
			t.Fatalf("released state %+v names no model", st)
		}
		model := strings.TrimSuffix(state, ".json") + ".model"
		mdata, err := os.ReadFile(model)
		if err != nil || decodeWarmModel(mdata, st.ModelID) == nil {
			t.Fatalf("%s does not hold the model %s names: %v", model, st.ModelID, err)
		}
		info, err := os.Stat(model)
		if err != nil {
			t.Fatal(err)
		}
		return st.ModelID, info
	}
	// README's signature is stable once it is past the racy window.
	st, err := os.Stat(filepath.Join(ws, "README"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(st.ModTime().Add(racyWindow + 100*time.Millisecond)))

	b1 := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, b1, ws, `echo one > a.txt`) // merged into base: the model changes
	id1, _ := released(b1)
	b2 := newDocker(t, WithReuse(2*time.Minute))
	if r := execShell(t, b2, ws, `ls`); r.stdout != "README\n" { // the sync removes a.txt
		t.Fatalf("second command: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	id2, info2 := released(b2)
	if id2 == id1 {
		t.Fatalf("the model changed but kept its id %s", id1)
	}
	b3 := newDocker(t, WithReuse(2*time.Minute))
	if r := execShell(t, b3, ws, `cat README`); r.stdout != "hello\n" || r.res.Overlay == nil || len(r.res.Overlay.Files)+len(r.res.Overlay.Deleted) != 0 {
		t.Fatalf("third command: stdout %q, overlay %+v, stderr %q", r.stdout, r.res.Overlay, r.stderr)
	}
	id3, info3 := released(b3)
	if id3 != id2 || !os.SameFile(info2, info3) || !info3.ModTime().Equal(info2.ModTime()) {
		t.Errorf("nothing changed, yet the model file was written again (id %s -> %s)", id2, id3)
	}
	writeFiles(t, ws, map[string]string{"README": "edited\n"})
	b4 := newDocker(t, WithReuse(2*time.Minute))
	if r := execShell(t, b4, ws, `cat README`); r.stdout != "edited\n" {
		t.Fatalf("after a host edit: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	if id4, _ := released(b4); id4 == id3 {
		t.Errorf("the sync changed the model but it kept its id %s", id3)
	}
}

// The reconcile stamp is trusted only as this user's regular file,
// changed within the interval.
func TestReconcileStamp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "stamp")
	if recentStamp(p, time.Minute) {
		t.Fatal("a missing stamp is recent")
	}
	touchStamp(p)
	if !recentStamp(p, time.Minute) {
		t.Fatal("a stamp just touched is not recent")
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	if recentStamp(p, time.Minute) {
		t.Fatal("a stamp older than the interval is recent")
	}
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(p, future, future); err != nil {
		t.Fatal(err)
	}
	if recentStamp(p, time.Minute) {
		t.Fatal("a stamp from the future is recent")
	}
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if recentStamp(link, time.Minute) {
		t.Fatal("a symlink counts as a stamp")
	}
	before, _ := os.Stat(target)
	touchStamp(link)
	if after, _ := os.Stat(target); !after.ModTime().Equal(before.ModTime()) || after.Size() != 0 {
		t.Fatal("touchStamp wrote through a symlink")
	}
}

// A model reads back as it was written, and nothing else does: another
// id, a torn file, an empty name, a name holding a newline (unlisted).
func TestWarmModelEncoding(t *testing.T) {
	m := map[string]string{"a": "d|755", "a/b c": "w|644|1|2|3|4", "l": "l|../x"}
	data := encodeWarmModel("id1", m)
	got := decodeWarmModel(data, "id1")
	if len(got) != len(m) {
		t.Fatalf("decoded %v, want %v", got, m)
	}
	for k, v := range m {
		if got[k] != v {
			t.Fatalf("decoded %v, want %v", got, m)
		}
	}
	for name, bad := range map[string][]byte{
		"other id":   data,
		"torn":       data[:len(data)-3],
		"empty name": append(append([]byte(nil), data...), 0, 'x', 0),
		"newline":    encodeWarmModel("id1", map[string]string{"a": "d|755", "p\nq": "w|644|1|2|3|4"}),
	} {
		id := "id1"
		if name == "other id" {
			id = "id2"
		}
		if decodeWarmModel(bad, id) != nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// .pulse/ at the top of a working copy is never reported (the wrapper
// prunes it from every listing, and the host refuses it), so what a
// command writes there must not outlive it: the next command on the
// same container, here running as the same uid on the copy it left,
// sees the workspace plus the pending stack, with no .pulse/ in it. A
// directory and a symlink, each in a command that writes nothing else,
// so that base stays of the generation the copy was kept with.
func TestDockerKeptCopyDropsAnUnreportedDotPulse(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"keep.txt": "kept\n"})
	// Past the sync's racy window (racyWindowFine; a coarse clock's is
	// longer, and only makes the check below pass for another reason), so
	// that no sync sends keep.txt again.
	time.Sleep(racyWindowFine + 100*time.Millisecond)
	b := newDocker(t, WithReuse(2*time.Minute))
	for _, plant := range []string{
		`mkdir .pulse && echo planted > .pulse/note`,
		`ln -s /tmp .pulse`,
	} {
		r := execShell(t, b, ws, plant+` && ls -A`)
		if r.res.ExitCode != 0 || !strings.Contains(r.stdout, ".pulse") {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", plant, r.res.ExitCode, r.stdout, r.stderr)
		}
		if r.res.Overlay != nil && (len(r.res.Overlay.Files) > 0 || len(r.res.Overlay.Deleted) > 0) {
			t.Fatalf("%s: overlay %+v, want nothing reported", plant, r.res.Overlay)
		}
		got := execShell(t, b, ws, `id -u; ls -A`)
		if got.stdout != "20000\nkeep.txt\n" {
			t.Fatalf("after %s: id -u; ls -A = %q, want 20000 and only keep.txt", plant, got.stdout)
		}
	}
}

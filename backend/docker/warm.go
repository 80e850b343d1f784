package docker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/internal/boxrt"
	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/pathguard"
)

// Warm reuse across processes (WithReuse). A CLI process runs one command
// and ends; without reuse each pays for a container of its own. With it,
// a container outlives the process that made it and a later process on
// the same workspace and settings takes it over, with the model of its
// base (sync.go), so that the sessions contract holds exactly as within
// one process.
//
// State, per workspace, under .pulse/docker/KEY/ (KEY hashes everything
// fixed when a container is made: image id, network mode, hidden paths,
// caches, limits, sizes, tools, the scripts), one slot N per container:
//
//	N.lock   flock'd (exclusive) by the process holding the slot, from
//	         its first command until Close: one process per container,
//	         so concurrent CLI commands take different slots
//	N.nonce  the pulse.warm.nonce label of the slot's current container,
//	         written before that container is created
//	N.json   the released state: container id, start time, when it was
//	         last used, the id of its model (warmState)
//	N.model  the model of its base (sync.go), apart, so that Collect and
//	         Reconcile, which read every slot's N.json, do not parse it
//
// N.json exists only while nobody holds the slot: a holder reads it and
// removes it before it touches the container, and writes it back in
// Close when what base holds is known. A holder that died (SIGKILL,
// crash) leaves no N.json, so the next holder removes that container and
// makes a new one: a base whose state would have to be guessed is never
// used. The file is replaced by rename; it is not fsynced, because what
// it describes (a running container's tmpfs) does not survive the
// machine going down either, and the start time in it tells a restarted
// container apart.
//
// Idle lifetime: the container's main process exits, and the engine
// removes it (AutoRemove), after idle seconds with no process but itself
// (warmIdleCmd). A holder does not take a container within warmMargin of
// that end. Reconcile and Collect (`pulse gc`) remove warm containers
// that expired, whose slot lost track of them, or whose holder died.

// Labels of warm containers.
const (
	LabelWarm      = "pulse.warm"       // the slot: <workspace>/.pulse/docker/<key>/<n>
	LabelWarmNonce = "pulse.warm.nonce" // matches <slot>.nonce while the slot owns it
	LabelWarmIdle  = "pulse.warm.idle"  // its idle lifetime in seconds
)

// warmSlots bounds the warm containers per workspace and settings; a
// process that finds every slot held runs on a container of its own,
// removed at Close, as without reuse.
const warmSlots = 4

// warmFormat is the version of N.json and of what a container's layout
// means; a change makes older state unusable (its container is removed).
const warmFormat = 2

// DefaultReuseIdle is the idle lifetime the CLI gives warm containers.
const DefaultReuseIdle = 5 * time.Minute

// warmPoll is how often a warm container looks for activity.
const warmPoll = 5

// WithReuse keeps the backend's containers for later processes: Close
// leaves each one running, for at most idle without a command, and a
// Backend of another process (or this one, later) on the same workspace
// and settings takes it over instead of creating one. idle is rounded up
// to whole seconds and must be at least a minute (the margin kept before
// a container's end is a fraction of it). See warm.go for the state kept
// under the workspace's .pulse/docker/.
func WithReuse(idle time.Duration) Option {
	return func(o *options) error {
		if idle < time.Minute {
			return fmt.Errorf("docker: WithReuse: idle lifetime %s is under a minute", idle)
		}
		o.reuseIdle = idle
		return nil
	}
}

// warmMargin is how long before its idle end a container is no longer
// taken: enough for a holder to reach its first exec, and for the poll.
func warmMargin(idle time.Duration) time.Duration {
	return min(idle/4, 30*time.Second)
}

type warmState struct {
	Format    int               `json:"format"`
	Key       string            `json:"key"`
	Workspace string            `json:"workspace"`
	Container string            `json:"container"`
	Nonce     string            `json:"nonce"`
	Started   string            `json:"started"`
	LastUsed  time.Time         `json:"last_used"`
	ModelID   string            `json:"model_id"` // of N.model; "": base must be rebuilt
	Model     map[string]string `json:"-"`        // read from N.model; nil: base must be rebuilt (sync.go)
}

// N.model holds what base holds, with the id N.json names, so that a
// model written for another release is never taken for this one: the
// magic line with the id, then path NUL signature NUL for every entry (no
// path or signature holds a NUL). Not JSON: a workspace of thousands of
// files makes a model of hundreds of kilobytes, which every command reads
// and writes, and JSON's escaping and maps cost tens of milliseconds.
const warmModelMagic = "pulse-docker-model 1 "

func encodeWarmModel(id string, model map[string]string) []byte {
	n := len(warmModelMagic) + len(id) + 1
	for p, sig := range model {
		n += len(p) + len(sig) + 2
	}
	out := make([]byte, 0, n)
	out = append(out, warmModelMagic...)
	out = append(out, id...)
	out = append(out, '\n')
	for p, sig := range model {
		out = append(out, p...)
		out = append(out, 0)
		out = append(out, sig...)
		out = append(out, 0)
	}
	return out
}

// decodeWarmModel returns the model in data when it is one of id, else
// nil (base is then rebuilt by the first sync).
func decodeWarmModel(data []byte, id string) map[string]string {
	head := warmModelMagic + id + "\n"
	if id == "" || !bytes.HasPrefix(data, []byte(head)) {
		return nil
	}
	data = data[len(head):]
	m := make(map[string]string, bytes.Count(data, []byte{0})/2)
	for len(data) > 0 {
		i := bytes.IndexByte(data, 0)
		if i <= 0 {
			return nil
		}
		j := bytes.IndexByte(data[i+1:], 0)
		if j <= 0 {
			return nil
		}
		if bytes.IndexByte(data[:i], '\n') >= 0 {
			// Base holds a name the sync's lists cannot carry (put
			// there by a release that copied such names in, unlisted):
			// it is made again.
			return nil
		}
		m[string(data[:i])] = string(data[i+1 : i+1+j])
		data = data[i+1+j+1:]
	}
	return m
}

// warmSlot is a slot this process holds.
type warmSlot struct {
	path  string // <dir>/<n>, the LabelWarm value
	key   string
	nonce string
	lock  *os.File
}

func (s *warmSlot) file(ext string) string { return s.path + "." + ext }

// warmKey hashes what a container is made with, so that only a container
// made exactly so is taken over.
func (b *Backend) warmKey(ctx context.Context, key boxKey) (string, error) {
	b.mu.Lock()
	img := b.imageID
	b.mu.Unlock()
	if img == "" {
		insp, err := b.cli.ImageInspect(ctx, b.o.image)
		if err != nil {
			return "", fmt.Errorf("docker: inspecting image %q: %w", b.o.image, err)
		}
		img = insp.ID
	}
	h := sha256.New()
	l := b.o.limits
	for _, part := range []string{
		strconv.Itoa(warmFormat), img, key.workspace, string(key.network), key.hidden, key.caches,
		strconv.FormatInt(l.MemoryBytes, 10), strconv.FormatFloat(l.CPUs, 'g', -1, 64), strconv.FormatInt(l.Pids, 10),
		strconv.FormatInt(tmpfsBytes, 10), strconv.FormatInt(b.o.scratchSize, 10), strconv.FormatInt(l.DiskBytes, 10), b.tools, strconv.FormatInt(int64(b.o.reuseIdle/time.Second), 10),
		runtimePath, seccompJSON(), b.chanKey(), boxrt.Identity(),
	} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	if key.lane != "" {
		// A fork's containers apart from its parent's; the default
		// lane's key is the one it always had.
		h.Write([]byte("lane\x00" + key.lane))
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

// warmIdleCmd is a warm container's main process, the runtime's idle
// step: it ends the container once no other process has run in it for
// the reuse idle time.
func (b *Backend) warmIdleCmd() []string {
	return []string{runtimePath, "idle", strconv.FormatInt(int64((b.o.reuseIdle+time.Second-1)/time.Second), 10), strconv.Itoa(warmPoll)}
}

// chanIdleCmd is warmIdleCmd for a container with a request channel: the
// same idle end, and the listener (channel.go).
func (b *Backend) chanIdleCmd() []string {
	return append(b.warmIdleCmd(), chanMount, strconv.Itoa(sandboxUID), strconv.Itoa(sandboxGID))
}

// chanKey is the warm key's part for the channel: containers with one and
// without one are never taken for each other.
func (b *Backend) chanKey() string {
	if b.chanUsable() {
		return chanVersion
	}
	return ""
}

// acquireWarm finds a slot for key: it takes over the released container
// of the first free slot when that one is usable (returning its state),
// or readies the slot for a new container (a nil state). It returns a
// nil slot when every slot is held.
func (b *Backend) acquireWarm(ctx context.Context, key boxKey) (*warmSlot, *warmState, error) {
	kh, err := b.warmKey(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	dir := filepath.Join(key.workspace, pathguard.ReservedDir, "docker", kh)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("docker: warm container state: %w", err)
	}
	for n := range warmSlots {
		s := &warmSlot{path: filepath.Join(dir, strconv.Itoa(n)), key: kh}
		f, err := os.OpenFile(s.file("lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("docker: warm container state: %w", err)
		}
		if err := lockSlot(f, s); err != nil {
			f.Close()
			if errors.Is(err, flock.ErrLocked) {
				continue // another process holds it
			}
			return nil, nil, fmt.Errorf("docker: locking %s: %w", s.file("lock"), err)
		}
		s.lock = f
		st, err := b.takeOver(ctx, s, key)
		if err != nil {
			s.release()
			return nil, nil, err
		}
		if st != nil {
			return s, st, nil
		}
		// A new container for this slot: its nonce is on disk before
		// the container exists, so that Collect never takes it for an
		// orphan.
		s.nonce = randomID()
		if err := writeFileAtomic(s.file("nonce"), []byte(s.nonce)); err != nil {
			s.release()
			return nil, nil, fmt.Errorf("docker: warm container state: %w", err)
		}
		return s, nil, nil
	}
	return nil, nil, nil
}

// releasedLockWait bounds how long lockSlot waits for the lock of a slot
// whose container is released (a variable for a test).
var releasedLockWait = time.Second

// lockSlot takes s's lock, open as f, without waiting for a holder. A
// live holder has no N.json (a takeover removes it, a new container has
// none until its release), so a lock that is taken while N.json is there
// belongs to a collector looking at the released container (Collect,
// which every sandbox opening on the engine runs) or to a taker about to
// remove N.json: each a moment, after which the container can be taken
// over (or is gone, or held), so lockSlot waits for it, boundedly,
// instead of passing the slot over and starting a container of its own.
// It returns flock.ErrLocked for a held slot.
func lockSlot(f *os.File, s *warmSlot) error {
	deadline := time.Now().Add(releasedLockWait)
	for {
		err := flock.TryLock(f)
		if !errors.Is(err, flock.ErrLocked) || time.Now().After(deadline) {
			return err
		}
		if _, serr := os.Lstat(s.file("json")); serr != nil {
			return err // held: nothing released
		}
		time.Sleep(time.Millisecond)
	}
}

// takeOver reads the held slot's released state and returns it when its
// container can be used as it is; otherwise it removes whatever
// container the slot had and returns nil.
func (b *Backend) takeOver(ctx context.Context, s *warmSlot, key boxKey) (*warmState, error) {
	data, err := os.ReadFile(s.file("json"))
	if errors.Is(err, fs.ErrNotExist) {
		// Never released: a first use, or a holder that died while it
		// held the container. Its base cannot be trusted.
		if nonce, err := os.ReadFile(s.file("nonce")); err == nil {
			b.removeByNonce(ctx, string(nonce))
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("docker: warm container state: %w", err)
	}
	// Held from here on: removed before the container is touched, so a
	// death from now on leaves the slot unreleased.
	if err := os.Remove(s.file("json")); err != nil {
		return nil, fmt.Errorf("docker: warm container state: %w", err)
	}
	var st warmState
	why := ""
	if err := json.Unmarshal(data, &st); err != nil {
		why = "unreadable state"
	} else {
		why = b.usable(ctx, s, key, &st)
	}
	if why != "" {
		b.log.Debug("not reusing warm container", "slot", s.path, "container", st.Container, "why", why)
		if st.Container != "" {
			_ = b.remove(ctx, st.Container)
		}
		if st.Nonce != "" {
			b.removeByNonce(ctx, st.Nonce)
		}
		return nil, nil
	}
	s.nonce = st.Nonce
	st.Model = readWarmModel(s, st.ModelID)
	return &st, nil
}

// readWarmModel returns the model in s's N.model when it has the id id;
// else nil, and base is rebuilt by the first sync.
func readWarmModel(s *warmSlot, id string) map[string]string {
	if id == "" {
		return nil
	}
	data, err := os.ReadFile(s.file("model"))
	if err != nil {
		return nil
	}
	return decodeWarmModel(data, id)
}

// usable says why st's container cannot be taken over, "" when it can.
func (b *Backend) usable(ctx context.Context, s *warmSlot, key boxKey, st *warmState) string {
	if st.Format != warmFormat || st.Key != s.key || st.Workspace != key.workspace || st.Container == "" {
		return "state of other settings"
	}
	if time.Since(st.LastUsed) > b.o.reuseIdle-warmMargin(b.o.reuseIdle) {
		return "idle lifetime (nearly) over"
	}
	insp, err := b.inspectRun(ctx, st.Container)
	if err != nil {
		return "container gone"
	}
	switch {
	case insp.State == nil || !insp.State.Running || insp.State.Restarting || insp.State.Paused:
		return "container not running"
	case insp.State.StartedAt != st.Started:
		return "container restarted" // its tmpfs, base with it, is gone
	case insp.Config == nil || insp.Config.Labels[LabelWarm] != s.path || insp.Config.Labels[LabelWarmNonce] != st.Nonce:
		return "container of another slot"
	}
	return ""
}

// removeByNonce removes the container labelled with nonce, if any.
func (b *Backend) removeByNonce(ctx context.Context, nonce string) {
	list, err := b.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelWarmNonce+"="+nonce))})
	if err != nil {
		return
	}
	for _, c := range list {
		b.log.Info("removing a warm container whose state is unknown", "container", c.ID)
		_ = b.remove(ctx, c.ID)
	}
}

// warmLabels are the labels of a container made for slot s.
func (b *Backend) warmLabels(s *warmSlot) map[string]string {
	l := make(map[string]string, len(b.labels)+3)
	for k, v := range b.labels {
		l[k] = v
	}
	l[LabelWarm] = s.path
	l[LabelWarmNonce] = s.nonce
	l[LabelWarmIdle] = strconv.FormatInt(int64(b.o.reuseIdle/time.Second), 10)
	return l
}

// releaseWarm hands the box's container on: with its model written to
// the slot when what base holds is known and nothing runs in it, else
// the container is removed. Either way the slot is unlocked.
func (b *Backend) releaseWarm(ctx context.Context, bx *box) error {
	s := bx.slot
	defer s.release()
	bx.mu.Lock()
	idle := bx.idle
	bx.idle = nil
	bx.mu.Unlock()
	for _, w := range idle {
		w.close() // the loop ends at EOF; the container's idle clock starts
	}
	ss := &bx.sync
	ss.mu.Lock()
	model, saved, running, poisoned := ss.model, ss.saved, ss.running, bx.poisoned
	ss.mu.Unlock()
	if poisoned || running > 0 || bx.started == "" {
		return b.remove(ctx, bx.id)
	}
	st := warmState{Format: warmFormat, Key: s.key, Workspace: bx.key.workspace, Container: bx.id, Nonce: s.nonce,
		Started: bx.started, LastUsed: time.Now()}
	var err error
	switch {
	case model != nil && saved != "":
		// N.model holds it already: this process only read it (and
		// held the slot, so nobody else wrote it since).
		st.ModelID = saved
	case model != nil:
		// The model first: N.json, which names it, is what releases.
		st.ModelID = randomID()
		err = writeFileAtomic(s.file("model"), encodeWarmModel(st.ModelID, model))
	}
	var data []byte
	if err == nil {
		data, err = json.Marshal(&st)
	}
	if err == nil {
		err = writeFileAtomic(s.file("json"), data)
	}
	if err != nil {
		_ = b.remove(ctx, bx.id)
		return fmt.Errorf("docker: saving the warm container's state: %w", err)
	}
	return nil
}

func (s *warmSlot) release() {
	if s.lock != nil {
		s.lock.Close() // drops the flock
		s.lock = nil
	}
}

// writeFileAtomic replaces name by data through a temporary file and a
// rename, so a reader sees the old file or the new one.
func writeFileAtomic(name string, data []byte) error {
	tmp := name + ".tmp" + randomID()
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// collectWarm decides about a warm container found by Collect, and
// removes it, under its slot's lock, when it is not running, its slot
// does not know it, its idle lifetime is over, or its state is neither
// released nor held (its holder died). It leaves it while a live process
// holds its slot (a container still being made included) or while it is
// released and fresh.
func (b *Backend) collectWarm(ctx context.Context, c container.Summary) (bool, error) {
	slot := c.Labels[LabelWarm]
	if !filepath.IsAbs(slot) || filepath.Clean(slot) != slot ||
		!strings.Contains(slot, "/"+pathguard.ReservedDir+"/docker/") {
		return true, b.remove(ctx, c.ID)
	}
	nonce, err := os.ReadFile(slot + ".nonce")
	if err != nil || string(nonce) != c.Labels[LabelWarmNonce] {
		return true, b.remove(ctx, c.ID) // the slot moved on to another container
	}
	f, err := os.OpenFile(slot+".lock", os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return true, b.remove(ctx, c.ID)
	}
	defer f.Close()
	if err := flock.TryLock(f); err != nil {
		return false, nil // held by a live process, which owns this container
	}
	data, err := os.ReadFile(slot + ".json")
	var st warmState
	if err != nil || json.Unmarshal(data, &st) != nil || st.Container != c.ID {
		return true, b.remove(ctx, c.ID) // its holder died: never released
	}
	idle, err := strconv.Atoi(c.Labels[LabelWarmIdle])
	if c.State == "running" && err == nil && time.Since(st.LastUsed) <= time.Duration(idle)*time.Second {
		return false, nil
	}
	_ = os.Remove(slot + ".json")
	return true, b.remove(ctx, c.ID)
}

package cowfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"time"
)

// DefaultLane is the lane of every transaction begun without WithLane,
// and of every transaction written before lanes existed.
const DefaultLane = ""

// ErrLane: a lane named by WithLane does not exist or cannot be read.
var ErrLane = errors.New("cowfs: lane")

// maxLaneDepth bounds how many forks deep a lane may be: the parent
// chain is walked for every transaction a stack considers, and a crafted
// lane file must not make it loop.
const maxLaneDepth = 64

// laneRec is the record of a lane, lanes/<id>: one frame (see record.go)
// holding this JSON object. A lane sees its own transactions and, through
// its parent, those of the parent lane's stack created up to Cut, but for
// the ones listed in Exclude (commands of the parent still running when
// the fork was made). It is written once (temp, fsync, rename, fsync of
// lanes/) and never changed.
type laneRec struct {
	V       int      `json:"v"`
	ID      string   `json:"id"`
	Parent  string   `json:"parent,omitempty"`
	Cut     int64    `json:"cut"`
	Exclude []string `json:"exclude,omitempty"`
}

// maxExclude bounds a lane record's exclusion list (each entry is a
// command that was running when the fork was made).
const maxExclude = 4096

func encodeLane(r laneRec) ([]byte, error) {
	p, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if len(p) > maxRecord {
		return nil, fmt.Errorf("cowfs: lane record of %d bytes", len(p))
	}
	return appendFrame(nil, p), nil
}

// decodeLane parses a lane file: exactly one whole, valid frame.
func decodeLane(b []byte) (laneRec, error) {
	var r laneRec
	frames, _, err := decodeFrames(b)
	if err != nil {
		return r, fmt.Errorf("%w: %w", errCorrupt, err)
	}
	if len(frames) != 1 {
		return r, fmt.Errorf("%w: lane file holds %d records", errCorrupt, len(frames))
	}
	if err := json.Unmarshal(frames[0], &r); err != nil {
		return r, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	switch {
	case r.V != 1:
		return r, fmt.Errorf("%w: lane record version %d", errCorrupt, r.V)
	case !validID(r.ID):
		return r, fmt.Errorf("%w: lane id %q", errCorrupt, r.ID)
	case r.Parent != DefaultLane && !validID(r.Parent), r.Parent == r.ID:
		return r, fmt.Errorf("%w: lane parent %q", errCorrupt, r.Parent)
	case r.Cut <= 0:
		return r, fmt.Errorf("%w: lane cut %d", errCorrupt, r.Cut)
	case len(r.Exclude) > maxExclude:
		return r, fmt.Errorf("%w: lane excludes %d transactions", errCorrupt, len(r.Exclude))
	}
	for _, id := range r.Exclude {
		if !validID(id) {
			return r, fmt.Errorf("%w: lane excludes %q", errCorrupt, id)
		}
	}
	return r, nil
}

// WithLane opens the FS on lane id (from FS.Fork): its Stack, Begin,
// Squash, CommitAll and DiscardAll work on that lane. The default is
// DefaultLane.
func WithLane(id string) Option {
	return func(o *options) error {
		if id != DefaultLane && !validID(id) {
			return fmt.Errorf("%w: bad lane id %q", ErrLane, id)
		}
		o.lane = id
		return nil
	}
}

// Lane returns the FS's lane.
func (f *FS) Lane() string { return f.opts.lane }

// LaneInfo describes a lane, as Lanes lists it.
type LaneInfo struct {
	ID     string    `json:"id"`
	Parent string    `json:"parent"`
	Forked time.Time `json:"forked"`
	Err    string    `json:"error,omitempty"` // the lane file cannot be read
}

// laneSet is the lanes of a workspace as read at one instant.
type laneSet struct {
	recs map[string]laneRec
	bad  map[string]error
}

// readLanesLocked reads every lane record. Lane files never change once
// written, so each is read once per FS (by name, inode and size).
func (f *FS) readLanesLocked() (*laneSet, error) {
	names, err := f.readDirNames("lanes")
	if err != nil {
		if isNotExist(err) {
			return &laneSet{recs: map[string]laneRec{}}, nil
		}
		return nil, fmt.Errorf("cowfs: lanes: %w", err)
	}
	ls := &laneSet{recs: map[string]laneRec{}}
	if f.laneCache == nil {
		f.laneCache = map[string]laneRec{}
	}
	for _, n := range names {
		if !validID(n) {
			continue
		}
		if r, ok := f.laneCache[n]; ok {
			ls.recs[n] = r
			continue
		}
		b, err := f.state.ReadFile("lanes/" + n)
		if err == nil {
			var r laneRec
			if r, err = decodeLane(b); err == nil && r.ID != n {
				err = fmt.Errorf("%w: lane file %s holds lane %s", errCorrupt, n, r.ID)
			}
			if err == nil {
				f.laneCache[n] = r
				ls.recs[n] = r
				continue
			}
		}
		if ls.bad == nil {
			ls.bad = map[string]error{}
		}
		ls.bad[n] = err
	}
	for n := range f.laneCache {
		if _, ok := ls.recs[n]; !ok {
			delete(f.laneCache, n)
		}
	}
	return ls, nil
}

// sees reports whether lane's stack holds t: t is lane's own, or lane's
// parent's stack held it at the fork (created up to the cut, not
// excluded), and so on up the chain.
func (ls *laneSet) sees(lane string, t *StackTx) bool {
	limit := int64(math.MaxInt64)
	created := t.Created.UnixNano()
	cur := lane
	for range maxLaneDepth {
		if t.Lane == cur {
			return created <= limit
		}
		if cur == DefaultLane {
			return false
		}
		r, ok := ls.recs[cur]
		if !ok {
			return false
		}
		for _, id := range r.Exclude {
			if id == t.ID {
				return false
			}
		}
		limit = min(limit, r.Cut)
		cur = r.Parent
	}
	return false
}

// check reports a lane that cannot be used: unreadable, missing, or with
// a parent chain that does not end in the default lane.
func (ls *laneSet) check(lane string) error {
	cur := lane
	for range maxLaneDepth {
		if cur == DefaultLane {
			return nil
		}
		if err := ls.bad[cur]; err != nil {
			return fmt.Errorf("%w %s: %w", ErrLane, cur, err)
		}
		r, ok := ls.recs[cur]
		if !ok {
			return fmt.Errorf("%w %s does not exist", ErrLane, cur)
		}
		cur = r.Parent
	}
	return fmt.Errorf("%w %s: forked more than %d deep", ErrLane, lane, maxLaneDepth)
}

// all lists the lanes a stack check must consider: the default lane and
// every readable one.
func (ls *laneSet) all() []string {
	out := []string{DefaultLane}
	for id := range ls.recs {
		out = append(out, id)
	}
	sort.Strings(out[1:])
	return out
}

// Fork makes a new lane whose stack starts as this FS's lane's stack: it
// sees every transaction that stack holds now (without copying any) and,
// from then on, only its own. Transactions this lane makes later, and
// commands of this lane still running now (their transactions are empty),
// are not part of the fork. It returns the new lane's id, for WithLane.
func (f *FS) Fork(ctx context.Context) (string, error) {
	unlock, err := f.lock(ctx)
	if err != nil {
		return "", err
	}
	defer unlock()
	st, err := f.stackLocked()
	if err != nil {
		return "", err
	}
	r := laneRec{V: 1, ID: newID(), Parent: f.opts.lane, Cut: time.Now().UnixNano()}
	for _, t := range st.Txs {
		if t.Created.UnixNano() > r.Cut {
			r.Cut = t.Created.UnixNano() // a clock stepped back: keep what the stack holds
		}
	}
	// Excluded: the empty transactions of commands still running, and
	// every transaction the stack could not read now (being committed,
	// damaged), which may come back below the cut.
	ids, err := f.txIDs()
	if err != nil {
		return "", err
	}
	read := map[string]*StackTx{}
	for _, t := range st.all {
		read[t.ID] = t
	}
	for _, id := range ids {
		if t := read[id]; t == nil || t.Empty() && st.lanes.sees(f.opts.lane, t) {
			r.Exclude = append(r.Exclude, id)
		}
	}
	if len(r.Exclude) > maxExclude {
		return "", fmt.Errorf("%w: %d commands running; cannot fork now", ErrLane, len(r.Exclude))
	}
	b, err := encodeLane(r)
	if err != nil {
		return "", err
	}
	if err := f.state.Mkdir("lanes", 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("cowfs: fork: %w", err)
	}
	tmp := "lanes/.new-" + r.ID
	if err := f.writeFileSync(tmp, b); err != nil {
		f.state.Remove(tmp)
		return "", fmt.Errorf("cowfs: fork: %w", err)
	}
	if err := f.state.Rename(tmp, "lanes/"+r.ID); err != nil {
		f.state.Remove(tmp)
		return "", fmt.Errorf("cowfs: fork: %w", err)
	}
	if err := f.syncState("lanes"); err != nil {
		return "", err
	}
	if err := f.holdLaneLocked(r.ID); err != nil {
		return "", fmt.Errorf("cowfs: fork: %w", err)
	}
	return r.ID, nil
}

// Lanes lists the forked lanes of the workspace (not the default one),
// after removing the records nothing needs any more (lanegc.go).
func (f *FS) Lanes(ctx context.Context) ([]LaneInfo, error) {
	unlock, err := f.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := f.pruneLanesLocked(); err != nil {
		return nil, err
	}
	ls, err := f.readLanesLocked()
	if err != nil {
		return nil, err
	}
	var out []LaneInfo
	for id, r := range ls.recs {
		out = append(out, LaneInfo{ID: id, Parent: r.Parent, Forked: time.Unix(0, r.Cut).UTC()})
	}
	for id, err := range ls.bad {
		out = append(out, LaneInfo{ID: id, Err: err.Error()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// checkLaneOpen refuses to open an FS on a lane that does not exist or
// cannot be read.
func (f *FS) checkLaneOpen(ctx context.Context) error {
	if f.opts.lane == DefaultLane {
		return nil
	}
	unlock, err := f.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	ls, err := f.readLanesLocked()
	if err != nil {
		return err
	}
	if err := ls.check(f.opts.lane); err != nil {
		return err
	}
	if err := f.holdLaneLocked(f.opts.lane); err != nil {
		return fmt.Errorf("%w %s: %w", ErrLane, f.opts.lane, err)
	}
	return nil
}

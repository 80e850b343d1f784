package cowfs

import (
	"encoding/json"
	"fmt"
)

// walFile is a decoded WAL: everything needed to roll a commit forward
// without the stage log.
type walFile struct {
	ID      string
	Desc    string
	Created int64
	Undoes  string
	Ops     []walOp
}

type walOp struct {
	change
	// Prev is true when the previous content was saved as prev/<index>.
	Prev bool
	// Dir is the inode of the directory the op works in (its parent) as
	// validation found it, when that directory is neither the workspace
	// nor an op (whose before image says it): a directory there with
	// another inode is another directory, the one validated renamed away
	// and something put in its place. 0 when not recorded (a WAL from
	// before it was).
	Dir uint64
}

type walRec struct {
	T       string  `json:"t"` // header, op, end
	V       int     `json:"v,omitempty"`
	Tx      string  `json:"tx,omitempty"`
	Desc    string  `json:"desc,omitempty"`
	Created int64   `json:"created,omitempty"`
	Undoes  string  `json:"undoes,omitempty"`
	N       int     `json:"n,omitempty"`
	I       int     `json:"i,omitempty"`
	Change  *change `json:"change,omitempty"`
	Prev    bool    `json:"prev,omitempty"`
	Dir     uint64  `json:"dir,omitempty"`
}

const walVersion = 1

func encodeWAL(w *walFile) ([]byte, error) {
	var buf []byte
	add := func(r walRec) error {
		p, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf = appendFrame(buf, p)
		return nil
	}
	if err := add(walRec{T: "header", V: walVersion, Tx: w.ID, Desc: w.Desc, Created: w.Created, Undoes: w.Undoes, N: len(w.Ops)}); err != nil {
		return nil, err
	}
	for i := range w.Ops {
		c := w.Ops[i].change
		if err := add(walRec{T: "op", I: i, Change: &c, Prev: w.Ops[i].Prev, Dir: w.Ops[i].Dir}); err != nil {
			return nil, err
		}
	}
	if err := add(walRec{T: "end", N: len(w.Ops)}); err != nil {
		return nil, err
	}
	return buf, nil
}

// decodeWAL parses and checks a WAL. It trusts nothing: every frame must
// be whole and pass its checksum, the op count must match the header and
// the end record, and every path must be clean, relative and outside
// .pulse. Any fault is an error; a WAL is never partially applied.
func decodeWAL(b []byte) (*walFile, error) {
	frames, _, err := decodeFrames(b)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	if len(frames) < 2 {
		return nil, fmt.Errorf("wal: %w: %d records", errCorrupt, len(frames))
	}
	recs := make([]walRec, len(frames))
	for i, p := range frames {
		if err := json.Unmarshal(p, &recs[i]); err != nil {
			return nil, fmt.Errorf("wal: %w: record %d: %v", errCorrupt, i, err)
		}
	}
	h := recs[0]
	if h.T != "header" || h.V != walVersion || !validID(h.Tx) {
		return nil, fmt.Errorf("wal: %w: bad header", errCorrupt)
	}
	if h.Undoes != "" {
		if _, _, ok := parseDone(h.Undoes); !ok {
			return nil, fmt.Errorf("wal: %w: bad undo target %q", errCorrupt, h.Undoes)
		}
	}
	if h.N != len(recs)-2 {
		return nil, fmt.Errorf("wal: %w: header says %d ops, found %d records", errCorrupt, h.N, len(recs))
	}
	end := recs[len(recs)-1]
	if end.T != "end" || end.N != h.N {
		return nil, fmt.Errorf("wal: %w: missing or bad end record", errCorrupt)
	}
	w := &walFile{ID: h.Tx, Desc: h.Desc, Created: h.Created, Undoes: h.Undoes, Ops: make([]walOp, 0, h.N)}
	seen := make(map[string]bool, h.N)
	for i, r := range recs[1 : len(recs)-1] {
		if r.T != "op" || r.I != i || r.Change == nil {
			return nil, fmt.Errorf("wal: %w: bad op record %d", errCorrupt, i)
		}
		if err := checkChange(r.Change); err != nil {
			return nil, fmt.Errorf("wal: op %d: %w", i, err)
		}
		if seen[r.Change.Path] {
			return nil, fmt.Errorf("wal: %w: %q appears twice", errCorrupt, r.Change.Path)
		}
		seen[r.Change.Path] = true
		if r.Prev && r.Change.Before.Type != typeFile {
			return nil, fmt.Errorf("wal: %w: op %d saves previous bytes of a %q", errCorrupt, i, r.Change.Before.Type)
		}
		w.Ops = append(w.Ops, walOp{change: *r.Change, Prev: r.Prev, Dir: r.Dir})
	}
	if err := checkShape(w.Ops); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	return w, nil
}

// checkShape refuses a set of changes that creates something beneath a
// path it makes a file, symlink or deletion. Staging never produces one
// (the parents of a created path are staged as directories), but applied
// in order it would create the entry through the new symlink, somewhere
// else than its path says, and a link's ".." would climb from there.
func checkShape(ops []walOp) error {
	kind := make(map[string]ChangeKind, len(ops))
	for i := range ops {
		kind[ops[i].Path] = ops[i].Kind
	}
	for i := range ops {
		if ops[i].Kind == KindDelete {
			continue
		}
		for _, a := range ancestors(ops[i].Path) {
			if k, ok := kind[a]; ok && k != KindMkdir {
				return fmt.Errorf("%w: %q is created beneath a %s of %q", errCorrupt, ops[i].Path, k, a)
			}
		}
	}
	return nil
}

// removesFirst reports whether applying op removes the entry at its path
// before anything is created there.
func removesFirst(op *walOp) bool {
	switch {
	case op.Kind == KindDelete:
		return true
	case op.Kind == KindMkdir:
		return op.Before.Type == typeFile || op.Before.Type == typeSymlink
	default:
		return op.Before.Type == typeDir
	}
}

func matchesAfter(op *walOp, cur snapshot) bool {
	switch op.Kind {
	case KindDelete:
		return cur.Type == typeAbsent
	case KindWrite:
		return cur.Type == typeFile && cur.SHA == op.Blob && cur.Mode == op.Mode
	case KindSymlink:
		return cur.Type == typeSymlink && cur.Target == op.Target
	case KindMkdir:
		// An implicit directory that existed keeps its mode; one the
		// commit creates must have the staged mode to count as done.
		return cur.Type == typeDir && (op.Implicit && op.Before.Type == typeDir || cur.Mode == op.Mode)
	}
	return false
}

// encodeAfter frames the after-images of a commit, one per op in WAL
// order: the one encoder of the after file that decodeAfter reads (the
// commit writes it, and an undo rewrites its predecessor's). A commit
// without ops gets a single "{}" frame, which decodeAfter skips.
func encodeAfter(afters []snapshot) ([]byte, error) {
	var buf []byte
	for _, a := range afters {
		p, err := json.Marshal(a)
		if err != nil {
			return nil, err
		}
		buf = appendFrame(buf, p)
	}
	if len(buf) == 0 {
		buf = appendFrame(buf, []byte("{}"))
	}
	return buf, nil
}

func decodeAfter(b []byte, n int) ([]snapshot, error) {
	frames, _, err := decodeFrames(b)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	if len(frames) != n {
		return nil, fmt.Errorf("%w: %d after-images for %d changes", errCorrupt, len(frames), n)
	}
	out := make([]snapshot, n)
	for i, p := range frames {
		if err := json.Unmarshal(p, &out[i]); err != nil {
			return nil, fmt.Errorf("%w: %v", errCorrupt, err)
		}
	}
	return out, nil
}

// writeWAL puts w in place as dir/wal through a synced temp file: the
// rename is the commit point. The directory is not yet synced.
func (f *FS) writeWAL(dir string, w *walFile) error {
	b, err := encodeWAL(w)
	if err != nil {
		return err
	}
	if err := f.writeFileSync(dir+"/wal.tmp", b); err != nil {
		return fmt.Errorf("cowfs: commit: %w", err)
	}
	failpoint(fpWALTemp)
	if err := f.state.Rename(dir+"/wal.tmp", dir+"/wal"); err != nil {
		return fmt.Errorf("cowfs: commit: %w", err)
	}
	return nil
}

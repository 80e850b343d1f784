package cowfs

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// ContentHashes returns, for each staged write, the hex SHA-256 of the
// bytes the commit would write, by path, as this Tx last read them. A
// review records them so that what a person approved can be matched to
// the file that landed.
func (t *Tx) ContentHashes() map[string]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]string, len(t.changes))
	for p, c := range t.changes {
		if c.Kind == KindWrite {
			out[p] = c.Blob
		}
	}
	return out
}

// Unstaged is what Unstage took out of a transaction: Paths, sorted, and
// the changes themselves, so that Restage can put them back.
type Unstaged struct {
	Paths   []string
	changes []change
}

// Unstage takes paths out of the transaction (a reviewer rejected them),
// so that a later Commit applies the rest. A path takes along what is
// staged beneath it, a staged deletion of one of its ancestors (which
// could not be applied without it), and directories staged only to hold
// what is now gone. Each path must be staged (ErrNotFound otherwise).
// Nothing in the workspace changes, and the staged bytes stay until the
// transaction ends, so Restage can undo it.
func (t *Tx) Unstage(ctx context.Context, paths ...string) (Unstaged, error) {
	rels := make([]string, 0, len(paths))
	for _, p := range paths {
		rel, err := cleanRel(t.fs.ws.dir, p)
		if err != nil {
			return Unstaged{}, err
		}
		rels = append(rels, rel)
	}
	var out []string
	var saved []change
	err := t.stageOp(ctx, func() ([]stageRec, error) {
		t.mu.Lock()
		defer t.mu.Unlock()
		gone := map[string]bool{}
		for _, rel := range rels {
			if t.changes[rel] == nil {
				return nil, fmt.Errorf("%w: %q is not staged in transaction %s", ErrNotFound, rel, t.id)
			}
			for q := range t.changes {
				if q == rel || strings.HasPrefix(q, rel+"/") {
					gone[q] = true
				}
			}
			for _, a := range ancestors(rel) {
				if c := t.changes[a]; c != nil && c.Kind == KindDelete {
					for q := range t.changes {
						if q == a || strings.HasPrefix(q, a+"/") {
							gone[q] = true
						}
					}
				}
			}
		}
		// Directories made only to hold what went: deepest first, so a
		// chain of them empties from the bottom.
		for changed := true; changed; {
			changed = false
			for q, c := range t.changes {
				if gone[q] || c.Kind != KindMkdir || !c.Implicit {
					continue
				}
				empty, held := true, false
				for r := range t.changes {
					if strings.HasPrefix(r, q+"/") {
						if !gone[r] {
							empty = false
							break
						}
						held = true
					}
				}
				if empty && held {
					gone[q], changed = true, true
				}
			}
		}
		out = make([]string, 0, len(gone))
		for q := range gone {
			out = append(out, q)
		}
		sort.Strings(out)
		saved = make([]change, 0, len(out))
		for _, q := range out {
			saved = append(saved, *t.changes[q])
		}
		recs := make([]stageRec, 0, len(out))
		for _, q := range out {
			recs = append(recs, stageRec{Op: "unstage", Path: q})
		}
		return recs, nil
	})
	if err != nil {
		return Unstaged{}, err
	}
	return Unstaged{Paths: out, changes: saved}, nil
}

// Restage puts back what Unstage took out, exactly as it was staged
// (the snapshot each change was first staged against included, so a
// commit still notices what changed in the workspace since). A path
// staged again meanwhile keeps its newer change.
func (t *Tx) Restage(ctx context.Context, u Unstaged) error {
	return t.stageOp(ctx, func() ([]stageRec, error) {
		t.mu.Lock()
		defer t.mu.Unlock()
		var recs []stageRec
		for i := range u.changes {
			c := u.changes[i]
			if t.changes[c.Path] != nil {
				continue
			}
			recs = append(recs, stageRec{Op: "set", Change: &c})
		}
		return recs, nil
	})
}

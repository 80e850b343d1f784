package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
)

// checkStack refuses, audited, to commit or discard transaction id alone
// while another pending transaction depends on it (see cowfs.StackError).
// A commit's check reads the stack only when there is another pending
// transaction (cowfs.FS.CheckCommit).
func (r *Review) checkStack(ctx context.Context, action, id string) error {
	var err error
	if action == "commit" {
		err = r.cow.CheckCommit(ctx, id)
	} else {
		var st *cowfs.Stack
		if st, err = r.cow.Stack(ctx); err == nil {
			err = st.CheckDiscard(id)
		}
	}
	if se := (*cowfs.StackError)(nil); errors.As(err, &se) {
		r.refused(ctx, action, id, id, err)
	}
	return err
}

// CommitAll applies the whole pending stack, in order, as one crash-safe
// commit (see cowfs.FS.CommitAll), and returns the paths written and the
// transactions committed. Each path is audited with the transaction of
// the squash that carried it.
func (r *Review) CommitAll(ctx context.Context) (paths, ids []string, err error) {
	return r.commitAll(ctx, nil)
}

// commitAll is CommitAll; a non-nil want commits only that stack (see
// cowfs.FS.CommitStack).
func (r *Review) commitAll(ctx context.Context, want []string) (paths, ids []string, err error) {
	if want != nil {
		paths, ids, err = r.cow.CommitStack(ctx, want)
	} else {
		paths, ids, err = r.cow.CommitAll(ctx)
	}
	if err != nil {
		r.refused(ctx, "commit", "", "pending stack", err)
		return nil, nil, err
	}
	if len(ids) == 0 {
		return nil, nil, nil
	}
	e := r.event("commit", "")
	e.Target, e.Decision = "pending stack", "allow"
	e.Detail = fmt.Sprintf("committed the pending stack of %d transaction(s): %s", len(ids), strings.Join(ids, " "))
	evs := []audit.Event{e}
	for _, p := range paths {
		pe := r.event("commit", "")
		pe.Target, pe.Decision, pe.Detail = p, "allow", "committed with the pending stack"
		evs = append(evs, pe)
	}
	r.record(ctx, evs)
	return paths, ids, nil
}

// DiscardAll drops every pending transaction (but the empty ones of
// commands still running) and returns their ids.
func (r *Review) DiscardAll(ctx context.Context) ([]string, error) {
	ids, err := r.cow.DiscardAll(ctx)
	evs := make([]audit.Event, 0, len(ids))
	for _, id := range ids {
		e := r.event("discard", id)
		e.Target, e.Decision, e.Detail = id, "allow", "discarded transaction "+id+" (discard --all)"
		evs = append(evs, e)
	}
	r.record(ctx, evs)
	if err != nil {
		r.refused(ctx, "discard", "", "pending stack", err)
	}
	return ids, err
}

// Squash replaces the pending stack by one transaction with the same
// effect (see cowfs.FS.Squash); the per-command audit events stay.
func (r *Review) Squash(ctx context.Context) (string, []string, error) {
	id, gone, err := r.cow.Squash(ctx, 0)
	if err != nil {
		r.refused(ctx, "squash", "", "pending stack", err)
		return "", nil, err
	}
	if len(gone) > 0 {
		r.record(ctx, []audit.Event{squashEvent(r.event("squash", id), id, gone)})
	}
	return id, gone, nil
}

func squashEvent(e audit.Event, id string, gone []string) audit.Event {
	e.Target, e.Decision = id, "allow"
	e.Detail = fmt.Sprintf("%d pending transactions squashed into %s: %s", len(gone), id, strings.Join(gone, " "))
	return e
}

// CommitAllPaths commits the ticked paths of the whole pending stack as
// one commit: the stack is squashed into one transaction (see Squash),
// and of that transaction only accept is committed, every other staged
// change rejected (see CommitPaths). A path ticked that the stack's net
// change does not hold (written, then removed again) has nothing to
// commit and is skipped. accept nil is CommitAll. A refused commit leaves
// the squashed transaction pending, whole.
func (r *Review) CommitAllPaths(ctx context.Context, accept []string) (paths, ids []string, err error) {
	if accept == nil {
		return r.CommitAll(ctx)
	}
	id, gone, err := r.Squash(ctx)
	if err != nil {
		return nil, nil, err
	}
	if id == "" {
		return nil, nil, nil
	}
	tx, err := r.tx(ctx, "commit", id)
	if err != nil {
		return nil, nil, err
	}
	staged := map[string]bool{}
	for _, c := range tx.Changes() {
		staged[c.Path] = true
	}
	var keep []string
	for _, p := range accept {
		if staged[p] {
			keep = append(keep, p)
		}
	}
	if len(keep) == 0 {
		return nil, nil, fmt.Errorf("sandbox: review: %w: no ticked path is in the pending stack's net change (squashed into %s); discard it instead", cowfs.ErrNotFound, id)
	}
	if paths, err = r.CommitPaths(ctx, id, keep); err != nil {
		return nil, nil, err
	}
	if len(gone) == 0 {
		gone = []string{id}
	}
	return paths, gone, nil
}

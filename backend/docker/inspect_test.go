package docker

import (
	"context"
	"testing"
	"time"
)

// The engine's own answer, decoded in part, says what the client's full
// inspect says of a warm container: running, since when, its labels; and
// of a removed one that it is gone.
func TestDockerInspectRunIsTheClients(t *testing.T) {
	ws := t.TempDir()
	b := newDocker(t, WithReuse(2*time.Minute))
	execShell(t, b, ws, "true")
	var id string
	b.mu.Lock()
	for _, bx := range b.boxes {
		id = bx.id
	}
	b.mu.Unlock()
	ctx := context.Background()
	full, err := b.cli.ContainerInspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	direct, ok := b.inspectRunDirect(ctx, id)
	if !ok {
		t.Fatalf("no direct answer for %s over %s (API %s)", id, b.cli.DaemonHost(), b.cli.ClientVersion())
	}
	ri, err := b.inspectRun(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// The fallback's conversion of the client's answer, which over a
	// unix socket inspectRun does not reach.
	for _, got := range []runInspect{direct, ri, runInspectOf(full)} {
		if got.State == nil || got.Config == nil || !got.State.Running || got.State.Paused || got.State.Restarting ||
			got.State.StartedAt != full.State.StartedAt || got.State.StartedAt == "" ||
			got.Config.Labels[LabelWarm] != full.Config.Labels[LabelWarm] || got.Config.Labels[LabelWarm] == "" ||
			got.Config.Labels[LabelWarmNonce] != full.Config.Labels[LabelWarmNonce] || len(got.Config.Labels) != len(full.Config.Labels) {
			t.Errorf("inspect: %+v %+v, the client's: %+v %+v", got.State, got.Config, full.State, full.Config.Labels)
		}
	}
	if err := b.remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.inspectRunDirect(ctx, id); ok {
		t.Error("a removed container got a direct answer")
	}
	if _, err := b.inspectRun(ctx, id); err == nil {
		t.Error("a removed container: no error")
	}
}

package backend

import "context"

type afterKey struct{}

// WithBackgroundAfter returns a ctx under which the background work a
// backend leaves after a command (the namespace backend's start of the
// init the next command takes) waits until after is closed, instead of
// starting as the command ends. A resident pulse closes it once the
// client has the command's exit status: the work then runs while the
// client exits and the next command is still to come, not on the two
// processors the command's own end and the client's exit need.
// A backend that is closed meanwhile does not wait.
func WithBackgroundAfter(ctx context.Context, after <-chan struct{}) context.Context {
	return context.WithValue(ctx, afterKey{}, after)
}

// BackgroundAfter returns the channel WithBackgroundAfter put in ctx;
// nil (start at once) when none.
func BackgroundAfter(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(afterKey{}).(<-chan struct{})
	return ch
}

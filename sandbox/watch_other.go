//go:build !linux

package sandbox

import "log/slog"

// watchNotifier has no inotify here: Watch polls.
type watchNotifier struct{ wake chan struct{} }

func newWatchNotifier(root, rel string, log *slog.Logger) *watchNotifier { return nil }

func (n *watchNotifier) close() {}

func (n *watchNotifier) take() map[string]bool { return nil }

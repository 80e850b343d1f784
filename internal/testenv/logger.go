package testenv

import (
	"log/slog"
	"strings"
	"testing"
)

// Logger returns a logger that writes each record, at debug level and up,
// to t's log: shown for a failed test or with -v.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

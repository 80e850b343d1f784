package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
)

// TestProbeCacheFile: the probe record lives in the user's cache directory
// ($XDG_CACHE_HOME, else ~/.cache), and nowhere when neither is an
// absolute path (tests run with an empty environment, so they never write
// one); Diagnose (pulse doctor) never uses it.
func TestProbeCacheFile(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"XDG_CACHE_HOME": "/c", "HOME": "/h"}, "/c/pulse/probe-namespace"},
		{map[string]string{"HOME": "/h"}, "/h/.cache/pulse/probe-namespace"},
		{map[string]string{"XDG_CACHE_HOME": "rel", "HOME": "/h"}, "/h/.cache/pulse/probe-namespace"},
		{map[string]string{"HOME": "rel"}, ""},
		{nil, ""},
		{map[string]string{"HOME": "/h", "full": "1"}, ""},
	} {
		o := &options{getenv: func(k string) string { return tc.env[k] }, fullProbe: tc.env["full"] != ""}
		if got := o.probeCacheFile("namespace"); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.env, got, tc.want)
		}
	}
}

// TestBackendOptionsReachTheDriver: options given for a backend reach it
// when selection opens it, and one of another type than the backend's own
// Option fails New instead of passing the backend over (remote's is
// checked in its early probe).
func TestBackendOptionsReachTheDriver(t *testing.T) {
	env := map[string]string{"PULSE_REMOTE_URL": "ws://127.0.0.1:1", "PULSE_REMOTE_TOKEN": "t"}
	getenv := withGetenv(func(k string) string { return env[k] })
	for _, tc := range []struct {
		name string
		opts []Option
		bad  bool
	}{
		{"host option", []Option{WithBackendName("host"), WithBackendOptions("host", host.WithLogger(slog.New(slog.DiscardHandler)))}, false},
		{"host, another type", []Option{WithBackendName("host"), WithBackendOptions("host", "not an option")}, true},
		{"remote, another type", []Option{getenv, WithRemoteOptions(42)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]Option{WithUnsafeHostExecution(UnsafeNetwork, UnsafeSecrets), WithAuditLog(filepath.Join(t.TempDir(), "a.jsonl"))}, tc.opts...)
			sb, err := New(context.Background(), t.TempDir(), opts...)
			if err == nil {
				defer sb.Close()
			}
			if got := errors.Is(err, backend.ErrOptionType); got != tc.bad {
				t.Fatalf("New: %v; refused as an invalid option: %v, want %v", err, got, tc.bad)
			}
			if !tc.bad && sb.Backend().Name() != "host" {
				t.Errorf("selected %s, want host", sb.Backend().Name())
			}
		})
	}
}

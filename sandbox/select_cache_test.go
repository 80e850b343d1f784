package sandbox

import "testing"

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

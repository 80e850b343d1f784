package namespace

import (
	"errors"
	"path"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// FuzzCleanDir: Request.Dir comes from agents. Whatever it is, the result
// either is refused as an invalid request or names a directory inside the
// workspace and outside .pulse.
func FuzzCleanDir(f *testing.F) {
	for _, s := range []string{"", ".", "a/b", "../x", "a/../../x", "/etc", ".pulse", "a/../.pulse/x", "a//b/", "..", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dir string) {
		c, err := cleanDir(dir)
		if err != nil {
			if !errors.Is(err, backend.ErrInvalidRequest) {
				t.Fatalf("error %v is not ErrInvalidRequest", err)
			}
			return
		}
		if c != path.Clean(c) || strings.HasPrefix(c, "/") || c == ".." || strings.HasPrefix(c, "../") {
			t.Fatalf("cleanDir(%q) = %q leaves the workspace", dir, c)
		}
		j := path.Join("/ws", c)
		if j != "/ws" && !strings.HasPrefix(j, "/ws/") {
			t.Fatalf("cleanDir(%q) = %q joins to %q", dir, c, j)
		}
		if j == "/ws/.pulse" || strings.HasPrefix(j, "/ws/.pulse/") {
			t.Fatalf("cleanDir(%q) = %q is inside .pulse", dir, c)
		}
	})
}

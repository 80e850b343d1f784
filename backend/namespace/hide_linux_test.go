package namespace

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

func TestCheckHidden(t *testing.T) {
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "dir/secret"), "s")
	writeFile(t, filepath.Join(ws, "file"), "f")
	if err := os.Symlink("dir", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want error // nil: accepted
		kept bool  // in the set: it exists, or its directory does
	}{
		{"dir/secret", nil, true},
		{"dir", nil, true},
		{"link", nil, true},          // the link itself is hidden
		{"missing", nil, true},       // hidden ahead: its directory is there
		{"dir/missing", nil, true},   // likewise
		{"gone/missing", nil, false}, // no directory to put a whiteout in
		{"file/below", nil, false},
		{"link/secret", backend.ErrUnsupported, false},
		{"../escape", backend.ErrInvalidRequest, false},
		{"/abs", backend.ErrInvalidRequest, false},
		{"dir/../file", backend.ErrInvalidRequest, false},
		{".pulse/audit.jsonl", backend.ErrInvalidRequest, false},
		{"", backend.ErrInvalidRequest, false},
	} {
		set, err := checkHidden(ws, []string{tc.path})
		if tc.want != nil {
			if !errors.Is(err, tc.want) {
				t.Errorf("%q: %v, want %v", tc.path, err, tc.want)
			}
			continue
		}
		if err != nil || set[tc.path] != tc.kept {
			t.Errorf("%q: set %v, %v; want kept %v", tc.path, set, err, tc.kept)
		}
	}
}

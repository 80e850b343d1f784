package server

import (
	"io/fs"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

// TestSavedOverlayCarriesContentOnly: a local backend reports the FIFOs
// and device nodes a command left (backend.File); the overlay archive,
// which carries workspace content only and which PackOverlay refuses them
// in, is packed without them, so the command's writes are not lost for
// them.
func TestSavedOverlayCarriesContentOnly(t *testing.T) {
	ov := &backend.Overlay{
		Files: []backend.File{
			{Path: "a", Mode: 0o644, Data: []byte("a\n")},
			{Path: "d", Mode: fs.ModeDir | 0o755},
			{Path: "fifo", Mode: fs.ModeNamedPipe | 0o644},
			{Path: "l", Mode: fs.ModeSymlink | 0o777, Data: []byte("a")},
			{Path: "tty", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600},
		},
		Deleted: []string{"gone"},
	}
	if _, err := protocol.PackOverlay(ov); err == nil {
		t.Fatal("PackOverlay took a FIFO: the filter below is no longer needed, or the format changed")
	}
	data, err := protocol.PackOverlay(contentOnly(ov))
	if err != nil {
		t.Fatal(err)
	}
	got, err := protocol.UnpackOverlay(data, protocol.OverlayLimits{Bytes: 1 << 20, Members: 100})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range got.Files {
		paths = append(paths, f.Path)
	}
	if len(paths) != 3 || paths[0] != "a" || paths[1] != "d" || paths[2] != "l" || len(got.Deleted) != 1 || got.Deleted[0] != "gone" {
		t.Errorf("unpacked files %v, deleted %v; want a d l and gone", paths, got.Deleted)
	}
	if len(ov.Files) != 5 {
		t.Errorf("contentOnly changed the overlay it was given: %d files", len(ov.Files))
	}
}

package namespace

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// TestStreamFilesHandsLargeFilesByPath: with StreamFiles, a file of at
// least streamMin bytes comes back as a Source holding exactly what the
// command wrote, Data nil; a small one as Data. The overlay cannot be
// encoded until loaded, and Release removes the kept file. Without
// StreamFiles every file has Data.
func TestStreamFilesHandsLargeFilesByPath(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	shell := "head -c 2097152 /dev/zero | tr '\\0' 'a' > big && chmod 000 big && echo hi > small"
	res, _, _ := runCmd(t, b, &backend.Request{Workspace: ws, Shell: shell, StreamFiles: true})
	ov := res.Overlay
	defer ov.Release()
	want := bytes.Repeat([]byte("a"), 2<<20)
	var src string
	for _, f := range ov.Files {
		switch f.Path {
		case "big":
			if f.Source == "" || f.Data != nil || f.Mode.Perm() != 0 {
				t.Fatalf("big: source %q, %d bytes of data, mode %v", f.Source, len(f.Data), f.Mode)
			}
			src = f.Source
			got, err := f.Bytes()
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("big: %d bytes, err %v", len(got), err)
			}
		case "small":
			if f.Source != "" || string(f.Data) != "hi\n" {
				t.Fatalf("small: source %q, data %q", f.Source, f.Data)
			}
		}
	}
	if src == "" {
		t.Fatalf("big not in the overlay: %+v", ov.Files)
	}
	if _, err := json.Marshal(ov); !errors.Is(err, backend.ErrSourceNotLoaded) {
		t.Fatalf("encoding an overlay with a source: %v", err)
	}
	ov.Release()
	if _, err := os.Lstat(src); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("kept file %s after Release: %v", src, err)
	}

	res, _, _ = runCmd(t, b, &backend.Request{Workspace: ws, Shell: shell})
	for _, f := range res.Overlay.Files {
		if f.Source != "" || f.Path == "big" && !bytes.Equal(f.Data, want) {
			t.Fatalf("%s without StreamFiles: source %q, %d bytes", f.Path, f.Source, len(f.Data))
		}
	}
}

// TestOverlayLoad: Load reads every source into Data, after which the
// overlay encodes and outlives Release.
func TestOverlayLoad(t *testing.T) {
	b := newBackend(t)
	res, _, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: "head -c 1048576 /dev/zero > big", StreamFiles: true})
	ov := res.Overlay
	if err := ov.Load(); err != nil {
		t.Fatal(err)
	}
	ov.Release()
	if len(ov.Files) != 1 || ov.Files[0].Source != "" || len(ov.Files[0].Data) != 1<<20 {
		t.Fatalf("after Load: %+v", ov.Files)
	}
	if _, err := json.Marshal(ov); err != nil {
		t.Fatal(err)
	}
}

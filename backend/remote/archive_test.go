package remote

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/internal/server/artifact"
	"github.com/pulse-agent/pulse/protocol"
)

var testPackLimits = packLimits{compressed: DefaultMaxCompressed, unpacked: DefaultMaxUnpacked, members: DefaultMaxMembers}

// TestPackExtractsOnServer: what pack writes is what the server's own
// fail-closed extractor accepts, byte-exact, without .pulse/.
func TestPackExtractsOnServer(t *testing.T) {
	ws := t.TempDir()
	files := map[string][]byte{
		"a.txt":           []byte("alpha\n"),
		"dir/sub/b.bin":   {0, 1, 2, 255, 254},
		"empty":           {},
		"dir/exec.sh":     []byte("#!/bin/sh\n"),
		".pulse/state.db": []byte("private"),
		".hidden/c.txt":   []byte("c"),
	}
	for p, data := range files {
		full := filepath.Join(ws, filepath.FromSlash(p))
		os.MkdirAll(filepath.Dir(full), 0o755)
		os.WriteFile(full, data, 0o644)
	}
	os.Chmod(filepath.Join(ws, "dir/exec.sh"), 0o755)
	os.Mkdir(filepath.Join(ws, "emptydir"), 0o755)
	pk, err := pack(ws, []extraFile{{name: ".pulse-stdin-x", data: []byte("in")}}, testPackLimits)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "ws")
	if err := artifact.Extract(pk.data, dst, protocol.ArchiveLimits{}); err != nil {
		t.Fatalf("the server refuses the packed workspace: %v", err)
	}
	for p, want := range files {
		got, err := os.ReadFile(filepath.Join(dst, filepath.FromSlash(p)))
		if p == ".pulse/state.db" {
			if err == nil {
				t.Error(".pulse/ was sent")
			}
			continue
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %q, %v; want %q", p, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dst, "dir/exec.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("exec.sh lost its executable bit: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "emptydir")); err != nil || !fi.IsDir() {
		t.Errorf("empty directory not sent: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, ".pulse-stdin-x")); string(got) != "in" {
		t.Errorf("extra file: %q", got)
	}
}

// TestPackLeavesHiddenPathsOut: a hidden file, and a hidden directory
// with everything below it, are not in the upload; the rest is.
func TestPackLeavesHiddenPathsOut(t *testing.T) {
	ws := t.TempDir()
	for p, data := range map[string]string{".env": "secret", "secrets/a.pem": "secret", "conf/key.pem": "secret", "conf/app.yaml": "ok", "keep": "ok"} {
		full := filepath.Join(ws, filepath.FromSlash(p))
		os.MkdirAll(filepath.Dir(full), 0o755)
		os.WriteFile(full, []byte(data), 0o644)
	}
	lim := testPackLimits
	lim.hidden = map[string]bool{".env": true, "secrets": true, "conf/key.pem": true}
	pk, err := pack(ws, nil, lim)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "ws")
	if err := artifact.Extract(pk.data, dst, protocol.ArchiveLimits{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".env", "secrets", "conf/key.pem"} {
		if _, err := os.Lstat(filepath.Join(dst, filepath.FromSlash(p))); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("hidden %s was uploaded: %v", p, err)
		}
	}
	for _, p := range []string{"keep", "conf/app.yaml"} {
		if _, err := os.Lstat(filepath.Join(dst, filepath.FromSlash(p))); err != nil {
			t.Errorf("%s was left out: %v", p, err)
		}
	}
}

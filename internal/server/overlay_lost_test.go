package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/protocol"
)

// A command whose writes the server cannot keep must not look like one
// that wrote nothing.
func TestLostOverlayFailsTheExecution(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	c.submit("warm-1", "echo control > c.txt", nil)
	ctl, _ := c.untilResult("warm-1", nil)
	if ctl.Payload["artifact"] != true {
		t.Fatalf("control run has no artifact: %s", ctl.raw)
	}
	ents, _ := os.ReadDir(h.root)
	if len(ents) != 1 {
		t.Fatalf("tenant dirs: %v", ents)
	}
	tdir := filepath.Join(h.root, ents[0].Name())
	// Anything that makes saving the overlay fail (disk full, EIO, ...).
	if err := os.RemoveAll(filepath.Join(tdir, ".overlays")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tdir, ".overlays"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.submit("w-1", "echo important > result.txt", nil)
	res, _ := c.untilResult("w-1", nil)
	if res.Payload["error"] != protocol.ResultOverlayLost || res.Payload["artifact"] == true {
		t.Fatalf("lost writes not reported: %s", res.raw)
	}
	if st, _ := c.do(protocol.ActionStatus, map[string]any{"execution_id": "w-1"}); st.str("status") != protocol.StatusFailed {
		t.Fatalf("status = %s, want %s", st.raw, protocol.StatusFailed)
	}
}

package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend/host"
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

// A local executor that cannot read back what an in-place backend changed
// (here: more than its overlay limit of 4 bytes) reports the command as
// run, with its exit code and output, and its writes as lost, by code.
func TestExecutorLostOverlayIsReported(t *testing.T) {
	hb, err := host.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hb.Close() })
	h := startServer(t, t.TempDir(), NewLocal(hb, 4, nil))
	c := h.dial(tokenA)
	c.submit("lost-1", "echo ran; echo 0123456789 > big.txt; exit 3", nil)
	res, _ := c.untilResult("lost-1", nil)
	if res.Payload["error"] != protocol.ResultOverlayLost || res.str("error_code") != protocol.CodeOverlayLost ||
		res.Payload["artifact"] == true || res.num("exit_code") != 3 || res.str("stdout") != "ran\n" {
		t.Fatalf("lost writes not reported as a run that lost them: %s", res.raw)
	}
}

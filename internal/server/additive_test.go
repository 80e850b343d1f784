package server

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
)

// stdout joins the stream events of one execution, decoding base64 ones.
func joinStdout(t *testing.T, streams []msg) []byte {
	t.Helper()
	var out []byte
	for _, s := range streams {
		if s.str("stream") != "stdout" {
			continue
		}
		if s.str("encoding") == "base64" {
			b, err := base64.StdEncoding.DecodeString(s.str("data"))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b...)
		} else {
			out = append(out, s.str("data")...)
		}
	}
	return out
}

func hasFeature(m msg, name string) bool {
	list, _ := m.Payload["features"].([]any)
	for _, f := range list {
		if f == name {
			return true
		}
	}
	return false
}

// The stdin field reaches the command byte for byte; a submit without it
// gives the command an empty stdin, as before the field existed.
func TestSubmitStdin(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	caps, _ := c.do(ActionCapabilities, nil)
	if !hasFeature(caps, FeatureStdin) || caps.num("max_stdin_bytes") != MaxStdinBytes {
		t.Fatalf("capabilities do not advertise stdin: %s", caps.raw)
	}

	in := make([]byte, 300<<10)
	rand.Read(in)
	in[0], in[len(in)-1] = 0, '\n'
	c.submit("in-1", "cat", map[string]any{"stdin": base64.StdEncoding.EncodeToString(in), "encoding": "base64"})
	res, streams := c.untilResult("in-1", nil)
	if got := joinStdout(t, streams); !bytes.Equal(got, in) || res.num("exit_code") != 0 {
		t.Fatalf("stdin echoed as %d bytes (want %d), result %s", len(got), len(in), res.raw)
	}

	// An argv command gets stdin too, and an empty stdin is EOF.
	c.submit("in-2", []string{"wc", "-c"}, map[string]any{"stdin": ""})
	if res, _ := c.untilResult("in-2", nil); strings.TrimSpace(res.str("stdout")) != "0" {
		t.Fatalf("empty stdin: %s", res.raw)
	}

	// Without the field the command reads EOF at once.
	c.submit("in-3", "cat; echo end", nil)
	if res, _ := c.untilResult("in-3", nil); res.str("stdout") != "end\n" {
		t.Fatalf("no stdin: %s", res.raw)
	}

	for name, v := range map[string]any{
		"not base64": "***",
		"unpadded":   "YQ",
		"not string": 12,
		"too large":  base64.StdEncoding.EncodeToString(make([]byte, MaxStdinBytes+1)),
	} {
		if r := c.submit("in-bad-"+strings.ReplaceAll(name, " ", "-"), "cat", map[string]any{"stdin": v}); r.Type != TypeError || r.str("code") != codeInvalid {
			t.Fatalf("%s stdin: %s", name, r.raw)
		}
	}
}

// Through the relay, stdin rides on the run exec or, when larger than one
// piece, as a file sent in pieces beside the workspace.
func TestRelayStdin(t *testing.T) {
	rh := startRelay(t)
	c := rh.dial(tokenA)
	rh.startWorker(t, "w1", workerToken, "2")
	rh.waitWorkers(t, 1)

	c.submit("rs-small", "cat", map[string]any{"stdin": base64.StdEncoding.EncodeToString([]byte("to the worker\n"))})
	if res, _ := c.untilResult("rs-small", nil); res.str("stdout") != "to the worker\n" {
		t.Fatalf("small stdin: %s", res.raw)
	}

	rh.relay.o.stdinPiece = 4096
	defer func() { rh.relay.o.stdinPiece = defaultStdinPiece }()
	big := make([]byte, 50<<10)
	rand.Read(big)
	sum := sha256.Sum256(big)
	c.submit("rs-big", []string{"sha256sum"}, map[string]any{"stdin": base64.StdEncoding.EncodeToString(big)})
	res, _ := c.untilResult("rs-big", nil)
	if !strings.HasPrefix(res.str("stdout"), hex.EncodeToString(sum[:])) {
		t.Fatalf("big stdin: %s", res.raw)
	}
	// The stdin file is not part of the workspace, so no overlay.
	if res.Payload["artifact"] != false {
		t.Fatalf("stdin file leaked into the overlay: %s", res.raw)
	}

	c.submit("rs-none", "cat; echo end", nil)
	if res, _ := c.untilResult("rs-none", nil); res.str("stdout") != "end\n" {
		t.Fatalf("no stdin: %s", res.raw)
	}
}

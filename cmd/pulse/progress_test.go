package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
)

func TestProgressOnlyOnATerminal(t *testing.T) {
	// A pipe (as in CI, or a log) never gets a progress line.
	r, w, err := os.Pipe()
	must(t, err)
	defer r.Close()
	defer w.Close()
	if p := newProgress(&cliEnv{stderr: w}); p != nil {
		p.close()
		t.Fatal("a progress line on a pipe")
	}
	if p := newProgress(&cliEnv{stderr: &bytes.Buffer{}}); p != nil {
		t.Fatal("a progress line on a buffer")
	}
	var nilP *progress
	nilP.set("no-op")
	nilP.close()
}

func TestProgressDrawsASlowStepAndErasesIt(t *testing.T) {
	old := progressDelay
	progressDelay = 0
	defer func() { progressDelay = old }()
	var out testenv.SyncBuffer
	// The drawing, on a writer that stands in for the terminal the check
	// above requires.
	p := &progress{w: &out, quit: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	p.set("committing abc")
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "pulse: committing abc ("); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no progress line: %q", out.String())
		}
	}
	p.close()
	if s := out.String(); !strings.HasSuffix(s, "\r\033[K") || strings.Contains(s, "\n") {
		t.Fatalf("the line was not erased in place: %q", s)
	}
}

package main

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestFlagReferenceIsCurrent fails when docs/cli.md does not hold
// pulse-worker's flags as -help prints them with an empty environment;
// make docs rewrites the section.
func TestFlagReferenceIsCurrent(t *testing.T) {
	var help bytes.Buffer
	if code := run(context.Background(), []string{"-help"}, func(string) string { return "" }, io.Discard, &help); code != exitOK {
		t.Fatalf("pulse-worker -help: exit %d\n%s", code, help.String())
	}
	testenv.Generated(t, "../../docs/cli.md", "pulse-worker -help", "```text\n"+help.String()+"```\n")
}

package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/pulse-agent/pulse/internal/server/cli"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestFlagReferenceIsCurrent fails when docs/cli.md does not hold
// pulse-server's flags as -help prints them with an empty environment;
// make docs rewrites the section.
func TestFlagReferenceIsCurrent(t *testing.T) {
	var out, help bytes.Buffer
	env := cli.Env{Getenv: func(string) string { return "" }, Stdout: &out, Stderr: &help}
	if code := cli.Run(context.Background(), []string{"-help"}, env); code != cli.ExitOK {
		t.Fatalf("pulse-server -help: exit %d\n%s%s", code, out.String(), help.String())
	}
	testenv.Generated(t, "../../docs/cli.md", "pulse-server -help", "```text\n"+out.String()+help.String()+"```\n")
}

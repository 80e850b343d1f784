package main

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// cliDocPath is the page whose reference section is every command's help.
const cliDocPath = "../../docs/cli.md"

// helpText runs `pulse ARGS... --help` in-process, as a user who started
// the binary as "pulse" with an empty environment would see it.
func helpText(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(string) string { return "" }, prog: "pulse"}
	if code := run(context.Background(), env, append(args, "--help")); code != exitOK || errb.Len() != 0 {
		t.Fatalf("pulse %s --help: exit %d, stderr %q", strings.Join(args, " "), code, errb.String())
	}
	return out.String()
}

// cliReference renders the generated part of docs/cli.md: `pulse help`,
// then each command's help and each subcommand's, headed so that a link
// can name one (docs/cli.md#pulse-cow-commit).
func cliReference(t *testing.T) string {
	var b strings.Builder
	block := func(heading, text string) {
		fmt.Fprintf(&b, "%s\n\n```text\n%s\n```\n\n", heading, strings.TrimRight(text, "\n"))
	}
	block("### pulse", helpText(t))
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		block("### pulse "+n, helpText(t, n))
		for _, s := range commands[n].subcommands {
			block("#### pulse "+n+" "+s, helpText(t, n, s))
		}
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// TestCLIReferenceIsCurrent fails when docs/cli.md does not hold the
// commands' help as they print it now, so the reference cannot drift from
// the binary. With PULSE_UPDATE_DOCS=1 (make docs) it rewrites the section.
func TestCLIReferenceIsCurrent(t *testing.T) {
	testenv.Generated(t, cliDocPath, "pulse help", cliReference(t))
}

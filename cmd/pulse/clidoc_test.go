package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// docs/cli.md holds, between these markers, every command's help as the
// command prints it. Text outside them is written by hand and kept.
const (
	cliDocBegin = "<!-- BEGIN GENERATED: pulse help (make docs); edit the commands' help, not this -->"
	cliDocEnd   = "<!-- END GENERATED -->"
	cliDocPath  = "../../docs/cli.md"
	// updateDocsEnv makes TestCLIReferenceIsCurrent rewrite the file
	// instead of failing: `make docs` and `go generate ./cmd/pulse` set it.
	updateDocsEnv = "PULSE_UPDATE_DOCS"
)

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
// the binary. With PULSE_UPDATE_DOCS=1 it rewrites the generated part.
func TestCLIReferenceIsCurrent(t *testing.T) {
	data, err := os.ReadFile(cliDocPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	before, rest, ok1 := strings.Cut(doc, cliDocBegin+"\n")
	old, after, ok2 := strings.Cut(rest, cliDocEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s lacks the markers %q and %q around its generated part", cliDocPath, cliDocBegin, cliDocEnd)
	}
	want := cliReference(t)
	if old == want {
		return
	}
	if os.Getenv(updateDocsEnv) == "1" {
		out := before + cliDocBegin + "\n" + want + cliDocEnd + after
		if err := os.WriteFile(cliDocPath, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	abs, _ := filepath.Abs(cliDocPath)
	t.Fatalf("%s does not match the commands' help (first difference at line %d of its generated part): run `make docs` (or go generate ./cmd/pulse) and commit it",
		abs, firstDiffLine(old, want))
}

func firstDiffLine(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}

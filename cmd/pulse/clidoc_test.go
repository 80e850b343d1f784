package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// TestDocsCommandLinesUseRealFlags reads every pulse command line in the
// shell blocks of the README and docs/*.md and checks that its command,
// subcommand and flags exist, as `pulse CMD [SUB] --help` lists them: a
// renamed or removed flag fails here instead of in a reader's terminal.
func TestDocsCommandLinesUseRealFlags(t *testing.T) {
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../../README.md")
	flagsOf := map[string]map[string]bool{}
	known := func(path []string) map[string]bool {
		key := strings.Join(path, " ")
		if f, ok := flagsOf[key]; ok {
			return f
		}
		f := map[string]bool{"help": true, "h": true}
		for _, l := range strings.Split(helpText(t, path...), "\n") {
			if strings.HasPrefix(l, "  -") {
				// "  -name type" or, for a bool, "  -name\tusage".
				f[strings.Fields(strings.TrimPrefix(l, "  -"))[0]] = true
			}
		}
		flagsOf[key] = f
		return f
	}
	checked := 0
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range shellLines(string(data)) {
			words := pulseWords(line)
			if words == nil {
				continue
			}
			checked++
			c, ok := commands[words[0]]
			if !ok {
				t.Errorf("%s: %q: pulse has no command %q", filepath.Base(page), line, words[0])
				continue
			}
			path := []string{words[0]}
			rest := words[1:]
			if c.subcommands != nil && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
				if !slices.Contains(c.subcommands, rest[0]) {
					t.Errorf("%s: %q: pulse %s has no subcommand %q", filepath.Base(page), line, words[0], rest[0])
					continue
				}
				path = append(path, rest[0])
				rest = rest[1:]
			}
			flags := known(path)
			for _, w := range rest {
				if w == "--" {
					break
				}
				if !strings.HasPrefix(w, "-") || w == "-" {
					continue
				}
				name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
				if !flags[name] {
					t.Errorf("%s: %q: pulse %s has no flag -%s", filepath.Base(page), line, strings.Join(path, " "), name)
				}
			}
		}
	}
	t.Logf("%d pulse command lines checked", checked)
	if checked < 10 {
		t.Fatalf("only %d pulse command lines found in the docs: the scan is broken", checked)
	}
}

// shellLines returns the lines of a page's ```sh and ```console blocks,
// with backslash continuations joined and `$ ` prompts removed.
func shellLines(page string) []string {
	var out []string
	in := false
	cont := ""
	for _, l := range strings.Split(page, "\n") {
		trim := strings.TrimSpace(l)
		if strings.HasPrefix(trim, "```") {
			info := strings.TrimSpace(strings.TrimPrefix(trim, "```"))
			in = !in && (info == "sh" || info == "console" || info == "bash")
			continue
		}
		if !in {
			continue
		}
		if strings.HasSuffix(trim, "\\") {
			cont += strings.TrimSuffix(trim, "\\") + " "
			continue
		}
		line := strings.TrimPrefix(cont+trim, "$ ")
		cont = ""
		out = append(out, line)
	}
	return out
}

// pulseWords returns the words after `pulse` (or bin/pulse, or go run
// ./cmd/pulse) in a shell line, up to a comment, pipe or list operator;
// nil when the line runs no pulse.
func pulseWords(line string) []string {
	words := strings.Fields(line)
	for i, w := range words {
		start := -1
		switch {
		case w == "pulse" || strings.HasSuffix(w, "/pulse"):
			start = i + 1
		case w == "./cmd/pulse" && i >= 2 && words[i-2] == "go" && words[i-1] == "run":
			start = i + 1
		}
		if start < 0 {
			continue
		}
		if i > 0 && !strings.Contains(words[i-1], "=") && words[i-1] != "run" && words[i-1] != "&&" && words[i-1] != "(" {
			return nil // an argument, not the program (cmd/pulse, a path)
		}
		var out []string
		for _, x := range words[start:] {
			if x == "#" || strings.HasPrefix(x, "#") || x == "|" || x == "&&" || x == ";" || x == "&" || x == "||" {
				break
			}
			out = append(out, strings.Trim(x, "'\""))
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	return nil
}

package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// mcpBackends are the isolating backends the MCP tests run on.
var mcpBackends = []string{"namespace", "docker"}

// TestMCPStackCommitDiscardSquash: an agent's fix touches the file its
// earlier command touched, so neither transaction commits alone. commit
// and discard without an id act on the whole stack, all or nothing; a
// refused per-id call names the transactions in the way and the tool to
// call instead, never a command line the agent has no tool for.
func TestMCPStackCommitDiscardSquash(t *testing.T) {
	for _, be := range mcpBackends {
		t.Run(be, func(t *testing.T) {
			ws := t.TempDir()
			must(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("v1\n"), 0o644))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			s := mcpSession(t, ctx, "--workspace", ws, "--backend", be)
			onDisk := func(p string) string {
				b, err := os.ReadFile(filepath.Join(ws, p))
				if err != nil {
					return "<" + err.Error() + ">"
				}
				return string(b)
			}

			var ex executeOut
			if txt, isErr := callTool(t, ctx, s, "execute", map[string]any{"command": "echo v2 > a.txt"}, &ex); isErr || ex.ExitCode != 0 || ex.Transaction == "" {
				t.Fatalf("execute: %s %+v", txt, ex)
			}
			var wf writeFileOut
			if txt, isErr := callTool(t, ctx, s, "write_file", map[string]any{"path": "a.txt", "content": "v3\n"}, &wf); isErr {
				t.Fatalf("write_file: %s", txt)
			}
			tx1, tx2 := ex.Transaction, wf.Transaction

			for _, c := range []struct{ tool, id, other, instead string }{
				{"commit", tx1, tx2, "commit without an id"},
				{"commit", tx2, tx1, "commit without an id"},
				{"discard", tx1, tx2, "discard without an id"},
			} {
				txt, isErr := callTool(t, ctx, s, c.tool, map[string]any{"id": c.id}, nil)
				if !isErr || !strings.Contains(txt, c.other) || !strings.Contains(txt, c.instead) || strings.Contains(txt, "pulse cow") {
					t.Errorf("%s %s alone = %q (error %v), want a refusal naming %s and saying %q, without a CLI command",
						c.tool, c.id, txt, isErr, c.other, c.instead)
				}
			}
			if got := onDisk("a.txt"); got != "v1\n" {
				t.Fatalf("a refused commit wrote a.txt: %q", got)
			}

			var sq squashOut
			if txt, isErr := callTool(t, ctx, s, "squash", map[string]any{}, &sq); isErr || sq.Transaction == "" || !slices.Equal(sq.Squashed, []string{tx1, tx2}) {
				t.Fatalf("squash = %s %+v, want one transaction replacing %s and %s", txt, sq, tx1, tx2)
			}
			if txt, isErr := callTool(t, ctx, s, "execute", map[string]any{"command": "cat a.txt; echo v4 > a.txt; echo b > b.txt"}, &ex); isErr || ex.Stdout != "v3\n" {
				t.Fatalf("execute after squash: %s %+v (want it to see v3)", txt, ex)
			}
			var cm commitOut
			txt, isErr := callTool(t, ctx, s, "commit", map[string]any{}, &cm)
			if isErr || !slices.Equal(cm.Transactions, []string{sq.Transaction, ex.Transaction}) || !slices.Contains(cm.Paths, "a.txt") || !slices.Contains(cm.Paths, "b.txt") {
				t.Fatalf("commit {} = %s %+v", txt, cm)
			}
			if a, b := onDisk("a.txt"), onDisk("b.txt"); a != "v4\n" || b != "b\n" {
				t.Fatalf("after commit {}: a.txt %q, b.txt %q", a, b)
			}

			if _, isErr := callTool(t, ctx, s, "execute", map[string]any{"command": "echo v5 > a.txt"}, &ex); isErr {
				t.Fatal("execute")
			}
			if _, isErr := callTool(t, ctx, s, "write_file", map[string]any{"path": "a.txt", "content": "v6\n"}, &wf); isErr {
				t.Fatal("write_file")
			}
			var dc discardOut
			if txt, isErr := callTool(t, ctx, s, "discard", map[string]any{}, &dc); isErr || len(dc.Discarded) != 2 ||
				!slices.Contains(dc.Discarded, ex.Transaction) || !slices.Contains(dc.Discarded, wf.Transaction) {
				t.Fatalf("discard {} = %s %+v", txt, dc)
			}
			if got := onDisk("a.txt"); got != "v4\n" {
				t.Fatalf("after discard {}: a.txt %q", got)
			}
			cm = commitOut{}
			if txt, isErr := callTool(t, ctx, s, "commit", map[string]any{}, &cm); isErr || len(cm.Transactions) != 0 {
				t.Fatalf("commit {} of nothing = %s %+v", txt, cm)
			}

			// A hook in the stack is for a person: commit {} refuses the
			// whole stack and says whom to ask, and nothing lands.
			if txt, isErr := callTool(t, ctx, s, "execute", map[string]any{"command": "echo c > c.txt; mkdir -p .git/hooks && printf '#!/bin/sh\\n' > .git/hooks/pre-commit"}, &ex); isErr || ex.ExitCode != 0 {
				t.Fatalf("execute: %s %+v", txt, ex)
			}
			if txt, isErr := callTool(t, ctx, s, "commit", map[string]any{}, nil); !isErr || !strings.Contains(txt, ".git/hooks/pre-commit") || !strings.Contains(txt, "ask the person") {
				t.Fatalf("commit {} of a stack holding a hook = %q (error %v), want a refusal that names it and whom to ask", txt, isErr)
			}
			for _, p := range []string{"c.txt", ".git/hooks/pre-commit"} {
				if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
					t.Errorf("%s reached the workspace through a refused commit", p)
				}
			}
		})
	}
}

package cowfs

import (
	"context"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/internal/fsmode"
)

// genText makes a text of n lines from a small vocabulary, so that
// repeated lines (the hard case for a matcher) are common.
func genText(r *rand.Rand, n int, finalNewline bool) string {
	words := []string{"alpha", "beta", "}", "", "return nil", "if err != nil {", "x := 1", "// note"}
	var b strings.Builder
	for i := 0; i < n; i++ {
		if r.Intn(4) == 0 {
			fmt.Fprintf(&b, "line %d %d", i, r.Intn(1000))
		} else {
			b.WriteString(words[r.Intn(len(words))])
		}
		if i < n-1 || finalNewline {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// mutate edits a random set of lines of s: replace, insert, delete.
func mutate(r *rand.Rand, s string, edits int) string {
	lines := strings.SplitAfter(s, "\n")
	for e := 0; e < edits && len(lines) > 0; e++ {
		i := r.Intn(len(lines))
		switch r.Intn(3) {
		case 0:
			lines[i] = fmt.Sprintf("changed %d\n", r.Int())
		case 1:
			lines = append(lines[:i], append([]string{fmt.Sprintf("inserted %d\n", r.Int())}, lines[i:]...)...)
		default:
			lines = append(lines[:i], lines[i+1:]...)
		}
	}
	out := strings.Join(lines, "")
	if r.Intn(3) == 0 {
		out = strings.TrimSuffix(out, "\n") // toggle the final newline
	}
	return out
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == ".pulse" {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, fi.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDiffAppliesWithPatch proves the diff is exact: GNU patch -p1
// applied to a copy of the workspace reproduces every staged text file
// byte for byte (created, changed, deleted, empty, no final newline),
// and the workspace after Commit equals the patched copy.
func TestDiffAppliesWithPatch(t *testing.T) {
	patchBin, err := exec.LookPath("patch")
	if err != nil {
		t.Skip("needs GNU patch: not in PATH")
	}
	for seed := int64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewSource(seed))
			ws := newWS(t)
			var files []string
			for i := 0; i < 6; i++ {
				p := fmt.Sprintf("src/f%d.txt", i)
				writeFile(t, ws, p, genText(r, 5+r.Intn(300), r.Intn(4) != 0), 0o644)
				files = append(files, p)
			}
			writeFile(t, ws, "empty-to-text", "", 0o644)
			writeFile(t, ws, "text-to-empty", "gone\n", 0o644)
			writeFile(t, ws, "deleted.txt", genText(r, 20, true), 0o644)
			writeFile(t, ws, "mode-only", "secret\n", 0o600)
			writeFile(t, ws, "mode-and-text", "a\nb\n", 0o640)
			f := openFS(t, ws)
			tx, _ := f.Begin(t.Context(), "roundtrip")
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range files {
				must(tx.Write(t.Context(), p, []byte(mutate(r, readFile(t, ws, p), 1+r.Intn(12))), 0))
			}
			must(tx.Write(t.Context(), "empty-to-text", []byte("now text\n"), 0))
			must(tx.Write(t.Context(), "text-to-empty", nil, 0))
			must(tx.Write(t.Context(), "new/dir/created.txt", []byte(genText(r, 40, seed%2 == 0)), 0))
			must(tx.Write(t.Context(), "new-empty", nil, 0))
			must(tx.Delete(t.Context(), "deleted.txt"))
			// Names GNU patch misreads unless quoted the way git does.
			must(tx.Write(t.Context(), "with space.txt", []byte("spaced\n"), 0))
			must(tx.Write(t.Context(), "caf\u00e9/tab\tname", []byte("odd\n"), 0))
			must(tx.Write(t.Context(), `quote"back\slash`, []byte("q\n"), 0))
			// Permission changes, which patch applies from the mode lines,
			// and a directory's, which it must skip.
			must(tx.Write(t.Context(), "mode-only", []byte("secret\n"), 0o666))
			must(tx.Write(t.Context(), "mode-and-text", []byte("a\nB\n"), 0o600))
			must(tx.Write(t.Context(), "new-private", []byte("p\n"), 0o600))
			must(tx.Mkdir(t.Context(), "src", 0o700))
			d, err := tx.Diff(t.Context())
			must(err)

			copyDir := t.TempDir()
			copyTree(t, ws, copyDir)
			cmd := exec.Command(patchBin, "-p1", "-s", "-f", "--no-backup-if-mismatch")
			cmd.Dir = copyDir
			cmd.Stdin = strings.NewReader(d)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("patch: %v\n%s\ndiff:\n%s", err, out, d)
			}
			if _, err := tx.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			want, got := snapshotTree(t, ws), snapshotTree(t, copyDir)
			for p, v := range want {
				if strings.HasPrefix(v, "dir:") {
					continue // patch creates directories with its own modes
				}
				if got[p] != v {
					t.Fatalf("%s: patched copy differs from the commit\npatched: %q\ncommit:  %q", p, got[p], v)
				}
			}
			for p, v := range got {
				if _, ok := want[p]; !ok && !strings.HasPrefix(v, "dir:") {
					t.Fatalf("%s exists only in the patched copy", p)
				}
			}
		})
	}
}

func TestDiffFormat(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "a.txt", "one\ntwo\n", 0o644)
	writeFile(t, ws, "bin", "\x00\x01", 0o644)
	writeFile(t, ws, "script", "echo\n", 0o644)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "format")
	tx.Write(t.Context(), "a.txt", []byte("one\nTWO"), 0)
	tx.Write(t.Context(), "bin", []byte("\x00\x02"), 0)
	tx.Write(t.Context(), "script", []byte("echo\n"), 0o755)
	tx.Write(t.Context(), "b.txt", []byte("hi\n"), 0)
	tx.Symlink(t.Context(), "a.txt", "link")
	d, err := tx.Diff(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n\\ No newline at end of file\n",
		"diff --git a/b.txt b/b.txt\nnew file mode 100644\n--- /dev/null\n+++ b/b.txt\n@@ -0,0 +1 @@\n+hi\n",
		"diff --git a/bin b/bin\nBinary files a/bin and b/bin differ\n",
		"diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n+a.txt\n\\ No newline at end of file\n",
		"diff --git a/script b/script\nold mode 100644\nnew mode 100755\n",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q\n--- diff:\n%s", want, d)
		}
	}
	if strings.Contains(d, ".pulse") {
		t.Error("diff mentions .pulse")
	}
}

// TestOpCodesRebuild checks the anchored diff on random inputs: replaying
// its opcodes on a must give b, equal ranges must really be equal, and
// the hunks must keep every change.
func TestOpCodesRebuild(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	for round := 0; round < 300; round++ {
		a := strings.SplitAfter(genText(r, r.Intn(400), r.Intn(2) == 0), "\n")
		b := strings.SplitAfter(mutate(r, strings.Join(a, ""), r.Intn(30)), "\n")
		if len(a) > 0 && a[len(a)-1] == "" {
			a = a[:len(a)-1]
		}
		if len(b) > 0 && b[len(b)-1] == "" {
			b = b[:len(b)-1]
		}
		var got []string
		i, j := 0, 0
		for _, op := range lineDiff(a, b) {
			if op.I1 != i || op.J1 != j {
				t.Fatalf("round %d: opcodes not contiguous at %+v", round, op)
			}
			if op.Tag == 'e' {
				for k := 0; k < op.I2-op.I1; k++ {
					if a[op.I1+k] != b[op.J1+k] {
						t.Fatalf("round %d: equal op %+v over different lines", round, op)
					}
				}
			}
			got = append(got, b[op.J1:op.J2]...)
			i, j = op.I2, op.J2
		}
		if i != len(a) || j != len(b) || strings.Join(got, "") != strings.Join(b, "") {
			t.Fatalf("round %d: opcodes do not rebuild b", round)
		}
		changed := 0
		for _, g := range groupedOpCodes(a, b, 3) {
			for _, op := range g {
				if op.Tag != 'e' {
					changed += op.I2 - op.I1 + op.J2 - op.J1
				}
			}
		}
		all := 0
		for _, op := range lineDiff(a, b) {
			if op.Tag != 'e' {
				all += op.I2 - op.I1 + op.J2 - op.J1
			}
		}
		if changed != all {
			t.Fatalf("round %d: hunks hold %d changed lines of %d", round, changed, all)
		}
	}
}

// A permission change must show in the diff whatever the bits, even with
// the content unchanged: a review that sees nothing must commit nothing.
func TestDiffShowsEveryPermissionChange(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, ".env", "DB_PASSWORD=x\n", 0o600)
	writeFile(t, ws, "run.sh", "echo\n", 0o750)
	writeFile(t, ws, "gone", "g\n", 0o640)
	writeFile(t, ws, "d/keep", "k\n", 0o644)
	writeFile(t, ws, "shared dir/x", "x\n", 0o644)
	if err := os.Chmod(filepath.Join(ws, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ws, "shared dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := openFS(t, ws)

	// Alone, the widening that was invisible: 0600 to 0666, same bytes.
	tx, _ := f.Begin(t.Context(), "chmod")
	if err := tx.Write(t.Context(), ".env", []byte("DB_PASSWORD=x\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	d, err := tx.Diff(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := "diff --git a/.env b/.env\nold mode 100600\nnew mode 100666\n"; d != want {
		t.Fatalf("mode-only diff = %q, want %q", d, want)
	}
	if err := tx.Discard(t.Context()); err != nil {
		t.Fatal(err)
	}

	tx, _ = f.Begin(t.Context(), "modes")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(tx.Write(t.Context(), ".env", []byte("DB_PASSWORD=x\n"), 0o666))
	must(tx.Write(t.Context(), "run.sh", []byte("echo\n"), 0o755)) // exec bit kept, group bits changed
	must(tx.Write(t.Context(), "new-key", []byte("k\n"), 0o600))
	must(tx.Delete(t.Context(), "gone"))
	must(tx.Mkdir(t.Context(), "d", 0o777))
	must(tx.Mkdir(t.Context(), "shared dir", 0o775|os.ModeSetgid))
	must(tx.Mkdir(t.Context(), "unchanged", 0o755))
	d, err = tx.Diff(t.Context())
	must(err)
	for _, want := range []string{
		"diff --git a/.env b/.env\nold mode 100600\nnew mode 100666\n",
		"diff --git a/run.sh b/run.sh\nold mode 100750\nnew mode 100755\n",
		"diff --git a/new-key b/new-key\nnew file mode 100600\n",
		"diff --git a/gone b/gone\ndeleted file mode 100640\n",
		"directory \"d\": old mode 040755, new mode 040777\n",
		"directory \"shared dir\": old mode 040755, new mode 042775\n",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q\n--- diff:\n%s", want, d)
		}
	}
	if strings.Contains(d, "unchanged") {
		t.Errorf("a new directory is shown:\n%s", d)
	}
	// Changes says the same, for a reviewer's summary.
	changed := map[string]string{}
	for _, c := range tx.Changes() {
		if c.ModeChanged {
			changed[c.Path] = fmt.Sprintf("%o>%o", fsmode.ToUnix(c.OldMode), fsmode.ToUnix(c.Mode))
		}
	}
	if want := map[string]string{".env": "600>666", "run.sh": "750>755", "d": "755>777", "shared dir": "755>2775"}; !maps.Equal(changed, want) {
		t.Errorf("mode changes %v, want %v", changed, want)
	}

	// GNU patch applies the file modes and skips the directory lines.
	patchBin, err := exec.LookPath("patch")
	if err != nil {
		t.Skip("needs GNU patch: not in PATH")
	}
	copyDir := t.TempDir()
	copyTree(t, ws, copyDir)
	for _, p := range []string{".env", "run.sh", "gone"} {
		fi, err := os.Stat(filepath.Join(ws, p))
		must(err)
		must(os.Chmod(filepath.Join(copyDir, p), fi.Mode().Perm()))
	}
	cmd := exec.Command(patchBin, "-p1", "-s", "-f", "--no-backup-if-mismatch")
	cmd.Dir = copyDir
	cmd.Stdin = strings.NewReader(d)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("patch: %v\n%s\ndiff:\n%s", err, out, d)
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".env", "run.sh", "new-key"} {
		want, err := os.Stat(filepath.Join(ws, p))
		must(err)
		got, err := os.Stat(filepath.Join(copyDir, p))
		must(err)
		if got.Mode().Perm() != want.Mode().Perm() {
			t.Errorf("%s: patched mode %v, committed %v", p, got.Mode().Perm(), want.Mode().Perm())
		}
	}
	if _, err := os.Stat(filepath.Join(copyDir, "gone")); err == nil {
		t.Error("patch kept the deleted file")
	}
}

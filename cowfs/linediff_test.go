package cowfs

import (
	"bytes"
	"errors"
	"fmt"
	"go/build"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// repetitiveInput is the case that once made the diff rewrite the whole
// file: n identical lines, and edits lines changed among them (replaced,
// inserted, deleted).
func repetitiveInput(r *rand.Rand, n, edits int) (old, nw string) {
	lines := make([]string, n)
	for i := range lines {
		lines[i] = "\tx = x + 1\n"
	}
	return strings.Join(lines, ""), strings.Join(editLines(r, lines, edits), "")
}

// scatteredInput is many distinct lines with frequent blank lines and
// closing braces, and edits lines replaced.
func scatteredInput(r *rand.Rand, n, edits int) (old, nw string) {
	lines := make([]string, n)
	for i := range lines {
		switch r.Intn(5) {
		case 0:
			lines[i] = "}\n"
		case 1:
			lines[i] = "\n"
		default:
			lines[i] = fmt.Sprintf("line %d value %d\n", i, r.Intn(1e6))
		}
	}
	return strings.Join(lines, ""), strings.Join(editLines(r, lines, edits), "")
}

// ordinaryInput is real Go source (the standard library's, so the test
// needs no data of its own) of about n lines, and edits typical edits:
// lines changed, inserted and deleted, blocks moved.
func ordinaryInput(t testing.TB, r *rand.Rand, n, edits int) (old, nw string) {
	t.Helper()
	var lines []string
	for _, dir := range []string{"net/http", "go/types", "runtime"} {
		files, err := filepath.Glob(filepath.Join(build.Default.GOROOT, "src", dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Skipf("needs the Go source tree under GOROOT for ordinary input: %v", err)
		}
		sort.Strings(files)
		for _, p := range files {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, strings.SplitAfter(string(b), "\n")...)
			if len(lines) >= n {
				break
			}
		}
		if len(lines) >= n {
			break
		}
	}
	lines = lines[:min(n, len(lines))]
	if l := lines[len(lines)-1]; !strings.HasSuffix(l, "\n") {
		lines[len(lines)-1] = l + "\n"
	}
	old = strings.Join(lines, "")
	nl := editLines(r, lines, edits*9/10)
	for k := 0; k < edits/10 && len(nl) > 40; k++ { // move a block
		i := r.Intn(len(nl) - 20)
		block := append([]string(nil), nl[i:i+1+r.Intn(15)]...)
		nl = append(nl[:i], nl[i+len(block):]...)
		j := r.Intn(len(nl))
		nl = append(nl[:j], append(block, nl[j:]...)...)
	}
	return old, strings.Join(nl, "")
}

// editLines returns a copy of lines with edits random edits: a line
// replaced, a line inserted, a line deleted, a line's indentation changed.
func editLines(r *rand.Rand, lines []string, edits int) []string {
	out := append([]string(nil), lines...)
	for e := 0; e < edits && len(out) > 0; e++ {
		i := r.Intn(len(out))
		switch r.Intn(4) {
		case 0:
			out[i] = fmt.Sprintf("\tchanged(%d)\n", r.Intn(1e9))
		case 1:
			out = append(out[:i], append([]string{fmt.Sprintf("\tinserted(%d)\n", r.Intn(1e9))}, out[i:]...)...)
		case 2:
			out = append(out[:i], out[i+1:]...)
		default:
			out[i] = "  " + out[i]
		}
	}
	return out
}

// applyHunks applies the unified-diff hunks in diff (what follows the
// "+++" line of one file) to old, strictly: every context and removed
// line must match, every header's counts must be right, and nothing may
// be left over. It is the test's own reader, so that the fuzz target and
// the random tests need no external tool.
func applyHunks(old []string, diff string) (string, error) {
	type entry struct {
		op   byte
		text string
	}
	var out strings.Builder
	pos := 0
	lines := strings.SplitAfter(diff, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	for k := 0; k < len(lines); {
		h := lines[k]
		var a1, an, b1, bn int
		if err := parseHunkHeader(h, &a1, &an, &b1, &bn); err != nil {
			return "", fmt.Errorf("line %d: %w", k+1, err)
		}
		k++
		var body []entry
		for k < len(lines) && !strings.HasPrefix(lines[k], "@@ ") {
			l := lines[k]
			k++
			if !strings.HasSuffix(l, "\n") {
				return "", fmt.Errorf("line %d lacks its newline", k)
			}
			switch l[0] {
			case ' ', '-', '+':
				body = append(body, entry{l[0], l[1:]})
			case '\\':
				if l != "\\ No newline at end of file\n" || len(body) == 0 {
					return "", fmt.Errorf("line %d: stray %q", k, l)
				}
				last := &body[len(body)-1]
				last.text = strings.TrimSuffix(last.text, "\n")
			default:
				return "", fmt.Errorf("line %d: %q in a hunk", k, l)
			}
		}
		start := a1 - 1
		if an == 0 {
			start = a1
		}
		if start < pos || start > len(old) {
			return "", fmt.Errorf("hunk %q starts at %d, already at %d of %d", h, start, pos, len(old))
		}
		for ; pos < start; pos++ {
			out.WriteString(old[pos])
		}
		gotA, gotB := 0, 0
		for _, e := range body {
			if e.op != '+' {
				if pos >= len(old) || old[pos] != e.text {
					return "", fmt.Errorf("hunk %q: line %d is not %q", h, pos+1, e.text)
				}
				pos++
				gotA++
			}
			if e.op != '-' {
				out.WriteString(e.text)
				gotB++
			}
		}
		if gotA != an || gotB != bn {
			return "", fmt.Errorf("hunk %q holds -%d +%d lines", h, gotA, gotB)
		}
	}
	for ; pos < len(old); pos++ {
		out.WriteString(old[pos])
	}
	return out.String(), nil
}

func parseHunkHeader(h string, a1, an, b1, bn *int) error {
	f := strings.Fields(h)
	if len(f) != 4 || f[0] != "@@" || f[3] != "@@" || f[1][0] != '-' || f[2][0] != '+' {
		return fmt.Errorf("bad hunk header %q", h)
	}
	parse := func(s string, start, n *int) error {
		*n = 1
		if i := strings.IndexByte(s, ','); i >= 0 {
			v, err := strconv.Atoi(s[i+1:])
			if err != nil {
				return err
			}
			*n, s = v, s[:i]
		}
		v, err := strconv.Atoi(s)
		*start = v
		return err
	}
	if err := parse(f[1][1:], a1, an); err != nil {
		return err
	}
	return parse(f[2][1:], b1, bn)
}

// textDiff renders the diff of one text file the way Tx.Diff does.
func textDiff(old, nw string) string {
	var w strings.Builder
	writeFileDiff(&w, "f",
		side{typ: typeFile, mode: 0o644, data: old, held: true, size: int64(len(old))},
		side{typ: typeFile, mode: 0o644, data: nw, held: true, size: int64(len(nw))})
	return w.String()
}

// checkApplies fails unless the diff of old against nw, read back by
// applyHunks, gives nw.
func checkApplies(t testing.TB, old, nw string) string {
	t.Helper()
	d := textDiff(old, nw)
	if old == nw {
		if d != "" {
			t.Fatalf("diff of equal files: %q", d)
		}
		return d
	}
	if isBinary(old) || isBinary(nw) {
		if !strings.Contains(d, "\nBinary files a/f and b/f differ\n") {
			t.Fatalf("binary change not summarised: %q", d)
		}
		return d
	}
	const head = "diff --git a/f b/f\n--- a/f\n+++ b/f\n"
	if !strings.HasPrefix(d, head) {
		t.Fatalf("diff header: %q", d)
	}
	got, err := applyHunks(splitLines(old), d[len(head):])
	if err != nil {
		t.Fatalf("diff does not apply: %v\nold %q\nnew %q\ndiff:\n%s", err, old, nw, d)
	}
	if got != nw {
		t.Fatalf("applied diff gives %q, want %q\ndiff:\n%s", got, nw, d)
	}
	return d
}

// TestLineDiffRebuild replays the edit script on random inputs, from
// small vocabularies (the hard case: lines repeat) to distinct lines:
// the script must be contiguous, its equal runs really equal, it must
// rebuild b, and the rendered hunks must apply.
func TestLineDiffRebuild(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	for round := 0; round < 400; round++ {
		var a, b []string
		switch round % 4 {
		case 0:
			a = strings.SplitAfter(genText(r, r.Intn(400), r.Intn(2) == 0), "\n")
			b = strings.SplitAfter(mutate(r, strings.Join(a, ""), r.Intn(30)), "\n")
		case 1: // two or three distinct lines: histogram falls back to Myers
			vocab := []string{"a\n", "b\n", "\n"}[:2+r.Intn(2)]
			for n := r.Intn(600); n > 0; n-- {
				a = append(a, vocab[r.Intn(len(vocab))])
			}
			b = editLines(r, a, r.Intn(40))
		case 2: // unrelated
			a = strings.SplitAfter(genText(r, r.Intn(200), true), "\n")
			b = strings.SplitAfter(genText(r, r.Intn(200), true), "\n")
		default:
			o, n := scatteredInput(r, r.Intn(2000), r.Intn(50))
			a, b = strings.SplitAfter(o, "\n"), strings.SplitAfter(n, "\n")
		}
		if len(a) > 0 && a[len(a)-1] == "" {
			a = a[:len(a)-1]
		}
		if len(b) > 0 && b[len(b)-1] == "" {
			b = b[:len(b)-1]
		}
		var got []string
		i, j := 0, 0
		ops := lineDiff(a, b)
		for _, op := range ops {
			if op.I1 != i || op.J1 != j || op.I2 < op.I1 || op.J2 < op.J1 {
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
		changed, all := 0, 0
		for _, g := range groupedOpCodes(a, b, 3) {
			for _, op := range g {
				if op.Tag != 'e' {
					changed += op.I2 - op.I1 + op.J2 - op.J1
				}
			}
		}
		for _, op := range ops {
			if op.Tag != 'e' {
				all += op.I2 - op.I1 + op.J2 - op.J1
			}
		}
		if changed != all {
			t.Fatalf("round %d: hunks hold %d changed lines of %d", round, changed, all)
		}
		checkApplies(t, strings.Join(a, ""), strings.Join(b, ""))
	}
}

// TestLineDiffMinimalOnSmallInputs compares the number of changed lines
// with the least possible (an LCS by dynamic programming) where the
// histogram has anchors: it must not rewrite what an LCS keeps, beyond
// the little that anchoring on rare lines may cost.
func TestLineDiffMinimalOnSmallInputs(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	var got, best int
	for round := 0; round < 300; round++ {
		a := strings.SplitAfter(genText(r, 1+r.Intn(120), true), "\n")
		a = a[:len(a)-1]
		b := editLines(r, a, 1+r.Intn(10))
		for _, op := range lineDiff(a, b) {
			if op.Tag != 'e' {
				got += op.I2 - op.I1 + op.J2 - op.J1
			}
		}
		best += len(a) + len(b) - 2*lcsLen(a, b)
	}
	if float64(got) > 1.1*float64(best) {
		t.Fatalf("changed lines %d, the least possible %d: more than 1.1x", got, best)
	}
}

func lcsLen(a, b []string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			switch {
			case a[i] == b[j]:
				cur[j+1] = prev[j] + 1
			case prev[j+1] > cur[j]:
				cur[j+1] = prev[j+1]
			default:
				cur[j+1] = cur[j]
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// gitDiff runs `git diff --no-index --histogram` on the two files and
// returns its output.
func gitDiff(tb testing.TB, git, a, b string) []byte {
	tb.Helper()
	cmd := exec.Command(git, "-c", "core.quotepath=off", "-c", "diff.noprefix=false",
		"diff", "--no-index", "--histogram", "--no-color", "--no-ext-diff", a, b)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		tb.Fatalf("git diff: %v", err)
	}
	return out
}

// hunkBody is the part of a unified diff that differs between tools of
// equal judgement: the hunk lines, without file headers, git's index
// line, hunk headers or the function names git appends to them.
func hunkBody(d []byte) (bytes, changed int) {
	in := false
	for _, l := range strings.SplitAfter(string(d), "\n") {
		switch {
		case strings.HasPrefix(l, "@@ "):
			in = true
		case strings.HasPrefix(l, "diff --git "):
			in = false
		case in && l != "":
			bytes += len(l)
			if l[0] == '+' || l[0] == '-' {
				changed++
			}
		}
	}
	return bytes, changed
}

// TestDiffSizeVsGit holds the diff to within 1.1x of `git diff
// --histogram`'s size, on repetitive input (the case that was 13x) and
// on ordinary source code. The sizes compared are the hunks' lines: the
// headers differ by design (git adds an index line and function names).
func TestDiffSizeVsGit(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("needs git to compare with: not in PATH")
	}
	r := rand.New(rand.NewSource(5))
	cases := []struct {
		name    string
		old, nw string
	}{}
	add := func(name, old, nw string) {
		cases = append(cases, struct{ name, old, nw string }{name, old, nw})
	}
	o, n := repetitiveInput(r, 20000, 200)
	add("repetitive-20k-200", o, n)
	o, n = repetitiveInput(r, 3000, 30)
	add("repetitive-3k-30", o, n)
	o, n = scatteredInput(r, 20000, 200)
	add("scattered-20k-200", o, n)
	o, n = ordinaryInput(t, r, 20000, 200)
	add("ordinary-20k-200", o, n)
	o, n = ordinaryInput(t, r, 2000, 20)
	add("ordinary-2k-20", o, n)
	dir := t.TempDir()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := filepath.Join(dir, c.name+".a"), filepath.Join(dir, c.name+".b")
			if err := os.WriteFile(a, []byte(c.old), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(b, []byte(c.nw), 0o644); err != nil {
				t.Fatal(err)
			}
			ours := checkApplies(t, c.old, c.nw)
			gotBytes, gotChanged := hunkBody([]byte(ours))
			refBytes, refChanged := hunkBody(gitDiff(t, git, a, b))
			t.Logf("hunk bytes %d vs git %d (%.3fx), changed lines %d vs git %d",
				gotBytes, refBytes, float64(gotBytes)/float64(refBytes), gotChanged, refChanged)
			if refBytes == 0 {
				t.Fatal("git found no difference")
			}
			if float64(gotBytes) > 1.1*float64(refBytes) || float64(gotChanged) > 1.1*float64(refChanged) {
				t.Fatalf("diff is %d bytes and %d changed lines, git's %d and %d: more than 1.1x",
					gotBytes, gotChanged, refBytes, refChanged)
			}
		})
	}
}

// TestDiffAppliesWithTools checks, on many random inputs, that GNU patch
// and git apply both reproduce every new file from Tx.Diff's output.
// Each round stages many files at once, so the tools run once a round.
func TestDiffAppliesWithTools(t *testing.T) {
	tools := map[string][]string{}
	if p, err := exec.LookPath("patch"); err == nil {
		tools["patch"] = []string{p, "-p1", "-s", "-f", "--no-backup-if-mismatch"}
	}
	if g, err := exec.LookPath("git"); err == nil {
		tools["git-apply"] = []string{g, "apply", "--whitespace=nowarn", "-"}
	}
	if len(tools) == 0 {
		t.Skip("needs GNU patch or git: neither is in PATH")
	}
	for seed := int64(1); seed <= 4; seed++ {
		r := rand.New(rand.NewSource(seed))
		ws := newWS(t)
		olds := map[string]string{}
		for i := 0; i < 40; i++ {
			p := fmt.Sprintf("d%d/f%d.txt", i%5, i)
			var o string
			switch i % 4 {
			case 0:
				o, _ = repetitiveInput(r, 1+r.Intn(500), 0)
			case 1:
				o, _ = scatteredInput(r, 1+r.Intn(800), 0)
			default:
				o = genText(r, r.Intn(300), r.Intn(3) != 0)
			}
			writeFile(t, ws, p, o, 0o644)
			olds[p] = o
		}
		f := openFS(t, ws)
		tx, err := f.Begin(t.Context(), "random")
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		for p, o := range olds {
			nw := mutate(r, strings.Join(editLines(r, splitLines(o), r.Intn(20)), ""), r.Intn(5))
			if err := tx.Write(t.Context(), p, []byte(nw), 0); err != nil {
				t.Fatal(err)
			}
			want[p] = nw
		}
		d, err := tx.Diff(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for name, argv := range tools {
			dir := t.TempDir()
			copyTree(t, ws, dir)
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Dir = dir
			cmd.Stdin = strings.NewReader(d)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("seed %d: %s: %v\n%s", seed, name, err, out)
			}
			for p, w := range want {
				if got := readFile(t, dir, p); got != w {
					t.Fatalf("seed %d: %s: %s = %q, want %q", seed, name, p, got, w)
				}
			}
		}
		if err := tx.Discard(t.Context()); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
}

// The hunks slide to git's places: an inserted function shows as itself,
// not shifted by a line into its neighbour's closing brace.
func TestDiffSlidesGroupsDown(t *testing.T) {
	old := "func a() {\n}\n\nfunc c() {\n}\n"
	nw := "func a() {\n}\n\nfunc b() {\n}\n\nfunc c() {\n}\n"
	d := checkApplies(t, old, nw)
	want := "@@ -1,5 +1,8 @@\n func a() {\n }\n \n+func b() {\n+}\n+\n func c() {\n }\n"
	if !strings.Contains(d, want) {
		t.Fatalf("diff:\n%s\nwant hunk:\n%s", d, want)
	}
}

func TestIsBinaryLooksAtTheFirst8000Bytes(t *testing.T) {
	if !isBinary("abc\x00") || isBinary(strings.Repeat("a", 8000)+"\x00") || isBinary("") {
		t.Fatal("isBinary is not git's rule")
	}
	if !bytes.Equal([]byte(textDiff("a\n", "a\n")), nil) {
		t.Fatal("diff of equal text")
	}
}

// TestDiffSizeVsGitRandom compares with git on many small random inputs
// of every kind, repeated-line ones included: none may be more than
// 1.1x git's size.
func TestDiffSizeVsGitRandom(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("needs git to compare with: not in PATH")
	}
	r := rand.New(rand.NewSource(99))
	dir := t.TempDir()
	var ours, ref int
	for round := 0; round < 120; round++ {
		var o, n string
		switch round % 4 {
		case 0:
			o = genText(r, r.Intn(400), true)
			n = mutate(r, o, r.Intn(30))
		case 1:
			vocab := []string{"a\n", "b\n", "\n"}[:2+r.Intn(2)]
			var a []string
			for k := r.Intn(600); k > 0; k-- {
				a = append(a, vocab[r.Intn(len(vocab))])
			}
			o, n = strings.Join(a, ""), strings.Join(editLines(r, a, r.Intn(40)), "")
		case 2:
			o, n = scatteredInput(r, r.Intn(2000), r.Intn(50))
		default:
			o, n = repetitiveInput(r, r.Intn(2000), r.Intn(50))
		}
		if o == n {
			continue
		}
		a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
		if err := os.WriteFile(a, []byte(o), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(b, []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
		got, _ := hunkBody([]byte(checkApplies(t, o, n)))
		want, _ := hunkBody(gitDiff(t, git, a, b))
		if float64(got) > 1.1*float64(want) {
			t.Errorf("round %d: %d bytes of hunks, git's %d", round, got, want)
		}
		ours, ref = ours+got, ref+want
	}
	t.Logf("hunk bytes %d, git's %d (%.4fx)", ours, ref, float64(ours)/float64(ref))
}

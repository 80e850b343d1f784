package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// UpdateDocsEnv makes Generated rewrite a section instead of failing;
// `make docs` (and go generate in the commands' packages) set it to 1.
const UpdateDocsEnv = "PULSE_UPDATE_DOCS"

// Generated checks the section NAME of the Markdown file at path: the
// text between the lines
//
//	<!-- BEGIN GENERATED: NAME (make docs) -->
//	<!-- END GENERATED: NAME -->
//
// must be want. It fails the test, naming `make docs` and the first line
// that differs, when it is not, so that a page generated from a
// program's own help cannot drift from it; with PULSE_UPDATE_DOCS=1 it
// rewrites the section and leaves the rest of the file as it was.
func Generated(t testing.TB, path, name, want string) {
	t.Helper()
	begin := "<!-- BEGIN GENERATED: " + name + " (make docs) -->\n"
	end := "<!-- END GENERATED: " + name + " -->"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(data), begin)
	old, after, ok2 := strings.Cut(rest, end)
	if !ok1 || !ok2 {
		t.Fatalf("%s lacks the lines %q and %q around its generated section", path, strings.TrimSpace(begin), end)
	}
	if old == want {
		return
	}
	if os.Getenv(UpdateDocsEnv) == "1" {
		if err := os.WriteFile(path, []byte(before+begin+want+end+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	abs, _ := filepath.Abs(path)
	t.Fatalf("%s: the generated section %q is not what the program prints now (first difference at line %d of the section): run `make docs` and commit the file",
		abs, name, firstDiffLine(old, want))
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

package docs

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/pulse-agent/pulse/policy"
)

// pages are the Markdown files these tests read, relative to the module
// root.
func pages(t *testing.T) []string {
	t.Helper()
	// The reference pages that live beside their code are checked too:
	// the docs link into them and they link back.
	ps := []string{"README.md", "CHANGELOG.md", "audit/SCHEMA.md", "protocol/PROTOCOL.md",
		"cmd/pulse-server/README.md", "cmd/pulse-worker/README.md"}
	more, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		ps = append(ps, filepath.ToSlash(strings.TrimPrefix(m, ".."+string(filepath.Separator))))
	}
	return ps
}

func read(t *testing.T, page string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// block is a fenced code block: its info string ("go", "yaml k8s") and text.
type block struct {
	info string
	text string
	line int
}

// scan splits a page into its fenced blocks and its prose lines (with
// inline code spans removed, so that a link inside `...` is not a link).
func scan(page string) (blocks []block, prose []string, proseLine []int) {
	sc := bufio.NewScanner(strings.NewReader(page))
	sc.Buffer(nil, 1<<20)
	var cur *block
	var fence string
	n := 0
	for sc.Scan() {
		n++
		l := sc.Text()
		trim := strings.TrimLeft(l, " ")
		if cur == nil {
			if strings.HasPrefix(trim, "```") || strings.HasPrefix(trim, "~~~") {
				fence = trim[:3]
				cur = &block{info: strings.TrimSpace(trim[3:]), line: n}
				continue
			}
			prose = append(prose, inlineCode.ReplaceAllString(l, ""))
			proseLine = append(proseLine, n)
			continue
		}
		if strings.HasPrefix(trim, fence) && strings.TrimSpace(trim[3:]) == "" {
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		cur.text += l + "\n"
	}
	return blocks, prose, proseLine
}

var (
	inlineCode = regexp.MustCompile("`[^`]*`")
	// [text](target) and [text](target "title"); images too.
	inlineLink = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	// [label]: target
	refLink = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// anchors returns the #fragments GitHub makes for a page's headings:
// lower case, punctuation dropped, spaces to hyphens, repeats numbered.
func anchors(page string) map[string]bool {
	_, prose, _ := scanKeepCode(page)
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose {
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if k := seen[s]; k > 0 {
			out[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// scanKeepCode is scan without removing inline code: a heading's slug keeps
// the text inside backticks.
func scanKeepCode(page string) ([]block, []string, []int) {
	blocks, _, lines := scan(page)
	all := strings.Split(page, "\n")
	prose := make([]string, len(lines))
	for i, n := range lines {
		prose[i] = all[n-1]
	}
	return blocks, prose, lines
}

func slug(h string) string {
	// Links in a heading count by their text.
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_':
			b.WriteRune(r)
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r > 127 && (unicode.IsLetter(r) || unicode.IsDigit(r)):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestLinksResolve checks every relative link of the pages: the file (or
// directory) exists inside the repository, and a #fragment into a Markdown
// file names one of its headings.
func TestLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range pages(t) {
		_, prose, lines := scan(read(t, p))
		for i, l := range prose {
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
				targets = append(targets, m[1])
			}
			if m := refLink.FindStringSubmatch(l); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				if err := checkLink(root, p, target); err != nil {
					t.Errorf("%s:%d: link %q: %v", p, lines[i], target, err)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the scan is broken")
	}
}

func checkLink(root, page, target string) error {
	file, frag, _ := strings.Cut(target, "#")
	var abs string
	if file == "" {
		abs = filepath.Join(root, page)
	} else {
		if strings.HasPrefix(file, "/") {
			return fmt.Errorf("absolute path; links are relative to the page")
		}
		abs = filepath.Join(root, filepath.Dir(page), filepath.FromSlash(file))
		if rel, err := filepath.Rel(root, abs); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return fmt.Errorf("leads out of the repository")
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("no such file: %w", err)
		}
	}
	if frag == "" || !strings.HasSuffix(abs, ".md") {
		return nil
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return err
	}
	if !anchors(string(data))[frag] {
		return fmt.Errorf("no heading makes the anchor #%s", frag)
	}
	return nil
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Quick start":                       "quick-start",
		"Agents over MCP: `pulse mcp`":      "agents-over-mcp-pulse-mcp",
		"pulse cow commit":                  "pulse-cow-commit",
		"Network allowlist & secrets":       "network-allowlist--secrets",
		"Sessions: many commands, one view": "sessions-many-commands-one-view",
		"[Link](x.md) text":                 "link-text",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
	a := anchors("# A\n## A\n```\n# not a heading\n```\n### A\n")
	for _, want := range []string{"a", "a-1", "a-2"} {
		if !a[want] {
			t.Errorf("anchors lack %q: %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a line in a code block was taken for a heading")
	}
}

// TestPolicyExamplesLoad parses every ```yaml block of the pages as a
// policy file: the examples are complete files that policy.Parse accepts.
// A block of other YAML says so in its info string (```yaml k8s).
func TestPolicyExamplesLoad(t *testing.T) {
	n := 0
	for _, p := range pages(t) {
		blocks, _, _ := scan(read(t, p))
		for _, b := range blocks {
			f := strings.Fields(b.info)
			if len(f) == 0 || (f[0] != "yaml" && f[0] != "yml") || (len(f) > 1 && f[1] != "policy") {
				continue
			}
			n++
			if _, err := policy.Parse([]byte(b.text)); err != nil {
				t.Errorf("%s:%d: the policy example does not load: %v\n%s", p, b.line, err, b.text)
			}
		}
	}
	if n == 0 {
		t.Fatal("no policy examples found: the scan is broken")
	}
}

// knownImports are the packages a ```go block may use without importing
// them: the block is a fragment, and the test adds what it names.
var knownImports = map[string]string{
	"sandbox":   "github.com/pulse-agent/pulse/sandbox",
	"policy":    "github.com/pulse-agent/pulse/policy",
	"secrets":   "github.com/pulse-agent/pulse/secrets",
	"audit":     "github.com/pulse-agent/pulse/audit",
	"backend":   "github.com/pulse-agent/pulse/backend",
	"namespace": "github.com/pulse-agent/pulse/backend/namespace",
	"docker":    "github.com/pulse-agent/pulse/backend/docker",
	"remote":    "github.com/pulse-agent/pulse/backend/remote",
	"host":      "github.com/pulse-agent/pulse/backend/host",
	"context":   "context",
	"errors":    "errors",
	"fmt":       "fmt",
	"io":        "io",
	"fs":        "io/fs",
	"log":       "log",
	"slog":      "log/slog",
	"http":      "net/http",
	"os":        "os",
	"filepath":  "path/filepath",
	"strings":   "strings",
	"syscall":   "syscall",
	"time":      "time",
	"bytes":     "bytes",
	"json":      "encoding/json",
}

// fixtures are the variables a statement fragment may use without
// declaring them: the sandbox, context and process the guide's sections
// start from.
var fixtures = map[string]string{
	"ctx": "ctx := context.Background()",
	"sb":  "var sb *sandbox.Sandbox",
	"p":   "var p *sandbox.Process",
	"pol": "pol := policy.Default()",
	"err": "var err error",
}

// snippetFile turns a ```go block into a Go file of package name: a block
// with its own package clause is used as it is; one of declarations gets
// the package clause and the imports it names; one of statements becomes
// the body of a function returning error, with the fixtures it uses.
func snippetFile(name, src string, idx int, pos string) (string, error) {
	// Errors name the page and line, not the generated file.
	lined := "//line " + pos + "\n" + src
	if strings.HasPrefix(strings.TrimSpace(src), "package ") {
		return src, nil
	}
	fset := token.NewFileSet()
	decl := "package " + name + "\n\n" + lined
	if f, err := parser.ParseFile(fset, "", decl, 0); err == nil {
		return withImports(decl, f), nil
	}
	body := fmt.Sprintf("func snippet%d() error {\n%s\nreturn nil\n}\n", idx, src)
	f, err := parser.ParseFile(fset, "", "package "+name+"\n\n"+body, 0)
	if err != nil {
		return "", fmt.Errorf("neither declarations nor statements: %w", err)
	}
	var pre []string
	for _, id := range f.Unresolved {
		if fx, ok := fixtures[id.Name]; ok && !contains(pre, fx) {
			pre = append(pre, fx)
		}
	}
	sort.Strings(pre)
	for i, fx := range pre {
		v := strings.Fields(strings.TrimPrefix(fx, "var "))[0]
		pre[i] = fx + "; _ = " + v
	}
	// A block that ends in a return of its own needs none after it (vet
	// would call ours unreachable).
	end := "return nil\n"
	if fn, ok := f.Decls[0].(*ast.FuncDecl); ok && len(fn.Body.List) > 1 {
		if _, ret := fn.Body.List[len(fn.Body.List)-2].(*ast.ReturnStmt); ret {
			end = ""
		}
	}
	full := "package " + name + "\n\n" + fmt.Sprintf("func snippet%d() error {\n%s\n%s\n%s}\n", idx, strings.Join(pre, "\n"), lined, end)
	f, err = parser.ParseFile(fset, "", full, 0)
	if err != nil {
		return "", err
	}
	return withImports(full, f), nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// withImports adds an import for each known package src names but does
// not declare.
func withImports(src string, f *ast.File) string {
	if len(f.Imports) > 0 {
		return src
	}
	used := map[string]bool{}
	for _, id := range f.Unresolved {
		if _, ok := knownImports[id.Name]; ok {
			used[id.Name] = true
		}
	}
	if len(used) == 0 {
		return src
	}
	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	var imp strings.Builder
	imp.WriteString("import (\n")
	for _, n := range names {
		fmt.Fprintf(&imp, "\t%s %q\n", n, knownImports[n])
	}
	imp.WriteString(")\n")
	pkg, rest, _ := strings.Cut(src, "\n")
	return pkg + "\n\n" + imp.String() + rest
}

// TestGoSnippetsBuild builds every ```go block of the pages against the
// packages as they are now, one package per page, so a guide cannot show
// an API that changed. A block shown only as an illustration that must
// not be built says so in its info string (```go notest); there should
// be none in guide.md.
func TestGoSnippetsBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the snippets with the go command; skipped in -short")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go command is not on PATH: %v", err)
	}
	// The packages live inside the module, under a directory the ./...
	// pattern skips (a leading underscore), so they resolve its imports.
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp("..", "_docsnippets")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	var pkgs []string
	total := 0
	for _, p := range pages(t) {
		blocks, _, _ := scan(read(t, p))
		name := "snip" + strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, strings.ToLower(strings.TrimSuffix(filepath.Base(p), ".md")))
		for i, b := range blocks {
			f := strings.Fields(b.info)
			if len(f) == 0 || f[0] != "go" || (len(f) > 1 && f[1] == "notest") {
				continue
			}
			// A block with a package clause of its own (a whole program)
			// is a package of its own; the page's fragments share one.
			pkg := name
			if strings.HasPrefix(strings.TrimSpace(b.text), "package ") {
				pkg = fmt.Sprintf("%s%d", name, i)
			}
			src, err := snippetFile(name, b.text, i, fmt.Sprintf("%s:%d", filepath.Join(root, p), b.line+1))
			if err != nil {
				t.Errorf("%s:%d: %v", p, b.line, err)
				continue
			}
			dir := filepath.Join(tmp, pkg)
			if _, err := os.Stat(dir); err != nil {
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				pkgs = append(pkgs, "./"+filepath.ToSlash(filepath.Join(filepath.Base(tmp), pkg)))
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("block%d.go", i)), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			total++
		}
	}
	if total == 0 {
		t.Fatal("no Go snippets found: the scan is broken")
	}
	cmd := exec.Command(gobin, append([]string{"vet"}, pkgs...)...)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the pages' Go snippets do not build (go vet): %v\n%s", err, out)
	}
	t.Logf("%d Go snippets in %d packages build", total, len(pkgs))
}

// TestPolicyPageNamesEveryField fails when policy.md leaves out a key of
// the policy file, an action or a limit: the field list comes from the
// policy package's own types, so a field added there must be documented.
func TestPolicyPageNamesEveryField(t *testing.T) {
	page := read(t, "docs/policy.md")
	keys := []string{"version", "secrets", "inject"} // file keys that are no struct field of their own
	for _, v := range []any{policy.Policy{}, policy.NetworkPolicy{}, policy.ResourceLimits{}, policy.Cache{}, policy.SecretInjection{}, policy.Rule{}} {
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			tag, _, _ := strings.Cut(rt.Field(i).Tag.Get("yaml"), ",")
			if tag != "" && tag != "-" {
				keys = append(keys, tag)
			}
		}
	}
	for _, a := range policy.Actions() {
		keys = append(keys, string(a))
	}
	for _, k := range policy.LimitKeys() {
		keys = append(keys, string(k))
	}
	for _, k := range keys {
		if !strings.Contains(page, "`"+k+"`") && !strings.Contains(page, k+":") {
			t.Errorf("docs/policy.md does not name the policy file's %q", k)
		}
	}
}

// TestReadmeIsTheFrontDoor keeps the README short, one click from what a
// newcomer comes for, and honest about the test command CI runs.
func TestReadmeIsTheFrontDoor(t *testing.T) {
	readme := read(t, "README.md")
	if n := len(readme); n > 16<<10 {
		t.Errorf("README.md is %d bytes, over 16 KiB: move the detail into docs/", n)
	}
	// Each task a newcomer comes for is a link on the README itself.
	for task, target := range map[string]string{
		"run a command":      "docs/cli.md#pulse-exec",
		"review and commit":  "docs/cli.md#reviewing-what-commands-wrote",
		"use the SDK":        "docs/guide.md",
		"allow a host":       "docs/policy.md#network",
		"run a fleet":        "docs/operations.md#a-fleet-pulse-worker",
		"what is enforced":   "docs/security.md",
		"write a policy":     "docs/policy.md",
		"reproduce a figure": "docs/benchmarks.md",
	} {
		if !strings.Contains(readme, "]("+target+")") {
			t.Errorf("README.md has no link to %s (%s)", target, task)
		}
	}
	// The README's test command is the one CI runs.
	ci := read(t, ".ci/run")
	const cmd = "make test"
	ciRuns := false
	for _, l := range strings.Split(ci, "\n") {
		if strings.TrimSpace(l) == cmd {
			ciRuns = true
		}
	}
	if !ciRuns {
		t.Errorf(".ci/run no longer runs %q on a line of its own; the README says it does", cmd)
	}
	blocks, _, _ := scan(readme)
	found := false
	for _, b := range blocks {
		if strings.TrimSpace(b.text) == cmd {
			found = true
		}
	}
	if !found {
		t.Errorf("README.md has no block holding just %q, the command CI runs", cmd)
	}
	mk := read(t, "Makefile")
	if !strings.Contains(mk, "\ntest:") {
		t.Error("the Makefile has no test target")
	}
}

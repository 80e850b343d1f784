package testenv

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// GoMirror writes a GOPROXY directory (the module proxy protocol's file
// layout, as `go mod download` leaves in $GOMODCACHE/cache/download)
// holding one module, example.com/greet v1.0.0 (package greet, func
// Hello), and returns it with the go.sum lines that check that module.
// Serve it with http.FileServer to stand in for a registry or a mirror.
func GoMirror(t testing.TB) (dir, gosum string) {
	t.Helper()
	dir = t.TempDir()
	v := filepath.Join(dir, "example.com", "greet", "@v")
	if err := os.MkdirAll(v, 0o755); err != nil {
		t.Fatal(err)
	}
	mod := "module example.com/greet\n\ngo 1.21\n"
	src := "package greet\n\n// Hello greets.\nfunc Hello() string { return \"hello from the mirror\" }\n"
	files := map[string]string{"example.com/greet@v1.0.0/go.mod": mod, "example.com/greet@v1.0.0/greet.go": src}
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	for _, name := range sortedKeys(files) {
		w, err := zw.Create(name)
		if err == nil {
			_, err = w.Write([]byte(files[name]))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"list": "v1.0.0\n", "v1.0.0.info": `{"Version":"v1.0.0","Time":"2026-01-01T00:00:00Z"}`,
		"v1.0.0.mod": mod, "v1.0.0.zip": zb.String(),
	} {
		if err := os.WriteFile(filepath.Join(v, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gosum = fmt.Sprintf("example.com/greet v1.0.0 %s\nexample.com/greet v1.0.0/go.mod %s\n",
		hash1(files), hash1(map[string]string{"go.mod": mod}))
	return dir, gosum
}

// GoMirrorApp is a main module using GoMirror's module: file name to
// content, with the go.sum given.
func GoMirrorApp(gosum string) map[string]string {
	return map[string]string{
		"go.mod":  "module example.com/app\n\ngo 1.21\n\nrequire example.com/greet v1.0.0\n",
		"go.sum":  gosum,
		"main.go": "package main\n\nimport \"example.com/greet\"\n\nfunc main() { println(greet.Hello()) }\n",
	}
}

// hash1 is the go.sum hash ("h1:", golang.org/x/mod/sumdb/dirhash) of
// the named files.
func hash1(files map[string]string) string {
	h := sha256.New()
	for _, name := range sortedKeys(files) {
		fmt.Fprintf(h, "%x  %s\n", sha256.Sum256([]byte(files[name])), name)
	}
	return "h1:" + base64.StdEncoding.EncodeToString(h.Sum(nil))
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

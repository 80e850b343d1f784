package boxrt

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The report's tar is written without archive/tar (see writeDirTar):
// archive/tar reads it back whole, as the host does.
func TestWriteDirTarReadsBack(t *testing.T) {
	top := t.TempDir()
	files := map[string]string{"status": "exit 0\n", "empty": "", "files-000000.tar": string(bytes.Repeat([]byte("x"), 1500))}
	if err := os.Mkdir(filepath.Join(top, "abc"), 0o700); err != nil {
		t.Fatal(err)
	}
	for n, d := range files {
		write(t, filepath.Join(top, "abc", n), d)
	}
	out := filepath.Join(t.TempDir(), "out.tar")
	if err := writeDirTar(out, top, "abc"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(b))
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the tar back: %v", err)
		}
		d, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = string(d)
	}
	if got["abc/"] != "" || len(got) != len(files)+1 {
		t.Fatalf("entries %d, want the directory and %d files", len(got), len(files))
	}
	for n, d := range files {
		if got["abc/"+n] != d {
			t.Errorf("abc/%s: %d bytes, want %d", n, len(got["abc/"+n]), len(d))
		}
	}
}

// A batch is never empty and never over its bounds, and the batches keep
// every name in order.
func TestBatches(t *testing.T) {
	var names []string
	for i := range 5000 {
		names = append(names, "./"+string(bytes.Repeat([]byte{'a' + byte(i%26)}, 1+i%200)))
	}
	var all []string
	for _, b := range batches(names) {
		n := 0
		for _, x := range b {
			n += len(x) + 1
		}
		if len(b) == 0 || len(b) > 2048 || n > 96<<10 {
			t.Fatalf("a batch of %d names, %d bytes", len(b), n)
		}
		all = append(all, b...)
	}
	if len(all) != len(names) {
		t.Fatalf("%d names after batching, want %d", len(all), len(names))
	}
	for i := range names {
		if all[i] != names[i] {
			t.Fatalf("name %d: %q, want %q", i, all[i], names[i])
		}
	}
}

// The runtime program must be static whatever builds it (`go build`
// with cgo on included): nothing it links may need cgo. archive/tar and
// net do, through os/user and the resolver.
func TestRuntimeLinksNoCgo(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go command to list the program's packages")
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/pulse-agent/pulse/cmd/pulse-runtime").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "runtime/cgo", "os/user", "net":
			t.Errorf("cmd/pulse-runtime links %s, which needs cgo where cgo is on", p)
		}
	}
}

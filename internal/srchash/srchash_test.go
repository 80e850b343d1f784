package srchash

import (
	"crypto/sha256"
	"testing"
	"testing/fstest"
)

func sum(pkg string, fsys fstest.MapFS) [32]byte {
	h := sha256.New()
	Write(h, pkg, fsys)
	return [32]byte(h.Sum(nil))
}

// The hash changes with any source byte, file name or package name, and
// not with test files or the order files were listed in.
func TestWriteSeesEverySourceByte(t *testing.T) {
	base := fstest.MapFS{"a.go": {Data: []byte("package a\n")}, "b_linux.go": {Data: []byte("package a // b\n")}}
	ref := sum("p", base)
	for name, fsys := range map[string]fstest.MapFS{
		"a byte":      {"a.go": {Data: []byte("package a \n")}, "b_linux.go": base["b_linux.go"]},
		"a name":      {"c.go": base["a.go"], "b_linux.go": base["b_linux.go"]},
		"a file":      {"a.go": base["a.go"], "b_linux.go": base["b_linux.go"], "c.go": {Data: []byte("package a\n")}},
		"bytes moved": {"a.go": {Data: []byte("package a\npackage a")}, "b_linux.go": {Data: []byte(" // b\n")}},
	} {
		if sum("p", fsys) == ref {
			t.Errorf("%s: the hash did not change", name)
		}
	}
	if sum("q", base) == ref {
		t.Error("another package's name: the hash did not change")
	}
	withTest := fstest.MapFS{"a.go": base["a.go"], "b_linux.go": base["b_linux.go"], "a_test.go": {Data: []byte("x")}}
	if sum("p", withTest) != ref {
		t.Error("a test file changed the hash")
	}
}

func TestWritePanicsWithoutSource(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for a package without source")
		}
	}()
	sum("p", fstest.MapFS{"a_test.go": {Data: []byte("x")}})
}

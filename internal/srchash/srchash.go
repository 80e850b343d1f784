// Package srchash hashes a package's own Go source, embedded into the
// package, for the identities of the programs that run inside a box (the
// namespace init and the in-box runtime): a program from another build
// beside a new binary must not pass for this build's, and it differs
// exactly where a source file does. It is a leaf: the standard library
// only, as those static programs need.
package srchash

import (
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
)

// Write writes to w, under pkg's name, each non-test .go file of fsys
// (the package's embedded source, its top directory) with its name and
// length, in name order. It panics when fsys cannot be read: an embedded
// file system always can, and an identity computed without the source
// would vouch for any build.
func Write(w io.Writer, pkg string, fsys fs.FS) {
	ents, err := fs.ReadDir(fsys, ".")
	if err != nil {
		panic("srchash: " + pkg + ": embedded sources: " + err.Error())
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".go") && !strings.HasSuffix(e.Name(), "_test.go") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		panic("srchash: " + pkg + ": no embedded source")
	}
	slices.Sort(names)
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			panic("srchash: " + pkg + ": embedded sources: " + err.Error())
		}
		fmt.Fprintf(w, "file %s/%q %d\n", pkg, n, len(b))
		w.Write(b)
	}
}

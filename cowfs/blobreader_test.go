package cowfs

import (
	"bytes"
	"fmt"
	"io"
	"testing"
)

// TestBlobReaderHoldsPacksBounded: a commit keeps the packs it reads open,
// and reads small ones whole; the packs held whole stay within packWhole
// in all however many Stage batches (one pack each) a transaction has,
// and every piece still reads back as staged.
func TestBlobReaderHoldsPacksBounded(t *testing.T) {
	f := openFS(t, newWS(t))
	tx, err := f.Begin(t.Context(), "packs")
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	size := packWhole/2 + 1
	for i := range n {
		data := bytes.Repeat([]byte{byte('a' + i)}, size)
		errs, err := tx.Stage(t.Context(), []Op{{Kind: KindWrite, Path: fmt.Sprint("f", i), Data: data, Mode: 0o644}})
		if err != nil || errs[0] != nil {
			t.Fatal(err, errs)
		}
	}
	b := f.blobReader(tx.dir())
	defer b.close()
	for i := range n {
		c := tx.cur(fmt.Sprint("f", i))
		if c == nil || c.Pack == "" {
			t.Fatalf("f%d: not staged in a pack: %+v", i, c)
		}
		r, cl, err := b.open(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		cl.Close()
		if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{byte('a' + i)}, size)) {
			t.Fatalf("f%d: read %d bytes back (%v)", i, len(got), err)
		}
	}
	held := 0
	for _, p := range b.packs {
		held += len(p.data)
	}
	if len(b.packs) != n || held > packWhole {
		t.Errorf("%d packs kept, %d bytes of them held in memory (at most %d)", len(b.packs), held, packWhole)
	}
}

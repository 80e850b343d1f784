package cowfs

import (
	"encoding/json"
	"testing"
)

// FuzzWAL feeds arbitrary bytes to the WAL decoder: it must never panic,
// and whatever it accepts must hold only clean workspace paths and
// re-encode to the same bytes.
func FuzzWAL(f *testing.F) {
	w := &walFile{ID: "0123456789abcdef", Desc: "seed", Created: 1, Ops: []walOp{
		{change: change{Path: "a/b.txt", Kind: KindWrite, Mode: 0o644, Blob: sha256Hex([]byte("x")), Size: 1}},
		{change: change{Path: "a/p.txt", Kind: KindWrite, Mode: 0o644, Blob: sha256Hex([]byte("x")), Pack: "pack-0123456789abcdef", Off: 7, Size: 1}},
		{change: change{Path: "gone", Kind: KindDelete, Before: snapshot{Type: typeFile, Ino: 3, Size: 2, SHA: sha256Hex([]byte("yy"))}}, Prev: true},
		{change: change{Path: "l", Kind: KindSymlink, Target: "a/b.txt"}},
		{change: change{Path: "a", Kind: KindMkdir, Mode: 0o755, Implicit: true}},
	}}
	seed, err := encodeWAL(w)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	f.Add([]byte{})
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := decodeWAL(b)
		if err != nil {
			return
		}
		for _, op := range w.Ops {
			if !isCleanRel(op.Path) || isReserved(op.Path) {
				t.Fatalf("accepted path %q", op.Path)
			}
		}
		again, err := encodeWAL(w)
		if err != nil {
			t.Fatal(err)
		}
		w2, err := decodeWAL(again)
		if err != nil {
			t.Fatalf("re-encoded WAL does not decode: %v", err)
		}
		if len(w2.Ops) != len(w.Ops) || w2.ID != w.ID {
			t.Fatal("round trip changed the WAL")
		}
	})
}

// FuzzStageRecord feeds arbitrary payloads to the stage log decoder.
func FuzzStageRecord(f *testing.F) {
	f.Add([]byte(`{"op":"set","change":{"path":"a","kind":"write","blob":"` + sha256Hex(nil) + `","before":{}}}`))
	f.Add([]byte(`{"op":"unstage","path":"../x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeStageRec(b)
		if err != nil {
			return
		}
		if r.Op == "set" && (!isCleanRel(r.Change.Path) || isReserved(r.Change.Path)) {
			t.Fatalf("accepted path %q", r.Change.Path)
		}
	})
}

// FuzzStageLog feeds arbitrary bytes to the stage log replay: it must
// never panic, never claim more than it was given, accept only clean
// paths, and replaying the accepted prefix must give the same records
// with nothing left over.
func FuzzStageLog(f *testing.F) {
	var seed []byte
	for _, r := range []stageRec{
		{Op: "begin", ID: "0123456789abcdef", Desc: "seed", Created: 1},
		{Op: "set", Change: &change{Path: "a", Kind: KindWrite, Blob: sha256Hex(nil), Before: snapshot{Type: typeAbsent}}},
		{Op: "batch", N: 2},
		{Op: "set", Change: &change{Path: "d", Kind: KindMkdir, Mode: 0o755, Implicit: true, Before: snapshot{Type: typeAbsent}}},
		{Op: "set", Change: &change{Path: "d/f", Kind: KindWrite, Blob: sha256Hex([]byte("x")), Pack: "pack-0123456789abcdef", Off: 3, Size: 1, Before: snapshot{Type: typeAbsent}}},
		{Op: "unstage", Path: "a"},
	} {
		p, err := json.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		seed = appendFrame(seed, p)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)-20])
	f.Add(seed[:len(seed)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, good, tail, err := replayLog(b, true)
		if err != nil {
			return
		}
		if good < 0 || good > len(b) || tail != (good < len(b)) {
			t.Fatalf("good %d of %d, tail %v", good, len(b), tail)
		}
		for _, r := range recs {
			if r.Op == "set" && (!isCleanRel(r.Change.Path) || isReserved(r.Change.Path) ||
				r.Change.Pack != "" && !validPack(r.Change.Pack)) {
				t.Fatalf("accepted %+v", r.Change)
			}
			if r.Op == "batch" {
				t.Fatal("a batch record was returned as a change")
			}
		}
		again, good2, tail2, err := replayLog(b[:good], true)
		if err != nil || good2 != good || tail2 || len(again) != len(recs) {
			t.Fatalf("replaying the accepted prefix: %d records, good %d, tail %v, %v", len(again), good2, tail2, err)
		}
	})
}

package cowfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStageLogDamage is the corruption table of the stage log and its
// seal: records lost at the end (cut at a record boundary, or anywhere
// before the sealed length) are told apart from a torn tail and refused
// with ErrDamaged, saying changes were lost, by Commit and by List; a
// torn tail past the seal (an append that never returned) is cut and the
// rest commits; a damaged or missing seal is refused.
func TestStageLogDamage(t *testing.T) {
	type damage struct {
		log  func(b []byte, frames [][]byte) []byte // nil: unchanged
		seal func(b []byte) []byte                  // nil: unchanged; returning nil removes it
		ok   bool                                   // the transaction still commits, all three files
	}
	lastFrame := func(frames [][]byte) int { return frameHeader + len(frames[len(frames)-1]) }
	cases := map[string]damage{
		"last record cut at its boundary": {log: func(b []byte, fr [][]byte) []byte { return b[:len(b)-lastFrame(fr)] }},
		"cut inside the last record":      {log: func(b []byte, fr [][]byte) []byte { return b[:len(b)-lastFrame(fr)/2] }},
		"cut to the begin record":         {log: func(b []byte, fr [][]byte) []byte { return b[:frameHeader+len(fr[0])] }},
		// Without a whole begin record the log is no empty transaction.
		"emptied":                     {log: func(b []byte, fr [][]byte) []byte { return b[:0] }},
		"cut inside the begin record": {log: func(b []byte, fr [][]byte) []byte { return b[:frameHeader+len(fr[0])/2] }},
		"cut inside the begin header": {log: func(b []byte, fr [][]byte) []byte { return b[:frameHeader/2] }},
		"torn tail past the seal": {log: func(b []byte, fr [][]byte) []byte {
			return append(b, 200, 0, 0, 0, 1, 2, 3, 4, '{')
		}, ok: true},
		"one seal slot damaged": {seal: func(b []byte) []byte {
			_, seq, _ := decodeSeal(b)
			b[int(seq%2)*sealSlot+13] ^= 1
			return b
		}, ok: true},
		"both seal slots damaged": {seal: func(b []byte) []byte { b[5] ^= 1; b[sealSlot+5] ^= 1; return b }},
		"seal missing":            {seal: func(b []byte) []byte { return nil }},
		"seal zeroed":             {seal: func(b []byte) []byte { return make([]byte, len(b)) }},
	}
	for name, d := range cases {
		t.Run(name, func(t *testing.T) {
			ws := newWS(t)
			f := openFS(t, ws)
			// Another transaction, below the damaged one, must stay
			// readable and committable whatever happens to it.
			other, _ := f.Begin(t.Context(), "other")
			if err := other.Write(t.Context(), "d", []byte("d"), 0); err != nil {
				t.Fatal(err)
			}
			tx, _ := f.Begin(t.Context(), "log")
			for _, p := range []string{"a", "b", "c"} {
				if err := tx.Write(t.Context(), p, []byte(p), 0); err != nil {
					t.Fatal(err)
				}
			}
			dir := filepath.Join(ws, StateDir, "tx", tx.ID())
			if d.log != nil {
				b, _ := os.ReadFile(filepath.Join(dir, "stage.log"))
				frames, _, _ := decodeFrames(b)
				os.WriteFile(filepath.Join(dir, "stage.log"), d.log(b, frames), 0o600)
			}
			if d.seal != nil {
				b, _ := os.ReadFile(filepath.Join(dir, "seal"))
				if nb := d.seal(b); nb == nil {
					os.Remove(filepath.Join(dir, "seal"))
				} else {
					os.WriteFile(filepath.Join(dir, "seal"), nb, 0o600)
				}
			}
			damaged, _ := os.ReadFile(filepath.Join(dir, "stage.log"))
			f2 := openFS(t, ws)
			infos, err := f2.List(t.Context())
			byID := map[string]TxInfo{}
			for _, in := range infos {
				byID[in.ID] = in
			}
			info, found := byID[tx.ID()]
			if err != nil || len(infos) != 2 || !found || byID[other.ID()].State != StateOpen {
				t.Fatalf("List = %+v, %v", infos, err)
			}
			st, err := f2.Stack(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			tx2, err := f2.Tx(t.Context(), tx.ID())
			if d.ok {
				if err != nil || info.State != StateOpen || len(st.Txs) != 2 || len(st.Damaged) != 0 {
					t.Fatalf("Tx = %v, List = %+v, Stack = %+v", err, infos, st)
				}
				if _, err := tx2.Commit(context.Background()); err != nil {
					t.Fatal(err)
				}
				if readFile(t, ws, "a")+readFile(t, ws, "b")+readFile(t, ws, "c") != "abc" {
					t.Fatal("wrong content")
				}
				return
			}
			if !errors.Is(err, ErrDamaged) {
				t.Fatalf("Tx of a damaged stage log: %v", err)
			}
			if info.State != StateQuarantined || !strings.Contains(info.Reason, "seal") && !strings.Contains(info.Reason, "lost") {
				t.Fatalf("List does not say so: %+v", info)
			}
			if len(st.Txs) != 1 || st.Txs[0].ID != other.ID() || len(st.Damaged) != 1 || st.Damaged[0].ID != tx.ID() || !errors.Is(st.Damaged[0].Err, ErrDamaged) {
				t.Fatalf("Stack = %+v, damaged %+v", st.Txs, st.Damaged)
			}
			// The evidence stays: reading a damaged log never cuts it.
			if b, _ := os.ReadFile(filepath.Join(dir, "stage.log")); string(b) != string(damaged) {
				t.Fatalf("the damaged stage log was rewritten: %d bytes, were %d", len(b), len(damaged))
			}
			for _, p := range []string{"a", "b", "c"} {
				if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
					t.Fatalf("%s was written", p)
				}
			}
			other2, err := f2.Tx(t.Context(), other.ID())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := other2.Commit(context.Background()); err != nil || readFile(t, ws, "d") != "d" {
				t.Fatalf("the other transaction: %v", err)
			}
		})
	}
}

// TestCrashBetweenLogAndSeal: killed after a write's record is durable
// but before the seal says so, the record counts (the log is longer than
// its seal, never shorter).
func TestCrashBetweenLogAndSeal(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "seal crash")
	cmd := helperCmd(ws, tx.ID(), "PULSE_COWFS_HELPER=stage", failpointEnv(fpStageLogSynced, 3))
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("helper was not killed: %s", out)
	}
	f2 := openFS(t, ws)
	tx2, err := f2.Tx(t.Context(), tx.ID())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tx2.Changes()); n != 3 {
		t.Fatalf("%d changes, want 3", n)
	}
	if err := tx2.Write(t.Context(), "more", []byte("m"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := tx2.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

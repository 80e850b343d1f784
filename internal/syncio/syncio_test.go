package syncio

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// TestWritesStayWhole: concurrent Writes of whole lines come out as whole
// lines (under -race, the test also fails on an unguarded write).
func TestWritesStayWhole(t *testing.T) {
	const writers, lines = 8, 200
	var raw bytes.Buffer
	w := &Writer{W: &raw}
	var b Buffer
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			line := []byte(strings.Repeat(string(rune('a'+i)), 64) + "\n")
			for range lines {
				if n, err := w.Write(line); n != len(line) || err != nil {
					t.Errorf("Writer.Write = %d, %v", n, err)
				}
				if n, err := b.Write(line); n != len(line) || err != nil {
					t.Errorf("Buffer.Write = %d, %v", n, err)
				}
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	for name, got := range map[string]string{"Writer": raw.String(), "Buffer": b.String()} {
		all := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
		if len(all) != writers*lines {
			t.Fatalf("%s: %d lines, want %d", name, len(all), writers*lines)
		}
		for _, l := range all {
			if len(l) != 64 || strings.Trim(l, l[:1]) != "" {
				t.Fatalf("%s: torn line %q", name, l)
			}
		}
	}
}

package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// chain links events onto the chain head (l.lastSeq, l.lastHash): each
// gets its time, session, sequence number, previous hash and key id, and
// is encoded as one line ending in its hash. It returns the lines and the
// new head; nothing is written. Call with the lock.
func (l *Logger) chain(events []Event) (buf []byte, seq uint64, prev string, err error) {
	seq, prev = l.lastSeq, l.lastHash
	for i, e := range events {
		if e.Time.IsZero() {
			e.Time = time.Now()
		}
		e.Time = e.Time.UTC()
		if e.SessionID == "" {
			e.SessionID = l.o.sessionID
		}
		e.scrub(l.o.scrubber)
		e.Seq = seq + 1
		e.PrevHash = prev
		e.KeyID = ""
		if l.o.key != nil {
			e.KeyID = l.o.key.id
		}
		canon, err := e.canonical()
		if err != nil {
			return nil, 0, "", fmt.Errorf("audit: encode event %d of %d: %w", i+1, len(events), err)
		}
		if len(canon)+len(hashKey)+hashLen+3 > MaxLineLen {
			return nil, 0, "", fmt.Errorf("audit: %w: event %d of %d: %d bytes, at most %d", ErrEventTooLarge, i+1, len(events), len(canon), MaxLineLen)
		}
		if buf == nil {
			// Guess the batch's size from its first line, within reason.
			buf = make([]byte, 0, min((len(canon)+len(hashKey)+hashLen+3+32)*len(events), 4<<20))
		}
		sum := l.o.key.hashOf(prev, canon)
		buf = append(buf, canon[:len(canon)-1]...)
		buf = append(buf, hashKey...)
		buf = append(buf, sum...)
		buf = append(buf, '"', '}', '\n')
		seq, prev = e.Seq, sum
	}
	return buf, seq, prev, nil
}

// hashOf is the chain hash of a line: SHA-256 without a key, HMAC-SHA256
// with one.
func (k *Key) hashOf(prev string, canonical []byte) string {
	if k == nil {
		return chainHash(prev, canonical)
	}
	return k.mac(prev, canonical)
}

// chainHash is hex(SHA-256(prev_hash as its 64 hex characters || canonical)).
func chainHash(prev string, canonical []byte) string {
	h := sha256.New()
	io.WriteString(h, prev)
	h.Write(canonical)
	return hex.EncodeToString(h.Sum(nil))
}

// current makes l.f the file now at l.path (another process may have
// rotated it) and loads the chain head from disk unless nothing changed
// since our own last append. It returns the file size. Call with the lock.
func (l *Logger) current() (int64, error) {
	st, err := os.Stat(l.path)
	if err != nil || idOf(st) != l.fid {
		if err := l.reopen(); err != nil {
			return 0, err
		}
	}
	fst, err := l.f.Stat()
	if err != nil {
		return 0, fmt.Errorf("audit: stat log: %w", err)
	}
	size := fst.Size()
	if l.cacheOK && size == l.cacheSize {
		return size, nil
	}
	size, seq, hash, keyID, err := l.readHead(size)
	if err != nil {
		return 0, err
	}
	if keyID != "" && (l.o.key == nil || l.o.key.id != keyID) {
		// Appending unkeyed (or under another key) to a keyed chain would
		// break it for good; the writer is misconfigured, not the log.
		have := "none"
		if l.o.key != nil {
			have = l.o.key.id
		}
		return 0, fmt.Errorf("audit: %s: %w: it is keyed with key %s, this writer has %s", l.path, ErrKeyRequired, keyID, have)
	}
	if err := l.checkHead(seq, hash, keyID != ""); err != nil {
		return 0, err
	}
	l.cacheOK, l.cacheSize, l.lastSeq, l.lastHash = true, size, seq, hash
	return size, nil
}

// checkHead compares the chain head found in the log with the head
// record, and notes a disagreement for the next append to record. Call
// with the lock.
func (l *Logger) checkHead(seq uint64, hash string, lastKeyed bool) error {
	l.mismatch = ""
	b := make([]byte, headSize+1)
	n, err := l.headf.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("audit: read head record: %w", err)
	}
	l.headEmpty = n == 0
	if n == 0 {
		// No head yet: a new log, or one written before head records.
		// An unkeyed log gets one from its next append. A keyed chain
		// always had one, so its loss is reported.
		if seq > 0 && lastKeyed {
			l.mismatch = fmt.Sprintf("the head record is missing; the log ends at seq %d", seq)
		}
		return nil
	}
	h, err := decodeHead(b[:n], l.o.key)
	switch {
	case errors.Is(err, ErrKeyRequired):
		return fmt.Errorf("audit: %s: %w", l.path, err)
	case err != nil:
		l.mismatch = fmt.Sprintf("the head record is damaged (%v); the log ends at seq %d", err, seq)
	case h.Seq > seq && seq == 0:
		l.mismatch = fmt.Sprintf("the log is empty, but its head record says it held seq %d (hash %s): the file was emptied or removed", h.Seq, h.Hash)
	case h.Seq > seq:
		l.mismatch = fmt.Sprintf("the log ends at seq %d, but its head record says seq %d (hash %s): events %d..%d were cut from the end", seq, h.Seq, h.Hash, seq+1, h.Seq)
	case h.Seq == seq && h.Hash != hash:
		l.mismatch = fmt.Sprintf("seq %d has hash %s, but the head record says %s: the end of the log was rewritten", seq, hash, h.Hash)
	}
	// Behind the log is fine: a writer died between the two writes, or
	// one that keeps no head appended.
	return nil
}

// readHead finds the chain head: the last complete line of the live file,
// or of the newest rotated file when the live one is empty. A torn last
// line (a writer died mid-append) is cut off, since no live writer can be
// writing while we hold the lock.
func (l *Logger) readHead(size int64) (int64, uint64, string, string, error) {
	if size > 0 {
		last, keep, err := lastLine(l.f, size)
		if err != nil {
			return 0, 0, "", "", fmt.Errorf("audit: read log tail: %w", err)
		}
		if keep != size {
			l.o.log.Warn("audit log ended in a torn line; cutting it off", "path", l.path, "bytes", size-keep)
			if err := l.f.Truncate(keep); err != nil {
				return 0, 0, "", "", fmt.Errorf("audit: repair torn tail: %w", err)
			}
			l.dirty = true // the repair is synced like an append
			size = keep
		}
		if last != nil {
			seq, hash, keyID, err := headOf(last)
			if err != nil {
				return 0, 0, "", "", fmt.Errorf("audit: %s: last line: %w", l.path, err)
			}
			return size, seq, hash, keyID, nil
		}
	}
	rotated, err := rotatedFiles(l.path)
	if err != nil {
		return 0, 0, "", "", err
	}
	for i := len(rotated) - 1; i >= 0; i-- {
		seq, hash, keyID, ok, err := lastOfFile(rotated[i])
		if err != nil {
			return 0, 0, "", "", err
		}
		if ok {
			return size, seq, hash, keyID, nil
		}
	}
	return size, 0, GenesisHash, "", nil
}

func headOf(line []byte) (uint64, string, string, error) {
	e, err := ParseLine(line)
	if err != nil {
		return 0, "", "", err
	}
	if _, h, ok := splitLine(line); !ok || h != e.Hash {
		return 0, "", "", fmt.Errorf("%w: line does not end with its hash", ErrMalformed)
	}
	return e.Seq, e.Hash, e.KeyID, nil
}

func lastOfFile(path string) (uint64, string, string, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", "", false, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, "", "", false, fmt.Errorf("audit: %w", err)
	}
	last, _, err := lastLine(f, st.Size())
	if err != nil || last == nil {
		return 0, "", "", false, err
	}
	seq, hash, keyID, err := headOf(last)
	if err != nil {
		return 0, "", "", false, fmt.Errorf("audit: %s: last line: %w", path, err)
	}
	return seq, hash, keyID, true, nil
}

// lastLine returns the last newline-terminated line of f (without the
// newline), or nil, and the offset just after it: bytes from there to size
// are a torn line.
func lastLine(f *os.File, size int64) ([]byte, int64, error) {
	// Lines are usually a few hundred bytes: start small, then widen.
	chunk := int64(4 << 10)
	var tail []byte
	end := size
	keep := int64(-1)
	for end > 0 {
		start := end - chunk
		if start < 0 {
			start = 0
		}
		buf := make([]byte, end-start)
		if _, err := f.ReadAt(buf, start); err != nil {
			return nil, 0, err
		}
		tail = append(buf, tail...)
		base := start
		if keep < 0 {
			if i := bytes.LastIndexByte(tail, '\n'); i >= 0 {
				keep = base + int64(i) + 1
			}
		}
		if keep >= 0 {
			// Need the newline before the last line too (or the start).
			rel := int(keep - base - 1) // index of the final newline in tail
			if j := bytes.LastIndexByte(tail[:rel], '\n'); j >= 0 {
				return append([]byte(nil), tail[j+1:rel]...), keep, nil
			}
			if base == 0 {
				return append([]byte(nil), tail[:rel]...), keep, nil
			}
		}
		end = start
		if chunk < 1<<20 {
			chunk *= 2
		}
		if size-end > 64<<20 {
			return nil, 0, fmt.Errorf("%w: last line longer than 64 MiB", ErrMalformed)
		}
	}
	return nil, 0, nil
}

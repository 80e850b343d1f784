package store

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Stream events live in one append-only file per execution beside the
// database rather than in SQLite: output is the bulk of what the server
// persists, and appending it to a file costs a copy into the page cache,
// where SQLite wrote every byte twice (WAL, then checkpoint) a page at a
// time. The database keeps the records; events written by older versions
// into its stream_events table are still read.
//
// A file is a sequence of records: uvarint seq, one byte stream (0 stdout,
// 1 stderr), uvarint length, data. Appends happen with whole batches in
// one write; a record cut short by a crash ends the file for readers.

// maxEventData bounds one record's length when reading, so a damaged file
// cannot make a reader allocate without bound.
const maxEventData = 1 << 30

// errEventLog: a record is malformed (never for a cut-short tail).
var errEventLog = errors.New("malformed event log")

func validLogName(id string) bool {
	if id == "" || len(id) > 128 || id[0] == '.' {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (s *Store) logPath(id string) (string, error) {
	if !validLogName(id) {
		return "", fmt.Errorf("store: execution id %q cannot name an event log: %w", id, errEventLog)
	}
	return filepath.Join(s.eventsDir, id+".log"), nil
}

// encodeEvents appends the records of events to b.
func encodeEvents(b []byte, events []Event) ([]byte, error) {
	for _, e := range events {
		var st byte
		switch e.Stream {
		case "stdout":
		case "stderr":
			st = 1
		default:
			return nil, fmt.Errorf("store: stream %q: %w", e.Stream, errEventLog)
		}
		if e.Seq <= 0 {
			return nil, fmt.Errorf("store: seq %d: %w", e.Seq, errEventLog)
		}
		b = binary.AppendUvarint(b, uint64(e.Seq))
		b = append(b, st)
		b = binary.AppendUvarint(b, uint64(len(e.Data)))
		b = append(b, e.Data...)
	}
	return b, nil
}

// appendLog writes events (all of one execution) to its log in one write.
func (s *Store) appendLog(id string, events []Event) error {
	p, err := s.logPath(id)
	if err != nil {
		return err
	}
	n := 0
	for _, e := range events {
		n += len(e.Data) + 2*binary.MaxVarintLen64 + 1
	}
	buf, err := encodeEvents(make([]byte, 0, n), events)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("store: append events: %w", err)
	}
	_, werr := f.Write(buf)
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("store: append events: %w", werr)
	}
	if cerr != nil {
		return fmt.Errorf("store: append events: %w", cerr)
	}
	return nil
}

// readLog returns the events of id's log with seq > afterSeq, in file
// order. A missing log has no events.
func (s *Store) readLog(id string, afterSeq int64) ([]Event, error) {
	p, err := s.logPath(id)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: events %s: %w", id, err)
	}
	defer f.Close()
	return decodeEvents(bufio.NewReaderSize(f, 256<<10), id, afterSeq)
}

// decodeEvents reads records until the end of r; a record cut short ends
// the log (a crash during its write), anything else malformed is an
// error.
func decodeEvents(r *bufio.Reader, id string, afterSeq int64) ([]Event, error) {
	var out []Event
	for {
		seq, err := binary.ReadUvarint(r)
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return out, nil
		}
		if err != nil || seq == 0 || seq > 1<<62 {
			return out, fmt.Errorf("store: events %s: bad seq: %w", id, errEventLog)
		}
		st, err := r.ReadByte()
		if err != nil {
			return out, nil
		}
		if st > 1 {
			return out, fmt.Errorf("store: events %s: bad stream %d: %w", id, st, errEventLog)
		}
		n, err := binary.ReadUvarint(r)
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return out, nil
		}
		if err != nil || n > maxEventData {
			return out, fmt.Errorf("store: events %s: bad length: %w", id, errEventLog)
		}
		if int64(seq) <= afterSeq {
			if _, err := r.Discard(int(n)); err != nil {
				return out, nil
			}
			continue
		}
		// Read rather than allocate the length up front: a damaged
		// length costs no more memory than the file holds.
		data, err := io.ReadAll(io.LimitReader(r, int64(n)))
		if err != nil {
			return out, fmt.Errorf("store: events %s: %w", id, err)
		}
		if uint64(len(data)) < n {
			return out, nil
		}
		e := Event{ExecutionID: id, Seq: int64(seq), Stream: "stdout", Data: data}
		if st == 1 {
			e.Stream = "stderr"
		}
		out = append(out, e)
	}
}

func (s *Store) removeLog(id string) error {
	p, err := s.logPath(id)
	if err != nil {
		return nil // no log can exist under such a name
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("store: remove events of %s: %w", id, err)
	}
	return nil
}

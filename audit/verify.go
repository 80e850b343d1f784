package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/pulse-agent/pulse/internal/flock"
)

// Verification errors; a *VerifyError wraps one of them.
var (
	// ErrTampered: the chain is broken: a line was modified, deleted,
	// inserted or moved.
	ErrTampered = errors.New("audit log tampered")
	// ErrTornTail: the last line has no newline: a writer died mid-append
	// (the next append repairs it) or the file was cut short.
	ErrTornTail = errors.New("audit log ends in an incomplete line")
)

// MaxLineLen bounds one line of the log; Verify reports longer lines as
// malformed instead of reading them into memory.
const MaxLineLen = 16 << 20

// Report is what Verify found.
type Report struct {
	// Files verified, oldest first: the rotated files, then the live one.
	Files []string
	// Events is the number of lines whose chain was intact.
	Events int
	// FirstSeq and LastSeq bound the intact prefix; LastHash is the hash
	// of event LastSeq. Record them elsewhere to detect later truncation
	// of the log's tail, which no hash chain can show on its own.
	FirstSeq, LastSeq uint64
	LastHash          string
	// BadSeq is the first sequence number found bad (0 when intact): the
	// seq the bad line should have had.
	BadSeq uint64
	// KeyID is the key of the keyed events ("" when none is keyed);
	// UnkeyedEvents counts the events before the first keyed one (written
	// before a key was configured), which only SHA-256 protects.
	KeyID         string
	UnkeyedEvents int
	// Head is true when a head record was found and checked: then a cut
	// of the log's tail, or its emptying, is reported as ErrTruncated.
	// HeadSeq is the seq it names.
	Head    bool
	HeadSeq uint64
}

// VerifyError says where the chain first broke.
type VerifyError struct {
	File string
	Line int    // 1-based line number in File
	Seq  uint64 // the seq expected at that line
	Msg  string
	Err  error // ErrTampered, ErrMalformed or ErrTornTail
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("audit: %s:%d: seq %d: %s", e.File, e.Line, e.Seq, e.Msg)
}

func (e *VerifyError) Unwrap() error { return e.Err }

// Verify checks the log at path and the files rotated from it, oldest
// first, as one chain: the first event has seq 1 and the genesis
// prev_hash, each next event has seq+1 and the previous hash as prev_hash,
// and each hash is SHA-256 of the previous hash and the line's bytes before
// its hash member. It returns the Report and, when the chain is broken, a
// *VerifyError naming the file, line and seq. It never panics on bad input.
//
// A hash chain alone cannot show lines removed from its end; the head
// record beside the log (PATH.head, see the package documentation) does:
// a log that ends before the seq it names fails with ErrTruncated. A
// keyed log (events with key_id) needs its key (VerifyKey), or fails
// with ErrKeyRequired. ExpectAnchor checks in addition against a seq and
// hash kept from an earlier Verify, somewhere the writer of the log
// cannot reach. ctx bounds the wait for the append lock and is checked
// between files; a cancelled Verify returns ctx's error, not a verdict.
//
// Verify checks the log as it stood at one moment, taken under the append
// lock: lines appended, and files rotated, by writers while it reads are
// left for the next Verify, and are never taken for a gap or a cut.
func Verify(ctx context.Context, path string, opts ...VerifyOption) (Report, error) {
	s, err := OpenSnapshot(ctx, path, opts...)
	if err != nil {
		return Report{}, err
	}
	defer s.Close()
	return s.Verify(ctx)
}

// Snapshot is the log at a path as it stood at one moment, taken under
// one shared hold of the append lock: its rotated files and its live
// file, open, with the size it had then. Reading them gives every event
// of the log up to that moment, each once, in order, however often
// writers append and rotate meanwhile; Verify checks the same. Close it
// when done.
type Snapshot struct {
	path string
	vo   verifyOptions
	sn   snapshot
}

// OpenSnapshot takes a Snapshot of the log at path. opts are those of
// Verify (the key also reads the head record). ctx bounds the wait for
// the append lock.
func OpenSnapshot(ctx context.Context, path string, opts ...VerifyOption) (*Snapshot, error) {
	s := &Snapshot{path: path}
	for _, o := range opts {
		o(&s.vo)
	}
	sn, err := snapshotLocked(ctx, path, s.vo.key)
	if err != nil {
		return nil, err
	}
	s.sn = sn
	return s, nil
}

// Rotated returns the files rotated from the log, oldest first. They are
// never written again, so they can be opened by name after the snapshot.
func (s *Snapshot) Rotated() []string { return s.sn.rotated }

// Live returns the live file, open, and its size at the snapshot: the
// bytes after it were appended later. f is nil when there was no live
// file. It belongs to the Snapshot, and Close closes it; it keeps its
// bytes when a later rotation renames it.
func (s *Snapshot) Live() (f *os.File, size int64) { return s.sn.live, s.sn.liveSize }

// Files returns the rotated files, oldest first, then the live file's
// path when there was one.
func (s *Snapshot) Files() []string {
	files := append([]string(nil), s.sn.rotated...)
	if s.sn.live != nil {
		files = append(files, s.path)
	}
	return files
}

// Close closes the live file.
func (s *Snapshot) Close() error {
	if s.sn.live == nil {
		return nil
	}
	err := s.sn.live.Close()
	s.sn.live = nil
	return err
}

// Verify checks the log as it stood at the snapshot, as the package's
// Verify does. ctx is checked between files.
func (s *Snapshot) Verify(ctx context.Context) (Report, error) {
	var rep Report
	path, sn, vo := s.path, s.sn, s.vo
	h, hasHead, herr := sn.h, sn.ok, sn.herr
	files := s.Files()
	if sn.live == nil && len(files) == 0 {
		if hasHead && herr == nil && h.Seq > 0 {
			rep.Head, rep.HeadSeq, rep.BadSeq = true, h.Seq, 1
			return rep, &VerifyError{File: path, Seq: 1, Err: ErrTruncated,
				Msg: fmt.Sprintf("the log is gone, but its head record says it held seq %d", h.Seq)}
		}
		return rep, fmt.Errorf("audit: %w", sn.liveErr)
	}
	rep.Files = files
	v := verifier{rep: &rep, prev: GenesisHash, vo: vo}
	if hasHead && herr == nil {
		v.headSeq = h.Seq
	}
	for _, f := range sn.rotated {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("audit: verify: %w", err)
		}
		if err := v.file(f); err != nil {
			return rep, err
		}
	}
	if sn.live != nil {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("audit: verify: %w", err)
		}
		// Only the bytes the live file held when the snapshot was taken:
		// the rotated files listed then and those bytes are one chain,
		// whatever was appended or rotated since.
		if err := v.stream(io.NewSectionReader(sn.live, 0, sn.liveSize), path); err != nil {
			return rep, err
		}
	}
	last := files[len(files)-1]
	if err := v.checkHead(last, h, hasHead, herr); err != nil {
		return rep, err
	}
	return rep, v.checkAnchor(last)
}

// snapshotLocked takes, under one shared hold of the append lock (when
// the lock file can be opened), what Verify checks: the head record, the
// list of rotated files, and the live file, open, with its size. A
// writer appends and rotates only under the exclusive lock, so these
// agree with each other: the rotated files listed and the first liveSize
// bytes of the live file are one chain, and the head record names an
// event in it. Rotated files are never written again, and the open live
// file keeps its bytes when a later rotation renames it, so Verify reads
// them after letting go of the lock, and writers are held up only for
// the listing. Without the lock (no lock file: no writer ever opened the
// log), a rotation while Verify lists the files could break that
// agreement, but nobody is there to rotate. It fails only when ctx
// ended the wait for the lock.
func snapshotLocked(ctx context.Context, path string, k *Key) (snapshot, error) {
	if lf, err := os.OpenFile(path+".lock", os.O_RDONLY|syscall.O_NOFOLLOW, 0); err == nil {
		defer lf.Close()
		if err := flock.LockShared(ctx, lf); err == nil {
			defer flock.Unlock(lf)
		} else if cerr := ctx.Err(); cerr != nil {
			return snapshot{}, fmt.Errorf("audit: verify: %w", cerr)
		}
	}
	var sn snapshot
	sn.h, sn.ok, sn.herr = readHeadFile(path, k)
	rotated, err := rotatedFiles(path)
	if err != nil {
		return snapshot{}, err
	}
	sn.rotated = rotated
	f, err := os.Open(path)
	if err != nil {
		if len(rotated) == 0 || errors.Is(err, fs.ErrNotExist) {
			sn.liveErr = err
			return sn, nil
		}
		return snapshot{}, fmt.Errorf("audit: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return snapshot{}, fmt.Errorf("audit: %w", err)
	}
	sn.live, sn.liveSize = f, st.Size()
	return sn, nil
}

// snapshot is what snapshotLocked found: the head record, whether there
// is one, and why it could not be used; the rotated files, oldest first;
// the live file and its size then (nil when it could not be opened, and
// liveErr says why).
type snapshot struct {
	h        head
	ok       bool
	herr     error
	rotated  []string
	live     *os.File
	liveSize int64
	liveErr  error
}

func (v *verifier) checkHead(lastFile string, h head, ok bool, err error) error {
	rep := v.rep
	fail := func(kind error, seq uint64, file string, line int, format string, args ...any) error {
		rep.BadSeq = seq
		return &VerifyError{File: file, Line: line, Seq: seq, Err: kind, Msg: fmt.Sprintf(format, args...)}
	}
	if !ok {
		if rep.KeyID != "" {
			return fail(ErrTampered, rep.LastSeq+1, lastFile+HeadSuffix, 0,
				"the head record of a keyed log is missing: a cut of its tail could not be seen")
		}
		return nil
	}
	if errors.Is(err, ErrKeyRequired) {
		return fail(ErrKeyRequired, rep.LastSeq+1, lastFile+HeadSuffix, 0, "%v", err)
	}
	if err != nil {
		return fail(ErrTampered, rep.LastSeq+1, lastFile+HeadSuffix, 0, "%v", err)
	}
	rep.Head, rep.HeadSeq = true, h.Seq
	if h.Seq == 0 {
		// Written by a keyed writer before the first line of a new log:
		// it names the genesis, under the key of the lines that follow.
		if h.Hash != GenesisHash || rep.KeyID != "" && h.KeyID == "" {
			return fail(ErrTampered, 1, lastFile+HeadSuffix, 0,
				"the head record names seq 0 with hash %s (key %q): it was rewritten", h.Hash, h.KeyID)
		}
		return nil
	}
	if rep.KeyID != "" && h.KeyID == "" && h.Seq >= v.firstKeyed {
		return fail(ErrTampered, h.Seq, lastFile+HeadSuffix, 0,
			"the head record is not keyed, but the log is keyed from seq %d: it was rewritten", v.firstKeyed)
	}
	if rep.LastSeq < h.Seq {
		if rep.LastSeq == 0 {
			return fail(ErrTruncated, 1, lastFile, 0,
				"the log is empty, but its head record says it held seq %d: the file was emptied", h.Seq)
		}
		return fail(ErrTruncated, rep.LastSeq+1, lastFile, v.lines,
			"the log ends at seq %d, but its head record says seq %d: events %d..%d were cut from the end",
			rep.LastSeq, h.Seq, rep.LastSeq+1, h.Seq)
	}
	if v.headSeen != h.Hash {
		return fail(ErrTampered, h.Seq, v.headFile, v.headLine,
			"seq %d has hash %s, its head record says %s: the log was rewritten", h.Seq, v.headSeen, h.Hash)
	}
	return nil
}

// VerifyOption adds a check to Verify.
type VerifyOption func(*verifyOptions)

type verifyOptions struct {
	anchorSeq  uint64
	anchorHash string
	key        *Key
}

// VerifyKey gives Verify the key of a keyed chain. Events without key_id
// before the first keyed one are accepted (and counted in
// Report.UnkeyedEvents); an unkeyed event after a keyed one is a
// downgrade and fails with ErrTampered.
func VerifyKey(k *Key) VerifyOption {
	return func(o *verifyOptions) { o.key = k }
}

// ExpectAnchor makes Verify fail unless the log holds event seq with
// exactly this hash: a log cut back before seq, or rewritten from an
// earlier point on, no longer does.
func ExpectAnchor(seq uint64, hash string) VerifyOption {
	return func(o *verifyOptions) { o.anchorSeq, o.anchorHash = seq, hash }
}

func (v *verifier) checkAnchor(lastFile string) error {
	if v.vo.anchorSeq == 0 {
		return nil
	}
	if v.rep.LastSeq < v.vo.anchorSeq {
		v.rep.BadSeq = v.rep.LastSeq + 1
		return &VerifyError{File: lastFile, Line: v.lines, Seq: v.rep.LastSeq + 1, Err: ErrTampered,
			Msg: fmt.Sprintf("log ends at seq %d but seq %d was recorded before: events were removed from the end", v.rep.LastSeq, v.vo.anchorSeq)}
	}
	if v.anchorSeen != v.vo.anchorHash {
		v.rep.BadSeq = v.vo.anchorSeq
		return &VerifyError{File: v.anchorFile, Line: v.anchorLine, Seq: v.vo.anchorSeq, Err: ErrTampered,
			Msg: fmt.Sprintf("seq %d has hash %s, the anchor says %s: the log was rewritten", v.vo.anchorSeq, v.anchorSeen, v.vo.anchorHash)}
	}
	return nil
}

// VerifyReader checks one stream as a whole log (seq from 1). name is used
// in error messages. A stream has no head record, so a cut tail is not
// seen; ExpectAnchor still applies, and VerifyKey for a keyed log.
func VerifyReader(r io.Reader, name string, opts ...VerifyOption) (Report, error) {
	rep := Report{Files: []string{name}}
	v := verifier{rep: &rep, prev: GenesisHash}
	for _, o := range opts {
		o(&v.vo)
	}
	if err := v.stream(r, name); err != nil {
		return rep, err
	}
	return rep, v.checkAnchor(name)
}

type verifier struct {
	rep        *Report
	prev       string
	seq        uint64
	vo         verifyOptions
	anchorSeen string // hash of seq vo.anchorSeq, once read
	anchorFile string // where it was read
	anchorLine int
	lines      int // lines read in the current file
	// The head record's seq, and the hash, file and line of that seq.
	headSeq  uint64
	headSeen string
	headFile string
	headLine int
	// firstKeyed is the seq of the first keyed event.
	firstKeyed uint64
}

func (v *verifier) file(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	return v.stream(f, path)
}

func (v *verifier) stream(r io.Reader, name string) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for lineNo := 1; ; lineNo++ {
		want := v.seq + 1
		bad := func(kind error, format string, args ...any) error {
			v.rep.BadSeq = want
			return &VerifyError{File: name, Line: lineNo, Seq: want, Msg: fmt.Sprintf(format, args...), Err: kind}
		}
		line, err := readLine(br)
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, errLineTooLong) {
			return bad(ErrMalformed, "line longer than %d bytes", MaxLineLen)
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return bad(ErrTornTail, "last line is incomplete (%d bytes, no newline)", len(line))
		}
		if err != nil {
			return fmt.Errorf("audit: read %s: %w", name, err)
		}
		e, perr := ParseLine(line)
		if perr != nil {
			if v.seq == 0 && lineNo == 1 {
				return bad(ErrMalformed, "not an audit log: %v", perr)
			}
			return bad(ErrMalformed, "%v", perr)
		}
		canon, claimed, ok := splitLine(line)
		if !ok || claimed != e.Hash {
			return bad(ErrMalformed, "line does not end with its hash member")
		}
		switch {
		case e.Seq == want:
		case e.Seq > want:
			return bad(ErrTampered, "events %d..%d are missing (line has seq %d)", want, e.Seq-1, e.Seq)
		default:
			return bad(ErrTampered, "out of order: line has seq %d after seq %d (inserted or moved)", e.Seq, v.seq)
		}
		if e.PrevHash != v.prev {
			return bad(ErrTampered, "prev_hash does not match the hash of seq %d (a line before it was changed, removed or inserted)", v.seq)
		}
		var k *Key
		switch {
		case e.KeyID != "":
			if v.vo.key == nil {
				return bad(ErrKeyRequired, "the event is keyed with key %s and no key was given", e.KeyID)
			}
			if e.KeyID != v.vo.key.id {
				return bad(ErrKeyRequired, "the event is keyed with key %s, the key given is %s", e.KeyID, v.vo.key.id)
			}
			k = v.vo.key
		case v.rep.KeyID != "":
			return bad(ErrTampered, "an unkeyed event after keyed ones (from seq %d): the chain was rewritten without the key", v.firstKeyed)
		}
		if got := k.hashOf(v.prev, canon); !hmac.Equal([]byte(got), []byte(e.Hash)) {
			return bad(ErrTampered, "hash mismatch: the line was modified")
		}
		if e.Action == ActionHeadMismatch {
			// The logger found the log cut (or its head gone) and said so
			// before appending on: the break stays visible.
			return bad(ErrTruncated, "recorded by the next writer: %s", e.Detail)
		}
		if k != nil && v.rep.KeyID == "" {
			v.rep.KeyID, v.firstKeyed = k.id, e.Seq
		}
		if k == nil {
			v.rep.UnkeyedEvents++
		}
		if v.rep.Events == 0 {
			v.rep.FirstSeq = e.Seq
		}
		v.rep.Events++
		v.rep.LastSeq, v.rep.LastHash = e.Seq, e.Hash
		v.seq, v.prev = e.Seq, e.Hash
		v.lines = lineNo
		if e.Seq == v.vo.anchorSeq {
			v.anchorSeen, v.anchorFile, v.anchorLine = e.Hash, name, lineNo
		}
		if e.Seq == v.headSeq {
			v.headSeen, v.headFile, v.headLine = e.Hash, name, lineNo
		}
	}
}

var errLineTooLong = errors.New("line too long")

// readLine returns the next line without its newline. A final line with no
// newline comes back with io.ErrUnexpectedEOF.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > MaxLineLen+1 {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return bytes.TrimSuffix(line, []byte("\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF:
			if len(line) == 0 {
				return nil, io.EOF
			}
			return line, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

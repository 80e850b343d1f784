package cowfs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"strings"
)

// Op is one change for Tx.Stage. Kind says which of the other fields
// count, as for the matching per-call method.
type Op struct {
	Kind ChangeKind
	Path string
	// Data is the file's bytes (KindWrite). Stage keeps no reference to
	// it after returning.
	Data []byte
	// Open, when set (KindWrite, with Data nil), gives the file's bytes
	// as a stream instead: Stage calls it once, copies what it reads
	// into the transaction's blobs through a fixed buffer while hashing,
	// and closes it, so that a large file is staged in bounded memory.
	// An error from Open or the reader fails this op alone (errs[i]).
	Open func() (io.ReadCloser, error)
	// Mode is the permission bits (KindWrite, KindMkdir), as for Write
	// and Mkdir.
	Mode os.FileMode
	// Target is the link target (KindSymlink).
	Target string
}

// WriteOp, MkdirOp, SymlinkOp and DeleteOp build the Op that does what
// Tx.Write, Mkdir, Symlink and Delete do.
func WriteOp(path string, data []byte, mode os.FileMode) Op {
	return Op{Kind: KindWrite, Path: path, Data: data, Mode: mode}
}

// MkdirOp: see WriteOp.
func MkdirOp(path string, mode os.FileMode) Op { return Op{Kind: KindMkdir, Path: path, Mode: mode} }

// SymlinkOp: see WriteOp.
func SymlinkOp(target, path string) Op { return Op{Kind: KindSymlink, Path: path, Target: target} }

// StreamOp is WriteOp with the bytes read from what open returns (see
// Op.Open).
func StreamOp(path string, open func() (io.ReadCloser, error), mode os.FileMode) Op {
	return Op{Kind: KindWrite, Path: path, Open: open, Mode: mode}
}

// DeleteOp: see WriteOp.
func DeleteOp(path string) Op { return Op{Kind: KindDelete, Path: path} }

// maxPackBytes bounds offsets and sizes read from records, so that their
// sum never overflows.
const maxPackBytes = 1 << 50

const packPrefix = "pack-"

// validPack reports whether name is a pack file name: "pack-" and 16
// lowercase hex digits. Names reach file paths, so nothing else passes.
func validPack(name string) bool {
	id, ok := strings.CutPrefix(name, packPrefix)
	return ok && validID(id)
}

// Stage stages ops, in order, as one batch: each op means what the
// matching Write, Mkdir, Symlink or Delete call means, and sees the
// transaction as the ops before it leave it. An op that call would
// refuse (bad path, limit, nothing to delete) stages nothing: its error
// is errs[i], and the other ops go on. Every limit is checked while the
// batch is planned, before anything is written.
//
// The accepted ops become durable together, at a cost that does not grow
// with their number: their bytes go to one pack file (one fsync, one
// fsync of blobs/), then their records to the stage log headed by a
// batch record (one fsync). A streamed op (Op.Open) has a blob file of
// its own instead (one more fsync, its name covered by the same fsync of
// blobs/), durable before the record that names it, like the pack. When
// Stage returns without error, all of them survive a crash; a crash
// before that leaves none of them in the transaction (at most an
// unreferenced pack or blob file, removed with it).
//
// err is for the batch as a whole (ErrClosed, the context, I/O): then
// nothing was staged and errs is nil.
func (t *Tx) Stage(ctx context.Context, ops []Op) (errs []error, err error) {
	errs = make([]error, len(ops))
	rels := make([]string, len(ops))
	shas := make([]string, len(ops))
	sizes := make([]int64, len(ops))
	for i, op := range ops {
		rels[i], errs[i] = t.checkOp(op)
		if errs[i] == nil && op.Kind == KindWrite && op.Open == nil {
			shas[i], sizes[i] = sha256Hex(op.Data), int64(len(op.Data))
		}
	}
	unlock, err := t.fs.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := t.refreshLocked(true); err != nil {
		return nil, err
	}
	if err := t.fs.countStaged(); err != nil {
		return nil, err
	}
	// Streamed bytes go to temps first, under the lock (a Discard must
	// not remove the directory under them): their size and hash decide
	// the plan.
	temps := make([]string, len(ops))
	defer func() {
		for _, tmp := range temps {
			if tmp != "" {
				t.fs.state.Remove(tmp)
			}
		}
	}()
	var buf []byte
	for i, op := range ops {
		if errs[i] != nil || op.Kind != KindWrite || op.Open == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if buf == nil {
			buf = make([]byte, streamBuf)
		}
		temps[i] = t.dir() + "/blobs/.tmp-s-" + newID()
		shas[i], sizes[i], errs[i], err = t.streamTemp(temps[i], op, buf)
		if err != nil {
			return nil, err
		}
	}
	t.mu.Lock()
	old := t.bytes
	t.pend, t.pendBytes, t.pendCount = map[string]*change{}, t.bytes, len(t.changes)
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.pend = nil
		t.mu.Unlock()
	}()

	pack := packPrefix + newID()
	var (
		all      []stageRec
		packed   [][]byte
		packSize int64
		at       = map[string]int64{} // offset of each SHA-256 in the pack
		recount  bool
		streamed []int // ops whose temp becomes blobs/<sha256>
	)
	for i, op := range ops {
		if errs[i] != nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		recs, err := t.planOp(op, rels[i], shas[i], sizes[i])
		if err != nil {
			errs[i] = err
			continue
		}
		delta, count := t.effect(recs)
		if count > t.fs.opts.maxChanges {
			errs[i] = &LimitError{Name: LimitChanges, Value: int64(t.fs.opts.maxChanges)}
			continue
		}
		t.mu.Lock()
		bytes := t.pendBytes + delta
		t.mu.Unlock()
		if !t.fs.fits(t.id, bytes) {
			// As for a single call, another process may have committed or
			// discarded what this FS still counts; recount once a batch.
			if !recount {
				recount = true
				if err := t.fs.recount(); err != nil {
					return nil, err
				}
			}
			if !t.fs.fits(t.id, bytes) {
				errs[i] = &LimitError{Name: LimitStagedBytes, Value: t.fs.opts.maxStagedBytes}
				continue
			}
		}
		if op.Kind == KindWrite && op.Open != nil {
			// blobs/<sha256>, named below (Pack stays empty).
			streamed = append(streamed, i)
		} else if op.Kind == KindWrite {
			off, ok := at[shas[i]]
			if !ok {
				off = packSize
				at[shas[i]] = off
				packed = append(packed, op.Data)
				packSize += int64(len(op.Data))
			}
			nc := recs[len(recs)-1].Change
			nc.Pack, nc.Off = pack, off
		}
		t.addPending(recs)
		all = append(all, recs...)
	}
	if len(all) == 0 {
		return errs, nil
	}
	t.mu.Lock()
	bytes := t.pendBytes
	t.mu.Unlock()
	for _, i := range streamed {
		name := t.dir() + "/blobs/" + shas[i]
		if _, err := t.fs.state.Lstat(name); err == nil {
			continue // the same bytes, staged before (the temp is removed)
		}
		if err := t.fs.state.Rename(temps[i], name); err != nil {
			return nil, fmt.Errorf("cowfs: stage: %w", err)
		}
		temps[i] = ""
	}
	if len(packed) > 0 {
		// Its fsync of blobs/ makes the streamed names durable too.
		if err := t.writePack(pack, packed); err != nil {
			return nil, err
		}
	} else if len(streamed) > 0 {
		if err := t.fs.syncState(t.dir() + "/blobs"); err != nil {
			return nil, err
		}
	}
	failpoint(fpBatchPacked)
	t.fs.account(t.id, bytes, false)
	if err := t.appendRecs(all); err != nil {
		t.fs.account(t.id, old, false)
		return nil, err
	}
	failpoint(fpStageAppended)
	return errs, nil
}

// checkOp does the checks of an op that need neither the lock nor the
// transaction's state, and returns its cleaned path.
func (t *Tx) checkOp(op Op) (string, error) {
	rel, err := cleanRel(t.fs.ws.dir, op.Path)
	if err != nil {
		return "", err
	}
	switch op.Kind {
	case KindWrite:
		if op.Open != nil && op.Data != nil {
			return "", fmt.Errorf("cowfs: %q: a write has Data or Open, not both", op.Path)
		}
		if int64(len(op.Data)) > t.fs.opts.maxFileBytes {
			return "", &LimitError{Name: LimitFileBytes, Value: t.fs.opts.maxFileBytes}
		}
	case KindSymlink:
		if err := checkLinkTarget(rel, op.Target); err != nil {
			return "", err
		}
	case KindMkdir, KindDelete, KindWhiteout:
	default:
		return "", fmt.Errorf("cowfs: %q: unknown change kind %q", op.Path, op.Kind)
	}
	return rel, nil
}

func (t *Tx) planOp(op Op, rel, sha string, size int64) ([]stageRec, error) {
	switch op.Kind {
	case KindWrite:
		return t.planWrite(rel, sha, size, op.Mode)
	case KindMkdir:
		return t.planMkdir(rel, op.Mode)
	case KindSymlink:
		return t.planSymlink(rel, op.Target)
	case KindWhiteout:
		return t.planWhiteout(rel)
	default:
		return t.planDelete(rel)
	}
}

// streamBuf is the buffer a streamed op is copied through: what staging
// it holds in memory, whatever its size.
const streamBuf = 256 << 10

// streamTemp copies the bytes of streamed op to the new file tmp through
// buf, hashing them, and makes them durable (fsync). opErr is the op's
// own failure (its source, the file size limit), with nothing kept; err
// is the state directory's, which fails the batch.
func (t *Tx) streamTemp(tmp string, op Op, buf []byte) (sha string, size int64, opErr, err error) {
	src, oerr := op.Open()
	if oerr != nil {
		return "", 0, fmt.Errorf("cowfs: %q: reading the bytes to stage: %w", op.Path, oerr), nil
	}
	defer src.Close()
	f, err := t.fs.state.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", 0, nil, fmt.Errorf("cowfs: stage: %w", err)
	}
	defer f.Close() // after a successful Close, a harmless second one
	h := sha256.New()
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if size += int64(n); size > t.fs.opts.maxFileBytes {
				return "", 0, &LimitError{Name: LimitFileBytes, Value: t.fs.opts.maxFileBytes}, nil
			}
			h.Write(buf[:n])
			if _, err := f.Write(buf[:n]); err != nil {
				return "", 0, nil, fmt.Errorf("cowfs: stage: %w", err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return "", 0, fmt.Errorf("cowfs: %q: reading the bytes to stage: %w", op.Path, rerr), nil
		}
	}
	if err := f.Sync(); err != nil {
		return "", 0, nil, fmt.Errorf("cowfs: stage: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", 0, nil, fmt.Errorf("cowfs: stage: %w", err)
	}
	failpoint(fpBatchStreamed)
	return hex.EncodeToString(h.Sum(nil)), size, nil, nil
}

// writePack writes the batch's bytes, one after the other, to
// blobs/<name>, and makes the file and its name durable.
func (t *Tx) writePack(name string, data [][]byte) error {
	p := t.dir() + "/blobs/" + name
	f, err := t.fs.state.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	fail := func(err error) error {
		f.Close()
		t.fs.state.Remove(p)
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	// Through a buffer: a batch of small files is one write, not one
	// each (a bigger piece goes straight through).
	bw := bufio.NewWriterSize(f, streamBuf)
	for _, d := range data {
		if _, err := bw.Write(d); err != nil {
			return fail(err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fail(err)
	}
	// The pack's bytes and its name in blobs/ are both needed before the
	// records that point at them are appended, in no order: one wait.
	d, err := t.fs.state.Open(t.dir() + "/blobs")
	if err != nil {
		return fail(err)
	}
	err = syncTogether(f, d)
	d.Close()
	if err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		t.fs.state.Remove(p)
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	return nil
}

// fits reports whether transaction id may hold bytes staged bytes
// without the workspace total passing its limit.
func (f *FS) fits(id string, bytes int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	delta := bytes - f.counted[id]
	return delta <= 0 || f.staged+delta <= f.opts.maxStagedBytes
}

// openBlob opens the staged bytes of write change c of the transaction
// whose state directory is dir: blobs/<sha256>, or c's section of a pack.
func (f *FS) openBlob(dir string, c *change) (io.Reader, io.Closer, error) {
	if c.Pack == "" {
		fl, err := f.state.Open(dir + "/blobs/" + c.Blob)
		if err != nil {
			return nil, nil, err
		}
		return fl, fl, nil
	}
	p, err := f.openPack(dir, c)
	if err != nil {
		return nil, nil, err
	}
	if _, err := p.fl.Seek(c.Off, io.SeekStart); err != nil {
		p.fl.Close()
		return nil, nil, err
	}
	// A LimitedReader over the file keeps io.Copy's copy_file_range path.
	return io.LimitReader(p.fl, c.Size), p.fl, nil
}

// openPack opens the pack of write change c and checks that it holds
// c's piece.
func (f *FS) openPack(dir string, c *change) (packFile, error) {
	fl, err := f.state.Open(dir + "/blobs/" + c.Pack)
	if err != nil {
		return packFile{}, err
	}
	fi, err := fl.Stat()
	if err != nil {
		fl.Close()
		return packFile{}, err
	}
	p := packFile{fl: fl, size: fi.Size()}
	if err := p.holds(c); err != nil {
		fl.Close()
		return packFile{}, err
	}
	return p, nil
}

func (p packFile) holds(c *change) error {
	if c.Off < 0 || c.Size < 0 || p.size < c.Off+c.Size {
		return fmt.Errorf("pack %s holds %d bytes, %q needs %d at %d", c.Pack, p.size, c.Path, c.Size, c.Off)
	}
	return nil
}

// blobReader opens the staged bytes of one transaction's writes, keeping
// each pack it opens open until close: the writes of a Stage batch share
// one pack, and opening it again for each (four lookups through the
// state root) cost a commit of many small files more than reading their
// bytes. Packs are immutable, and a commit reads them under the lock. A
// pack is read whole, once, when it is opened, while the packs so held
// stay within packWhole bytes in all (one read instead of one per piece;
// each piece is still checked against its record by whoever reads it):
// a transaction of many Stage batches has as many packs, which are not
// all held in memory at once.
type blobReader struct {
	f     *FS
	dir   string
	packs map[string]packFile
	whole int64   // bytes of the packs read whole
	buf   *[]byte // what the bytes are read through, from copyBufs
}

type packFile struct {
	fl   *os.File
	size int64
	data []byte // the whole pack, when read whole
}

// packWhole bounds the bytes of the packs a blobReader holds read whole.
const packWhole = 16 << 20

// noClose is the closer of a piece of a kept pack.
type noClose struct{}

func (noClose) Close() error { return nil }

func (f *FS) blobReader(dir string) *blobReader {
	return &blobReader{f: f, dir: dir, packs: map[string]packFile{}}
}

// open is openBlob through the kept packs.
func (b *blobReader) open(c *change) (io.Reader, io.Closer, error) {
	if c.Pack == "" {
		return b.f.openBlob(b.dir, c)
	}
	p, ok := b.packs[c.Pack]
	if !ok {
		var err error
		if p, err = b.f.openPack(b.dir, c); err != nil {
			return nil, nil, err
		}
		if p.size <= packWhole-b.whole {
			p.data = make([]byte, p.size)
			if _, err := io.ReadFull(io.NewSectionReader(p.fl, 0, p.size), p.data); err != nil {
				p.fl.Close()
				return nil, nil, err
			}
			b.whole += p.size
		}
		b.packs[c.Pack] = p
	} else if err := p.holds(c); err != nil {
		return nil, nil, err
	}
	if p.data != nil {
		return bytes.NewReader(p.data[c.Off : c.Off+c.Size]), noClose{}, nil
	}
	return io.NewSectionReader(p.fl, c.Off, c.Size), noClose{}, nil
}

// buffer is the reader's buffer, for one copy at a time.
func (b *blobReader) buffer() []byte {
	if b.buf == nil {
		b.buf = copyBufs.Get().(*[]byte)
	}
	return *b.buf
}

// close closes the kept packs; nil-safe.
func (b *blobReader) close() {
	if b == nil {
		return
	}
	for k, p := range b.packs {
		p.fl.Close()
		delete(b.packs, k)
	}
	if b.buf != nil {
		copyBufs.Put(b.buf)
		b.buf = nil
	}
}

// check reads the staged bytes of write change c and checks their size
// and SHA-256 against the record, so that a truncated, zeroed or flipped
// blob is found before anything depends on it. The error wraps
// ErrDamaged and names the path.
func (b *blobReader) check(c *change) error {
	r, cl, err := b.open(c)
	if err != nil {
		return fmt.Errorf("%w: staged bytes of %q are missing: %v", ErrDamaged, c.Path, err)
	}
	defer cl.Close()
	if c.Pack == "" {
		if fl, ok := cl.(*os.File); ok {
			if fi, err := fl.Stat(); err == nil && fi.Size() != c.Size {
				return fmt.Errorf("%w: staged bytes of %q are %d bytes, the record says %d", ErrDamaged, c.Path, fi.Size(), c.Size)
			}
		}
	}
	h := sha256.New()
	n, err := copyHash(h, nil, r, b.buffer())
	if err != nil {
		return fmt.Errorf("%w: staged bytes of %q: %v", ErrDamaged, c.Path, err)
	}
	return verifySum(c, n, h)
}

// verifySum compares n bytes hashed into h with write change c.
func verifySum(c *change, n int64, h hash.Hash) error {
	if n != c.Size {
		return fmt.Errorf("%w: staged bytes of %q are %d bytes, the record says %d", ErrDamaged, c.Path, n, c.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != c.Blob {
		return fmt.Errorf("%w: staged bytes of %q have SHA-256 %.12s…, the record says %.12s…", ErrDamaged, c.Path, got, c.Blob)
	}
	return nil
}

// checkBlobs checks the staged bytes of every write in ops, each
// distinct piece once.
func (f *FS) checkBlobs(dir string, ops []walOp) error {
	type key struct {
		pack, blob string
		off, size  int64
	}
	seen := map[key]bool{}
	b := f.blobReader(dir)
	defer b.close()
	for i := range ops {
		c := &ops[i].change
		if c.Kind != KindWrite {
			continue
		}
		k := key{c.Pack, c.Blob, c.Off, c.Size}
		if seen[k] {
			continue
		}
		if err := b.check(c); err != nil {
			return err
		}
		seen[k] = true
	}
	return nil
}

package cowfs

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// The stack generation lets a process that read the pending stack before
// know, with one read of the lock file, that nobody changed the staging
// area since: a command on an unchanged stack of hundreds of transactions
// then reads none of them again (not even their two fstatat calls).
//
// Every holder of the workspace lock except a reader of the stack writes
// a new random generation into the lock file right after taking the lock,
// before it changes anything: so a holder that crashes half way through a
// change has already made every cached stack stale, and none is trusted
// again. The generation is random rather than counted, so that a lock file
// removed and made again never brings an old value back. It is not
// fsynced: only processes hold cached stacks, and none outlives the
// machine. A reader that finds no generation writes one (it holds the
// lock). As a second guard, against a transaction directory added or
// removed by hand or by a pulse from before the generation, the tx
// directory must also look as it did (identity, mtime and ctime).

// genSize is the length of a generation.
const genSize = 16

// newGen writes a fresh generation into the lock file and returns it.
func newGen(lf *os.File) ([]byte, error) {
	g := make([]byte, genSize)
	if _, err := rand.Read(g); err != nil {
		return nil, err
	}
	if _, err := lf.WriteAt(g, 0); err != nil {
		return nil, err
	}
	return g, nil
}

// readGen returns the lock file's generation, writing one if it has none.
func readGen(lf *os.File) ([]byte, error) {
	g := make([]byte, genSize)
	n, err := lf.ReadAt(g, 0)
	if n == genSize {
		return g, nil
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return newGen(lf)
}

// txDirStamp is the tx directory's identity and times, read from its
// descriptor; ok false when it cannot be read.
func txDirStamp(dirfd int) (dirStamp, bool) {
	var st unix.Stat_t
	if unix.Fstat(dirfd, &st) != nil {
		return dirStamp{}, false
	}
	return dirStamp{ino: st.Ino, dev: uint64(st.Dev), mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, true
}

// unchangedStack returns the last stack read when the generation is the
// one it was read at and the tx directory looks as it did then; nil
// otherwise. The caller holds the lock.
func (f *FS) unchangedStack(gen []byte) *Stack {
	last := f.lastStack
	if last == nil || gen == nil || !bytes.Equal(gen, f.lastGen) {
		return nil
	}
	d, err := f.state.Open("tx")
	if err != nil {
		return nil
	}
	now, ok := txDirStamp(int(d.Fd()))
	d.Close()
	if !ok || now != f.lastTxDir {
		return nil
	}
	return &Stack{fs: f, Txs: last.Txs, lane: last.lane, all: last.all, lanes: last.lanes, key: last.key}
}

// keepStack records st as the last stack, read at gen with the tx
// directory as stamped (a nil gen or no stamp keeps nothing).
func (f *FS) keepStack(st *Stack, ids []string, gen []byte, txDir dirStamp, stamped bool) {
	f.lastStack, f.lastIDs = st, slices.Clone(ids)
	f.lastGen, f.lastTxDir = nil, dirStamp{}
	if gen != nil && stamped {
		f.lastGen, f.lastTxDir = slices.Clone(gen), txDir
	}
}

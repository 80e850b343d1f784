package cowfs

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
)

// The seal of a stage log, tx/<id>/seal, says how many bytes of whole
// records the log held when its last append returned, so that a log cut
// at a record boundary (or cut anywhere before that point) is told apart
// from a torn tail: a torn tail only ever lies past the seal, since the
// append it belonged to never returned. Without it, losing the last
// records of a log looks like a log that never had them, and the commit
// would succeed with those changes silently gone.
//
// It is two 32-byte slots, written in turn, each
//
//	[0:4]   "PSL1"
//	[4:12]  uint64 LE sequence number, one more each append
//	[12:20] uint64 LE length of the log
//	[20:24] CRC-32C of [0:20]
//	[24:32] zero
//
// and the valid slot with the higher sequence number counts. A slot is
// rewritten in place and fdatasynced after the log's fsync, so a crash
// tearing one leaves the other (the previous append's length, which the
// log still holds). A log whose begin record says "sealed" must have a
// seal; logs written before seals existed have none and are read as
// before.
const (
	sealSlot  = 32
	sealMagic = "PSL1"
)

func encodeSealSlot(seq, length uint64) []byte {
	b := make([]byte, sealSlot)
	copy(b, sealMagic)
	binary.LittleEndian.PutUint64(b[4:12], seq)
	binary.LittleEndian.PutUint64(b[12:20], length)
	binary.LittleEndian.PutUint32(b[20:24], crc32.Checksum(b[:20], crcTable()))
	return b
}

// decodeSeal returns the length and sequence number of the newer valid
// slot; ok is false when neither is valid.
func decodeSeal(b []byte) (length, seq uint64, ok bool) {
	for off := 0; off+sealSlot <= len(b) && off < 2*sealSlot; off += sealSlot {
		s := b[off : off+sealSlot]
		if string(s[:4]) != sealMagic || crc32.Checksum(s[:20], crcTable()) != binary.LittleEndian.Uint32(s[20:24]) {
			continue
		}
		if q := binary.LittleEndian.Uint64(s[4:12]); !ok || q > seq {
			seq, length, ok = q, binary.LittleEndian.Uint64(s[12:20]), true
		}
	}
	return length, seq, ok
}

// newSeal is the seal of a log that is length bytes long when created.
func newSeal(length uint64) []byte {
	return append(encodeSealSlot(1, length), make([]byte, sealSlot)...)
}

// readSeal returns the sealed length of transaction t's log and the
// sequence number of the slot that said so.
func (t *Tx) readSeal() (length, seq uint64, err error) {
	b, err := t.fs.state.ReadFile(t.dir() + "/seal")
	if err != nil {
		return 0, 0, fmt.Errorf("%w: transaction %s: the seal of its stage log is missing: %v", ErrDamaged, t.id, err)
	}
	length, seq, ok := decodeSeal(b)
	if !ok {
		return 0, 0, fmt.Errorf("%w: transaction %s: the seal of its stage log is damaged", ErrDamaged, t.id)
	}
	return length, seq, nil
}

// checkSeal refuses a stage log whose whole records end at whole, before
// the length its seal records: records that were appended (the call that
// appended them returned) are gone. A log of no whole record is refused
// whatever its seal says, since every log is made with its begin record.
func (t *Tx) checkSeal(whole int64) error {
	length, seq, err := t.readSeal()
	if err != nil {
		return err
	}
	t.sealSeq = seq
	if uint64(whole) < length {
		return fmt.Errorf("%w: transaction %s: its stage log holds %d bytes of whole records but %d were written: staged changes were lost (the log was cut or damaged)",
			ErrDamaged, t.id, whole, length)
	}
	if whole == 0 {
		return fmt.Errorf("%w: transaction %s: its stage log holds no whole begin record (the log was cut or damaged)", ErrDamaged, t.id)
	}
	return nil
}

// writeSeal records that the log is length bytes long, in the slot the
// previous append did not use, and makes it durable.
func (t *Tx) writeSeal(length int64) error {
	fl, err := t.fs.state.OpenFile(t.dir()+"/seal", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer fl.Close()
	seq := t.sealSeq + 1
	if _, err := fl.WriteAt(encodeSealSlot(seq, uint64(length)), int64(seq%2)*sealSlot); err != nil {
		return err
	}
	if err := fl.Sync(); err != nil {
		return err
	}
	t.sealSeq = seq
	return nil
}

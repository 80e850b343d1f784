package audit

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
)

// The head record: PATH.head holds the seq and hash of the last event
// appended, rewritten in place (one pwrite of headSize bytes, under the
// append lock) after each append. Cutting lines off the end of the log, or
// emptying it, leaves the head pointing past its end, which Verify
// reports; with a key the head carries an HMAC, so it cannot be rewritten
// to match a cut log without the key.

// HeadSuffix is appended to the log's path to name its head record.
const HeadSuffix = ".head"

// headSize is the fixed length of the head record: fixed so that each
// update overwrites the whole previous one with a single write.
const headSize = 256

// ActionHeadMismatch is the action of the event a Logger records when it
// finds the log does not end where its head record says (lines cut from
// the end, the file emptied, the head removed or damaged). Verify reports
// such an event as ErrTruncated: the chain was broken before it.
const ActionHeadMismatch = "audit-head-mismatch"

// ErrTruncated: events were cut from the end of the log (or the file was
// emptied or removed), as its head record shows.
var ErrTruncated = errors.New("audit log was cut short")

// head is the decoded head record.
type head struct {
	V     int    `json:"v"`
	Seq   uint64 `json:"seq"`
	Hash  string `json:"hash"`
	KeyID string `json:"key_id,omitempty"`
	Sum   string `json:"sum"`
}

func headSum(k *Key, seq uint64, hash string) string {
	msg := "pulse audit head\n" + strconv.FormatUint(seq, 10) + "\n" + hash + "\n"
	if k == nil {
		s := sha256.Sum256([]byte(msg))
		return hex.EncodeToString(s[:])
	}
	m := hmac.New(sha256.New, k.secret)
	io.WriteString(m, msg+k.id)
	return hex.EncodeToString(m.Sum(nil))
}

func encodeHead(k *Key, seq uint64, hash string) []byte {
	h := head{V: 1, Seq: seq, Hash: hash, Sum: headSum(k, seq, hash)}
	if k != nil {
		h.KeyID = k.id
	}
	b, _ := json.Marshal(&h)
	out := bytes.Repeat([]byte{' '}, headSize)
	copy(out, b)
	out[headSize-1] = '\n'
	return out
}

// errHeadDamaged: the head record is not one, or its sum does not match.
var errHeadDamaged = errors.New("head record damaged")

// decodeHead parses a head record and checks its sum: with k when the
// record is keyed (ErrKeyRequired when k is nil or another key).
func decodeHead(b []byte, k *Key) (head, error) {
	var h head
	if err := json.Unmarshal(bytes.TrimRight(b, " \n"), &h); err != nil || h.V != 1 || !isHex([]byte(h.Hash)) {
		return h, errHeadDamaged
	}
	if h.KeyID != "" {
		if k == nil || k.id != h.KeyID {
			return h, fmt.Errorf("%w: the head record is keyed with key %s", ErrKeyRequired, h.KeyID)
		}
	} else {
		k = nil
	}
	if !hmac.Equal([]byte(h.Sum), []byte(headSum(k, h.Seq, h.Hash))) {
		return h, errHeadDamaged
	}
	return h, nil
}

// readHeadFile reads PATH.head; ok is false when there is none.
func readHeadFile(path string, k *Key) (h head, ok bool, err error) {
	f, err := os.OpenFile(path+HeadSuffix, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return h, false, nil
	}
	if err != nil {
		return h, false, fmt.Errorf("audit: head record: %w", err)
	}
	defer f.Close()
	b := make([]byte, headSize+1)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return h, false, fmt.Errorf("audit: head record: %w", err)
	}
	if n == 0 {
		// Created by a writer's Open, before its first append.
		return h, false, nil
	}
	if n != headSize {
		return h, true, errHeadDamaged
	}
	h, err = decodeHead(b[:n], k)
	return h, true, err
}

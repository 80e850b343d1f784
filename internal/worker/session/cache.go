package session

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"google.golang.org/protobuf/proto"
)

// fingerprint identifies an exec's content. The command's length is hashed
// first so that command "ab" with stdin "c" differs from "a" with "bc".
// A Box, when there is one, is hashed after the stdin (deterministic
// encoding, its length first): an Exec without one hashes as it always did.
type fingerprint [sha256.Size]byte

func fingerprintOf(command string, stdin []byte, box *sandboxv1.Box) fingerprint {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(command)))
	h.Write(n[:])
	h.Write([]byte(command))
	if box != nil {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(box)
		binary.BigEndian.PutUint64(n[:], uint64(len(stdin)))
		h.Write(n[:])
		h.Write(stdin)
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	} else {
		h.Write(stdin)
	}
	var fp fingerprint
	h.Sum(fp[:0])
	return fp
}

type cacheEntry struct {
	reqID    uint64
	fp       fingerprint
	terminal *sandboxv1.WorkerFrame
}

// lru is a bounded least-recently-used map req_id → terminal frame. It is
// not safe for concurrent use; Session guards it.
type lru struct {
	max   int
	order *list.List // front = most recent
	items map[uint64]*list.Element
}

func newLRU(max int) *lru {
	return &lru{max: max, order: list.New(), items: make(map[uint64]*list.Element)}
}

func (c *lru) get(reqID uint64) (cacheEntry, bool) {
	el, ok := c.items[reqID]
	if !ok {
		return cacheEntry{}, false
	}
	c.order.MoveToFront(el)
	return el.Value.(cacheEntry), true
}

func (c *lru) put(reqID uint64, fp fingerprint, terminal *sandboxv1.WorkerFrame) {
	e := cacheEntry{reqID: reqID, fp: fp, terminal: proto.Clone(terminal).(*sandboxv1.WorkerFrame)}
	if el, ok := c.items[reqID]; ok {
		el.Value = e
		c.order.MoveToFront(el)
		return
	}
	c.items[reqID] = c.order.PushFront(e)
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.items, last.Value.(cacheEntry).reqID)
	}
}

func (c *lru) len() int { return c.order.Len() }

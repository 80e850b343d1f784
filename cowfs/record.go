package cowfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
)

// A record file (stage log, WAL, after-image) is a sequence of frames:
//
//	uint32 little-endian payload length (1 .. maxRecord)
//	uint32 little-endian CRC-32C (Castagnoli) of the payload
//	payload (one JSON object)
//
// A zero length is refused so that a zeroed sector never decodes as a run
// of empty records (the CRC-32C of nothing is 0).
const (
	frameHeader = 8
	maxRecord   = 1 << 20
)

// crcTable is made on first use, not at package init: every process that
// links cowfs (the namespace init too) would pay for the table otherwise,
// and most never read or write a record.
var crcTable = sync.OnceValue(func() *crc32.Table { return crc32.MakeTable(crc32.Castagnoli) })

// errCorrupt marks a record file that is damaged somewhere other than a
// torn tail: bad length, bad checksum, bad payload.
var errCorrupt = errors.New("corrupt record")

func appendFrame(dst, payload []byte) []byte {
	var h [frameHeader]byte
	binary.LittleEndian.PutUint32(h[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:8], crc32.Checksum(payload, crcTable()))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// decodeFrames splits buf into payloads. good is the offset just past the
// last whole, valid frame. err is nil when buf ends on a frame boundary,
// wraps io.ErrUnexpectedEOF when the last frame is cut short (a torn
// append, which a log may truncate away), and wraps errCorrupt for any
// other damage.
func decodeFrames(buf []byte) (payloads [][]byte, good int, err error) {
	off := 0
	for off < len(buf) {
		if len(buf)-off < frameHeader {
			return payloads, off, fmt.Errorf("frame header at %d: %w", off, io.ErrUnexpectedEOF)
		}
		n := binary.LittleEndian.Uint32(buf[off : off+4])
		sum := binary.LittleEndian.Uint32(buf[off+4 : off+8])
		if n == 0 || n > maxRecord {
			return payloads, off, fmt.Errorf("%w: frame at %d has length %d", errCorrupt, off, n)
		}
		end := off + frameHeader + int(n)
		if end > len(buf) {
			return payloads, off, fmt.Errorf("frame at %d wants %d bytes, %d left: %w", off, n, len(buf)-off-frameHeader, io.ErrUnexpectedEOF)
		}
		p := buf[off+frameHeader : end]
		if crc32.Checksum(p, crcTable()) != sum {
			return payloads, off, fmt.Errorf("%w: frame at %d fails its checksum", errCorrupt, off)
		}
		payloads = append(payloads, p)
		off = end
	}
	return payloads, off, nil
}

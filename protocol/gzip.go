package protocol

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// StoredGzipMax is how much a GzipWriter holds back before it compresses:
// a stream that ends within it is written as one stored (uncompressed)
// deflate block. Setting up compress/flate's compressor allocates about
// 1.2 MB of tables and takes ~0.3–1 ms here, more than packing and
// sending a small workspace or overlay takes in all, and compressing a
// few KiB saves less than that on any link. Any gzip reader reads both.
const StoredGzipMax = 16 << 10

// GzipWriter writes a gzip stream, as the upload and overlay archives
// are: streams of up to StoredGzipMax bytes as one stored block, longer
// ones compressed at the given level from their first byte. It is not
// safe for concurrent use.
type GzipWriter struct {
	w      io.Writer
	level  int
	buf    bytes.Buffer
	zw     *gzip.Writer
	err    error
	closed bool
}

// NewGzipWriter returns a GzipWriter writing to w; level is as for
// gzip.NewWriterLevel (an invalid one is reported by the first Write past
// StoredGzipMax, or else by Close).
func NewGzipWriter(w io.Writer, level int) *GzipWriter {
	return &GzipWriter{w: w, level: level}
}

// Write implements io.Writer.
func (g *GzipWriter) Write(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.zw == nil {
		if g.buf.Len()+len(p) <= StoredGzipMax {
			return g.buf.Write(p)
		}
		zw, err := gzip.NewWriterLevel(g.w, g.level)
		if err != nil {
			g.err = err
			return 0, err
		}
		g.zw = zw
		if _, err := zw.Write(g.buf.Bytes()); err != nil {
			g.err = err
			return 0, err
		}
		g.buf = bytes.Buffer{}
	}
	n, err := g.zw.Write(p)
	if err != nil {
		g.err = err
	}
	return n, err
}

// Close ends the stream (the gzip trailer) and writes what is held back.
// It does not close the underlying writer; a second Close does nothing.
func (g *GzipWriter) Close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	if g.err != nil {
		return g.err
	}
	g.err = errClosed // for a Write after Close
	if g.zw != nil {
		return g.zw.Close()
	}
	if g.level < gzip.HuffmanOnly || g.level > gzip.BestCompression {
		return fmt.Errorf("gzip: invalid compression level: %d", g.level)
	}
	data := g.buf.Bytes()
	// RFC 1952 header: magic, deflate, no flags, no mtime, no extra
	// flags, unknown OS (as compress/gzip writes it); then one final
	// stored block (RFC 1951 3.2.4: BFINAL=1, BTYPE=00, LEN, ~LEN); then
	// the CRC-32 and the length.
	out := make([]byte, 0, 10+5+len(data)+8)
	out = append(out, 0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff)
	out = append(out, 0x01)
	out = binary.LittleEndian.AppendUint16(out, uint16(len(data)))
	out = binary.LittleEndian.AppendUint16(out, ^uint16(len(data)))
	out = append(out, data...)
	out = binary.LittleEndian.AppendUint32(out, crc32.ChecksumIEEE(data))
	out = binary.LittleEndian.AppendUint32(out, uint32(len(data)))
	_, err := g.w.Write(out)
	return err
}

var errClosed = errors.New("protocol: write to a closed GzipWriter")

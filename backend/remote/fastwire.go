package remote

import (
	"bytes"
	"encoding/base64"
	"strconv"

	"github.com/pulse-agent/pulse/protocol"
)

// The server sends output as many stream frames and then repeats all of
// it inside the result (the Python server's ProcessResult had stdout and
// stderr fields). Decoding both with encoding/json costs more than
// everything else on the client's path, so the two shapes that carry bulk
// get a fast path. Each falls back to protocol.ParseFrame whenever the input is not
// exactly what it expects, and FuzzFastPaths checks that whatever the
// fast paths accept, protocol.ParseFrame accepts with the same meaning.

const (
	streamPrefix = `{"type":"stream","payload":{"execution_id":"`
	streamSuffix = `,"encoding":"base64"}}`
)

// plainString returns the bytes of s up to the next quote, and the rest
// after it, when none of them needs JSON unescaping.
func plainString(s []byte) (val, rest []byte, ok bool) {
	i := bytes.IndexByte(s, '"')
	if i < 0 {
		return nil, nil, false
	}
	for _, c := range s[:i] {
		if c < 0x20 || c == '\\' || c >= 0x80 {
			return nil, nil, false
		}
	}
	return s[:i], s[i+1:], true
}

// fastStream decodes a base64 stream frame in the exact form the Go
// server writes it, or reports false.
func fastStream(data []byte) (*protocol.Frame, bool) {
	rest, ok := bytes.CutPrefix(data, []byte(streamPrefix))
	if !ok {
		return nil, false
	}
	id, rest, ok := plainString(rest)
	if !ok {
		return nil, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"stream":"`)); !ok {
		return nil, false
	}
	stream, rest, ok := plainString(rest)
	if !ok || (string(stream) != "stdout" && string(stream) != "stderr") {
		return nil, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"data":"`)); !ok {
		return nil, false
	}
	i := bytes.IndexByte(rest, '"')
	if i < 0 {
		return nil, false
	}
	b64 := rest[:i]
	// The decoder skips CR and LF, which JSON does not allow raw in a
	// string; everything else outside the alphabet it refuses.
	if bytes.IndexByte(b64, '\n') >= 0 || bytes.IndexByte(b64, '\r') >= 0 {
		return nil, false
	}
	out := make([]byte, base64.StdEncoding.DecodedLen(len(b64)))
	n, err := base64.StdEncoding.Decode(out, b64)
	if err != nil {
		return nil, false
	}
	rest = rest[i+1:]
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"seq":`)); !ok {
		return nil, false
	}
	j := bytes.IndexByte(rest, ',')
	if j < 1 || j > 19 || (rest[0] == '0' && j > 1) {
		return nil, false
	}
	for _, c := range rest[:j] {
		if c < '0' || c > '9' {
			return nil, false
		}
	}
	seq, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	if err != nil || string(rest[j:]) != streamSuffix {
		return nil, false
	}
	return &protocol.Frame{Type: protocol.TypeStream, Stream: &protocol.StreamEvent{
		ExecutionID: string(id), Stream: string(stream), Seq: seq, Encoding: protocol.EncodingBase64, Bytes: out[:n],
	}}, true
}

// bulkFields are the result fields that repeat the whole output.
var bulkFields = [][]byte{[]byte(`"stdout":"`), []byte(`"stderr":"`)}

// skimResult returns a result frame with large stdout and stderr values
// emptied, so that encoding/json need not scan them. A key pattern can
// only match a real key in valid JSON (inside a string its quotes would
// be escaped), and emptying a string without escapes keeps valid JSON
// valid. Small values are kept: stderr carries the server's message when
// a command could not start.
func skimResult(data []byte) []byte {
	if !bytes.HasPrefix(data, []byte(`{"type":"result"`)) {
		return data
	}
	for _, key := range bulkFields {
		i := bytes.Index(data, key)
		if i < 0 {
			continue
		}
		start := i + len(key)
		end := bytes.IndexByte(data[start:], '"')
		if end < 64<<10 || bytes.IndexByte(data[start:start+end], '\\') >= 0 {
			continue
		}
		data = append(data[:start:start], data[start+end:]...)
	}
	return data
}

// decodeFrame is protocol.ParseFrame with the fast paths in front.
func decodeFrame(data []byte) (*protocol.Frame, error) {
	if f, ok := fastStream(data); ok {
		return f, nil
	}
	return protocol.ParseFrame(skimResult(data))
}

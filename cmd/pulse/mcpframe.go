package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/pulse-agent/pulse/cowfs"
)

// mcpFrameLimit is the longest message `pulse mcp` reads: the largest
// file cowfs stages, base64-encoded in a write_file call, with room for
// the rest of the request. (Text sent as UTF-8 may escape to more; such a
// file is sent as base64.)
var mcpFrameLimit = base64.StdEncoding.EncodedLen(int(cowfs.DefaultMaxFileBytes)) + 1<<20

// frameReader sits between the client's stream and the MCP SDK, which
// ends the session on the first message it cannot take: one over its
// frame limit, one that is not JSON, one that is not JSON-RPC, a batch. The
// reader hands the SDK only lines it will take, each at most limit bytes,
// and answers every other line itself with a JSON-RPC error — carrying
// the request's id when one can be found, else null — so that one bad
// request costs the agent that request, not its sandbox. An over-long
// line is read through and dropped as it comes, never held.
type frameReader struct {
	r     *bufio.Reader
	limit int
	reply io.Writer // takes one whole line per Write (lockedWriter)

	out []byte // the rest of the line being handed out
	err error  // the stream's end, returned once out is drained
}

func newFrameReader(r io.Reader, limit int, reply io.Writer) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10), limit: limit, reply: reply}
}

// Read returns bytes of one accepted line at a time, never of two.
func (f *frameReader) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		if err := f.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}

// next reads one line: it becomes out when the SDK can take it, else it
// is answered. The error is one writing an answer.
func (f *frameReader) next() error {
	var (
		line []byte
		n    int
		over bool
		sc   idScanner
	)
	for {
		chunk, err := f.r.ReadSlice('\n')
		n += len(chunk)
		if !over && len(line)+len(chunk) > f.limit {
			over = true
			sc.feed(line)
			line = nil
		}
		if over {
			sc.feed(chunk)
		} else {
			line = append(line, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			f.err = err
		}
		break
	}
	if over {
		code := jsonrpc.CodeInvalidRequest
		id := sc.result()
		if id == nil {
			code = jsonrpc.CodeParseError
		}
		return f.answer(id, code, fmt.Sprintf("message of %d bytes is over the limit of %d bytes and was not read (nothing was done); "+
			"a file of up to %d bytes fits in one write_file call as base64", n, f.limit, cowfs.DefaultMaxFileBytes))
	}
	msg := bytes.TrimSpace(line)
	if len(msg) == 0 {
		return nil // blank lines are no messages
	}
	if id, code, why := checkFrame(msg); why != "" {
		return f.answer(id, code, why)
	}
	f.out = line
	return nil
}

// checkFrame says why the SDK would not take msg, one trimmed line, and
// the id to answer with (nil: null); "" when it would.
func checkFrame(msg []byte) (id json.RawMessage, code int, why string) {
	if !json.Valid(msg) {
		return nil, jsonrpc.CodeParseError, "message is not valid JSON"
	}
	if msg[0] == '[' {
		// The SDK ends the session on a batch once the protocol version
		// is 2025-06-18 or later, which dropped them; no client of that
		// era sends one, and an older one gets this answer.
		return nil, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not supported: send one message a line"
	}
	if _, err := jsonrpc.DecodeMessage(msg); err != nil {
		var sc idScanner
		sc.feed(msg)
		return sc.result(), jsonrpc.CodeInvalidRequest, "not a JSON-RPC 2.0 message: " + err.Error()
	}
	return nil, 0, ""
}

func (f *frameReader) answer(id json.RawMessage, code int, why string) error {
	if id == nil {
		id = json.RawMessage("null")
	}
	b, err := json.Marshal(struct {
		Version string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: int64(code), Message: "pulse mcp: " + why}})
	if err != nil {
		return err
	}
	_, err = f.reply.Write(append(b, '\n'))
	return err
}

// lockedWriter writes each Write whole, so that the answers of
// frameReader and the SDK's messages never interleave on stdout.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// idScanner finds the "id" member of a JSON object fed to it in pieces,
// without holding the object: a request too long to read still gets its
// answer. It reads the top level only, as a JSON decoder would (the last
// "id" wins; escaped keys are unescaped), and keeps only short keys and
// values. Fed something that is not a JSON object it may find nothing,
// or a bogus id that result then refuses.
type idScanner struct {
	depth     int
	done      bool // the top-level value has ended
	inStr     bool
	esc       bool
	isKey     bool // the string being read is a key of the top level
	expectKey bool
	lastKey   []byte // raw, quotes included; nil when too long to be "id"
	keyOver   bool
	afterID   bool // a top-level ':' after the key "id": its value comes next
	capStr    bool // capturing the id's string value
	capLit    bool // capturing the id's number or literal
	val       []byte
	valOver   bool
	id        []byte // the last complete id value, raw
}

const (
	idMaxKey = 16   // `"\u0069\u0064"` is 14 bytes
	idMaxVal = 1024 // longer ids are not recovered
)

func (s *idScanner) feed(p []byte) {
	for _, c := range p {
		s.byte(c)
	}
}

func (s *idScanner) byte(c byte) {
	if s.done {
		return
	}
	if s.capLit {
		if c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '-' || c == '+' || c == '.' || c == 'E' {
			s.keep(c)
			return
		}
		s.capLit = false
		s.finishVal()
	}
	if s.inStr {
		switch {
		case s.isKey:
			if len(s.lastKey) < idMaxKey {
				s.lastKey = append(s.lastKey, c)
			} else {
				s.keyOver = true
			}
		case s.capStr:
			s.keep(c)
		}
		switch {
		case s.esc:
			s.esc = false
		case c == '\\':
			s.esc = true
		case c == '"':
			s.inStr = false
			s.isKey = false
			if s.capStr {
				s.capStr = false
				s.finishVal()
			}
		}
		return
	}
	switch c {
	case '"':
		s.inStr = true
		if s.depth == 1 && s.expectKey {
			s.isKey, s.expectKey = true, false
			s.lastKey, s.keyOver = append(s.lastKey[:0], c), false
		} else if s.depth == 1 && s.afterID {
			s.afterID, s.capStr = false, true
			s.val, s.valOver = append(s.val[:0], c), false
		}
	case '{', '[':
		s.afterID = false
		s.depth++
		if s.depth == 1 {
			s.expectKey = c == '{'
			if c == '[' {
				s.done = true // a batch: no one id answers it
			}
		}
	case '}', ']':
		s.depth--
		if s.depth <= 0 {
			s.done = true
		}
	case ':':
		if s.depth == 1 {
			s.afterID = !s.keyOver && keyIsID(s.lastKey)
		}
	case ',':
		if s.depth == 1 {
			s.expectKey, s.afterID = true, false
		}
	case ' ', '\t', '\r', '\n':
	default:
		if s.depth == 1 && s.afterID {
			s.afterID, s.capLit = false, true
			s.val, s.valOver = append(s.val[:0], c), false
		}
	}
}

func (s *idScanner) keep(c byte) {
	if len(s.val) < idMaxVal {
		s.val = append(s.val, c)
	} else {
		s.valOver = true
	}
}

// finishVal ends the capture of an id value: the last one wins, as in a
// decoder, and one too long to keep clears an earlier one.
func (s *idScanner) finishVal() {
	s.id = nil
	if !s.valOver {
		s.id = append([]byte(nil), s.val...)
	}
}

// keyIsID reports whether raw, a quoted JSON string, is "id".
func keyIsID(raw []byte) bool {
	if string(raw) == `"id"` {
		return true
	}
	if !bytes.ContainsRune(raw, '\\') {
		return false
	}
	var k string
	return json.Unmarshal(raw, &k) == nil && k == "id"
}

// result is the id found, when it is one a JSON-RPC request may carry
// (a string or a number), else nil.
func (s *idScanner) result() json.RawMessage {
	if s.capLit { // the stream ended inside the literal
		s.capLit = false
		s.finishVal()
	}
	if s.id == nil {
		return nil
	}
	var v any
	if err := json.Unmarshal(s.id, &v); err != nil {
		return nil
	}
	if _, err := jsonrpc.MakeID(v); err != nil || v == nil {
		return nil
	}
	return json.RawMessage(s.id)
}

package nsinit

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The init reads its two configs with the decoder below instead of
// encoding/json's. The wire format is the same JSON the backend writes
// with encoding/json (and the same values come out: TestDecodeConfig and
// FuzzDecodeConfig compare the two), but encoding/json decodes by
// reflection, and in a process that has done nothing yet its first
// Decode of a Config builds the type's field tables and warms the
// reflection caches: 0.1-0.3 ms of every init's start, a tenth of it.
// This decoder knows Config's fields and reads them straight into it.
//
// It follows encoding/json where the backend's output could reach a
// difference: whitespace anywhere between tokens, unknown keys skipped,
// keys matched exactly or else case-insensitively, null leaving a string,
// number or bool as it was and setting a slice or pointer to nil, strings
// unescaped (\uXXXX with surrogate pairs, an unpaired surrogate or an
// invalid UTF-8 byte read as U+FFFD), []byte as standard base64, numbers
// refused for an integer field unless they are integers that fit. It is
// read from the backend's own pipe, never from the sandbox.

// errConfigSyntax is a config that is not the JSON the backend writes.
var errConfigSyntax = errors.New("config: invalid JSON")

// maxConfigDepth bounds the nesting of values skipped (as encoding/json's
// 10000 does).
const maxConfigDepth = 10000

type configDecoder struct {
	r *bufio.Reader
}

func newConfigDecoder(r io.Reader) *configDecoder {
	return &configDecoder{r: bufio.NewReaderSize(r, 8<<10)}
}

// buffered returns what the decoder has read past the last value.
func (d *configDecoder) buffered() io.Reader {
	b, _ := d.r.Peek(d.r.Buffered())
	return strings.NewReader(string(b))
}

// decode reads the next JSON value, which must be an object (or null),
// into c.
func (d *configDecoder) decode(c *Config) error {
	return d.object(func(key string) error {
		f := configField(key)
		if f == nil {
			return d.skip(0)
		}
		return f(d, c)
	})
}

// peek returns the next byte that is not white space, without consuming
// it.
func (d *configDecoder) peek() (byte, error) {
	for {
		b, err := d.r.ReadByte()
		if err != nil {
			if err == io.EOF {
				return 0, io.ErrUnexpectedEOF
			}
			return 0, err
		}
		switch b {
		case ' ', '\t', '\n', '\r':
			continue
		}
		_ = d.r.UnreadByte()
		return b, nil
	}
}

// next consumes and returns the next byte that is not white space.
func (d *configDecoder) next() (byte, error) {
	b, err := d.peek()
	if err == nil {
		_, _ = d.r.ReadByte()
	}
	return b, err
}

func (d *configDecoder) expect(want byte) error {
	b, err := d.next()
	if err != nil {
		return err
	}
	if b != want {
		return fmt.Errorf("%w: %q where %q was expected", errConfigSyntax, b, want)
	}
	return nil
}

// null consumes a null literal if one comes next.
func (d *configDecoder) null() (bool, error) {
	b, err := d.peek()
	if err != nil || b != 'n' {
		return false, err
	}
	return true, d.literal("null")
}

func (d *configDecoder) literal(lit string) error {
	for i := 0; i < len(lit); i++ {
		b, err := d.r.ReadByte()
		if err != nil {
			return io.ErrUnexpectedEOF
		}
		if b != lit[i] {
			return fmt.Errorf("%w: not %s", errConfigSyntax, lit)
		}
	}
	return nil
}

// object reads an object (or null, which does nothing), calling field for
// each key with the decoder positioned at its value.
func (d *configDecoder) object(field func(key string) error) error {
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	if err := d.expect('{'); err != nil {
		return err
	}
	b, err := d.peek()
	if err != nil {
		return err
	}
	if b == '}' {
		_, _ = d.r.ReadByte()
		return nil
	}
	for {
		if b, err := d.peek(); err != nil {
			return err
		} else if b != '"' {
			return fmt.Errorf("%w: object key", errConfigSyntax)
		}
		key, err := d.str()
		if err != nil {
			return err
		}
		if err := d.expect(':'); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		b, err := d.next()
		if err != nil {
			return err
		}
		switch b {
		case ',':
		case '}':
			return nil
		default:
			return fmt.Errorf("%w: %q after an object value", errConfigSyntax, b)
		}
	}
}

// array reads an array, calling elem for each element with the decoder
// positioned at it. null is nil, reported as such.
func (d *configDecoder) array(elem func() error) (isNull bool, err error) {
	if isNull, err := d.null(); isNull || err != nil {
		return isNull, err
	}
	if err := d.expect('['); err != nil {
		return false, err
	}
	b, err := d.peek()
	if err != nil {
		return false, err
	}
	if b == ']' {
		_, _ = d.r.ReadByte()
		return false, nil
	}
	for {
		if err := elem(); err != nil {
			return false, err
		}
		b, err := d.next()
		if err != nil {
			return false, err
		}
		switch b {
		case ',':
		case ']':
			return false, nil
		default:
			return false, fmt.Errorf("%w: %q after an array element", errConfigSyntax, b)
		}
	}
}

// str reads a string token and returns it unescaped.
func (d *configDecoder) str() (string, error) {
	if err := d.expect('"'); err != nil {
		return "", err
	}
	var sb strings.Builder
	for {
		b, err := d.r.ReadByte()
		if err != nil {
			return "", io.ErrUnexpectedEOF
		}
		switch {
		case b == '"':
			return sb.String(), nil
		case b < 0x20:
			return "", fmt.Errorf("%w: control character in a string", errConfigSyntax)
		case b == '\\':
			if err := d.escape(&sb); err != nil {
				return "", err
			}
		case b < utf8.RuneSelf:
			sb.WriteByte(b)
		default:
			_ = d.r.UnreadByte()
			if err := d.utf8Rune(&sb); err != nil {
				return "", err
			}
		}
	}
}

// utf8Rune copies one UTF-8 sequence, or U+FFFD for a byte that does not
// start a valid one (consuming that byte only).
func (d *configDecoder) utf8Rune(sb *strings.Builder) error {
	var buf [utf8.UTFMax]byte
	n := 0
	for n < utf8.UTFMax {
		p, _ := d.r.Peek(n + 1)
		if len(p) < n+1 {
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
			break
		}
		buf[n] = p[n]
		n++
		if utf8.FullRune(buf[:n]) {
			break
		}
	}
	r, size := utf8.DecodeRune(buf[:n])
	if r == utf8.RuneError && size <= 1 {
		size = 1
	}
	_, _ = d.r.Discard(size)
	sb.WriteRune(r)
	return nil
}

func (d *configDecoder) escape(sb *strings.Builder) error {
	b, err := d.r.ReadByte()
	if err != nil {
		return io.ErrUnexpectedEOF
	}
	switch b {
	case '"', '\\', '/':
		sb.WriteByte(b)
	case 'b':
		sb.WriteByte('\b')
	case 'f':
		sb.WriteByte('\f')
	case 'n':
		sb.WriteByte('\n')
	case 'r':
		sb.WriteByte('\r')
	case 't':
		sb.WriteByte('\t')
	case 'u':
		r, err := d.hex4()
		if err != nil {
			return err
		}
		if utf16.IsSurrogate(r) {
			// A pair when a \u escape of its other half follows; else
			// U+FFFD, and what follows is read on its own. The bytes
			// looked at one by one: each must come for the string to
			// end, so none is waited for past the config's end.
			r2 := rune(-1)
			if p, _ := d.r.Peek(1); len(p) == 1 && p[0] == '\\' {
				if p, _ := d.r.Peek(2); len(p) == 2 && p[1] == 'u' {
					if p, _ := d.r.Peek(6); len(p) == 6 {
						r2 = hex4(p[2:])
					}
				}
			}
			if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
				_, _ = d.r.Discard(6)
				r = dec
			} else {
				r = utf8.RuneError
			}
		}
		sb.WriteRune(r)
	default:
		return fmt.Errorf("%w: escape \\%c", errConfigSyntax, b)
	}
	return nil
}

func (d *configDecoder) hex4() (rune, error) {
	p, _ := d.r.Peek(4)
	if len(p) < 4 {
		return 0, io.ErrUnexpectedEOF
	}
	r := hex4(p)
	if r < 0 {
		return 0, fmt.Errorf("%w: \\u escape", errConfigSyntax)
	}
	_, _ = d.r.Discard(4)
	return r, nil
}

// hex4 is the value of four hex digits, -1 if they are not.
func hex4(p []byte) rune {
	var r rune
	for _, b := range p[:4] {
		switch {
		case '0' <= b && b <= '9':
			b -= '0'
		case 'a' <= b && b <= 'f':
			b = b - 'a' + 10
		case 'A' <= b && b <= 'F':
			b = b - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(b)
	}
	return r
}

// number reads a number token, checked against JSON's grammar.
func (d *configDecoder) number() (string, error) {
	if _, err := d.peek(); err != nil {
		return "", err
	}
	var sb strings.Builder
	digits := func() int {
		n := 0
		for {
			b, err := d.r.ReadByte()
			if err != nil {
				return n
			}
			if b < '0' || b > '9' {
				_ = d.r.UnreadByte()
				return n
			}
			sb.WriteByte(b)
			n++
		}
	}
	opt := func(set string) bool {
		b, err := d.r.ReadByte()
		if err != nil {
			return false
		}
		if strings.IndexByte(set, b) < 0 {
			_ = d.r.UnreadByte()
			return false
		}
		sb.WriteByte(b)
		return true
	}
	opt("-")
	p, _ := d.r.Peek(1)
	if len(p) == 1 && p[0] == '0' {
		_, _ = d.r.ReadByte()
		sb.WriteByte('0')
	} else if digits() == 0 {
		return "", fmt.Errorf("%w: number", errConfigSyntax)
	}
	if opt(".") && digits() == 0 {
		return "", fmt.Errorf("%w: number", errConfigSyntax)
	}
	if opt("eE") {
		opt("+-")
		if digits() == 0 {
			return "", fmt.Errorf("%w: number", errConfigSyntax)
		}
	}
	return sb.String(), nil
}

// skip reads and drops one value of any kind.
func (d *configDecoder) skip(depth int) error {
	if depth > maxConfigDepth {
		return fmt.Errorf("%w: nested too deep", errConfigSyntax)
	}
	b, err := d.peek()
	if err != nil {
		return err
	}
	switch {
	case b == '{':
		return d.object(func(string) error { return d.skip(depth + 1) })
	case b == '[':
		_, err := d.array(func() error { return d.skip(depth + 1) })
		return err
	case b == '"':
		_, err := d.str()
		return err
	case b == 't':
		return d.literal("true")
	case b == 'f':
		return d.literal("false")
	case b == 'n':
		return d.literal("null")
	case b == '-' || ('0' <= b && b <= '9'):
		_, err := d.number()
		return err
	}
	return fmt.Errorf("%w: %q starts no value", errConfigSyntax, b)
}

// The typed readers. A null leaves *p as it was, as encoding/json does.

func (d *configDecoder) setString(p *string) error {
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	s, err := d.str()
	if err == nil {
		*p = s
	}
	return err
}

func (d *configDecoder) setBool(p *bool) error {
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	b, err := d.peek()
	if err != nil {
		return err
	}
	switch b {
	case 't':
		*p = true
		return d.literal("true")
	case 'f':
		*p = false
		return d.literal("false")
	}
	return fmt.Errorf("%w: not a bool", errConfigSyntax)
}

func (d *configDecoder) integer(bits int, unsigned bool) (int64, uint64, error) {
	b, err := d.peek()
	if err != nil {
		return 0, 0, err
	}
	if b != '-' && (b < '0' || b > '9') {
		return 0, 0, fmt.Errorf("%w: not a number", errConfigSyntax)
	}
	tok, err := d.number()
	if err != nil {
		return 0, 0, err
	}
	if unsigned {
		u, err := strconv.ParseUint(tok, 10, bits)
		return 0, u, err
	}
	i, err := strconv.ParseInt(tok, 10, bits)
	return i, 0, err
}

func (d *configDecoder) setInt64(p *int64) error {
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	i, _, err := d.integer(64, false)
	if err == nil {
		*p = i
	}
	return err
}

func (d *configDecoder) setInt(p *int) error {
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	i, _, err := d.integer(strconv.IntSize, false)
	if err == nil {
		*p = int(i)
	}
	return err
}

func (d *configDecoder) setUint16(p *uint16) error {
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	_, u, err := d.integer(16, true)
	if err == nil {
		*p = uint16(u)
	}
	return err
}

// decodeSlice reads an array into *p as encoding/json does: element i
// is decoded into the slice's own element i where the slice (or its
// spare capacity) has one, the length then cut to the elements read; []
// is a new empty slice, null nil.
func decodeSlice[T any](d *configDecoder, p *[]T, elem func(*T) error) error {
	s := *p
	i := 0
	isNull, err := d.array(func() error {
		switch {
		case i < len(s):
		case i < cap(s):
			s = s[:i+1]
		default:
			var zero T
			s = append(s, zero)
		}
		err := elem(&s[i])
		i++
		return err
	})
	if err != nil {
		return err
	}
	switch {
	case isNull:
		s = nil
	case i == 0:
		s = []T{}
	case i < len(s):
		s = s[:i]
	}
	*p = s
	return nil
}

func (d *configDecoder) setStrings(p *[]string) error {
	return decodeSlice(d, p, d.setString)
}

func (d *configDecoder) setUint8(p *uint8) error {
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	_, u, err := d.integer(8, true)
	if err == nil {
		*p = uint8(u)
	}
	return err
}

func (d *configDecoder) setCaches(p *[]CacheBind) error {
	return decodeSlice(d, p, func(c *CacheBind) error {
		return d.object(func(key string) error {
			switch foldKey(key, "src", "dst") {
			case "src":
				return d.setString(&c.Src)
			case "dst":
				return d.setString(&c.Dst)
			}
			return d.skip(0)
		})
	})
}

// setSeccomp reads the program as BPFProgram.UnmarshalJSON does: a []byte
// (base64, or as encoding/json also takes one, an array of numbers), null
// being an empty program.
func (d *configDecoder) setSeccomp(p *BPFProgram) error {
	b, err := d.peek()
	if err != nil {
		return err
	}
	var raw []byte
	switch b {
	case 'n':
		if err := d.literal("null"); err != nil {
			return err
		}
	case '[':
		if err := decodeSlice(d, &raw, d.setUint8); err != nil {
			return err
		}
	default:
		s, err := d.str()
		if err != nil {
			return err
		}
		raw = make([]byte, base64.StdEncoding.DecodedLen(len(s)))
		n, err := base64.StdEncoding.Decode(raw, []byte(s))
		if err != nil {
			return fmt.Errorf("seccomp program: %w", err)
		}
		raw = raw[:n]
	}
	prog, err := bpfFromBytes(raw)
	if err == nil {
		*p = prog
	}
	return err
}

func (d *configDecoder) setEgress(p **EgressConfig) error {
	if isNull, err := d.null(); isNull || err != nil {
		if isNull {
			*p = nil
		}
		return err
	}
	if *p == nil {
		*p = new(EgressConfig)
	}
	e := *p
	return d.object(func(key string) error {
		switch foldKey(key, "socket", "ca_file", "port", "forward") {
		case "socket":
			return d.setString(&e.Socket)
		case "ca_file":
			return d.setString(&e.CAFile)
		case "port":
			return d.setInt(&e.Port)
		case "forward":
			return d.setStrings(&e.Forward)
		}
		return d.skip(0)
	})
}

func (d *configDecoder) setTTY(p **TTYConfig) error {
	if isNull, err := d.null(); isNull || err != nil {
		if isNull {
			*p = nil
		}
		return err
	}
	if *p == nil {
		*p = new(TTYConfig)
	}
	t := *p
	return d.object(func(key string) error {
		switch foldKey(key, "rows", "cols") {
		case "rows":
			return d.setUint16(&t.Rows)
		case "cols":
			return d.setUint16(&t.Cols)
		}
		return d.skip(0)
	})
}

// configFields are Config's JSON keys, as its tags name them.
var configFields = []struct {
	key string
	set func(*configDecoder, *Config) error
}{
	{"root", func(d *configDecoder, c *Config) error { return d.setString(&c.Root) }},
	{"workspace", func(d *configDecoder, c *Config) error { return d.setString(&c.Workspace) }},
	{"upper", func(d *configDecoder, c *Config) error { return d.setString(&c.Upper) }},
	{"work", func(d *configDecoder, c *Config) error { return d.setString(&c.Work) }},
	{"dir", func(d *configDecoder, c *Config) error { return d.setString(&c.Dir) }},
	{"home", func(d *configDecoder, c *Config) error { return d.setString(&c.Home) }},
	{"args", func(d *configDecoder, c *Config) error { return d.setStrings(&c.Args) }},
	{"shell", func(d *configDecoder, c *Config) error { return d.setString(&c.Shell) }},
	{"env", func(d *configDecoder, c *Config) error { return d.setStrings(&c.Env) }},
	{"new_net", func(d *configDecoder, c *Config) error { return d.setBool(&c.NewNet) }},
	{"read_only", func(d *configDecoder, c *Config) error { return d.setStrings(&c.ReadOnly) }},
	{"mask", func(d *configDecoder, c *Config) error { return d.setStrings(&c.Mask) }},
	{"read_write", func(d *configDecoder, c *Config) error { return d.setStrings(&c.ReadWrite) }},
	{"caches", func(d *configDecoder, c *Config) error { return d.setCaches(&c.Caches) }},
	{"hostname", func(d *configDecoder, c *Config) error { return d.setString(&c.Hostname) }},
	{"last_cap", func(d *configDecoder, c *Config) error { return d.setInt(&c.LastCap) }},
	{"seccomp", func(d *configDecoder, c *Config) error { return d.setSeccomp(&c.Seccomp) }},
	{"pids_limited", func(d *configDecoder, c *Config) error { return d.setBool(&c.PidsLimited) }},
	{"file_size", func(d *configDecoder, c *Config) error { return d.setInt64(&c.FileSize) }},
	{"nproc", func(d *configDecoder, c *Config) error { return d.setInt64(&c.NProc) }},
	{"data", func(d *configDecoder, c *Config) error { return d.setInt64(&c.Data) }},
	{"egress", func(d *configDecoder, c *Config) error { return d.setEgress(&c.Egress) }},
	{"tty", func(d *configDecoder, c *Config) error { return d.setTTY(&c.TTY) }},
	{"layers", func(d *configDecoder, c *Config) error { return d.setStrings(&c.Layers) }},
	{"scratch", func(d *configDecoder, c *Config) error { return d.setString(&c.Scratch) }},
	{"scratch_bytes", func(d *configDecoder, c *Config) error { return d.setInt64(&c.ScratchBytes) }},
	{"scratch_inodes", func(d *configDecoder, c *Config) error { return d.setInt64(&c.ScratchInodes) }},
}

// configField is the setter of Config's field for key: the exact match,
// else one that matches but for case, as encoding/json picks.
func configField(key string) func(*configDecoder, *Config) error {
	for _, f := range configFields {
		if f.key == key {
			return f.set
		}
	}
	for _, f := range configFields {
		if strings.EqualFold(f.key, key) {
			return f.set
		}
	}
	return nil
}

// foldKey returns the one of keys that key names, exactly or but for
// case; "" for none.
func foldKey(key string, keys ...string) string {
	for _, k := range keys {
		if k == key {
			return k
		}
	}
	for _, k := range keys {
		if strings.EqualFold(k, key) {
			return k
		}
	}
	return ""
}

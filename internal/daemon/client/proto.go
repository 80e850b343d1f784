package client

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// Version is the wire format's version; a daemon refuses any other.
const Version = 1

// MaxMessage bounds one message on the socket. A request that does not
// fit (an environment of more than ~190 KiB) is run in-process.
const MaxMessage = 192 << 10

// Commands are the pulse commands a client hands to the daemon (pulse
// and its front end alike); every other command runs in the client.
var Commands = []string{"exec", "cow", "mcp", "review"}

// The request's operations.
const (
	OpRun    = "run"
	OpStatus = "status"
	OpStop   = "stop"
)

// Request is what a client asks of a daemon.
type Request struct {
	V  int    `json:"v"`
	Op string `json:"op"`
	// Args are the command's arguments after the program name
	// ("exec", "--", "true"); Prog is how the user started pulse, for
	// the hints it prints.
	Args []string `json:"args,omitempty"`
	Prog string   `json:"prog,omitempty"`
	// Dir is the client's working directory, Env its environment: both
	// must be the daemon's (see Name).
	Dir string   `json:"dir"`
	Env []string `json:"env,omitempty"`
}

// Reply is what a client of Run reads of a daemon's reply (package
// daemon's Reply, which the daemon writes, has these fields and more).
type Reply struct {
	Accepted bool
	Refused  string
	Pid      int
	Exit     *int
}

// appendRequest appends r as JSON, as json.Marshal writes it
// (FuzzAppendRequest holds the two to the same bytes).
func appendRequest(b []byte, r *Request) []byte {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(r.V), 10)
	b = append(b, `,"op":`...)
	b = appendString(b, r.Op)
	if len(r.Args) > 0 {
		b = append(b, `,"args":`...)
		b = appendStrings(b, r.Args)
	}
	if r.Prog != "" {
		b = append(b, `,"prog":`...)
		b = appendString(b, r.Prog)
	}
	b = append(b, `,"dir":`...)
	b = appendString(b, r.Dir)
	if len(r.Env) > 0 {
		b = append(b, `,"env":`...)
		b = appendStrings(b, r.Env)
	}
	return append(b, '}')
}

func appendStrings(b []byte, list []string) []byte {
	b = append(b, '[')
	for i, s := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

// appendString appends s as a JSON string, escaped as encoding/json
// escapes it: its short escapes, \u00XX for the other control
// characters and for <, > and &, U+2028 and U+2029 escaped, and each
// byte that is not UTF-8 as U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '\\' || c == '"':
				b = append(b, '\\', c)
			case c == '\b':
				b = append(b, '\\', 'b')
			case c == '\f':
				b = append(b, '\\', 'f')
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// errReply: a reply that is not a JSON object of the fields Reply reads.
var errReply = errors.New("daemon: malformed reply")

// parseReply reads the fields of Reply from one reply (a JSON object);
// others are skipped. Keys match exactly (the daemon writes them so).
func parseReply(data []byte) (Reply, error) {
	p := &scanner{b: data}
	var r Reply
	if !p.eat('{') {
		return r, errReply
	}
	if !p.eat('}') {
		for {
			key, ok := p.str()
			if !ok || !p.eat(':') {
				return r, errReply
			}
			switch key {
			case "accepted":
				switch {
				case p.lit("true"):
					r.Accepted = true
				case p.lit("false"):
					r.Accepted = false
				default:
					return r, errReply
				}
			case "refused":
				if r.Refused, ok = p.str(); !ok {
					return r, errReply
				}
			case "pid":
				if r.Pid, ok = p.int(); !ok {
					return r, errReply
				}
			case "exit":
				if p.lit("null") {
					r.Exit = nil
					break
				}
				n, ok := p.int()
				if !ok {
					return r, errReply
				}
				r.Exit = &n
			default:
				if !p.skip(0) {
					return r, errReply
				}
			}
			if p.eat(',') {
				continue
			}
			if p.eat('}') {
				break
			}
			return r, errReply
		}
	}
	if p.space(); p.i != len(p.b) {
		return r, errReply
	}
	return r, nil
}

// scanner reads JSON values from b at i.
type scanner struct {
	b []byte
	i int
}

func (p *scanner) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

// eat consumes c, after white space.
func (p *scanner) eat(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// lit consumes the literal s, after white space.
func (p *scanner) lit(s string) bool {
	p.space()
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// int reads an integer.
func (p *scanner) int() (int, bool) {
	p.space()
	j := p.i
	if j < len(p.b) && p.b[j] == '-' {
		j++
	}
	k := j
	for k < len(p.b) && p.b[k] >= '0' && p.b[k] <= '9' {
		k++
	}
	if k == j || (p.b[j] == '0' && k-j > 1) {
		return 0, false
	}
	n, err := strconv.Atoi(string(p.b[p.i:k]))
	if err != nil {
		return 0, false
	}
	p.i = k
	return n, true
}

// str reads a string, its escapes decoded (a lone surrogate, and a byte
// that is not UTF-8, as U+FFFD, as encoding/json does).
func (p *scanner) str() (string, bool) {
	if !p.eat('"') {
		return "", false
	}
	var out []byte
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return string(out), true
		case c < 0x20:
			return "", false
		case c == '\\':
			if p.i+1 >= len(p.b) {
				return "", false
			}
			e := p.b[p.i+1]
			p.i += 2
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return "", false
				}
				if r >= 0xD800 && r < 0xDC00 && p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
					save := p.i
					p.i += 2
					if lo, ok := p.hex4(); ok && lo >= 0xDC00 && lo < 0xE000 {
						r = (r-0xD800)<<10 + (lo - 0xDC00) + 0x10000
					} else {
						p.i = save
					}
				}
				if r >= 0xD800 && r < 0xE000 {
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
			default:
				return "", false
			}
		case c < utf8.RuneSelf:
			out = append(out, c)
			p.i++
		default:
			r, size := utf8.DecodeRune(p.b[p.i:])
			if r == utf8.RuneError && size == 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
			} else {
				out = append(out, p.b[p.i:p.i+size]...)
			}
			p.i += size
		}
	}
	return "", false
}

func (p *scanner) hex4() (rune, bool) {
	if len(p.b)-p.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
}

// maxDepth bounds the nesting skip follows.
const maxDepth = 64

// skip reads any value.
func (p *scanner) skip(depth int) bool {
	if depth > maxDepth {
		return false
	}
	p.space()
	if p.i >= len(p.b) {
		return false
	}
	switch c := p.b[p.i]; {
	case c == '"':
		_, ok := p.str()
		return ok
	case c == '{' || c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		p.i++
		if p.eat(end) {
			return true
		}
		for {
			if c == '{' {
				if _, ok := p.str(); !ok || !p.eat(':') {
					return false
				}
			}
			if !p.skip(depth + 1) {
				return false
			}
			if p.eat(',') {
				continue
			}
			return p.eat(end)
		}
	case p.lit("true"), p.lit("false"), p.lit("null"):
		return true
	default:
		j := p.i
		for p.i < len(p.b) && (p.b[p.i] == '-' || p.b[p.i] == '+' || p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E' || (p.b[p.i] >= '0' && p.b[p.i] <= '9')) {
			p.i++
		}
		return p.i > j
	}
}

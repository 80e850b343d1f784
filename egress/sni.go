package egress

import (
	"encoding/binary"
	"errors"
	"strings"
)

// errNotHello: the bytes are a TLS record, but not one whole ClientHello
// this parser can read (fragmented over records, truncated, malformed).
// The proxy refuses such a tunnel: a server name it cannot see is not one
// it has checked.
var errNotHello = errors.New("not a readable TLS ClientHello")

// maxRecord is the largest TLS record: 5 bytes of header, 2^14 of payload
// plus the slack RFC 8446 allows.
const maxRecord = 5 + 16384 + 256

// helloLen returns the length of the TLS record that b starts with, once
// its 5-byte header is in b.
func helloLen(b []byte) (int, bool) {
	if len(b) < 5 || b[0] != 0x16 {
		return 0, false
	}
	return 5 + int(binary.BigEndian.Uint16(b[3:5])), true
}

// serverName returns the SNI host name of the ClientHello record b (""
// when it names none). b must hold the whole first record.
func serverName(b []byte) (string, error) {
	n, ok := helloLen(b)
	if !ok || n > len(b) || n > maxRecord {
		return "", errNotHello
	}
	rec := b[5:n]
	if len(rec) < 4 || rec[0] != 1 {
		return "", errNotHello
	}
	hl := int(rec[1])<<16 | int(rec[2])<<8 | int(rec[3])
	if 4+hl > len(rec) {
		return "", errNotHello // continues in another record
	}
	h := cursor(rec[4 : 4+hl])
	if !h.skip(2+32) || !h.skipVec(1) || !h.skipVec(2) || !h.skipVec(1) {
		return "", errNotHello
	}
	if len(h) == 0 {
		return "", nil // no extensions
	}
	exts, ok := h.vec(2)
	if !ok || len(h) != 0 {
		return "", errNotHello
	}
	name, seen := "", false
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec(2)
		if !ok1 || !ok2 {
			return "", errNotHello
		}
		if typ != 0 {
			continue
		}
		if seen {
			return "", errNotHello // two server_name extensions
		}
		seen = true
		list, ok := data.vec(2)
		if !ok || len(data) != 0 {
			return "", errNotHello
		}
		for len(list) > 0 {
			if len(list) < 1 {
				return "", errNotHello
			}
			nt := list[0]
			list = list[1:]
			v, ok := list.vec(2)
			if !ok {
				return "", errNotHello
			}
			if nt != 0 {
				continue
			}
			if name != "" || len(v) == 0 || len(v) > 255 {
				return "", errNotHello
			}
			name = string(v)
		}
	}
	if strings.ContainsAny(name, "\x00/:[] ") {
		return "", errNotHello
	}
	return name, nil
}

type cursor []byte

func (c *cursor) skip(n int) bool {
	if len(*c) < n {
		return false
	}
	*c = (*c)[n:]
	return true
}

func (c *cursor) u16() (uint16, bool) {
	if len(*c) < 2 {
		return 0, false
	}
	v := binary.BigEndian.Uint16(*c)
	*c = (*c)[2:]
	return v, true
}

// vec reads a vector with a big-endian length prefix of lenBytes (1 or 2).
func (c *cursor) vec(lenBytes int) (cursor, bool) {
	if len(*c) < lenBytes {
		return nil, false
	}
	n := int((*c)[0])
	if lenBytes == 2 {
		n = int(binary.BigEndian.Uint16(*c))
	}
	*c = (*c)[lenBytes:]
	if len(*c) < n {
		return nil, false
	}
	v := (*c)[:n]
	*c = (*c)[n:]
	return v, true
}

func (c *cursor) skipVec(lenBytes int) bool {
	_, ok := c.vec(lenBytes)
	return ok
}

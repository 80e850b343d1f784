package egress

import (
	"bytes"
	"io"
	"net/http"
	"sort"
	"strings"
)

// A host a secret is bound to has seen the secret's value, and what it
// answers can carry the value back: an error that quotes the credential
// it refused, a debug endpoint that lists the request's headers. The
// command must only ever see placeholders, so every answer from a bound
// host has each injected value replaced by its placeholder, in the
// header and in the body, before the command reads a byte of it.
//
// For that the body has to be readable and whole: a request to a bound
// host asks for no content coding (Accept-Encoding: identity) and for no
// range (a slice of an answer can hold a piece of a value, which no
// replacement would find), and an answer that is encoded anyway, or
// partial, is withheld (fail closed).

// prepareForScrub makes a request to a bound host ask for an answer the
// proxy can scrub.
func prepareForScrub(h http.Header) {
	h.Set("Accept-Encoding", "identity")
	h.Del("Range")
	h.Del("If-Range")
}

// unscrubbable returns why an answer from a bound host cannot be scrubbed
// ("" when it can).
func unscrubbable(resp *http.Response) string {
	if ce := strings.TrimSpace(resp.Header.Get("Content-Encoding")); ce != "" && !strings.EqualFold(ce, "identity") {
		return "the answer of a host with bound secrets is encoded (" + ce + "), so it cannot be checked for their values"
	}
	if resp.StatusCode == http.StatusPartialContent {
		return "the answer of a host with bound secrets is partial, so it cannot be checked for their values"
	}
	return ""
}

// scrubber replaces the values of injections with their placeholders.
type scrubber struct {
	ins []Injection // longest value first
}

func newScrubber(ins []Injection) *scrubber {
	s := &scrubber{ins: append([]Injection(nil), ins...)}
	sort.SliceStable(s.ins, func(i, j int) bool { return len(s.ins[i].Value) > len(s.ins[j].Value) })
	return s
}

func (s *scrubber) str(v string) string {
	if s == nil {
		return v
	}
	for _, in := range s.ins {
		v = strings.ReplaceAll(v, in.Value, in.Placeholder)
	}
	return v
}

// header scrubs h in place, names and values.
func (s *scrubber) header(h http.Header) {
	renamed := map[string]string{}
	for k, vs := range h {
		for i, v := range vs {
			vs[i] = s.str(v)
		}
		if nk := s.str(k); nk != k {
			renamed[k] = nk
		}
	}
	for k, nk := range renamed {
		h[nk] = append(h[nk], h[k]...)
		delete(h, k)
	}
}

// response scrubs resp's header, and its body and trailer as they are
// read; a body's length is then unknown (chunked, or the end of the
// connection for HTTP/1.0).
func (s *scrubber) response(resp *http.Response, method string) {
	s.header(resp.Header)
	if method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified || resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	resp.Body = &scrubReader{s: s, r: resp.Body, trailer: resp.Trailer}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	if resp.ProtoAtLeast(1, 1) {
		resp.TransferEncoding = []string{"chunked"}
	} else {
		resp.TransferEncoding = nil
		resp.Close = true
	}
}

// scrubReader is a body with the values replaced. It holds back only the
// end of what it read that could be the start of a value, until it knows:
// a streamed answer (server-sent events, a model's tokens) is not held up
// by bytes no value can begin with.
type scrubReader struct {
	s       *scrubber
	r       io.ReadCloser
	trailer http.Header
	pending []byte // read, not yet decided
	out     []byte // decided, not yet returned
	buf     []byte
	eof     bool
	err     error
}

func (r *scrubReader) Read(b []byte) (int, error) {
	for len(r.out) == 0 {
		if r.eof {
			return 0, r.err
		}
		if r.buf == nil {
			r.buf = make([]byte, 32<<10)
		}
		n, err := r.r.Read(r.buf)
		r.pending = append(r.pending, r.buf[:n]...)
		if err != nil {
			r.eof = true
			r.err = err
			if err == io.EOF && r.trailer != nil {
				// Filled in by now: the body's end carries it.
				r.s.header(r.trailer)
			}
		}
		r.decide()
	}
	n := copy(b, r.out)
	r.out = r.out[n:]
	if len(r.out) == 0 {
		r.out = nil
	}
	return n, nil
}

// decide moves what pending can no longer change into out: every
// position at which each value would fit whole, and at the end all.
func (r *scrubReader) decide() {
	limit := len(r.pending)
	if !r.eof {
		limit -= r.s.partial(r.pending)
	}
	p := 0
	for p < limit {
		j, in := -1, Injection{}
		for _, cand := range r.s.ins {
			if k := bytes.Index(r.pending[p:], []byte(cand.Value)); k >= 0 && (j < 0 || k < j) {
				j, in = k, cand // longest first: a tie keeps the longer
			}
		}
		if j < 0 || p+j >= limit {
			r.out = append(r.out, r.pending[p:limit]...)
			p = limit
			break
		}
		r.out = append(r.out, r.pending[p:p+j]...)
		r.out = append(r.out, in.Placeholder...)
		p += j + len(in.Value)
	}
	r.pending = append(r.pending[:0], r.pending[p:]...)
}

func (r *scrubReader) Close() error { return r.r.Close() }

// partial is the length of the longest end of p that is the start of a
// value, not the whole of it: what more bytes could make a value.
func (s *scrubber) partial(p []byte) int {
	n := 0
	for _, in := range s.ins {
		for l := min(len(in.Value)-1, len(p)); l > n; l-- {
			if bytes.HasSuffix(p, []byte(in.Value[:l])) {
				n = l
				break
			}
		}
	}
	return n
}

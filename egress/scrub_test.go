package egress

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/policy"
)

// A host a secret is bound to can send the secret's value back: an error
// quoting the credential it refused, an endpoint listing the request's
// headers. The command must still only ever see the placeholder. Here a
// bound server (TLS through CONNECT, and plain HTTP) echoes the
// Authorization header it got in a header, in the body (in pieces that
// cut the value, gzip-compressed when asked, a byte range when asked) and
// in a trailer: the command reads the placeholder everywhere, while the
// server did get the real value.
func TestBoundHostAnswersAreScrubbed(t *testing.T) {
	var mu sync.Mutex
	var got []string
	echo := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		mu.Lock()
		got = append(got, auth)
		mu.Unlock()
		body := []byte(strings.Repeat("padding ", 100) + "bad credentials: " + auth + "\n" + auth + auth + "\nend\n")
		rw.Header().Set("X-Echo", auth)
		switch {
		case r.URL.Path == "/range":
			http.ServeContent(rw, r, "", time.Time{}, bytes.NewReader(body))
		case strings.Contains(r.Header.Get("Accept-Encoding"), "gzip"):
			rw.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(rw)
			zw.Write(body)
			zw.Close()
		default:
			rw.Header().Set("Trailer", "X-Echo-Trailer")
			rw.WriteHeader(http.StatusUnauthorized)
			for i := 0; i < len(body); i += 5 {
				rw.Write(body[i:min(i+5, len(body))])
				rw.(http.Flusher).Flush()
			}
			rw.Header().Set("X-Echo-Trailer", auth)
		}
	})
	tlsSrv := httptest.NewTLSServer(echo)
	defer tlsSrv.Close()
	plainSrv := httptest.NewServer(echo)
	defer plainSrv.Close()
	tlsPort, plainPort := port(t, tlsSrv.URL), port(t, plainSrv.URL)

	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(tlsSrv.Certificate())
	ph := NewPlaceholder("API_TOKEN")
	p, err := New(Config{
		Policy: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{
			fmt.Sprintf("api.example.com:%d", tlsPort), fmt.Sprintf("api.example.com:%d", plainPort),
			fmt.Sprintf("127.0.0.1:%d", tlsPort), fmt.Sprintf("127.0.0.1:%d", plainPort)}},
		Inject:        []Injection{{Name: "API_TOKEN", Value: realToken, Placeholder: ph, Hosts: []string{"api.example.com"}}},
		CA:            ca,
		UpstreamRoots: roots,
		Resolver:      mapResolver{"api.example.com": {"127.0.0.1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(l)
	defer p.Close()
	pu, _ := url.Parse("http://" + l.Addr().String())
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AppendCertsFromPEM(ca.CertPEM())
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: sandboxRoots}, DisableCompression: true}}

	leaks := func(what string, resp *http.Response, body []byte) {
		t.Helper()
		all := fmt.Sprintf("%v %v %s", resp.Header, resp.Trailer, body)
		// The whole value, and either half of it (a range could cut it).
		for _, v := range []string{realToken, realToken[:len(realToken)/2], realToken[len(realToken)/2:]} {
			if strings.Contains(all, v) {
				t.Errorf("%s: the command read the secret's value: %s", what, all)
				return
			}
		}
	}
	for _, base := range []string{fmt.Sprintf("https://api.example.com:%d", tlsPort), fmt.Sprintf("http://api.example.com:%d", plainPort)} {
		for _, tc := range []struct {
			name, path string
			header     map[string]string
		}{
			{"echo in pieces", "/", nil},
			{"gzip asked", "/", map[string]string{"Accept-Encoding": "gzip"}},
			{"a range cutting the value", "/range", map[string]string{"Range": "bytes=0-845"}},
			{"the other half", "/range", map[string]string{"Range": "bytes=846-"}},
		} {
			what := base + " " + tc.name
			req, _ := http.NewRequest("GET", base+tc.path, nil)
			req.Header.Set("Authorization", "Bearer "+ph)
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("%s: reading the body: %v", what, err)
			}
			if resp.Header.Get("Content-Encoding") == "gzip" {
				if zr, err := gzip.NewReader(bytes.NewReader(body)); err == nil {
					body, _ = io.ReadAll(zr)
				}
			}
			leaks(what, resp, body)
			if resp.Header.Get("X-Echo") != "Bearer "+ph || !strings.Contains(string(body), "bad credentials: Bearer "+ph+"\n") {
				t.Errorf("%s: the placeholder is not where the value was: %d %v\n%s", what, resp.StatusCode, resp.Header, body)
			}
			if tc.name == "echo in pieces" && (resp.Trailer.Get("X-Echo-Trailer") != "Bearer "+ph ||
				!strings.HasSuffix(string(body), "Bearer "+ph+"Bearer "+ph+"\nend\n")) {
				t.Errorf("%s: trailer %v, body %q", what, resp.Trailer, body)
			}
		}
	}
	mu.Lock()
	for _, a := range got {
		if a != "Bearer "+realToken {
			t.Errorf("the bound server got %q, not the secret", a)
		}
	}
	mu.Unlock()

	// An answer the proxy cannot read whole is withheld: a server that
	// compresses although asked not to.
	gz := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(rw)
		io.WriteString(zw, r.Header.Get("Authorization"))
		zw.Close()
	}))
	defer gz.Close()
	p2, err := New(Config{
		Policy:   policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{fmt.Sprintf("api.example.com:%d", port(t, gz.URL)), gz.Listener.Addr().String()}},
		Inject:   []Injection{{Name: "API_TOKEN", Value: realToken, Placeholder: ph, Hosts: []string{"api.example.com"}}},
		CA:       ca,
		Resolver: mapResolver{"api.example.com": {"127.0.0.1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p2.Serve(l2)
	defer p2.Close()
	c, err := net.Dial("tcp", l2.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET http://api.example.com:%d/ HTTP/1.1\r\nHost: api.example.com:%d\r\nAuthorization: %s\r\nConnection: close\r\n\r\n", port(t, gz.URL), port(t, gz.URL), ph)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(DeniedHeader) != "answer-withheld" {
		t.Errorf("an encoded answer of a bound host: %d %v %q", resp.StatusCode, resp.Header, body)
	}
}

// The body is scrubbed whatever the reads cut: one byte at a time, values
// that overlap (the longer wins), a value at the very end.
func TestScrubReaderAcrossReads(t *testing.T) {
	s := newScrubber([]Injection{
		{Name: "A", Value: "secretvalue", Placeholder: "<A>"},
		{Name: "B", Value: "secretvalue-long", Placeholder: "<B>"},
		{Name: "C", Value: "xyz", Placeholder: "<C>"},
	})
	for in, want := range map[string]string{
		"":                                "",
		"plain":                           "plain",
		"secretvalue":                     "<A>",
		"secretvalue-long":                "<B>",
		"ssecretvaluesecretvalue-longxyz": "s<A><B><C>",
		"secretvalu":                      "secretvalu",
		"xyxyzz secretvalue-lon":          "xy<C>z <A>-lon",
	} {
		for _, chunk := range []int{1, 2, 7, 1 << 20} {
			r := &scrubReader{s: s, r: io.NopCloser(&chunked{data: []byte(in), n: chunk})}
			got, err := io.ReadAll(r)
			if err != nil || string(got) != want {
				t.Errorf("%q in reads of %d: %q, %v; want %q", in, chunk, got, err, want)
			}
		}
	}
}

type chunked struct {
	data []byte
	n    int
}

func (c *chunked) Read(b []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(b[:min(len(b), c.n)], c.data)
	c.data = c.data[n:]
	return n, nil
}

// A streamed answer is passed on as it comes: only an end that could
// start a value waits for more bytes (a model's tokens, server-sent
// events, must not wait for the next event).
func TestScrubReaderPassesAStreamOn(t *testing.T) {
	s := newScrubber([]Injection{{Name: "A", Value: "secretvalue", Placeholder: "<A>"}})
	pr, pw := io.Pipe()
	r := &scrubReader{s: s, r: pr}
	go func() {
		pw.Write([]byte("data: one\n\n"))
		pw.Write([]byte("data: sec"))
		pw.Write([]byte("retvalue\n\n"))
		pw.Close()
	}()
	buf := make([]byte, 64)
	// Each Read must return without the next write: the writer blocks on
	// the pipe until this side reads, so a reader that held the event back
	// would take the next write's bytes with it.
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "data: one\n\n" {
		t.Fatalf("first read: %q, %v; want the whole first event", buf[:n], err)
	}
	n, err = r.Read(buf)
	if err != nil || string(buf[:n]) != "data: " {
		t.Fatalf("second read: %q, %v; want the part that cannot start the value", buf[:n], err)
	}
	rest, err := io.ReadAll(r)
	if err != nil || string(rest) != "<A>\n\n" {
		t.Fatalf("rest: %q, %v", rest, err)
	}
}

// FuzzScrubReader: whatever the body and however the reads cut it, the
// command reads no value, and the same bytes as in one read.
func FuzzScrubReader(f *testing.F) {
	f.Add([]byte("ssecretvaluesecretvalue-longxyz"), uint8(1))
	f.Add([]byte("xyxyzz secretvalue-lon"), uint8(3))
	f.Add([]byte("secretvalu"), uint8(7))
	ins := []Injection{
		{Name: "A", Value: "secretvalue", Placeholder: "<A>"},
		{Name: "B", Value: "secretvalue-long", Placeholder: "<B>"},
		{Name: "C", Value: "xyz", Placeholder: "<C>"},
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint8) {
		s := newScrubber(ins)
		read := func(n int) string {
			got, err := io.ReadAll(&scrubReader{s: s, r: io.NopCloser(&chunked{data: body, n: n})})
			if err != nil {
				t.Fatal(err)
			}
			return string(got)
		}
		whole := read(len(body) + 1)
		if cut := read(int(cut%16) + 1); cut != whole {
			t.Fatalf("%q: cut reads give %q, one read %q", body, cut, whole)
		}
		for _, in := range ins {
			if strings.Contains(whole, in.Value) {
				t.Fatalf("%q: %q still holds %q", body, whole, in.Value)
			}
		}
	})
}

package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/policy"
)

func benchProxy(b *testing.B, allow string) string {
	p, err := New(Config{Policy: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{allow}}})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go p.Serve(l)
	b.Cleanup(func() { p.Close() })
	return l.Addr().String()
}

// BenchmarkDownload64MiB: 64 MiB through an allowed CONNECT tunnel against
// the same download straight from the server, both timed in each round.
func BenchmarkDownload64MiB(b *testing.B) {
	const size = 64 << 20
	chunk := make([]byte, 1<<20)
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			go func() {
				for range size / len(chunk) {
					if _, err := c.Write(chunk); err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	proxy := benchProxy(b, srv.Addr().String())
	get := func(viaProxy bool) time.Duration {
		start := time.Now()
		var c net.Conn
		var r io.Reader
		if viaProxy {
			c, err = net.Dial("tcp", proxy)
			if err != nil {
				b.Fatal(err)
			}
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\n\r\n", srv.Addr())
			br := bufio.NewReaderSize(c, 64<<10)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 {
				b.Fatalf("CONNECT: %v %v", resp, err)
			}
			r = br
		} else {
			c, err = net.Dial("tcp", srv.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			r = c
		}
		n, _ := io.Copy(io.Discard, r)
		c.Close()
		if n != size {
			b.Fatalf("got %d bytes", n)
		}
		return time.Since(start)
	}
	var direct, via time.Duration
	b.SetBytes(size)
	for b.Loop() {
		direct += get(false)
		via += get(true)
	}
	b.ReportMetric(float64(via)/float64(direct), "x-vs-direct")
}

// BenchmarkSmallRequests: 1,000 small plain-HTTP requests through the proxy
// against the same requests straight to the server, each with a
// keep-alive client; reports the time the proxy adds to each request.
func BenchmarkSmallRequests(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	su, _ := url.Parse(srv.URL)
	pu, _ := url.Parse("http://" + benchProxy(b, su.Host))
	run := func(cl *http.Client) time.Duration {
		start := time.Now()
		for range 1000 {
			resp, err := cl.Get(srv.URL + "/x")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
		return time.Since(start)
	}
	directCl := &http.Client{Transport: &http.Transport{}}
	viaCl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
	var direct, via time.Duration
	rounds := 0
	for b.Loop() {
		direct += run(directCl)
		via += run(viaCl)
		rounds++
	}
	b.ReportMetric(float64(via-direct)/float64(rounds)/1000/1e6, "ms-added/req")
	b.ReportMetric(float64(via)/float64(direct), "x-vs-direct")
}

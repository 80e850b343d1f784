package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

func benchProxy(b *testing.B, allow ...string) string {
	p, err := New(Config{Policy: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: allow}})
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

// downloadSize is what each download of BenchmarkDownload64MiB fetches.
const downloadSize = 64 << 20

// BenchmarkDownload64MiB: a 64 MiB download through an allowed CONNECT
// tunnel against the same download without the proxy, both measured in
// every round (the order alternates between rounds, so a change of the
// machine's load hits both sides alike). Each metric is the median of
// the rounds' ratios, proxied ÷ direct:
//
//   - x-vs-direct-https: an HTTPS GET with net/http, the way an HTTPS
//     download (go, pip, npm, curl) goes through the proxy: the same
//     Transport settings, TLS config, server and body reads on both
//     sides, a new connection each (keep-alives off); the only difference
//     is Transport.Proxy, so the proxied side adds the CONNECT and the
//     relay. cpu-x-vs-direct-https is the same for the process's CPU time
//     (server, proxy and client all run in it), which the machine's load
//     disturbs less than the wall clock.
//   - x-vs-direct-tcp: 64 MiB of raw bytes over plain TCP, with the same
//     reads (io.Copy into io.Discard) on both sides: the proxy's relay
//     alone, against a reference that does nothing but copy, the worst
//     case. cpu-x-vs-direct-tcp as above.
//   - x-vs-direct-tcp-sandbox: the raw bytes through the proxy on a unix
//     socket behind a TCP relay, the hops a sandbox's connection takes.
func BenchmarkDownload64MiB(b *testing.B) {
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
				for range downloadSize / len(chunk) {
					if _, err := c.Write(chunk); err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	hs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(downloadSize))
		for range downloadSize / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer hs.Close()
	hu, _ := url.Parse(hs.URL)
	tcpAddr := srv.Addr().String()
	proxy := benchProxy(b, tcpAddr, hu.Host)
	relay := benchUnixRelay(b, tcpAddr)
	client := func(viaProxy bool) *http.Client {
		tr := hs.Client().Transport.(*http.Transport).Clone()
		tr.DisableKeepAlives = true
		if viaProxy {
			tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: proxy})
		}
		return &http.Client{Transport: tr}
	}
	directHTTPS, viaHTTPS := client(false), client(true)
	getHTTPS := func(cl *http.Client) func() int64 {
		return func() int64 {
			resp, err := cl.Get(hs.URL)
			if err != nil {
				b.Fatal(err)
			}
			defer resp.Body.Close()
			n, _ := io.Copy(io.Discard, resp.Body)
			return n
		}
	}
	getTCP := func(addr string, viaProxy bool) func() int64 {
		return func() int64 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			var r io.Reader = c
			if viaProxy {
				fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\n\r\n", tcpAddr)
				br := bufio.NewReaderSize(c, 64<<10)
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != 200 {
					b.Fatalf("CONNECT: %v %v", resp, err)
				}
				// What br read past the reply first, then the same
				// reads from the connection as the direct side's.
				r = br
			}
			n, _ := io.Copy(io.Discard, r)
			return n
		}
	}
	type side struct {
		name      string
		get       func() int64
		wall, cpu time.Duration
	}
	sides := []*side{
		{name: "https direct", get: getHTTPS(directHTTPS)},
		{name: "https proxy", get: getHTTPS(viaHTTPS)},
		{name: "tcp direct", get: getTCP(tcpAddr, false)},
		{name: "tcp proxy", get: getTCP(proxy, true)},
		{name: "tcp sandbox", get: getTCP(relay, true)},
	}
	measure := func(s *side) {
		start, cpu0 := time.Now(), processCPU()
		if n := s.get(); n != downloadSize {
			b.Fatalf("%s: got %d bytes", s.name, n)
		}
		s.wall, s.cpu = time.Since(start), processCPU()-cpu0
	}
	ratio := func(a, d time.Duration) float64 { return float64(a) / float64(max(d, 1)) }
	var https, httpsCPU, tcp, tcpCPU, sandbox []float64
	b.SetBytes(downloadSize)
	round := 0
	for b.Loop() {
		for i := range sides {
			if round%2 == 1 {
				i = len(sides) - 1 - i
			}
			measure(sides[i])
		}
		round++
		https = append(https, ratio(sides[1].wall, sides[0].wall))
		httpsCPU = append(httpsCPU, ratio(sides[1].cpu, sides[0].cpu))
		tcp = append(tcp, ratio(sides[3].wall, sides[2].wall))
		tcpCPU = append(tcpCPU, ratio(sides[3].cpu, sides[2].cpu))
		sandbox = append(sandbox, ratio(sides[4].wall, sides[2].wall))
	}
	b.ReportMetric(testenv.Median(https), "x-vs-direct-https")
	b.ReportMetric(testenv.Median(httpsCPU), "cpu-x-vs-direct-https")
	b.ReportMetric(testenv.Median(tcp), "x-vs-direct-tcp")
	b.ReportMetric(testenv.Median(tcpCPU), "cpu-x-vs-direct-tcp")
	b.ReportMetric(testenv.Median(sandbox), "x-vs-direct-tcp-sandbox")
}

// benchUnixRelay serves a proxy allowing allow on a unix socket and
// returns a TCP address relaying to it, as the sandbox's forwarder does.
func benchUnixRelay(b *testing.B, allow string) string {
	p, err := New(Config{Policy: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{allow}}})
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(b.TempDir(), "proxy.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	go p.Serve(ul)
	b.Cleanup(func() { p.Close() })
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tl.Close() })
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("unix", sock)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { io.Copy(u, c); u.(*net.UnixConn).CloseWrite() }()
				io.Copy(c, u)
			}()
		}
	}()
	return tl.Addr().String()
}

// processCPU is the user and system time this process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

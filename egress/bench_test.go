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
	"slices"
	"syscall"
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
// the same download straight from the server, both timed in each round,
// in alternating order. x-vs-direct is the median of the rounds' ratios
// (the machine's load swings a sum); cpu-x-vs-direct the same for the
// process's CPU time (server, proxy and client are all in it), which
// load disturbs less; x-vs-direct-unix goes through the proxy on a unix
// socket behind a TCP relay, the hops a sandbox's connection takes.
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
	relay := benchUnixRelay(b, srv.Addr().String())
	get := func(addr string, viaProxy bool) (wall, cpu time.Duration) {
		start, cpu0 := time.Now(), processCPU()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		var r io.Reader = c
		if viaProxy {
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\n\r\n", srv.Addr())
			br := bufio.NewReaderSize(c, 64<<10)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 {
				b.Fatalf("CONNECT: %v %v", resp, err)
			}
			r = br
		}
		n, _ := io.Copy(io.Discard, r)
		c.Close()
		if n != size {
			b.Fatalf("got %d bytes", n)
		}
		return time.Since(start), processCPU() - cpu0
	}
	var wall, cpu, wallUnix []float64
	b.SetBytes(size)
	round := 0
	for b.Loop() {
		var dw, dc, vw, vc, uw time.Duration
		if round%2 == 0 {
			dw, dc = get(srv.Addr().String(), false)
			vw, vc = get(proxy, true)
			uw, _ = get(relay, true)
		} else {
			uw, _ = get(relay, true)
			vw, vc = get(proxy, true)
			dw, dc = get(srv.Addr().String(), false)
		}
		round++
		wall = append(wall, float64(vw)/float64(dw))
		wallUnix = append(wallUnix, float64(uw)/float64(dw))
		if dc > 0 {
			cpu = append(cpu, float64(vc)/float64(dc))
		}
	}
	b.ReportMetric(median(wall), "x-vs-direct")
	b.ReportMetric(median(wallUnix), "x-vs-direct-unix")
	if len(cpu) > 0 {
		b.ReportMetric(median(cpu), "cpu-x-vs-direct")
	}
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

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
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

package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/policy"
)

// FuzzRequests feeds arbitrary bytes to the proxy as a command would: it
// must not crash, must answer or close, and must never dial anything but
// the one allowed address, whatever the request line, headers, tunnel
// bytes or ClientHello say.
func FuzzRequests(f *testing.F) {
	for _, s := range []string{
		"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\nCONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n",
		"GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\nGET http://10.0.0.1/ HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n",
		"GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: evil\r\n\r\n",
		"GET http://[::1]:1/ HTTP/1.1\r\nHost: [::1]:1\r\n\r\n",
		"CONNECT allowed.test:1 HTTP/1.1\r\n\r\n\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00",
		"GET / HTTP/1.1\r\nHost: 127.0.0.1:1\r\nHost: x\r\n\r\n",
		"CONNECT [::ffff:127.0.0.1]:1 HTTP/1.1\r\n\r\n",
		string(socksRequest(1, "127.0.0.1", 1)) + "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
		string(socksRequest(1, "other.test", 1)),
		string(socksRequest(1, "10.0.0.1", 443)),
		string(socksRequest(3, "127.0.0.1", 1)),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var mu sync.Mutex
		var bad []string
		p, err := New(Config{
			Policy:   policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{"127.0.0.1:1", "allowed.test:1"}},
			Resolver: mapResolver{"allowed.test": {"127.0.0.1"}, "other.test": {"10.0.0.1"}},
			Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
				if addr != "127.0.0.1:1" {
					mu.Lock()
					bad = append(bad, addr)
					mu.Unlock()
				}
				return nil, errors.New("no dialling in the fuzzer")
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() { p.ServeConn(server); close(done) }()
		client.SetDeadline(time.Now().Add(2 * time.Second))
		go func() { client.Write(data); client.Close() }()
		go io.Copy(io.Discard, client)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			client.Close()
			p.Close()
			<-done
		}
		mu.Lock()
		defer mu.Unlock()
		if len(bad) > 0 {
			t.Fatalf("dialled %v", bad)
		}
	})
}

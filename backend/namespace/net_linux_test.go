package namespace

import (
	"net"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// listen starts a TCP listener on the host's 127.0.0.1 that accepts and
// closes connections, and returns its address.
func listen(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l.Addr().String()
}

func policyTimeout(d time.Duration) policy.ResourceLimits { return policy.ResourceLimits{Timeout: d} }

func secretsMode(s string) secrets.Mode { return secrets.Mode(s) }

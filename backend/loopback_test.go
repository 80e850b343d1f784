package backend

import (
	"reflect"
	"testing"

	"github.com/pulse-agent/pulse/policy"
)

func TestLoopbackForwards(t *testing.T) {
	for _, tc := range []struct {
		allow []string
		mode  policy.NetworkMode
		want  []string
	}{
		{[]string{"127.0.0.1:8080", "127.0.0.1:9090", "127.0.0.1:8080"}, policy.NetworkAllowlist, []string{"127.0.0.1:8080", "127.0.0.1:9090"}},
		// no port (80, 443), any port, a range, another address, a
		// name, the proxy's own port: none forwarded
		{[]string{"127.0.0.1", "127.0.0.1:*", "127.0.0.0/8:8080", "127.0.0.2:8080", "[::1]:8080", "localhost:8080", "example.com:8080", "127.0.0.1:3128"}, policy.NetworkAllowlist, nil},
		{[]string{"127.0.0.1:8080"}, policy.NetworkDenyAll, nil},
		{[]string{"127.0.0.1:80"}, policy.NetworkAllowlist, []string{"127.0.0.1:80"}},
	} {
		got := LoopbackForwards(policy.NetworkPolicy{Mode: tc.mode, Allow: tc.allow}, 3128)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s %v: got %v, want %v", tc.mode, tc.allow, got, tc.want)
		}
	}
}

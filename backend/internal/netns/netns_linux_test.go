package netns

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// A listener made inside another process's network namespace is not on
// the host's loopback, and the calling thread is back on the host's
// network afterwards.
func TestDoListensInTheOtherNamespace(t *testing.T) {
	testenv.MustHaveRoot(t, "entering another network namespace takes CAP_SYS_ADMIN")
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare(1) to make a network namespace")
	}
	cmd := exec.Command("unshare", "--net", "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// unshare execs sleep once the namespace exists; wait for that.
	self, _ := os.Readlink("/proc/self/ns/net")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ns, err := os.Readlink("/proc/" + itoa(cmd.Process.Pid) + "/ns/net"); err == nil && ns != self {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child never got a network namespace of its own")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var l net.Listener
	var lerr error
	if err := Do(cmd.Process.Pid, func() { l, lerr = net.Listen("tcp4", "127.0.0.1:0") }); err != nil {
		t.Fatal(err)
	}
	if lerr != nil {
		// A fresh namespace's loopback is down: the listen fails there
		// (on the host's it would not), which shows where it ran.
		t.Logf("listen inside: %v", lerr)
	} else {
		defer l.Close()
		if c, err := net.DialTimeout("tcp", l.Addr().String(), time.Second); err == nil {
			c.Close()
			t.Fatalf("the listener at %s is reachable from the host's network", l.Addr())
		}
	}
}

func TestDoGoneProcess(t *testing.T) {
	err := Do(1<<30, func() { t.Error("fn ran without a namespace") })
	if !errors.Is(err, ErrNoNamespace) {
		t.Fatalf("Do on no process: %v, want ErrNoNamespace", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

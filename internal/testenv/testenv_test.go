package testenv

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	RunIfChild("missing-required", func() {
		// A test binary of its own would run a test; calling Missing from
		// a stand-in is the same decision without the testing machinery.
		os.Exit(2)
	})
	os.Exit(m.Run())
}

func TestRequiredRule(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  bool
	}{{"", false}, {"0", false}, {"1", true}, {"yes", true}, {"true", true}} {
		t.Setenv("PULSE_REQUIRE_NODE", tc.value)
		if got := Required(Node); got != tc.want {
			t.Errorf("PULSE_REQUIRE_NODE=%q: Required %v, want %v", tc.value, got, tc.want)
		}
	}
	if Docker.Env() != "PULSE_REQUIRE_DOCKER" {
		t.Errorf("Docker.Env() = %q; CI (.ci/run) sets PULSE_REQUIRE_DOCKER", Docker.Env())
	}
}

// TestMissingSkipsUnlessRequired runs the decision in a subtest: not
// required, the subtest is skipped; required, it fails, which is checked
// by re-running this test binary on just that case.
func TestMissingSkipsUnlessRequired(t *testing.T) {
	if os.Getenv("TESTENV_FAIL_CASE") == "1" {
		Missing(t, Bwrap, "bwrap is not installed")
		return
	}
	t.Setenv(Bwrap.Env(), "")
	ok := t.Run("not required", func(t *testing.T) {
		Missing(t, Bwrap, "bwrap is not installed")
		t.Error("Missing returned")
	})
	if !ok {
		t.Fatal("a missing capability that is not required failed the test")
	}

	cmd := Command(t, "unused", "-test.run=^TestMissingSkipsUnlessRequired$")
	cmd.Env = append(cmd.Env, "TESTENV_FAIL_CASE=1", Bwrap.Env()+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(string(out), "PULSE_REQUIRE_BWRAP=1 but bwrap is not installed") {
		t.Fatalf("required and missing: %v\n%s; want a failure naming the variable", err, out)
	}
}

func TestRunIfChild(t *testing.T) {
	err := Command(t, "missing-required").Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("child: %v; want the stand-in's exit status 2", err)
	}
}

func TestPoll(t *testing.T) {
	calls := 0
	if err := Poll(10*time.Second, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || calls != 3 {
		t.Fatalf("Poll: %v after %d calls; want nil after 3", err, calls)
	}
	errLast := errors.New("still not")
	if err := Poll(time.Millisecond, func() error { return errLast }); !errors.Is(err, errLast) {
		t.Fatalf("Poll past its deadline: %v; want the last error wrapped", err)
	}
}

func TestRecv(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Recv(t, ch, time.Minute, "a value"); got != 7 {
		t.Fatalf("Recv = %d, want 7", got)
	}
	// Nothing arrives: Recv fails the test (here a recorder of Fatalf)
	// instead of waiting on.
	rec := &fatalRecorder{TB: t}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		Recv(rec, make(chan int), time.Millisecond, "the silent channel")
		rec.returned = true
	}()
	<-ended
	if rec.returned || !strings.Contains(rec.msg, "the silent channel") {
		t.Fatalf("Recv of a silent channel: returned %v, failure %q; want a failure naming what was awaited", rec.returned, rec.msg)
	}
}

// fatalRecorder records a Fatalf and ends its goroutine, as testing.T does.
type fatalRecorder struct {
	testing.TB
	msg      string
	returned bool
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestPKI(t *testing.T) {
	p := NewPKI(t)
	for _, pair := range [][2]string{{p.ServerCertFile, p.ServerKeyFile}, {p.ClientCertFile, p.ClientKeyFile}} {
		if _, err := tls.LoadX509KeyPair(pair[0], pair[1]); err != nil {
			t.Fatalf("PEM files: %v", err)
		}
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", p.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	handshake := func(cfg *tls.Config) error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ln.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		// The server's verdict on the client certificate arrives with the
		// first read under TLS 1.3.
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	if err := handshake(p.ClientConfig()); err != nil {
		t.Fatalf("mutual TLS on 127.0.0.1: %v", err)
	}
	noCert := p.ClientConfig()
	noCert.Certificates = nil
	if err := handshake(noCert); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
}

func TestMedian(t *testing.T) {
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("odd count: %v, want 2", got)
	}
	if got := Median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("even count: %v, want 2.5", got)
	}
	in := []time.Duration{5, 1, 9, 3}
	if got := Median(in); got != 4 {
		t.Errorf("durations: %v, want 4", got)
	}
	if in[0] != 5 {
		t.Errorf("Median sorted its argument: %v", in)
	}
	if got := Median[float64](nil); got != 0 {
		t.Errorf("none: %v, want 0", got)
	}
}

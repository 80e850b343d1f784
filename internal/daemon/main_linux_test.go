package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.RunIfChild("daemon-dial", dialMain)
	testenv.RunIfChild("daemon-listen", listenMain)
	os.Exit(m.Run())
}

// dialMain is a client that skips every check of its own: it dials the
// socket in os.Args[1], sends a run request for the directory and
// environment in os.Args[2:] with its stdio, and prints what the daemon
// answered ("closed" when it hung up without a word).
func dialMain() {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: os.Args[1], Net: "unixpacket"})
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	defer c.Close()
	req := Request{V: Version, Op: OpRun, Args: []string{"exec", "--", "true"}, Dir: os.Args[2], Env: os.Args[3:]}
	data, _ := json.Marshal(req)
	if _, err := c.Write(data); err != nil {
		// Hung up before the request came (EPIPE): refused at once.
		fmt.Println("closed")
		return
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err == io.EOF || n == 0 || errors.Is(err, syscall.ECONNRESET) {
		fmt.Println("closed")
		return
	}
	if err != nil {
		fmt.Println("read:", err)
		return
	}
	fmt.Println(string(buf[:n]))
}

// listenMain listens on the socket os.Args[1], says so, and accepts
// until killed.
func listenMain() {
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: os.Args[1], Net: "unixpacket"})
	if err != nil {
		fmt.Println("listen:", err)
		return
	}
	fmt.Println("listening")
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
	}
}

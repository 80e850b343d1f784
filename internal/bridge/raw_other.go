//go:build !linux

package bridge

import "net"

// dialUnix connects to the Unix socket sock (elsewhere than Linux, where
// no sandbox init runs, through package net).
func dialUnix(sock string) (conn, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

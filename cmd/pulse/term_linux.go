package main

import "golang.org/x/sys/unix"

// ioctlGetTermios reads a terminal's settings (its name differs per OS).
const ioctlGetTermios = unix.TCGETS

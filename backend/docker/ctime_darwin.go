package docker

import "syscall"

// statCtime is a file's ctime in nanoseconds.
func statCtime(st *syscall.Stat_t) int64 { return st.Ctimespec.Nano() }

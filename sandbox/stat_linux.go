package sandbox

import "syscall"

// ctimeOf is st's inode change time; the stat fields are named per OS.
func ctimeOf(st *syscall.Stat_t) syscall.Timespec { return st.Ctim }

// Package dirent reads a directory's entries with getdents into a
// caller's buffer, for walks that visit many directories and so cannot
// afford os.File's allocations and the extra fstat per entry. It is the
// one place that parses struct linux_dirent64.
package dirent

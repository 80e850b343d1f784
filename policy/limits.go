package policy

import (
	"cmp"
	"time"
)

// ResourceLimits bounds what one command may consume. A zero field means
// "the default" for Timeout and OutputBytes (see WithDefaults), and for
// Pids and MemoryBytes on the isolating backends (see
// WithIsolationDefaults); "no limit" for the others.
type ResourceLimits struct {
	// Timeout is the wall-clock limit of one command.
	Timeout time.Duration `json:"timeout,omitempty" yaml:"timeout,omitempty"`
	// MemoryBytes caps resident memory (cgroup or container limit).
	MemoryBytes int64 `json:"memory_bytes,omitempty" yaml:"memory_bytes,omitempty"`
	// CPUs caps CPU time as a number of cores (1.5 = one and a half cores).
	CPUs float64 `json:"cpus,omitempty" yaml:"cpus,omitempty"`
	// Pids caps the number of processes and threads.
	Pids int64 `json:"pids,omitempty" yaml:"pids,omitempty"`
	// OutputBytes caps stdout and stderr, each; more is dropped and the
	// result says it was truncated.
	OutputBytes int64 `json:"output_bytes,omitempty" yaml:"output_bytes,omitempty"`
	// FileSizeBytes caps the size of any one file the command writes.
	FileSizeBytes int64 `json:"file_size_bytes,omitempty" yaml:"file_size_bytes,omitempty"`
	// DiskBytes caps the disk space that what a command writes (the files
	// it creates or changes: its overlay, or its container's workspace)
	// may take while it runs. The kernel enforces it as the command
	// writes, so that a command cannot fill the host's disk; one that
	// reaches it is ended and the result names the limit. Zero means the
	// isolating backends' default (see DefaultDiskBytes). On the
	// namespace backend the writes are held in a tmpfs, so they count
	// toward MemoryBytes as well.
	DiskBytes int64 `json:"disk_bytes,omitempty" yaml:"disk_bytes,omitempty"`
}

// Defaults applied where a ResourceLimits field is zero.
const (
	DefaultTimeout     = 10 * time.Minute
	DefaultOutputBytes = 16 << 20
)

// Defaults the isolating backends (namespace, Docker) apply where Pids or
// MemoryBytes is zero, so that a command no policy bounds still cannot
// take the host down: a fork bomb stops at DefaultPids tasks instead of
// the host's pid space, a runaway allocation at DefaultMemoryBytes. They
// leave room for real builds (a parallel `go test ./...` or `make -j`
// runs a few hundred tasks; most compilers and linkers stay well below a
// GiB); a policy raises them with limits.pids and limits.memory_bytes.
// The host backend enforces neither (see its Capabilities).
const (
	DefaultPids        = 1024
	DefaultMemoryBytes = 1 << 30
)

// DefaultDiskBytes is the most that an isolating backend lets a command
// write where DiskBytes is zero. The backend lowers it further to
// DefaultDiskShare of the space free where the writes go, measured when
// the command starts, so that the default cannot fill a small disk
// either; a DiskBytes that a policy sets is used as it is (the policy's
// author chose it). A policy raises it with limits.disk_bytes.
const (
	DefaultDiskBytes = 4 << 30
	DefaultDiskShare = 0.5
)

// DiskDefault is the bound on what a command writes when DiskBytes is
// zero, given free, the bytes free where its writes go (negative when not
// known): DefaultDiskBytes, or DefaultDiskShare of free if that is less.
func DiskDefault(free int64) int64 {
	if free < 0 {
		return DefaultDiskBytes
	}
	return min(DefaultDiskBytes, int64(float64(free)*DefaultDiskShare))
}

// WithIsolationDefaults returns l with a zero Pids and MemoryBytes replaced
// by DefaultPids and DefaultMemoryBytes. The isolating backends call it on
// what they are asked to enforce; the facade does not, so that a backend
// that cannot enforce these limits is not refused for limits nobody asked
// for.
func (l ResourceLimits) WithIsolationDefaults() ResourceLimits {
	l.Pids = cmp.Or(l.Pids, DefaultPids)
	l.MemoryBytes = cmp.Or(l.MemoryBytes, DefaultMemoryBytes)
	return l
}

// WithDefaults returns l with a zero Timeout and OutputBytes replaced by
// DefaultTimeout and DefaultOutputBytes, so that no command runs unbounded.
func (l ResourceLimits) WithDefaults() ResourceLimits {
	l.Timeout = cmp.Or(l.Timeout, DefaultTimeout)
	l.OutputBytes = cmp.Or(l.OutputBytes, DefaultOutputBytes)
	return l
}

// LimitKey names one resource limit: its key in a policy file's limits
// section, in ResourceLimits' JSON, in Capabilities.Limits and in a
// LimitError. Code that looks a limit up by name uses these constants, so
// that a misspelt key is a compile error rather than a limit nobody checks.
type LimitKey string

// The resource limits, one per ResourceLimits field.
const (
	LimitTimeout       LimitKey = "timeout"
	LimitMemoryBytes   LimitKey = "memory_bytes"
	LimitCPUs          LimitKey = "cpus"
	LimitPids          LimitKey = "pids"
	LimitOutputBytes   LimitKey = "output_bytes"
	LimitFileSizeBytes LimitKey = "file_size_bytes"
	LimitDiskBytes     LimitKey = "disk_bytes"
)

// LimitKeys returns every limit key, in the order the policy file
// documents them.
func LimitKeys() []LimitKey {
	return []LimitKey{LimitTimeout, LimitMemoryBytes, LimitCPUs, LimitPids, LimitOutputBytes, LimitFileSizeBytes, LimitDiskBytes}
}

// Defaulted reports whether every command has limit k, because
// WithDefaults fills it in (the timeout and the output cap).
func (k LimitKey) Defaulted() bool { return k == LimitTimeout || k == LimitOutputBytes }

// IsSet reports whether l sets limit k (its field is not zero). An
// unknown key is never set.
func (l ResourceLimits) IsSet(k LimitKey) bool {
	switch k {
	case LimitTimeout:
		return l.Timeout > 0
	case LimitMemoryBytes:
		return l.MemoryBytes > 0
	case LimitCPUs:
		return l.CPUs > 0
	case LimitPids:
		return l.Pids > 0
	case LimitOutputBytes:
		return l.OutputBytes > 0
	case LimitFileSizeBytes:
		return l.FileSizeBytes > 0
	case LimitDiskBytes:
		return l.DiskBytes > 0
	}
	return false
}

package policy

import "time"

// ResourceLimits bounds what one command may consume. A zero field means
// "the backend's default" for Timeout and OutputBytes (see DefaultLimits)
// and "no limit" for the others.
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
}

// Defaults applied where a ResourceLimits field is zero.
const (
	DefaultTimeout     = 10 * time.Minute
	DefaultOutputBytes = 16 << 20
)

// WithDefaults returns l with a zero Timeout and OutputBytes replaced by
// DefaultTimeout and DefaultOutputBytes, so that no command runs unbounded.
func (l ResourceLimits) WithDefaults() ResourceLimits {
	if l.Timeout == 0 {
		l.Timeout = DefaultTimeout
	}
	if l.OutputBytes == 0 {
		l.OutputBytes = DefaultOutputBytes
	}
	return l
}

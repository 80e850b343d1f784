package nsinit

import (
	"encoding/binary"
	"encoding/json"
	"errors"

	"golang.org/x/sys/unix"
)

// Env marks a process as a sandbox init. Its value is the protocol
// version, so a binary never mistakes an older parent's config for its own.
const (
	Env     = "PULSE_NAMESPACE_INIT"
	Version = "1"
	// Fds of the init: the config pipe and the status pipe. The status pipe
	// is close-on-exec in the init, so EOF on it without a message means
	// the command was exec'd.
	ConfigFd = 3
	StatusFd = 4
	// TraceEnv, set in the init's environment, makes it report the time
	// of each set-up step on the status pipe ("phase <name> <ns>",
	// CLOCK_MONOTONIC); the start-up profile test reads them.
	TraceEnv = "PULSE_NAMESPACE_TRACE"
)

// Config is everything the init needs, sent by the parent over the
// config pipe as JSON (written with encoding/json, read in the init by
// decode_linux.go, which must learn any field added here). Host paths are
// absolute.
type Config struct {
	Root      string   `json:"root"`
	Workspace string   `json:"workspace"`
	Upper     string   `json:"upper"`
	Work      string   `json:"work"`
	Dir       string   `json:"dir"`
	Home      string   `json:"home"`
	Args      []string `json:"args,omitempty"`
	Shell     string   `json:"shell,omitempty"`
	Env       []string `json:"env"`
	NewNet    bool     `json:"new_net"`
	ReadOnly  []string `json:"read_only,omitempty"`
	// Mask are system paths (inside /etc) hidden from the command.
	Mask      []string `json:"mask,omitempty"`
	ReadWrite []string `json:"read_write,omitempty"`
	// Caches are host directories bound read-write at another path
	// (Request.Caches); landlock lets the command write below Dst.
	Caches   []CacheBind `json:"caches,omitempty"`
	Hostname string      `json:"hostname"`
	// LastCap is the highest capability number the kernel knows, read
	// once by the backend (static config only).
	LastCap int `json:"last_cap,omitempty"`
	// Seccomp is the compiled filter program (static config only): the
	// policy is fixed, so the backend compiles it once for every init.
	Seccomp BPFProgram `json:"seccomp,omitempty"`
	// PidsLimited: the command has a pids limit (cgroup or RLIMIT_NPROC)
	// that the init's threads count against, so the init starts the
	// threads its runtime may want before the command starts.
	PidsLimited bool `json:"pids_limited,omitempty"`
	// Rlimits; zero means leave the inherited limit.
	FileSize int64 `json:"file_size,omitempty"`
	NProc    int64 `json:"nproc,omitempty"`
	Data     int64 `json:"data,omitempty"`
	// Egress is set in allowlist mode (egress_linux.go).
	Egress *EgressConfig `json:"egress,omitempty"`
	// TTY runs the command on a terminal of this size (tty_linux.go).
	TTY *TTYConfig `json:"tty,omitempty"`
	// Layers are the pending layers laid between the workspace and the
	// upper directory, bottom first (overlay_linux.go).
	Layers []string `json:"layers,omitempty"`
	// Scratch, when set, is an empty host directory on which the init
	// mounts a tmpfs of ScratchBytes bytes and ScratchInodes inodes for
	// the upper and work directories (scratch_linux.go): the kernel then
	// bounds what the command writes while it runs.
	Scratch       string `json:"scratch,omitempty"`
	ScratchBytes  int64  `json:"scratch_bytes,omitempty"`
	ScratchInodes int64  `json:"scratch_inodes,omitempty"`
}

// CacheBind is one Request.Cache: host Src shown writable at Dst.
type CacheBind struct {
	Src string `json:"src"`
	Dst string `json:"dst"`
}

// BPFProgram travels as base64 of packed 8-byte instructions rather than
// as JSON objects: decoding a hundred objects by reflection was a
// measurable part of a cold init's start.
type BPFProgram []unix.SockFilter

func (p BPFProgram) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 8*len(p))
	for _, in := range p {
		b = binary.LittleEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.LittleEndian.AppendUint32(b, in.K)
	}
	return json.Marshal(b)
}

func (p *BPFProgram) UnmarshalJSON(data []byte) error {
	var b []byte
	if err := json.Unmarshal(data, &b); err != nil {
		return err
	}
	prog, err := bpfFromBytes(b)
	if err != nil {
		return err
	}
	*p = prog
	return nil
}

// bpfFromBytes unpacks instructions packed as MarshalJSON packs them.
func bpfFromBytes(b []byte) (BPFProgram, error) {
	if len(b)%8 != 0 {
		return nil, errors.New("seccomp program: not a whole number of instructions")
	}
	prog := make(BPFProgram, 0, len(b)/8)
	for ; len(b) > 0; b = b[8:] {
		prog = append(prog, unix.SockFilter{Code: binary.LittleEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.LittleEndian.Uint32(b[4:])})
	}
	return prog, nil
}

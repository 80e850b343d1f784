package session

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"google.golang.org/protobuf/proto"
)

// encodeFrames is the fuzz input format: each ServerFrame as a uvarint
// length followed by its protobuf bytes.
func encodeFrames(frames ...*sandboxv1.ServerFrame) []byte {
	var out []byte
	for _, f := range frames {
		b, _ := proto.Marshal(f)
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	return out
}

func decodeFrames(data []byte) []*sandboxv1.ServerFrame {
	var frames []*sandboxv1.ServerFrame
	for len(data) > 0 && len(frames) < 256 {
		n, k := binary.Uvarint(data)
		if k <= 0 || n > uint64(len(data)-k) {
			break
		}
		f := &sandboxv1.ServerFrame{}
		// gRPC drops a frame that does not unmarshal; so do we.
		if proto.Unmarshal(data[k:k+int(n)], f) == nil {
			frames = append(frames, f)
		}
		data = data[k+int(n):]
	}
	return frames
}

// FuzzFrames feeds arbitrary relay frame sequences to a session and checks
// that it neither panics nor deadlocks, opens with Hello, never answers an
// id it was not asked about, and never sends more terminal frames for an
// id than Exec frames carried it.
func FuzzFrames(f *testing.F) {
	ex := func(id uint64, cmd string) *sandboxv1.ServerFrame {
		return &sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Exec{Exec: &sandboxv1.Exec{ReqId: id, Command: cmd, Stdin: []byte("in"), TimeoutS: 1, Streaming: true}}}
	}
	ab := func(id uint64) *sandboxv1.ServerFrame {
		return &sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Abort{Abort: &sandboxv1.Abort{ReqId: id}}}
	}
	f.Add(encodeFrames(ex(1, "x"), ex(1, "x"), ex(1, "y")))
	f.Add(encodeFrames(ex(1, "block"), ex(2, "x"), ex(3, "x"), ex(4, "x"), ab(2), ab(1), ab(9)))
	f.Add(encodeFrames(ex(1, "block"), ex(1, "block"), ex(1, "z"), ab(1), ex(1, "block")))
	f.Add(encodeFrames(&sandboxv1.ServerFrame{}, ex(0, "")))
	f.Add([]byte{0x05, 0xff, 0xff, 0xff, 0xff, 0xff})

	f.Fuzz(func(t *testing.T, data []byte) {
		frames := decodeFrames(data)
		execs := map[uint64]int{}
		for _, fr := range frames {
			if e := fr.GetExec(); e != nil {
				execs[e.GetReqId()]++
			}
		}
		s, err := New(Config{Capacity: 2, QueueSize: 2, CacheSize: 4, Heartbeat: time.Hour}, newFakeRunner(echoRunner(nil)))
		if err != nil {
			t.Fatal(err)
		}
		st := newFakeStream()
		for _, fr := range frames {
			st.in <- fr
		}
		close(st.in)
		done := make(chan error, 1)
		go func() { done <- s.Serve(context.Background(), st) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return after the stream ended")
		}
		close(st.out)
		first := true
		terminals := map[uint64]int{}
		for w := range st.out {
			if first {
				if w.GetHello() == nil {
					t.Fatalf("first frame %v is not Hello", w)
				}
				first = false
				continue
			}
			if w.GetHello() != nil || w.GetHeartbeat() != nil {
				continue
			}
			id := reqID(w)
			if execs[id] == 0 {
				t.Fatalf("frame %v for req_id %d that no Exec carried", w, id)
			}
			if w.GetEnd() != nil || w.GetExecError() != nil {
				terminals[id]++
				if terminals[id] > execs[id] {
					t.Fatalf("req_id %d: %d terminal frames for %d Execs", id, terminals[id], execs[id])
				}
			}
		}
	})
}

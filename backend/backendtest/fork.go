package backendtest

import (
	"fmt"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// fork returns a stack that starts with st's layers and diverges from
// there, as a forked sandbox's lane does: the layers are shared, not
// copied.
func (st *stackSim) fork() *stackSim {
	return &stackSim{e: st.e, layers: append([]backend.PendingLayer(nil), st.layers...), n: st.n + 1000}
}

// testStackForkIndependent: two stacks that share their bottom layers
// and then diverge run alternately on one workspace; each command sees
// the workspace, the shared layers and its own stack's later layers,
// never the other's — also where both change the same path, and where one
// removes a shared path the other keeps.
func testStackForkIndependent(t *testing.T, s *suite) {
	e, a := s.setupStack(t)
	e.writeFile("base.txt", []byte("base\n"))
	a.run("echo shared > s.txt && mkdir -p d && echo shared > d/x")
	b := a.fork()
	a.run("echo a > mine.txt && echo a > both.txt && rm d/x")
	b.run("echo b > mine.txt && echo b > both.txt && echo b >> s.txt")
	for i := range 3 {
		if _, out := a.run(fmt.Sprintf("cat s.txt mine.txt both.txt base.txt; test ! -e d/x && echo nox; echo a%d > step", i)); out != "shared\na\na\nbase\nnox\n" {
			t.Fatalf("step %d, stack a saw %q", i, out)
		}
		if _, out := b.run(fmt.Sprintf("cat s.txt mine.txt both.txt d/x; test ! -e step && echo nostep; echo b%d > other", i)); out != "shared\nb\nb\nb\nshared\nnostep\n" {
			t.Fatalf("step %d, stack b saw %q", i, out)
		}
	}
	if _, out := a.run("cat step; test ! -e other && echo noother"); out != "a2\nnoother\n" {
		t.Fatalf("stack a at the end saw %q", out)
	}
	if _, out := b.run("cat other; test ! -e step && echo nostep"); out != "b2\nnostep\n" {
		t.Fatalf("stack b at the end saw %q", out)
	}
	// The shared base, with nothing of either on top.
	base := &stackSim{e: e, layers: a.layers[:1:1], n: 5000}
	if _, out := base.run("cat s.txt d/x; test ! -e mine.txt && test ! -e both.txt && echo neither"); out != "shared\nshared\nneither\n" {
		t.Fatalf("the shared base saw %q", out)
	}
}

package docker

import (
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// applyToModelScanning is applyToModel as it was before subtrees: every
// removal scans the whole model. The indexed one must leave the same model.
func applyToModelScanning(model map[string]string, ov *backend.Overlay, concurrent bool) {
	var none subtrees
	for _, p := range ov.Deleted {
		none.removeTree(model, p)
		if concurrent {
			model[p] = "?"
		}
	}
	for _, f := range ov.Files {
		if concurrent {
			model[f.Path] = "?"
			continue
		}
		switch {
		case f.Mode&fs.ModeDir != 0:
			model[f.Path] = dirSig(tarMode(f.Mode))
		case f.Mode&fs.ModeSymlink != 0:
			none.removeTree(model, f.Path)
			model[f.Path] = "l|" + string(f.Data)
		default:
			none.removeTree(model, f.Path)
			model[f.Path] = "x" // replaced below: only the key set and kinds matter here
		}
	}
}

// TestApplyToModelIsTheScan: on random models and overlays — a directory
// replaced by a file or a link, a file by a directory, deletions of whole
// trees, paths put in and dropped again within one overlay, overlays on
// both sides of subtreesFrom — the indexed update leaves exactly the
// entries the full scan leaves.
func TestApplyToModelIsTheScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	name := func() string {
		depth := 1 + r.IntN(4)
		p := ""
		for i := 0; i < depth; i++ {
			if p != "" {
				p += "/"
			}
			p += fmt.Sprintf("d%d", r.IntN(4))
		}
		return p
	}
	for round := 0; round < 400; round++ {
		model := map[string]string{}
		for i := 0; i < 5+r.IntN(200); i++ {
			p := name()
			model[p] = "f|" + p
		}
		ov := &backend.Overlay{}
		for i := 0; i < r.IntN(3*subtreesFrom); i++ {
			p := name()
			switch r.IntN(4) {
			case 0:
				ov.Deleted = append(ov.Deleted, p)
			case 1:
				ov.Files = append(ov.Files, backend.File{Path: p, Mode: fs.ModeDir | 0o755})
			case 2:
				ov.Files = append(ov.Files, backend.File{Path: p, Mode: fs.ModeSymlink | 0o777, Data: []byte("t")})
			default:
				ov.Files = append(ov.Files, backend.File{Path: p, Mode: 0o644, Data: []byte(p)})
			}
		}
		concurrent := r.IntN(5) == 0
		want, got := maps.Clone(model), maps.Clone(model)
		applyToModelScanning(want, ov, concurrent)
		applyToModel(got, ov, concurrent)
		if len(got) != len(want) {
			t.Fatalf("round %d: %d entries, the scan leaves %d", round, len(got), len(want))
		}
		for p, sig := range want {
			g, ok := got[p]
			if !ok {
				t.Fatalf("round %d: %s missing", round, p)
			}
			if sig != "x" && g != sig {
				t.Fatalf("round %d: %s = %q, the scan leaves %q", round, p, g, sig)
			}
		}
	}
}

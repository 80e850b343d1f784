package sandbox

import (
	"os/exec"
	"strings"
	"testing"
)

// The facade links no concrete backend: selection goes through the
// drivers the program's imports register (backend.Register). The facade
// alone, and an SDK program that imports only backend/namespace, link no
// Docker client; the pulse binary (backend/all) does.
func TestFacadeLinksNoDockerClient(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("needs the go command to list dependencies: %v", err)
	}
	for _, tc := range []struct {
		pkg        string
		wantDocker bool
	}{
		{".", false},
		{"./testdata/nsonly", false},
		{"../backend/all", true}, // the check can fail
	} {
		out, err := exec.Command(goBin, "list", "-deps", tc.pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", tc.pkg, err)
		}
		var docker, backends []string
		for _, p := range strings.Fields(string(out)) {
			switch {
			case strings.HasPrefix(p, "github.com/docker/"), strings.HasPrefix(p, "github.com/moby/"):
				docker = append(docker, p)
			case tc.pkg == "." && strings.HasPrefix(p, "github.com/pulse-agent/pulse/backend/") &&
				!strings.HasPrefix(p, "github.com/pulse-agent/pulse/backend/internal/"):
				backends = append(backends, p)
			}
		}
		if got := len(docker) > 0; got != tc.wantDocker {
			t.Errorf("%s links Docker client packages: %v, want %v: %v", tc.pkg, got, tc.wantDocker, docker)
		}
		if len(backends) > 0 {
			t.Errorf("the facade links concrete backends: %v", backends)
		}
	}
}

package docker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
)

// runInspect is the part of a container's inspect that a takeover looks
// at (usable): whether it runs, since when, and its labels.
type runInspect struct {
	State  *runState
	Config *runConfig
}

type runState struct {
	Running, Restarting, Paused bool
	StartedAt                   string
}

type runConfig struct {
	Labels map[string]string
}

// inspectRun returns that part of container id's inspect. Over a unix
// socket it asks the engine itself and decodes only that part: the
// client's ContainerInspect decodes the whole answer into the engine's
// types, and the first such decode in a process (every CLI command's)
// builds encoding/json's tables for dozens of them, about a tenth of a
// CLI command's CPU on Docker. Elsewhere (TCP, TLS, ssh), and whenever
// that request does not come back as a container, it takes the client's
// answer, errors included.
func (b *Backend) inspectRun(ctx context.Context, id string) (runInspect, error) {
	if ri, ok := b.inspectRunDirect(ctx, id); ok {
		return ri, nil
	}
	insp, err := b.cli.ContainerInspect(ctx, id)
	if err != nil {
		return runInspect{}, err
	}
	return runInspectOf(insp), nil
}

// runInspectOf is the part of the client's inspect that runInspect holds.
func runInspectOf(insp container.InspectResponse) runInspect {
	var ri runInspect
	if insp.ContainerJSONBase != nil && insp.State != nil {
		ri.State = &runState{insp.State.Running, insp.State.Restarting, insp.State.Paused, insp.State.StartedAt}
	}
	if insp.Config != nil {
		ri.Config = &runConfig{insp.Config.Labels}
	}
	return ri
}

func (b *Backend) inspectRunDirect(ctx context.Context, id string) (runInspect, bool) {
	v := b.cli.ClientVersion()
	if !strings.HasPrefix(b.cli.DaemonHost(), "unix://") || v == "" || id == "" || strings.ContainsAny(id, "/?#%") {
		return runInspect{}, false
	}
	u := url.URL{Scheme: "http", Host: client.DummyHost, Path: "/v" + strings.TrimPrefix(v, "v") + "/containers/" + id + "/json"}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return runInspect{}, false
	}
	resp, err := b.cli.HTTPClient().Do(req)
	if err != nil {
		return runInspect{}, false
	}
	defer func() {
		// Read to its end, so that the connection is kept for the
		// client's next request.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
	}()
	var ri runInspect
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&ri) != nil || ri.State == nil {
		return runInspect{}, false
	}
	return ri, true
}

package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/internal/worker/runner"
	"github.com/pulse-agent/pulse/protocol"
)

// forEachIsolation runs test once for each kind of box a worker makes:
// the namespace backend's and gVisor's (WORKER_ISOLATION).
func forEachIsolation(t *testing.T, test func(t *testing.T, isolation string)) {
	for _, iso := range []string{runner.IsolationNamespace, runner.IsolationGVisor} {
		t.Run(iso, func(t *testing.T) { test(t, iso) })
	}
}

// startBoxingWorker runs a pulse-worker process like startWorker, with
// extra environment, boxing with isolation, and skips when the worker
// cannot box executions that way here (no user namespaces, no runsc;
// unless the test environment requires it): what is under test is the
// box.
func (rh *relayHarness) startBoxingWorker(t *testing.T, isolation, id, capacity string, env ...string) {
	t.Helper()
	cmd := testenv.Command(t, "pulse-worker")
	cmd.Env = append(cmd.Env, "RELAY_ADDR="+rh.addr, "SANDBOX_ID="+id, "SANDBOX_TOKEN="+workerToken,
		"RELAY_TLS=0", "WORKER_MAX_CONCURRENT="+capacity, "WORKER_ISOLATION="+isolation)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	rh.waitWorkers(t, 1)
	if _, capTotal, _ := rh.relay.Workers(); fmt.Sprint(capTotal) != capacity {
		err := fmt.Errorf("the worker makes no %s boxes here (capacity %d): %s", isolation, capTotal, stderr.String())
		need := testenv.Namespace
		if isolation == runner.IsolationGVisor {
			need = testenv.GVisor
		}
		testenv.MustHave(t, need, err) // fails under PULSE_REQUIRE_*, else skips saying why
	}
}

// Two executions at once on one worker, tried as the second would attack
// the first: it knows where workspaces live on a worker, and looks for
// the secret the first wrote into its workspace, for the first's
// environment and argv among the processes it can see, and for the
// worker's own loopback listeners (its health endpoint, the relay). It
// proves each probe works on what is its own, so that finding nothing
// means there was nothing to find.
func TestFleetExecutionsOnOneWorkerCannotSeeEachOther(t *testing.T) {
	forEachIsolation(t, fleetExecutionsCannotSeeEachOther)
}

func fleetExecutionsCannotSeeEachOther(t *testing.T, isolation string) {
	rh := startRelay(t)
	health := testenv.FreeAddr(t)
	rh.startBoxingWorker(t, isolation, "w-box", "2", "WORKER_HEALTH_LISTEN="+health, "WORKER_OWN_SECRET=worker-env-secret-3141")
	if r, _ := rh.dial(tokenA).do(protocol.ActionCapabilities, nil); !strings.Contains(r.raw, `"deny-all":"strong"`) {
		t.Fatalf("a relay with a boxing worker does not call network deny-all strong: %s", r.raw)
	}
	_, healthPort, _ := net.SplitHostPort(health)
	_, relayPort, _ := net.SplitHostPort(rh.addr)

	a, b := rh.dial(tokenA), rh.dial(tokenA)
	a.submit("box-a", `echo "$A_SECRET" > secret.txt && echo ready && sleep 60 # argv-marker-a`,
		map[string]any{"env": map[string]any{"A_SECRET": "env-secret-of-a-2718"}, "timeout_s": 120})
	for {
		m := a.recv()
		if m.Type == protocol.TypeResult {
			t.Fatalf("execution A ended before B ran: %s", m.raw)
		}
		if m.Type == protocol.TypeStream && strings.Contains(m.str("data"), "ready") {
			break
		}
	}

	// The markers are built at run time: written out, they would be in
	// the probe's own argv.
	probe := func(loopback bool) string {
		p := `
leak() { echo "LEAK: $*"; }
sa="env-secret-of"; sa="$sa-a"; am="argv-marker"; am="$am-a"; ws="worker-env-secret"
echo own-file-of-b > mine.txt
# Files: A's workspace sits beside this one on the worker; and anywhere else a
# worker keeps things.
for f in "$(dirname "$PWD")"/*/secret.txt /tmp/*/secret.txt /tmp/secret.txt /var/tmp/*/secret.txt; do
  [ -r "$f" ] && grep -q "$sa" "$f" && leak "file $f"
done
cat "$(dirname "$PWD")"/*/mine.txt 2>/dev/null | grep -q own-file-of-b && echo probe-files-ok
# Processes: every /proc entry's argv and environment.
for p in /proc/[0-9]*; do
  cat "$p/cmdline" 2>/dev/null | tr '\0' '\n' | grep -q "$am" && leak "argv of $p"
  cat "$p/environ" 2>/dev/null | tr '\0' '\n' | grep -q -e "$sa" -e "$ws" && leak "environ of $p"
done
cat /proc/self/environ | tr '\0' '\n' | grep -q B_OWN=1 && echo probe-proc-ok
env | grep -q -e "$sa" -e "$ws" -e SANDBOX_TOKEN && leak "own environment"
`
		if loopback {
			p += `
# The worker's loopback: its health endpoint and the relay it dials.
for port in ` + healthPort + ` ` + relayPort + `; do
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && leak "loopback port $port"
done
`
		}
		return p + "echo probe-done\n"
	}
	for _, tc := range []struct {
		network  string
		loopback bool
	}{
		// The fleet's default since it enforces policies: the box's own
		// empty network.
		{"deny-all", true},
		// allow-all gives the box the pod's network, as it gives a
		// box on one machine the host's (docs/security.md): the rest
		// stays apart.
		{"allow-all", false},
	} {
		id := "box-b-" + tc.network
		b.submit(id, probe(tc.loopback), map[string]any{"env": map[string]any{"B_OWN": "1"}, "timeout_s": 60,
			"network": map[string]any{"mode": tc.network}})
		res, _ := b.untilResult(id, nil)
		out := res.str("stdout")
		if strings.Contains(out, "LEAK") {
			t.Errorf("network %s: execution B saw execution A or the worker:\n%s", tc.network, out)
		}
		for _, ok := range []string{"probe-files-ok", "probe-proc-ok", "probe-done"} {
			if !strings.Contains(out, ok) {
				t.Errorf("network %s: the probe did not pass its check %q (so it proves nothing): stdout %q stderr %q", tc.network, ok, out, res.str("stderr"))
			}
		}
	}

	// A was running all along, and its own write is its own.
	r, other := a.do(protocol.ActionCancel, map[string]any{"execution_id": "box-a"})
	if r.str("status") != protocol.StatusCancelled {
		t.Fatalf("cancel A: %s", r.raw)
	}
	a.untilResult("box-a", other)
}

// An allowlist policy on the fleet, tried from outside: the box reaches
// the listed host through the egress proxy beside it on the worker, with
// the secret bound to that host put into its request there; a host not
// listed is refused, and so is the placeholder sent to a listed host it is
// not bound to. The box sees only the placeholder, and every connection
// comes back in the result.
func TestFleetAllowlistReachesOnlyItsHostsAndInjectsOnlyThere(t *testing.T) {
	forEachIsolation(t, fleetAllowlistReachesOnlyItsHosts)
}

func fleetAllowlistReachesOnlyItsHosts(t *testing.T, isolation string) {
	const value = "fleet-secret-value-0123456789"
	type seen struct{ auth string }
	listen := func(name string) (port string, got chan seen) {
		got = make(chan seen, 4)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got <- seen{auth: r.Header.Get("Authorization")}
			io.WriteString(w, "answer-of-"+name)
		}))
		t.Cleanup(srv.Close)
		_, port, _ = net.SplitHostPort(srv.Listener.Addr().String())
		return port, got
	}
	boundPort, boundSeen := listen("bound")    // listed, the secret bound to it
	otherPort, otherSeen := listen("other")    // listed, not bound
	deniedPort, deniedSeen := listen("denied") // not listed

	rh := startRelay(t)
	rh.startBoxingWorker(t, isolation, "w-egress", "2")
	c := rh.dial(tokenA)
	ph := egress.NewPlaceholder("API_TOKEN")
	get := func(port, host string) string {
		// Through the proxy the box's environment names, by hand:
		// bash alone, no client tool needed in the image.
		return `(exec 3<>/dev/tcp/127.0.0.1/3128 && printf 'GET http://` + host + `:` + port + `/ HTTP/1.1\r\nHost: ` + host + `:` + port +
			`\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n' "$API_TOKEN" >&3 && cat <&3); echo`
	}
	script := `echo "token-in-box=$API_TOKEN"; echo "proxy=$HTTP_PROXY"
` + get(boundPort, "localhost") + `
` + get(otherPort, "127.0.0.1") + `
` + get(deniedPort, "127.0.0.1") + `
`
	r := c.submit("egress-1", script, map[string]any{
		"network": map[string]any{"mode": "allowlist", "allow": []string{"localhost:" + boundPort, "127.0.0.1:" + otherPort}},
		"env":     map[string]any{"API_TOKEN": ph},
		"inject":  []map[string]any{{"env": "API_TOKEN", "hosts": []string{"localhost"}, "placeholder": ph, "value": value}},
	})
	if r.Type == protocol.TypeError {
		t.Fatalf("allowlist submission refused on the fleet: %s", r.raw)
	}
	res, _ := c.untilResult("egress-1", nil)
	out := res.str("stdout")
	if strings.Contains(out, value) || !strings.Contains(out, "token-in-box="+ph) {
		t.Errorf("the box saw the secret's value, or not its placeholder:\n%s", out)
	}
	if !strings.Contains(out, "answer-of-bound") {
		t.Errorf("the listed host was not reached:\n%s\nstderr %s", out, res.str("stderr"))
	}
	if strings.Contains(out, "answer-of-denied") || strings.Contains(out, "answer-of-other") {
		t.Errorf("a refused request reached its host:\n%s", out)
	}
	select {
	case s := <-boundSeen:
		if s.auth != "Bearer "+value {
			t.Errorf("the bound host got Authorization %q, want the injected value", s.auth)
		}
	default:
		t.Error("the bound host saw no request")
	}
	for name, ch := range map[string]chan seen{"not bound": otherSeen, "not listed": deniedSeen} {
		select {
		case s := <-ch:
			t.Errorf("the %s host got a request (Authorization %q)", name, s.auth)
		default:
		}
	}

	// The audit: every connection, with why it was refused.
	evs, _ := res.Payload["network"].([]any)
	var allowedBound, refusedDenied, refusedOther bool
	for _, e := range evs {
		ev, _ := e.(map[string]any)
		port := fmt.Sprint(ev["port"])
		allowed, _ := ev["allowed"].(bool)
		injected := fmt.Sprint(ev["injected"])
		switch {
		case port == boundPort && allowed && strings.Contains(injected, "API_TOKEN"):
			allowedBound = true
		case port == deniedPort && !allowed && ev["reason"] != "":
			refusedDenied = true
		case port == otherPort && !allowed:
			refusedOther = true
		}
	}
	if !allowedBound || !refusedDenied || !refusedOther {
		t.Errorf("network events %v: want the bound host allowed with API_TOKEN injected (%v), the unlisted refused (%v), the placeholder to the unbound refused (%v)",
			evs, allowedBound, refusedDenied, refusedOther)
	}
}

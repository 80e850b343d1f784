// Package k8s_test checks deploy/k8s/pulse.yaml (with each of the
// Postgres files beside it) the way a cluster would take it, without a
// cluster: every object is decoded strictly with the
// Kubernetes API types (an unknown or misspelt field fails, as
// `kubectl apply --validate=strict` does), every pod is evaluated against
// the Pod Security "restricted" level by the admission plugin's own code,
// the references between objects are resolved, and then two server
// replicas sharing one Postgres and a worker are started with exactly the
// manifest's settings (paths mapped into a temporary directory) to show
// that they run, the worker attaches to both, and they answer their
// probes.
package k8s_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/server/cli"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/internal/testenv/testproc"
)

func TestMain(m *testing.M) {
	// A pulse-worker child boxes executions with the namespace backend,
	// which re-runs this binary as each box's init.
	namespace.Init()
	testenv.RunIfChild("pulse-worker", testproc.Worker)
	code := m.Run()
	testenv.StopSharedPostgres()
	os.Exit(code)
}

type manifest struct {
	services     []*corev1.Service
	claims       []*corev1.PersistentVolumeClaim
	deployments  []*appsv1.Deployment
	statefulSets []*appsv1.StatefulSet
	budgets      []*policyv1.PodDisruptionBudget
}

// postgresFiles are the ways to give the servers their database; an
// install is pulse.yaml and one of them.
var postgresFiles = []string{"postgres-external.yaml", "postgres-statefulset.yaml"}

// load decodes pulse.yaml strictly, one object per document.
func load(t *testing.T) manifest {
	t.Helper()
	m := loadFile(t, "pulse.yaml")
	if len(m.deployments) != 2 {
		t.Fatalf("%d Deployments, want pulse-server and pulse-worker", len(m.deployments))
	}
	return m
}

// install is pulse.yaml with the Postgres file named.
func install(t *testing.T, postgres string) manifest {
	t.Helper()
	m, pg := load(t), loadFile(t, postgres)
	m.services = append(m.services, pg.services...)
	m.claims = append(m.claims, pg.claims...)
	m.deployments = append(m.deployments, pg.deployments...)
	m.statefulSets = append(m.statefulSets, pg.statefulSets...)
	m.budgets = append(m.budgets, pg.budgets...)
	return m
}

// pods are the pod templates of the manifest's workloads, by name.
func (m manifest) pods() map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for _, d := range m.deployments {
		out[d.Name] = &d.Spec.Template
	}
	for _, s := range m.statefulSets {
		out[s.Name] = &s.Spec.Template
	}
	return out
}

// loadFile decodes one file strictly, one object per document.
func loadFile(t *testing.T, name string) manifest {
	t.Helper()
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	dec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var m manifest
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		js, err := utilyaml.ToJSON(doc)
		if err != nil {
			t.Fatalf("%s document %d: %v", name, i, err)
		}
		obj, gvk, err := dec.Decode(js, nil, nil)
		if err != nil {
			// Strict decoding returns the object and an error naming each
			// unknown or duplicate field: any of them fails.
			t.Fatalf("%s document %d: %v", name, i, err)
		}
		switch o := obj.(type) {
		case *corev1.Service:
			m.services = append(m.services, o)
		case *corev1.PersistentVolumeClaim:
			m.claims = append(m.claims, o)
		case *appsv1.Deployment:
			m.deployments = append(m.deployments, o)
		case *appsv1.StatefulSet:
			m.statefulSets = append(m.statefulSets, o)
		case *policyv1.PodDisruptionBudget:
			m.budgets = append(m.budgets, o)
		default:
			t.Fatalf("%s document %d: %v is not a kind this test checks; teach it", name, i, gvk)
		}
	}
	return m
}

func (m manifest) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	for _, d := range m.deployments {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no Deployment %s", name)
	return nil
}

func stripComments(doc []byte) []byte {
	var out bytes.Buffer
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out.Write(line)
		}
	}
	return out.Bytes()
}

// restrictedExceptions are the Pod Security "restricted" rules a
// deployment is let off, each one documented in docs/security.md: the
// worker's boxes mount a /proc of their own, which the kernel allows only
// where the container's /proc is unmasked ("baseline" allows that in a
// pod with its own user namespace, which the worker has).
var restrictedExceptions = map[string][]string{
	"pulse-worker": {"procMount"},
}

func TestPodsMeetRestrictedPodSecurity(t *testing.T) {
	eval, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, pg := range postgresFiles {
		for name, tmpl := range install(t, pg).pods() {
			except := restrictedExceptions[name]
			if len(except) > 0 {
				lv := psaapi.LevelVersion{Level: psaapi.LevelBaseline, Version: psaapi.LatestVersion()}
				if res := psapolicy.AggregateCheckResults(eval.EvaluatePod(lv, &tmpl.ObjectMeta, &tmpl.Spec)); !res.Allowed {
					t.Errorf("%s (%s): Pod Security baseline refuses it: %s", name, pg, res.ForbiddenDetail())
				}
				if tmpl.Spec.HostUsers == nil || *tmpl.Spec.HostUsers {
					t.Errorf("%s (%s): excepted from restricted without a user namespace of its own (hostUsers: false)", name, pg)
				}
			}
			lv := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
			res := psapolicy.AggregateCheckResults(eval.EvaluatePod(lv, &tmpl.ObjectMeta, &tmpl.Spec))
			for i, reason := range res.ForbiddenReasons {
				if !slices.Contains(except, reason) {
					t.Errorf("%s (%s): Pod Security restricted refuses it: %s: %s", name, pg, reason, res.ForbiddenDetails[i])
				}
			}
		}
	}
}

// The worker's seccomp profile (deploy/k8s/seccomp/pulse-worker.json) is
// the runtime's default for a container without capabilities, plus what a
// box is made with: it refuses what it does not list, allows the
// namespace and mount calls without conditions, and still refuses what
// the default refuses a container without capabilities.
func TestWorkerSeccompProfileAddsOnlyTheBox(t *testing.T) {
	b, err := os.ReadFile("seccomp/pulse-worker.json")
	if err != nil {
		t.Fatal(err)
	}
	var prof struct {
		DefaultAction   string   `json:"defaultAction"`
		DefaultErrnoRet int      `json:"defaultErrnoRet"`
		Architectures   []string `json:"architectures"`
		Syscalls        []struct {
			Names    []string          `json:"names"`
			Action   string            `json:"action"`
			Args     []json.RawMessage `json:"args"`
			ErrnoRet int               `json:"errnoRet"`
		} `json:"syscalls"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&prof); err != nil {
		t.Fatalf("the profile does not decode strictly: %v", err)
	}
	if prof.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Errorf("defaultAction %q: a profile must refuse what it does not list", prof.DefaultAction)
	}
	free := map[string]bool{} // allowed whatever the arguments
	for _, s := range prof.Syscalls {
		for _, n := range s.Names {
			if s.Action == "SCMP_ACT_ALLOW" && len(s.Args) == 0 {
				free[n] = true
			}
		}
	}
	for _, n := range []string{"clone", "unshare", "setns", "mount", "umount2", "pivot_root", "sethostname", "fsopen", "fsconfig", "fsmount", "move_mount", "mount_setattr"} {
		if !free[n] {
			t.Errorf("%s is not allowed: a box cannot be made", n)
		}
	}
	for _, n := range []string{"bpf", "perf_event_open", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "keyctl", "add_key", "request_key", "open_by_handle_at", "clone3", "syslog", "reboot", "swapon", "acct", "quotactl", "iopl", "userfaultfd"} {
		if free[n] {
			t.Errorf("%s is allowed, which the runtime's default refuses a container without capabilities", n)
		}
	}
}

// The servers are a fleet: several replicas, replaced one at a time,
// kept two-available by a budget, on a Postgres URL from a mounted
// secret under their pod's name; workers attach to every replica through
// a headless Service; each Postgres file defines the Service the URL
// names.
func TestServersAreReplicasOnPostgres(t *testing.T) {
	m := load(t)
	sd := m.deployment(t, "pulse-server")
	if sd.Spec.Replicas == nil || *sd.Spec.Replicas != 3 {
		t.Errorf("pulse-server replicas %d, want 3", ptrValue(sd.Spec.Replicas))
	}
	if sd.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		t.Error("pulse-server is recreated: every replica stops at once on an update")
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range sd.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if _, ok := env["PULSE_REMOTE_DB"]; ok {
		t.Error("PULSE_REMOTE_DB is set in the environment: the Postgres URL holds a password; mount it (PULSE_REMOTE_DB_FILE)")
	}
	if env["PULSE_REMOTE_DB_FILE"].Value == "" {
		t.Error("no PULSE_REMOTE_DB_FILE: the replicas need the shared database")
	}
	if r := env["PULSE_REPLICA_ID"].ValueFrom; r == nil || r.FieldRef == nil || r.FieldRef.FieldPath != "metadata.name" {
		t.Error("PULSE_REPLICA_ID is not the pod's name")
	}
	budget := false
	for _, b := range m.budgets {
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err == nil && sel.Matches(labels.Set(sd.Spec.Template.Labels)) {
			// An eviction must stay possible, or drains block.
			budget = b.Spec.MaxUnavailable != nil && b.Spec.MaxUnavailable.IntValue() >= 1
		}
	}
	if !budget {
		t.Error("no PodDisruptionBudget lets one server replica go at a time")
	}

	wenv := map[string]string{}
	for _, e := range m.deployment(t, "pulse-worker").Spec.Template.Spec.Containers[0].Env {
		wenv[e.Name] = e.Value
	}
	host, port, err := net.SplitHostPort(wenv["RELAY_ADDR"])
	if err != nil || wenv["RELAY_EACH_ADDRESS"] != "1" {
		t.Fatalf("workers: RELAY_ADDR %q (%v), RELAY_EACH_ADDRESS %q: want one name, each address attached", wenv["RELAY_ADDR"], err, wenv["RELAY_EACH_ADDRESS"])
	}
	headless := false
	for _, svc := range m.services {
		if svc.Name != host {
			continue
		}
		for _, p := range svc.Spec.Ports {
			headless = headless || (svc.Spec.ClusterIP == corev1.ClusterIPNone && fmt.Sprint(p.Port) == port)
		}
	}
	if !headless {
		t.Errorf("workers dial %s:%s, which is no headless Service's port: they would reach one replica", host, port)
	}
	for _, pg := range postgresFiles {
		found := false
		for _, svc := range loadFile(t, pg).services {
			found = found || svc.Name == "pulse-postgres"
		}
		if !found {
			t.Errorf("%s defines no Service pulse-postgres, which the database URL names", pg)
		}
	}
}

func TestObjectsFitTogether(t *testing.T) {
	for _, pg := range postgresFiles {
		t.Run(pg, func(t *testing.T) { objectsFitTogether(t, install(t, pg)) })
	}
}

func objectsFitTogether(t *testing.T, m manifest) {
	for _, st := range m.statefulSets {
		sel, err := metav1.LabelSelectorAsSelector(st.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(st.Spec.Template.Labels)) {
			t.Errorf("%s: selector %v does not match its pods' labels %v (%v)", st.Name, st.Spec.Selector, st.Spec.Template.Labels, err)
		}
		if !slices.ContainsFunc(m.services, func(s *corev1.Service) bool { return s.Name == st.Spec.ServiceName }) {
			t.Errorf("%s: serviceName %s is no Service of the manifest", st.Name, st.Spec.ServiceName)
		}
		volumes := map[string]bool{}
		for _, v := range st.Spec.Template.Spec.Volumes {
			volumes[v.Name] = true
		}
		for _, c := range st.Spec.VolumeClaimTemplates {
			volumes[c.Name] = true
		}
		for _, c := range st.Spec.Template.Spec.Containers {
			checkResources(t, st.Name, c)
			if c.ReadinessProbe == nil {
				t.Errorf("%s: no readiness probe", st.Name)
			}
			for _, vm := range c.VolumeMounts {
				if !volumes[vm.Name] {
					t.Errorf("%s: mount %s names no volume", st.Name, vm.Name)
				}
			}
		}
	}
	for _, d := range m.deployments {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("%s: selector %v does not match its pods' labels %v (%v)", d.Name, d.Spec.Selector, d.Spec.Template.Labels, err)
		}
		spec := d.Spec.Template.Spec
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Errorf("%s: mounts a service account token it has no use for", d.Name)
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range spec.Volumes {
			volumes[v.Name] = v
		}
		for _, c := range spec.Containers {
			checkResources(t, d.Name, c)
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				if p == nil || p.HTTPGet == nil {
					t.Errorf("%s: %s probe is not an HTTP GET", d.Name, what)
					continue
				}
				if want := map[string]string{"readiness": "/readyz", "liveness": "/healthz"}[what]; p.HTTPGet.Path != want {
					t.Errorf("%s: %s probe on %q, want %q", d.Name, what, p.HTTPGet.Path, want)
				}
				if p.HTTPGet.Port.Type == intstr.String && ports[p.HTTPGet.Port.StrVal] == 0 {
					t.Errorf("%s: %s probe port %q is no port of the container", d.Name, what, p.HTTPGet.Port.StrVal)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					t.Errorf("%s: %s comes from a secret into the environment; mount it and use %s_FILE", d.Name, e.Name, e.Name)
				}
			}
			for _, vm := range c.VolumeMounts {
				if _, ok := volumes[vm.Name]; !ok {
					t.Errorf("%s: mount %s names no volume", d.Name, vm.Name)
				}
			}
		}
		for _, v := range spec.Volumes {
			if pvc := v.PersistentVolumeClaim; pvc != nil && !hasClaim(m.claims, pvc.ClaimName) {
				t.Errorf("%s: volume %s claims %s, which the manifest does not define", d.Name, v.Name, pvc.ClaimName)
			}
		}
	}
	for _, s := range m.services {
		if s.Spec.Type == corev1.ServiceTypeExternalName {
			if s.Spec.ExternalName == "" || len(s.Spec.Selector) > 0 {
				t.Errorf("Service %s: an ExternalName names a host and selects no pods", s.Name)
			}
			continue
		}
		var backing *corev1.PodTemplateSpec
		for _, tmpl := range m.pods() {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(tmpl.Labels)) {
				backing = tmpl
			}
		}
		if backing == nil {
			t.Errorf("Service %s selects no pods", s.Name)
			continue
		}
		named := map[string]bool{}
		for _, c := range backing.Spec.Containers {
			for _, p := range c.Ports {
				named[p.Name] = true
			}
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.Type == intstr.String && !named[p.TargetPort.StrVal] {
				t.Errorf("Service %s: target port %q is no port of its pods", s.Name, p.TargetPort.StrVal)
			}
		}
	}
	worker := m.deployment(t, "pulse-worker")
	covered := false
	for _, b := range m.budgets {
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err == nil && sel.Matches(labels.Set(worker.Spec.Template.Labels)) {
			covered = true
		}
	}
	if !covered {
		t.Error("no PodDisruptionBudget covers the workers")
	}
}

func hasClaim(claims []*corev1.PersistentVolumeClaim, name string) bool {
	for _, c := range claims {
		if c.Name == name {
			return true
		}
	}
	return false
}

// checkResources: a container with limits alone has its requests set to
// the limits by the API server, so each worker would reserve its whole
// limit; both are set, requests no larger than limits.
func checkResources(t *testing.T, pod string, c corev1.Container) {
	t.Helper()
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okReq := c.Resources.Requests[r]
		lim, okLim := c.Resources.Limits[r]
		if !okReq || !okLim {
			t.Errorf("%s/%s: %s request %v and limit %v: want both", pod, c.Name, r, okReq, okLim)
			continue
		}
		if req.Cmp(lim) > 0 {
			t.Errorf("%s/%s: %s request %s above its limit %s", pod, c.Name, r, req.String(), lim.String())
		}
	}
}

// pod maps a container's mounts into a temporary directory, so that its
// environment's paths can be used as they are on the node.
type pod struct {
	root   string
	mounts []corev1.VolumeMount
}

func (p pod) path(t *testing.T, in string) string {
	t.Helper()
	for _, m := range p.mounts {
		if in == m.MountPath || strings.HasPrefix(in, m.MountPath+"/") {
			return filepath.Join(p.root, in)
		}
	}
	t.Fatalf("%s is under no volume mount of the container", in)
	return ""
}

func (p pod) file(t *testing.T, in string, data []byte) {
	t.Helper()
	local := p.path(t, in)
	if err := os.MkdirAll(filepath.Dir(local), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(local, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// env returns the container's environment with every absolute path mapped
// into the pod, and fieldRefs given the values the kubelet would.
func (p pod) env(t *testing.T, c corev1.Container, podName string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			out[e.Name] = podName
		case e.ValueFrom != nil:
			t.Fatalf("%s: this test cannot give a value from %v", e.Name, e.ValueFrom)
		case strings.HasPrefix(e.Value, "/"):
			out[e.Name] = p.path(t, e.Value)
		default:
			out[e.Name] = e.Value
		}
	}
	return out
}

func token(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestServerAndWorkerRunAsTheManifestSays starts two pulse-server
// replicas on one Postgres database with the server container's args and
// environment (production mode: strong tokens, absolute paths, mutual
// TLS off loopback all checked; the database URL from its mounted file,
// each replica named as its pod) and a pulse-worker process with the
// worker container's, only the listening ports moved to free loopback
// ones and RELAY_ADDR pointed at the two replicas. The servers' and the
// worker's probes must answer ready and each replica must count the
// worker — the manifest describes a fleet that works.
func TestServerAndWorkerRunAsTheManifestSays(t *testing.T) {
	m := load(t)
	pki := testenv.NewPKI(t)
	readPEM := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	remoteTok, workerTok := token(t), token(t)
	database := testenv.SharedPostgres(t).NewDatabase(t)

	sd := m.deployment(t, "pulse-server")
	sc := sd.Spec.Template.Spec.Containers[0]
	type addrs struct{ api, workers, health string }
	var replicas []addrs
	var serr testenv.SyncBuffer
	for _, podName := range []string{"pulse-server-7d9f-a1", "pulse-server-7d9f-b2"} {
		sp := pod{root: t.TempDir(), mounts: sc.VolumeMounts}
		senv := sp.env(t, sc, podName)
		for name, data := range map[string][]byte{
			"PULSE_REMOTE_TOKEN_FILE": []byte(remoteTok + "\n"), "PULSE_WORKER_TOKEN_FILE": []byte(workerTok + "\n"),
			"PULSE_TLS_CERT": readPEM(pki.ServerCertFile), "PULSE_TLS_KEY": readPEM(pki.ServerKeyFile), "PULSE_TLS_CA": readPEM(pki.CAFile),
			"PULSE_REMOTE_DB_FILE": []byte(database + "\n"),
		} {
			if senv[name] == "" {
				t.Fatalf("the server container does not set %s", name)
			}
			if err := os.MkdirAll(filepath.Dir(senv[name]), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(senv[name], data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(senv["PULSE_REMOTE_WORKSPACE_ROOT"], 0o700); err != nil {
			t.Fatal(err)
		}
		health := testenv.FreeAddr(t)
		senv["PULSE_REMOTE_PORT"], senv["PULSE_WORKER_LISTEN"], senv["PULSE_HEALTH_LISTEN"] = "0", "0.0.0.0:0", health

		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan addrs, 1)
		done := make(chan int, 1)
		go func() {
			done <- cli.Run(ctx, append(append([]string{}, sc.Command...), sc.Args...), cli.Env{
				Getenv: func(k string) string { return senv[k] }, Stdout: io.Discard, Stderr: &serr,
				OnListen: func(api, workers string) { ready <- addrs{api, workers, health} },
			})
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Error("pulse-server did not stop")
			}
		})
		select {
		case a := <-ready:
			replicas = append(replicas, a)
		case code := <-done:
			t.Fatalf("pulse-server exited %d with the manifest's settings:\n%s", code, serr.String())
		case <-time.After(60 * time.Second):
			t.Fatalf("pulse-server did not listen:\n%s", serr.String())
		}
	}
	plain := &http.Client{Timeout: 10 * time.Second}
	probe := func(url string) error {
		resp, err := plain.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
	for _, a := range replicas {
		if err := probe("http://" + a.health + sc.ReadinessProbe.HTTPGet.Path); err != nil {
			t.Fatalf("server readiness: %v\n%s", err, serr.String())
		}
	}
	for _, podName := range []string{"pulse-server-7d9f-a1", "pulse-server-7d9f-b2"} {
		if !strings.Contains(serr.String(), `"replica":"`+podName+`"`) {
			t.Fatalf("no replica is named %s:\n%s", podName, serr.String())
		}
	}

	wd := m.deployment(t, "pulse-worker")
	wc := wd.Spec.Template.Spec.Containers[0]
	wp := pod{root: t.TempDir(), mounts: wc.VolumeMounts}
	wenv := wp.env(t, wc, "pulse-worker-abc12")
	wp.file(t, strings.TrimPrefix(wenv["SANDBOX_TOKEN_FILE"], wp.root), []byte(workerTok+"\n"))
	wp.file(t, strings.TrimPrefix(wenv["SSL_CERT_FILE"], wp.root), readPEM(pki.CAFile))
	// The headless Service's name resolves to each replica; here each
	// replica is 127.0.0.1 on a port of its own.
	var relays []string
	for _, a := range replicas {
		_, port, _ := net.SplitHostPort(a.workers)
		relays = append(relays, net.JoinHostPort("127.0.0.1", port))
	}
	wenv["RELAY_ADDR"] = strings.Join(relays, ",")
	whealth := testenv.FreeAddr(t)
	wenv["WORKER_HEALTH_LISTEN"] = whealth
	w := testenv.Command(t, "pulse-worker")
	for k, v := range wenv {
		w.Env = append(w.Env, k+"="+v)
	}
	var wlog testenv.SyncBuffer
	w.Stderr = &wlog
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Kill(); w.Wait() })
	testenv.Eventually(t, 60*time.Second, func() error {
		if err := probe("http://" + whealth + wc.ReadinessProbe.HTTPGet.Path); err != nil {
			return fmt.Errorf("worker readiness: %v\n%s", err, wlog.String())
		}
		return nil
	})
	mtls := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: pki.ClientConfig()}}
	for _, a := range replicas {
		_, apiPort, _ := net.SplitHostPort(a.api)
		testenv.Eventually(t, 30*time.Second, func() error {
			resp, err := mtls.Get("https://127.0.0.1:" + apiPort + "/metrics")
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !bytes.Contains(body, []byte("pulse_server_workers 1")) {
				return fmt.Errorf("replica %s does not count the worker:\n%s\n%s", a.api, body, wlog.String())
			}
			return nil
		})
	}
}

func ptrValue(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

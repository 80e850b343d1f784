package server

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pulse-agent/pulse/protocol"
)

// metrics is the server's Prometheus exposition, written by hand in the
// text format so the server needs no metrics library.
type metrics struct {
	mu       sync.Mutex
	byStatus map[string]uint64
	rejects  map[string]uint64
	actions  map[string]uint64
	buckets  []float64 // upper bounds in seconds
	counts   []uint64  // per bucket, not cumulative
	sum      float64
	n        uint64
	active   int

	connections  atomic.Int64
	unauthorized atomic.Uint64
	// workers reports attached workers; nil without a relay.
	workers func() (live int, capacity int, busy int)
}

func newMetrics() *metrics {
	b := []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	return &metrics{
		byStatus: map[string]uint64{}, rejects: map[string]uint64{}, actions: map[string]uint64{},
		buckets: b, counts: make([]uint64, len(b)+1),
	}
}

var knownActions = map[string]bool{
	protocol.ActionSubmit: true, protocol.ActionCancel: true, protocol.ActionStatus: true, protocol.ActionAttach: true, protocol.ActionUpload: true,
	protocol.ActionDownload: true, protocol.ActionReconcile: true, protocol.ActionCapabilities: true,
	protocol.ActionSignal: true, protocol.ActionStdin: true, protocol.ActionResize: true, "dial": true,
}

func (m *metrics) action(a string) {
	if !knownActions[a] {
		a = "other" // bounded label values whatever clients send
	}
	m.mu.Lock()
	m.actions[a]++
	m.mu.Unlock()
}

func (m *metrics) rejected(reason string) {
	m.mu.Lock()
	m.rejects[reason]++
	m.mu.Unlock()
}

func (m *metrics) setActive(n int) {
	m.mu.Lock()
	m.active = n
	m.mu.Unlock()
}

func (m *metrics) finished(status string, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.byStatus[status]++
	s := d.Seconds()
	i := sort.SearchFloat64s(m.buckets, s)
	m.counts[i]++
	m.sum += s
	m.n++
}

func sortedKeys(m map[string]uint64) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write([]byte(s.m.render()))
}

func (m *metrics) render() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# HELP pulse_server_executions_total Executions that ended, by final status.\n# TYPE pulse_server_executions_total counter\n")
	for _, st := range []string{"COMPLETED", "FAILED"} {
		p("pulse_server_executions_total{status=%q} %d\n", st, m.byStatus[st])
	}
	p("# HELP pulse_server_executions_active Executions running now.\n# TYPE pulse_server_executions_active gauge\n")
	p("pulse_server_executions_active %d\n", m.active)
	p("# HELP pulse_server_submissions_rejected_total Submissions refused, by reason.\n# TYPE pulse_server_submissions_rejected_total counter\n")
	for _, k := range sortedKeys(m.rejects) {
		p("pulse_server_submissions_rejected_total{reason=%q} %d\n", k, m.rejects[k])
	}
	p("# HELP pulse_server_requests_total Client requests, by action.\n# TYPE pulse_server_requests_total counter\n")
	for _, k := range sortedKeys(m.actions) {
		p("pulse_server_requests_total{action=%q} %d\n", k, m.actions[k])
	}
	p("# HELP pulse_server_connections Open client connections.\n# TYPE pulse_server_connections gauge\n")
	p("pulse_server_connections %d\n", m.connections.Load())
	p("# HELP pulse_server_unauthorized_total Connection attempts without a valid token.\n# TYPE pulse_server_unauthorized_total counter\n")
	p("pulse_server_unauthorized_total %d\n", m.unauthorized.Load())
	if m.workers != nil {
		live, capacity, busy := m.workers()
		p("# HELP pulse_server_workers Attached workers.\n# TYPE pulse_server_workers gauge\npulse_server_workers %d\n", live)
		p("# HELP pulse_server_worker_capacity Execution slots of attached workers.\n# TYPE pulse_server_worker_capacity gauge\npulse_server_worker_capacity %d\n", capacity)
		p("# HELP pulse_server_worker_busy Slots in use on attached workers.\n# TYPE pulse_server_worker_busy gauge\npulse_server_worker_busy %d\n", busy)
	}
	p("# HELP pulse_server_execution_duration_seconds Execution latency from start to end.\n# TYPE pulse_server_execution_duration_seconds histogram\n")
	var cum uint64
	for i, ub := range m.buckets {
		cum += m.counts[i]
		p("pulse_server_execution_duration_seconds_bucket{le=\"%g\"} %d\n", ub, cum)
	}
	cum += m.counts[len(m.buckets)]
	p("pulse_server_execution_duration_seconds_bucket{le=\"+Inf\"} %d\n", cum)
	p("pulse_server_execution_duration_seconds_sum %g\npulse_server_execution_duration_seconds_count %d\n", m.sum, m.n)
	return b.String()
}

// Command fleet is the end-to-end check of a pulse-server fleet (make
// fleet-e2e): a real Postgres, several pulse-server replicas and
// pulse-workers as processes on 127.0.0.1, and many clients submitting
// bounded commands while one server and two workers are SIGKILLed and
// restarted. It prints one summary line
//
//	submitted=N completed=N unknown=N lost=0 dup=0 p50=… p99=…
//
// and exits 1 on any loss or duplicate run. Before the fleet, the same
// binaries run as a single server (SQLite, as one machine runs it) under
// the same load: the same workers, clients, commands and think time, for
// -baseline (90 s), without the kills. Its submit-to-first-byte latency
// is printed beside the fleet's as the baseline line, with the ratio of
// the p99s (the goal is within 2x; a miss is reported, not a failure),
// and each phase's hops line splits that latency where it is spent.
//
// The load: 300 clients, each pausing 60 s on average between commands
// (exponentially distributed, so the load is steady over the phase),
// submit about 5 commands a second. Each command costs the 2-core machine
// about 0.2 CPU-seconds (a box, the relay's steps on the worker, the
// stream and the records), so that keeps both phases loaded (about half
// the CPU) without a standing queue. At 20 s of think time (15 a second)
// both queued for seconds, and the p99s measured the queue, not the
// fleet. 90 s of baseline gives about 450 samples, enough for a p99 that
// holds from run to run, and the whole check stays near 5 minutes.
//
// What counts:
//   - submitted: executions a server took (its STARTING answer, or found
//     later by attach);
//   - completed: a result with exit 0 and the command's own output;
//   - unknown: an end without the command's outcome, with its reason:
//     UNKNOWN (its replica died and another swept it), or an error result
//     (error_code WORKER_LOST: its worker was killed; UNAVAILABLE: no
//     worker could take it);
//   - lost: a submitted execution whose client got neither by the end;
//   - dup: a command that ran more than once. Each command first sends
//     its execution id to a listener of this program (bash's /dev/tcp:
//     the fleet's commands run with the network allowed, in boxes whose
//     writes outside the workspace are captured, so a file would not
//     do); an id received twice ran twice. A completed id never received
//     means runs cannot be seen, and fails the check rather than report
//     dup=0 unchecked.
//   - p50/p99: submit to the first stream frame on the submitting
//     connection, over the executions that completed there.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/protocol"
)

const (
	clientToken = "dev-token"
	workerToken = "worker-token"
)

type settings struct {
	servers, workers, capacity int
	clients                    int
	duration, think, lease     time.Duration
	baseline                   time.Duration
	keep                       bool
}

func main() {
	var s settings
	flag.IntVar(&s.servers, "servers", 3, "pulse-server replicas")
	flag.IntVar(&s.workers, "workers", 6, "pulse-workers, each attached to every replica")
	flag.IntVar(&s.capacity, "capacity", 8, "WORKER_MAX_CONCURRENT of each worker")
	flag.IntVar(&s.clients, "clients", 300, "clients submitting at once")
	flag.DurationVar(&s.duration, "duration", 2*time.Minute, "how long clients submit")
	flag.DurationVar(&s.think, "think", 60*time.Second, "mean pause of a client between its commands (exponential)")
	flag.DurationVar(&s.lease, "lease", 3*time.Second, "--replica-lease of the servers")
	flag.DurationVar(&s.baseline, "baseline", 90*time.Second, "how long the single server is measured first, under the same load (0: not at all)")
	flag.BoolVar(&s.keep, "keep", false, "keep the work directory (logs) afterwards")
	flag.Parse()
	os.Exit(run(s))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "fleet: "+format+"\n", args...)
}

func run(s settings) int {
	dir, err := os.MkdirTemp("", "pulse-fleet-")
	if err != nil {
		logf("%v", err)
		return 2
	}
	failed := true
	defer func() {
		if s.keep || failed {
			logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	bin := filepath.Join(dir, "bin")
	logf("building pulse-server and pulse-worker")
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/pulse-server", "./cmd/pulse-worker")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		logf("build: %v", err)
		return 2
	}
	runs, err := listenRuns()
	if err != nil {
		logf("%v", err)
		return 2
	}
	ran := runs.addr

	// The baseline is the fleet's load on one server: the same workers,
	// clients, commands and think time, one server on SQLite instead of
	// three on Postgres, and no churn. What differs is what the goal
	// compares: the replicas, the shared store and the kills.
	var base *outcomes
	if s.baseline > 0 {
		logf("baseline: 1 server (SQLite), %d workers, %d clients for %v", s.workers, s.clients, s.baseline)
		f, err := startFleet(dir, bin, "base", 1, s.workers, s, filepath.Join(dir, "base.sqlite3"))
		if err != nil {
			logf("baseline: %v", err)
			return 2
		}
		base = load(f, "b", s.clients, s.baseline, s.think, ran, nil)
		f.stop()
	}

	pg, err := testenv.NewPostgresCluster()
	if err != nil {
		logf("postgres: %v", err)
		return 2
	}
	defer pg.Stop()
	logf("fleet: %d servers (Postgres), %d workers, %d clients for %v", s.servers, s.workers, s.clients, s.duration)
	f, err := startFleet(dir, bin, "fleet", s.servers, s.workers, s, pg.URL("postgres"))
	if err != nil {
		logf("fleet: %v", err)
		return 2
	}
	churn := func(ctx context.Context) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.duration / 3):
		}
		victims := []*proc{f.servers[len(f.servers)/2]}
		for i := 0; i < 2 && i < len(f.workers); i++ {
			victims = append(victims, f.workers[i])
		}
		for _, p := range victims {
			logf("SIGKILL %s", p.name)
			p.kill()
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
		for _, p := range victims {
			logf("restart %s", p.name)
			if err := p.start(); err != nil {
				logf("restart %s: %v", p.name, err)
			}
		}
	}
	out := load(f, "f", s.clients, s.duration, s.think, ran, churn)
	f.stop()

	seen := runs.close()
	dup, unseen := 0, 0
	for id, n := range seen {
		if strings.HasPrefix(id, "f-") && n > 1 {
			dup++
			logf("ran %d times: %s", n, id)
		}
	}
	for id, o := range out.byID {
		if o == "completed" && seen[id] == 0 {
			unseen++
		}
	}
	// A run no client knows of: the command ran, yet its execution was
	// never reported submitted.
	for id := range seen {
		if _, ok := out.byID[id]; strings.HasPrefix(id, "f-") && !ok {
			logf("ran but never reported: %s", id)
			out.lost++
		}
	}
	if s.keep {
		for name, o := range map[string]*outcomes{"fleet": out, "baseline": base} {
			if o != nil {
				o.dump(filepath.Join(dir, name+"-hops.tsv"), runs)
			}
		}
	}
	p50, p99 := out.percentile(50), out.percentile(99)
	fmt.Printf("submitted=%d completed=%d unknown=%d lost=%d dup=%d p50=%v p99=%v\n",
		out.submitted, out.completed, out.unknown, out.lost, dup, p50, p99)
	fmt.Printf("fleet hops: %s\n", out.hops(runs))
	if base != nil {
		b99 := base.percentile(99)
		ratio := 0.0
		if b99 > 0 {
			ratio = float64(p99) / float64(b99)
		}
		fmt.Printf("baseline: single server submitted=%d completed=%d unknown=%d p50=%v p99=%v; fleet p99 is %.2fx (goal: within 2x)\n",
			base.submitted, base.completed, base.unknown, base.percentile(50), b99, ratio)
		fmt.Printf("baseline hops: %s\n", base.hops(runs))
	}
	out.unknownWhy()
	switch {
	case out.lost > 0 || dup > 0:
		logf("FAIL: lost=%d dup=%d", out.lost, dup)
		return 1
	case unseen > 0:
		logf("FAIL: %d completed commands never reported their run to %s: duplicates cannot be counted", unseen, ran)
		return 1
	case out.bad > 0:
		logf("FAIL: %d executions ended in a way no command of this check should (see above)", out.bad)
		return 1
	case out.completed == 0:
		logf("FAIL: nothing completed")
		return 1
	}
	failed = false
	return 0
}

// runLog counts the runs commands report: each connects to it and sends
// its execution id. When the first report of an id arrived is the time
// its command started in its box.
type runLog struct {
	addr  string
	l     net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	n     map[string]int
	first map[string]time.Time
}

func listenRuns() (*runLog, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &runLog{addr: l.Addr().String(), l: l, n: map[string]int{}, first: map[string]time.Time{}}
	r.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.wg.Go(func() {
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(30 * time.Second))
				b, _ := io.ReadAll(io.LimitReader(c, 256))
				if id := strings.TrimSpace(string(b)); id != "" {
					r.mu.Lock()
					r.n[id]++
					if _, ok := r.first[id]; !ok {
						r.first[id] = time.Now()
					}
					r.mu.Unlock()
				}
			})
		}
	})
	return r, nil
}

// close stops listening once the reports under way are read, and returns
// how often each id ran.
func (r *runLog) close() map[string]int {
	time.Sleep(time.Second) // a report whose command just ended
	r.l.Close()
	r.wg.Wait()
	return r.n
}

// started returns when id's command first reported its run.
func (r *runLog) started(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.first[id]
	return t, ok
}

// proc is one server or worker process, restartable with the same
// arguments.
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	log  string

	mu  sync.Mutex
	cmd *exec.Cmd
}

func (p *proc) start() error {
	lf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return err
	}
	go func() { cmd.Wait(); lf.Close() }()
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	return nil
}

func (p *proc) signal(sig os.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Signal(sig)
	}
}

func (p *proc) kill() { p.signal(syscall.SIGKILL) }

// fleet is the processes of one phase.
type fleet struct {
	servers, workers []*proc
	api              []string // each server's WebSocket host:port
}

func (f *fleet) stop() {
	for _, p := range append(slices.Clone(f.workers), f.servers...) {
		p.signal(syscall.SIGTERM)
	}
	time.Sleep(2 * time.Second)
	for _, p := range append(slices.Clone(f.workers), f.servers...) {
		p.kill()
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func startFleet(dir, bin, phase string, nServers, nWorkers int, s settings, database string) (*fleet, error) {
	f := &fleet{}
	var relays []string
	for i := range nServers {
		api, err := freeAddr()
		if err != nil {
			return nil, err
		}
		wl, err := freeAddr()
		if err != nil {
			return nil, err
		}
		_, port, _ := net.SplitHostPort(api)
		id := fmt.Sprintf("%s-s%d", phase, i)
		p := &proc{
			name: id, bin: filepath.Join(bin, "pulse-server"), log: filepath.Join(dir, id+".log"),
			args: []string{"--development", "--executor", "relay", "--host", "127.0.0.1", "--port", port, "--worker-listen", wl,
				"--workspace-root", filepath.Join(dir, id+"-ws"), "--database", database, "--replica-id", id,
				"--replica-lease", s.lease.String(), "--max-concurrency", "128", "--log-level", "warn"},
			env: []string{"PULSE_REMOTE_TOKEN=" + clientToken, "PULSE_WORKER_TOKEN=" + workerToken},
		}
		if err := p.start(); err != nil {
			return nil, err
		}
		f.servers = append(f.servers, p)
		f.api = append(f.api, api)
		relays = append(relays, wl)
	}
	for i := range nWorkers {
		id := fmt.Sprintf("%s-w%d", phase, i)
		p := &proc{
			name: id, bin: filepath.Join(bin, "pulse-worker"), log: filepath.Join(dir, id+".log"),
			args: []string{"--log-level", "warn"},
			env: []string{"RELAY_ADDR=" + strings.Join(relays, ","), "SANDBOX_TOKEN=" + workerToken, "SANDBOX_ID=" + id,
				fmt.Sprintf("WORKER_MAX_CONCURRENT=%d", s.capacity)},
		}
		if err := p.start(); err != nil {
			return nil, err
		}
		f.workers = append(f.workers, p)
	}
	want := fmt.Sprintf("pulse_server_workers %d\n", nWorkers)
	for _, api := range f.api {
		if err := testenv.Poll(60*time.Second, func() error {
			resp, err := http.Get("http://" + api + "/metrics")
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(b), want) {
				return fmt.Errorf("%s: not every worker attached", api)
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("%w (logs in %s)", err, dir)
		}
	}
	return f, nil
}

// outcomes is what the clients of one phase saw.
type outcomes struct {
	mu                                  sync.Mutex
	submitted, completed, unknown, lost int
	bad                                 int
	ttfb                                []time.Duration
	byID                                map[string]string
	timed                               map[string]hopTimes // the completed ones in ttfb
	why                                 map[string]int      // unknown ends by their reason's kind
	start                               time.Time
}

// hopTimes is when one submission passed each hop, on the client's clock:
// the submit sent, the server's STARTING answer (the record is in the
// store), and the first stream frame. When the command started in its
// box comes from the run log.
type hopTimes struct {
	sent, ack, first time.Time
}

// hops is the p50 and p99 of each hop of the executions timed: submit
// to STARTING (the server took it), STARTING to the command's start in
// its box (a worker was chosen, its directory and workspace made, the
// box started), and that start to the first byte at the client (the
// output through the worker, the server and the WebSocket).
func (o *outcomes) hops(r *runLog) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var accept, start, out []time.Duration
	for id, h := range o.timed {
		ran, ok := r.started(id)
		if !ok || h.ack.IsZero() {
			continue
		}
		accept = append(accept, h.ack.Sub(h.sent))
		start = append(start, ran.Sub(h.ack))
		out = append(out, h.first.Sub(ran))
	}
	pct := func(v []time.Duration) string {
		return fmt.Sprintf("p50=%v p99=%v", percentile(v, 50), percentile(v, 99))
	}
	return fmt.Sprintf("n=%d submit->STARTING %s; STARTING->box started %s; box started->first byte %s",
		len(accept), pct(accept), pct(start), pct(out))
}

// dump writes each timed execution's hops, in milliseconds from the
// phase's start, to file (with -keep): to see when the slow ones ran.
func (o *outcomes) dump(file string, r *runLog) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var b strings.Builder
	b.WriteString("id\tsent\tack\tstarted\tfirst\n")
	ms := func(t time.Time) int64 { return t.Sub(o.start).Milliseconds() }
	for id, h := range o.timed {
		ran, _ := r.started(id)
		fmt.Fprintf(&b, "%s\t%d\t%d\t%d\t%d\n", id, ms(h.sent), ms(h.ack), ms(ran), ms(h.first))
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		logf("%v", err)
	}
}

// unknownWhy logs how many executions ended without their outcome, by
// the kind of reason.
func (o *outcomes) unknownWhy() {
	o.mu.Lock()
	defer o.mu.Unlock()
	kinds := slices.Sorted(maps.Keys(o.why))
	for _, k := range kinds {
		logf("unknown: %d × %s", o.why[k], k)
	}
}

func (o *outcomes) percentile(p int) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return percentile(o.ttfb, p)
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	v := slices.Clone(d)
	slices.Sort(v)
	i := (len(v)*p + 99) / 100
	return v[max(0, min(i, len(v))-1)].Round(time.Millisecond)
}

// load runs clients for d, each submitting one command at a time with
// pauses averaging think, then waits for what they have in flight;
// during runs alongside.
func load(f *fleet, phase string, clients int, d, think time.Duration, ran string, during func(context.Context)) *outcomes {
	out := &outcomes{byID: map[string]string{}, timed: map[string]hopTimes{}, why: map[string]int{}, start: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if during != nil {
		go during(ctx)
	}
	end := time.Now().Add(d)
	// An execution in flight when submitting stops has this long to end:
	// the lease, a worker's liveness and a restart all fit in it.
	hardEnd := end.Add(90 * time.Second)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			// Pauses are exponential, the first one too: each client
			// is then a Poisson source from the start, and the load
			// steady over the phase. (Uniform pauses with a uniform
			// first one peaked at about 1.5 times the mean rate a
			// think time in, where the kills are, and the p99s
			// measured that peak.)
			pause := func() time.Duration { return time.Duration(rng.ExpFloat64() * float64(think)) }
			time.Sleep(min(pause(), d))
			for n := 0; time.Now().Before(end); n++ {
				id := fmt.Sprintf("%s-%d-%d", phase, c, n)
				cl := &client{f: f, next: c % len(f.api), ran: ran}
				r := cl.runOne(id, hardEnd)
				out.record(id, r)
				time.Sleep(min(pause(), time.Until(end)))
			}
		})
	}
	wg.Wait()
	return out
}

func (o *outcomes) record(id string, r result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !r.submitted {
		return
	}
	o.submitted++
	o.byID[id] = r.kind
	switch r.kind {
	case "completed":
		o.completed++
		if r.ttfb > 0 {
			o.ttfb = append(o.ttfb, r.ttfb)
			o.timed[id] = r.hops
		}
	case "unknown":
		o.unknown++
		o.why[reasonKind(r.why)]++
	case "lost":
		o.lost++
		logf("lost: %s: %s", id, r.why)
	default:
		o.bad++
		logf("unexpected end: %s: %s", id, r.why)
	}
}

type result struct {
	submitted bool
	kind      string // completed, unknown, lost, bad
	why       string
	ttfb      time.Duration
	hops      hopTimes
}

// reasonKind is why's kind, without the names and times in it.
func reasonKind(why string) string {
	switch {
	case strings.Contains(why, "stopped renewing its lease"):
		replica, _, _ := strings.Cut(strings.TrimPrefix(why, "replica "), " ")
		return "UNKNOWN: the lease of " + replica + " expired"
	case strings.HasPrefix(why, protocol.CodeWorkerLost):
		return protocol.CodeWorkerLost
	}
	if why == "" {
		return "UNKNOWN without a reason (marked by its own replica at restart)"
	}
	code, _, _ := strings.Cut(why, ":")
	return code
}

type client struct {
	f    *fleet
	next int
	ran  string
}

type wireFrame struct {
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
}

type payload struct {
	Status    string `json:"status"`
	Code      string `json:"code"`
	Message   string `json:"message"`
	Reason    string `json:"reason"`
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	ErrorCode string `json:"error_code"`
}

// runOne submits id and follows it to its end, across servers: a dropped
// connection is followed by an attach on the next server, a refusal for
// capacity by the same submission again (the id was not taken).
func (c *client) runOne(id string, hardEnd time.Time) result {
	host, port, _ := net.SplitHostPort(c.ran)
	// The second's sleep keeps executions in flight, so that the kills
	// find some running; the first byte comes before it.
	command := fmt.Sprintf("echo %s > /dev/tcp/%s/%s && echo %s && sleep 1", id, host, port, id)
	sent := false // a submit went out: the id may be taken
	var res result
	for attempt := 0; time.Now().Before(hardEnd); attempt++ {
		if attempt > 0 {
			time.Sleep(time.Duration(min(attempt, 10)) * 100 * time.Millisecond)
		}
		api := c.f.api[c.next%len(c.f.api)]
		ctx, cancel := context.WithDeadline(context.Background(), hardEnd)
		conn, _, err := websocket.Dial(ctx, "ws://"+api, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + clientToken}}})
		if err != nil {
			cancel()
			c.next++
			continue
		}
		conn.SetReadLimit(64 << 20)
		var msg map[string]any
		if !sent {
			msg = map[string]any{"action": protocol.ActionSubmit, "payload": map[string]any{
				"request_id": "s", "execution_id": id, "command": command, "timeout_s": 60}}
		} else {
			msg = map[string]any{"action": protocol.ActionAttach, "payload": map[string]any{
				"request_id": "a", "execution_id": id, "after_seq": 0}}
		}
		b, _ := json.Marshal(msg)
		t0 := time.Now()
		if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
			conn.CloseNow()
			cancel()
			c.next++
			continue
		}
		if msg["action"] == protocol.ActionSubmit {
			sent = true
		}
		done, retry, err := c.follow(ctx, conn, &res, t0, msg["action"] == protocol.ActionSubmit, id)
		conn.CloseNow()
		cancel()
		if done {
			return res
		}
		if retry == "resubmit" {
			sent = false
		}
		if err != nil || retry == "other" {
			c.next++
		}
	}
	if !res.submitted {
		return res
	}
	res.kind, res.why = "lost", "no end before the deadline"
	return res
}

// follow reads one connection's frames. It returns done when the
// execution's end is known, else what to try next: "resubmit" (the id was
// never taken), "other" (another server), "" (the same, after a pause).
func (c *client) follow(ctx context.Context, conn *websocket.Conn, res *result, t0 time.Time, timing bool, id string) (bool, string, error) {
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			return false, "other", err
		}
		var f wireFrame
		var p payload
		if json.Unmarshal(data, &f) != nil || json.Unmarshal(f.Payload, &p) != nil {
			res.kind, res.why = "bad", "unparsable frame "+string(data)
			return true, "", nil
		}
		switch f.Type {
		case protocol.TypeStream:
			if timing && res.ttfb == 0 {
				res.hops.first = time.Now()
				res.ttfb = res.hops.first.Sub(t0)
			}
		case protocol.TypeResponse:
			if timing && p.Status == protocol.StatusStarting {
				res.hops.sent, res.hops.ack = t0, time.Now()
			}
			switch p.Status {
			case protocol.StatusStarting, protocol.StatusAttached, protocol.StatusCompleted, protocol.StatusFailed:
				res.submitted = true
			case protocol.StatusUnknown:
				res.submitted = true
				res.kind, res.why = "unknown", p.Reason
				return true, "", nil
			}
		case protocol.TypeError:
			switch p.Code {
			case protocol.CodeCapacity, protocol.CodeNotFound:
				// Not taken: submit it again.
				res.ttfb, res.hops = 0, hopTimes{}
				return false, "resubmit", nil
			case protocol.CodeDuplicate:
				// An earlier submit of ours was taken: follow it.
				res.submitted = true
				res.ttfb, res.hops = 0, hopTimes{}
				return false, "", nil
			}
			res.submitted = true
			res.kind, res.why = "bad", "error frame "+string(data)
			return true, "", nil
		case protocol.TypeResult:
			res.submitted = true
			switch {
			case p.ErrorCode != "" && p.ExitCode == -1:
				// Ended with the reason it has no outcome: its worker
				// was lost (WORKER_LOST), or none could take it.
				res.kind, res.why = "unknown", p.ErrorCode+": "+p.Stderr
			case p.ExitCode == 0 && p.Stdout == id+"\n":
				res.kind = "completed"
			default:
				res.kind, res.why = "bad", "result "+string(data)
			}
			return true, "", nil
		}
	}
}

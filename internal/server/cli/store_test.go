package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// frame is one server frame, decoded loosely.
type frame struct {
	Type    string         `json:"type"`
	Payload map[string]any `json:"payload"`
}

// exchange sends one message on a new connection and returns the frames
// up to the first for which last is true.
func exchange(t *testing.T, api, token string, msg map[string]any, last func(frame) bool) []frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+api, &websocket.DialOptions{HTTPHeader: map[string][]string{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatalf("dial %s: %v", api, err)
	}
	defer c.CloseNow()
	b, _ := json.Marshal(msg)
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
	var out []frame
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("after %+v: %v", out, err)
		}
		var f frame
		if err := json.Unmarshal(data, &f); err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
		if f.Type == "error" {
			t.Fatalf("error frame: %s", data)
		}
		if last(f) {
			return out
		}
	}
}

func statusOf(t *testing.T, api, id string) string {
	t.Helper()
	fs := exchange(t, api, "dev-token", map[string]any{"action": "status", "payload": map[string]any{"execution_id": id}},
		func(f frame) bool { return f.Type == "response" })
	s, _ := fs[len(fs)-1].Payload["status"].(string)
	return s
}

// A server's SQLite database moves into Postgres with migrate-store; two
// replicas then share it: either replays what the other (or the old
// server) ran, and one restarting leaves the other's running execution
// alone. The URL's password appears in no output.
func TestMigrateStoreThenReplicasShareIt(t *testing.T) {
	cluster := testenv.StartPostgres(t)
	const password = "pw-s3cret-4417"
	url := strings.Replace(cluster.NewDatabase(t), "postgres@", "postgres:"+password+"@", 1)
	dir := t.TempDir()
	sqlite := filepath.Join(dir, "db.sqlite3")
	vars := map[string]string{"PULSE_REMOTE_TOKEN": "dev-token"}
	serverArgs := func(db ...string) []string {
		return append([]string{"--development", "--backend", "host", "--unsafe-host", "--port", "0",
			"--workspace-root", filepath.Join(dir, "ws")}, db...)
	}

	one := start(t, serverArgs("--database", sqlite), vars)
	if out := roundTrip(t, "ws://"+one.api, "dev-token", nil); out != "from-main\n" {
		t.Fatalf("stdout %q", out)
	}
	one.cancel()
	if code := <-one.code; code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	one.code <- ExitOK // for the cleanup

	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"migrate-store", "--from", sqlite, "--to", url}, env(nil), &stdout, &stderr, nil); code != ExitOK {
		t.Fatalf("migrate-store exit %d: %s%s", code, stdout.String(), stderr.String())
	}
	if !strings.HasPrefix(stdout.String(), "moved 1 executions with ") || strings.Contains(stdout.String()+stderr.String(), password) {
		t.Fatalf("migrate-store said %q %q", stdout.String(), stderr.String())
	}
	// Run again (as after an interruption): nothing is copied twice.
	stdout.Reset()
	if code := run(context.Background(), []string{"migrate-store", "--from", sqlite, "--to", url}, env(nil), &stdout, &stderr, nil); code != ExitOK ||
		!strings.Contains(stdout.String(), "moved 0 executions with 0 events") || !strings.Contains(stdout.String(), "1 were there already") {
		t.Fatalf("second migrate-store: %d %q %q", code, stdout.String(), stderr.String())
	}

	// Replica a reads the URL from a file, replica b from the
	// environment.
	urlFile := filepath.Join(dir, "db-url")
	if err := os.WriteFile(urlFile, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := start(t, serverArgs("--replica-id", "a"), map[string]string{"PULSE_REMOTE_TOKEN": "dev-token", "PULSE_REMOTE_DB_FILE": urlFile})
	startB := func() *started {
		return start(t, serverArgs(), map[string]string{"PULSE_REMOTE_TOKEN": "dev-token", "PULSE_REMOTE_DB": url, "PULSE_REPLICA_ID": "b"})
	}
	b := startB()

	// What the SQLite server ran replays through a replica that never
	// saw it.
	replay := exchange(t, b.api, "dev-token", map[string]any{"action": "attach", "payload": map[string]any{"execution_id": "cli-1"}},
		func(f frame) bool { return f.Type == "result" })
	var got string
	for _, f := range replay {
		if f.Type == "stream" {
			d, _ := f.Payload["data"].(string)
			got += d
		}
	}
	if got != "from-main\n" {
		t.Fatalf("replayed %q, frames %+v", got, replay)
	}

	// a runs something long; b restarts and must not quarantine it.
	exchange(t, a.api, "dev-token", map[string]any{"action": "submit", "payload": map[string]any{
		"execution_id": "long-1", "command": "sleep 60", "request_id": "s1"}},
		func(f frame) bool { return f.Type == "response" })
	if st := statusOf(t, b.api, "long-1"); st != "RUNNING" {
		t.Fatalf("long-1 is %s on b", st)
	}
	b.cancel()
	if code := <-b.code; code != ExitOK {
		t.Fatalf("b exit %d", code)
	}
	b.code <- ExitOK
	b = startB()
	if st := statusOf(t, b.api, "long-1"); st != "RUNNING" {
		t.Fatalf("after b restarted, a's running execution is %s", st)
	}
	exchange(t, a.api, "dev-token", map[string]any{"action": "cancel", "payload": map[string]any{"execution_id": "long-1", "request_id": "c1"}},
		func(f frame) bool { return f.Type == "response" })
	testenv.Eventually(t, 30*time.Second, func() error {
		if st := statusOf(t, b.api, "long-1"); st == "RUNNING" {
			return errors.New("still RUNNING")
		}
		return nil
	})
	for name, s := range map[string]*started{"a": a, "b": b} {
		log := s.stderr.String()
		if strings.Contains(log, password) {
			t.Fatalf("replica %s logged the database password:\n%s", name, log)
		}
		if !strings.Contains(log, `"replica":"`+name+`"`) {
			t.Fatalf("replica %s's log does not name it:\n%s", name, log)
		}
	}
}

// A database URL's password shows nowhere: not in -help (the flag's
// default is not the environment's value), not in a start-up problem,
// not when the database does not answer. A URL of another scheme is a
// start-up problem rather than a SQLite file of that name.
func TestDatabaseURLPasswordIsNeverShown(t *testing.T) {
	const password = "pw-9c41e7"
	url := "postgres://pulse:" + password + "@127.0.0.1:1/pulse?connect_timeout=5"
	token := "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c2e4f6a8b0c1d3e5f7a9b2c4d6e8f0a1b"
	for _, c := range []struct {
		name string
		args []string
		vars map[string]string
		code int
		want string
	}{
		{"help", []string{"-help"}, map[string]string{"PULSE_REMOTE_DB": url}, ExitOK, "-replica-id"},
		{"other scheme", []string{"--development", "--database", "mysql://pulse:" + password + "@db/pulse"},
			map[string]string{"PULSE_REMOTE_TOKEN": "dev"}, ExitUsage, `"mysql" URLs are not supported`},
		// Production: a URL needs no absolute path; nothing listens on
		// port 1, so the server fails to start, saying where it tried.
		{"unreachable", []string{"--port", "0", "--workspace-root", t.TempDir(), "--backend", "host", "--unsafe-host"},
			map[string]string{"PULSE_REMOTE_TOKEN": token, "PULSE_REMOTE_DB": url}, ExitFailure, "postgres://pulse@127.0.0.1:1/pulse"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), c.args, env(c.vars), &stdout, &stderr, nil)
			out := stdout.String() + stderr.String()
			if code != c.code || !strings.Contains(out, c.want) || strings.Contains(out, password) {
				t.Fatalf("exit %d (want %d), output (want %q, never the password):\n%s", code, c.code, c.want, out)
			}
		})
	}
}

// A client that reattaches to replica b while replica a runs its command
// gets, from b, the events so far once, then each later one as a appends
// it, then the result: b follows the shared store live (LISTEN/NOTIFY
// with re-reads after the last seq sent).
func TestReattachOnAnotherReplicaIsLive(t *testing.T) {
	url := testenv.SharedPostgres(t).NewDatabase(t)
	dir := t.TempDir()
	replica := func(id string) *started {
		return start(t, []string{"--development", "--backend", "host", "--unsafe-host", "--port", "0",
			"--workspace-root", filepath.Join(dir, "ws-"+id), "--database", url, "--replica-id", id},
			map[string]string{"PULSE_REMOTE_TOKEN": "dev-token"})
	}
	a, b := replica("a"), replica("b")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func(api string) *websocket.Conn {
		c, _, err := websocket.Dial(ctx, "ws://"+api, &websocket.DialOptions{HTTPHeader: map[string][]string{"Authorization": {"Bearer dev-token"}}})
		if err != nil {
			t.Fatalf("dial %s: %v", api, err)
		}
		t.Cleanup(func() { c.CloseNow() })
		return c
	}
	send := func(c *websocket.Conn, msg map[string]any) {
		b, _ := json.Marshal(msg)
		if err := c.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
	}
	read := func(c *websocket.Conn) (frame, string) {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var f frame
		if err := json.Unmarshal(data, &f); err != nil {
			t.Fatal(err)
		}
		return f, string(data)
	}

	// Submit on a and wait for its first line there: the command runs,
	// and prints the rest once b has answered the attach (the gate file),
	// so lines 2..5 can only reach b live.
	gate := filepath.Join(dir, "gate")
	// On a failure too: a's shutdown waits for its command to end.
	t.Cleanup(func() { os.WriteFile(gate, nil, 0o600) })
	ca := dial(a.api)
	send(ca, map[string]any{"action": "submit", "payload": map[string]any{
		"request_id": "s1", "execution_id": "live-1", "command": "echo 1; while [ ! -e " + gate + " ]; do sleep 0.05; done; for i in 2 3 4 5; do echo $i; sleep 0.3; done"}})
	for {
		f, raw := read(ca)
		if f.Type == "error" || f.Type == "result" {
			t.Fatalf("on a before the first line: %s", raw)
		}
		if f.Type == "stream" {
			break
		}
	}
	ca.CloseNow() // the client leaves a, as when its connection dropped

	cb := dial(b.api)
	send(cb, map[string]any{"action": "attach", "payload": map[string]any{"request_id": "r1", "execution_id": "live-1", "after_seq": 0}})
	var (
		got      string
		lastSeq  float64
		answered string
		live     int // stream frames after the answer
		trace    []string
	)
	for {
		f, raw := read(cb)
		trace = append(trace, raw)
		switch f.Type {
		case "stream":
			seq, _ := f.Payload["seq"].(float64)
			if seq <= lastSeq {
				t.Fatalf("seq %v after %v: a replayed or repeated event\n%s", seq, lastSeq, strings.Join(trace, "\n"))
			}
			lastSeq = seq
			d, _ := f.Payload["data"].(string)
			got += d
			if answered != "" {
				live++
			}
		case "response":
			// ATTACHED: b follows a run still going. Anything else (the
			// RUNNING of a snapshot) leaves the client with no live
			// stream and no result.
			if answered, _ = f.Payload["status"].(string); answered != "ATTACHED" {
				t.Fatalf("b answered %s\n%s", raw, strings.Join(trace, "\n"))
			}
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		case "result":
			if answered == "" || live < 4 {
				t.Fatalf("b answered %q and sent %d events live; the run was not followed\n%s", answered, live, strings.Join(trace, "\n"))
			}
			if got != "1\n2\n3\n4\n5\n" {
				t.Fatalf("b streamed %q\n%s", got, strings.Join(trace, "\n"))
			}
			if code, _ := f.Payload["exit_code"].(float64); code != 0 || f.Payload["stdout"] != got {
				t.Fatalf("result %s", raw)
			}
			return
		default:
			t.Fatalf("unexpected frame %s\n%s", raw, strings.Join(trace, "\n"))
		}
	}
}

package audit

import (
	"encoding/json"
	"testing"
	"time"
)

// ocsfRequired are the attributes OCSF 1.3 requires of every event class
// used here (Base Event, File System, Process, Network Activity,
// Application Lifecycle), plus the ones the mapping in SCHEMA.md
// promises.
var ocsfRequired = []string{"class_uid", "category_uid", "activity_id", "type_uid", "severity_id", "time", "metadata"}

func exportJSON(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func get(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

func TestOCSFExport(t *testing.T) {
	at := time.Date(2026, 12, 1, 8, 0, 0, 123e6, time.UTC)
	cases := []struct {
		name                      string
		e                         Event
		class, category, activity float64
		severity                  float64
		check                     func(t *testing.T, o map[string]any)
	}{
		{"shell", Event{Action: "shell", Target: "go test ./...", Decision: "allow", ExitCode: Int(0), DurationMS: 812.4, ExecutionID: "ex1"},
			1007, 1, 1, 1, func(t *testing.T, o map[string]any) {
				if get(o, "process", "cmd_line") != "go test ./..." || get(o, "exit_code") != 0.0 || get(o, "duration") != 812.0 || get(o, "process", "uid") != "ex1" {
					t.Errorf("process fields: %v", o)
				}
			}},
		{"commit by a reviewer", Event{Action: "commit", Target: "src/a.go", Decision: "allow", TxID: "0123456789abcdef",
			Actor: "alice", Via: "review-page", SessionID: "page-1", ContentSHA256: "ab"},
			1001, 1, 3, 1, func(t *testing.T, o map[string]any) {
				if get(o, "file", "path") != "src/a.go" || get(o, "file", "name") != "a.go" {
					t.Errorf("file: %v", o["file"])
				}
				if get(o, "actor", "user", "name") != "alice" || get(o, "actor", "session", "uid") != "page-1" || get(o, "actor", "app_name") != "review-page" {
					t.Errorf("actor: %v", o["actor"])
				}
				h, _ := get(o, "file", "hashes").([]any)
				if len(h) != 1 || get(h[0].(map[string]any), "algorithm_id") != 3.0 || get(h[0].(map[string]any), "value") != "ab" {
					t.Errorf("hashes: %v", h)
				}
				if o["action_id"] != 1.0 || o["disposition_id"] != 1.0 || o["status_id"] != 1.0 || get(o, "unmapped", "tx_id") != "0123456789abcdef" {
					t.Errorf("outcome: %v", o)
				}
			}},
		{"refused write", Event{Action: "write", Target: ".git/hooks/pre-commit", Decision: "deny", Reason: "policy"},
			1001, 1, 3, 3, func(t *testing.T, o map[string]any) {
				if o["action_id"] != 2.0 || o["status_id"] != 2.0 || o["status_detail"] != "policy" || o["disposition"] != "Blocked" {
					t.Errorf("denial: %v", o)
				}
			}},
		{"discard", Event{Action: "discard", Target: "a.txt", Decision: "allow", TxID: "t1"}, 1001, 1, 99, 1, nil},
		{"delete staged", Event{Action: "delete-staged", Target: "old.txt", Decision: "allow"}, 1001, 1, 4, 1, nil},
		{"network refused", Event{Action: "network", Target: "*", Decision: "deny", Destination: "10.0.0.1", Port: 443, Protocol: "tcp"},
			4001, 4, 5, 3, func(t *testing.T, o map[string]any) {
				if get(o, "dst_endpoint", "ip") != "10.0.0.1" || get(o, "dst_endpoint", "port") != 443.0 || get(o, "connection_info", "protocol_name") != "tcp" {
					t.Errorf("network: %v", o)
				}
			}},
		{"sandbox-init unsafe", Event{Action: "sandbox-init", Target: "host", Decision: "allow", Reason: "UNSAFE_HOST"}, 6002, 6, 3, 4, nil},
		{"head mismatch", Event{Action: ActionHeadMismatch, Decision: "deny"}, 0, 0, 99, 5, nil},
		{"limits", Event{Action: "limits", Target: "pids", Decision: "allow"}, 0, 0, 99, 1, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.e.Time, c.e.Seq, c.e.Hash, c.e.PrevHash = at, 7, "h7", "h6"
			o := exportJSON(t, OCSF(c.e, "v1.2.3"))
			for _, k := range ocsfRequired {
				if _, ok := o[k]; !ok {
					t.Errorf("missing %s", k)
				}
			}
			if o["class_uid"] != c.class || o["category_uid"] != c.category || o["activity_id"] != c.activity || o["severity_id"] != c.severity {
				t.Errorf("class %v category %v activity %v severity %v", o["class_uid"], o["category_uid"], o["activity_id"], o["severity_id"])
			}
			if o["type_uid"] != c.class*100+c.activity {
				t.Errorf("type_uid %v", o["type_uid"])
			}
			if o["time"] != float64(at.UnixMilli()) {
				t.Errorf("time %v", o["time"])
			}
			if get(o, "metadata", "version") != OCSFVersion || get(o, "metadata", "product", "name") != "Pulse" ||
				get(o, "metadata", "uid") != "h7" || get(o, "metadata", "sequence") != 7.0 {
				t.Errorf("metadata %v", o["metadata"])
			}
			for _, k := range []string{"class_name", "category_name", "activity_name", "severity", "type_name"} {
				if s, _ := o[k].(string); s == "" {
					t.Errorf("%s empty", k)
				}
			}
			if get(o, "unmapped", "action") != c.e.Action {
				t.Errorf("unmapped.action %v", get(o, "unmapped", "action"))
			}
			if c.check != nil {
				c.check(t, o)
			}
		})
	}
}

func TestECSExport(t *testing.T) {
	e := Event{Time: time.Unix(0, 5).UTC(), Seq: 3, Hash: "h3", Action: "commit", Target: "x/y.txt", Decision: "allow",
		Actor: "bob", Via: "cli", TxID: "t1", ContentSHA256: "cd", DurationMS: 2}
	o := exportJSON(t, ECS(e, "devel"))
	if o["@timestamp"] != "1970-01-01T00:00:00.000000005Z" || get(o, "ecs", "version") != ECSVersion {
		t.Fatalf("%v", o)
	}
	if get(o, "event", "action") != "commit" || get(o, "event", "outcome") != "success" || get(o, "event", "sequence") != 3.0 ||
		get(o, "event", "duration") != 2e6 {
		t.Fatalf("event %v", o["event"])
	}
	if get(o, "file", "path") != "x/y.txt" || get(o, "file", "hash", "sha256") != "cd" || get(o, "user", "name") != "bob" ||
		get(o, "labels", "tx_id") != "t1" || get(o, "labels", "via") != "cli" {
		t.Fatalf("%v", o)
	}
	sh := exportJSON(t, ECS(Event{Action: "shell", Target: "ls", ExitCode: Int(2), Decision: "deny"}, "devel"))
	if get(sh, "process", "command_line") != "ls" || get(sh, "process", "exit_code") != 2.0 || get(sh, "event", "outcome") != "failure" {
		t.Fatalf("%v", sh)
	}
}

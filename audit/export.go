package audit

import (
	"path"
	"strings"
)

// OCSFVersion and ECSVersion are the schema versions the exports follow.
const (
	OCSFVersion = "1.3.0"
	ECSVersion  = "8.11.0"
)

// The OCSF classes events map to (category_uid is class_uid / 1000).
const (
	OCSFClassBase           = 0    // Base Event
	OCSFClassFileSystem     = 1001 // File System Activity
	OCSFClassProcess        = 1007 // Process Activity
	OCSFClassNetwork        = 4001 // Network Activity
	OCSFClassAppLifecycle   = 6002 // Application Lifecycle
	ocsfActivityOther       = 99
	ocsfSeverityInformation = 1
	ocsfSeverityMedium      = 3
	ocsfSeverityHigh        = 4
	ocsfSeverityCritical    = 5
)

var ocsfClassNames = map[int]string{
	OCSFClassBase: "Base Event", OCSFClassFileSystem: "File System Activity",
	OCSFClassProcess: "Process Activity", OCSFClassNetwork: "Network Activity",
	OCSFClassAppLifecycle: "Application Lifecycle",
}

var ocsfCategoryNames = map[int]string{
	0: "Uncategorized", 1: "System Activity", 4: "Network Activity", 6: "Application Activity",
}

var ocsfSeverityNames = map[int]string{1: "Informational", 2: "Low", 3: "Medium", 4: "High", 5: "Critical"}

// ocsfClass says which OCSF class and activity an action maps to; the
// table is documented in SCHEMA.md ("Export to OCSF and ECS").
func ocsfClass(e *Event) (class, activity int, activityName string) {
	switch e.Action {
	case "shell":
		return OCSFClassProcess, 1, "Launch"
	case "read":
		return OCSFClassFileSystem, 2, "Read"
	case "write", "write-staged", "write-in-place":
		return OCSFClassFileSystem, 3, "Update"
	case "delete", "delete-staged", "delete-in-place":
		return OCSFClassFileSystem, 4, "Delete"
	case "mkdir", "symlink":
		return OCSFClassFileSystem, 1, "Create"
	case "commit", "undo":
		// The reviewer's decision puts (or puts back) the content in the
		// workspace: an update of the file, by the reviewer.
		return OCSFClassFileSystem, 3, "Update"
	case "discard", "reject":
		return OCSFClassFileSystem, ocsfActivityOther, "Other"
	case "network":
		if e.Decision == "deny" {
			return OCSFClassNetwork, 5, "Refuse"
		}
		return OCSFClassNetwork, ocsfActivityOther, "Other"
	case "sandbox-init":
		return OCSFClassAppLifecycle, 3, "Start"
	}
	return OCSFClassBase, ocsfActivityOther, "Other"
}

func ocsfSeverity(e *Event) int {
	switch {
	case e.Action == ActionHeadMismatch:
		return ocsfSeverityCritical
	case e.Reason == "UNSAFE_HOST" || e.Action == "cow-recovery":
		return ocsfSeverityHigh
	case e.Decision == "deny":
		return ocsfSeverityMedium
	}
	return ocsfSeverityInformation
}

// isFileAction reports whether Target is a workspace path.
func isFileAction(e *Event) bool {
	c, _, _ := ocsfClass(e)
	return c == OCSFClassFileSystem && !(e.TxID != "" && e.Target == e.TxID)
}

func setNonEmpty(m map[string]any, k string, v string) {
	if v != "" {
		m[k] = v
	}
}

// OCSF returns e as an OCSF event object (schema version OCSFVersion),
// ready to be encoded as one JSON line. Fields OCSF has no place for go
// under "unmapped" with their audit names.
func OCSF(e Event, productVersion string) map[string]any {
	class, activity, activityName := ocsfClass(&e)
	category := class / 1000
	sev := ocsfSeverity(&e)
	out := map[string]any{
		"class_uid":     class,
		"class_name":    ocsfClassNames[class],
		"category_uid":  category,
		"category_name": ocsfCategoryNames[category],
		"activity_id":   activity,
		"activity_name": activityName,
		"type_uid":      class*100 + activity,
		"type_name":     ocsfClassNames[class] + ": " + activityName,
		"severity_id":   sev,
		"severity":      ocsfSeverityNames[sev],
		"time":          e.Time.UnixMilli(),
		"time_dt":       e.Time.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		"metadata": map[string]any{
			"version":  OCSFVersion,
			"uid":      e.Hash,
			"sequence": e.Seq,
			"log_name": "pulse-audit",
			"product":  map[string]any{"name": "Pulse", "vendor_name": "Pulse", "version": productVersion},
		},
	}
	setNonEmpty(out, "message", e.Detail)
	switch e.Decision {
	case "allow":
		out["action_id"], out["action"] = 1, "Allowed"
		out["disposition_id"], out["disposition"] = 1, "Allowed"
		out["status_id"], out["status"] = 1, "Success"
	case "deny":
		out["action_id"], out["action"] = 2, "Denied"
		out["disposition_id"], out["disposition"] = 2, "Blocked"
		out["status_id"], out["status"] = 2, "Failure"
	}
	setNonEmpty(out, "status_detail", e.Reason)
	if e.DurationMS != 0 {
		out["duration"] = int64(e.DurationMS)
	}
	if e.ExitCode != nil {
		out["exit_code"] = *e.ExitCode
	}
	actor := map[string]any{}
	if e.Actor != "" {
		actor["user"] = map[string]any{"name": e.Actor}
	}
	if e.SessionID != "" {
		actor["session"] = map[string]any{"uid": e.SessionID}
	}
	setNonEmpty(actor, "app_name", e.Via)
	if len(actor) > 0 {
		out["actor"] = actor
	}
	switch class {
	case OCSFClassProcess:
		p := map[string]any{"cmd_line": e.Target}
		setNonEmpty(p, "uid", e.ExecutionID)
		out["process"] = p
	case OCSFClassFileSystem:
		if isFileAction(&e) && e.Target != "" {
			f := map[string]any{"path": e.Target, "name": path.Base(e.Target)}
			if e.ContentSHA256 != "" {
				f["hashes"] = []map[string]any{{"algorithm_id": 3, "algorithm": "SHA-256", "value": e.ContentSHA256}}
			}
			out["file"] = f
		}
	case OCSFClassNetwork:
		dst := map[string]any{}
		if e.Destination != "" && e.Destination != "*" {
			if strings.ContainsAny(e.Destination, ":/") || isIPv4(e.Destination) {
				dst["ip"] = e.Destination
			} else {
				dst["hostname"] = e.Destination
			}
		}
		if e.Port != 0 {
			dst["port"] = e.Port
		}
		if len(dst) > 0 {
			out["dst_endpoint"] = dst
		}
		if e.Protocol != "" && e.Protocol != "any" {
			out["connection_info"] = map[string]any{"protocol_name": e.Protocol}
		}
	}
	if e.ContainerID != "" {
		out["container"] = map[string]any{"uid": e.ContainerID}
	}
	un := map[string]any{"action": e.Action}
	for k, v := range map[string]string{
		"decision": e.Decision, "target": e.Target, "execution_id": e.ExecutionID,
		"isolation_level": e.IsolationLevel, "enforcement_level": e.EnforcementLevel, "backend": e.Backend,
		"tx_id": e.TxID, "key_id": e.KeyID, "prev_hash": e.PrevHash,
	} {
		setNonEmpty(un, k, v)
	}
	out["unmapped"] = un
	return out
}

func isIPv4(s string) bool {
	dots := 0
	for _, c := range s {
		switch {
		case c == '.':
			dots++
		case c < '0' || c > '9':
			return false
		}
	}
	return dots == 3
}

// ECS returns e as an Elastic Common Schema document (ECSVersion).
func ECS(e Event, productVersion string) map[string]any {
	class, _, _ := ocsfClass(&e)
	ev := map[string]any{
		"kind":     "event",
		"action":   e.Action,
		"sequence": e.Seq,
		"id":       e.Hash,
		"provider": "pulse",
		"dataset":  "pulse.audit",
	}
	var category, typ []string
	switch class {
	case OCSFClassProcess:
		category, typ = []string{"process"}, []string{"start"}
	case OCSFClassFileSystem:
		category = []string{"file"}
		switch e.Action {
		case "read":
			typ = []string{"access"}
		case "delete", "delete-staged", "delete-in-place":
			typ = []string{"deletion"}
		case "mkdir", "symlink":
			typ = []string{"creation"}
		default:
			typ = []string{"change"}
		}
	case OCSFClassNetwork:
		category, typ = []string{"network"}, []string{"connection"}
	default:
		category, typ = []string{"configuration"}, []string{"info"}
	}
	switch e.Decision {
	case "allow":
		typ = append(typ, "allowed")
		ev["outcome"] = "success"
	case "deny":
		typ = append(typ, "denied")
		ev["outcome"] = "failure"
	}
	ev["category"], ev["type"] = category, typ
	setNonEmpty(ev, "reason", e.Reason)
	if e.DurationMS != 0 {
		ev["duration"] = int64(e.DurationMS * 1e6)
	}
	out := map[string]any{
		"@timestamp": e.Time.UTC().Format("2006-01-02T15:04:05.000000000Z"),
		"ecs":        map[string]any{"version": ECSVersion},
		"event":      ev,
		"observer":   map[string]any{"product": "Pulse", "vendor": "Pulse", "version": productVersion},
	}
	setNonEmpty(out, "message", e.Detail)
	labels := map[string]any{}
	for k, v := range map[string]string{
		"session_id": e.SessionID, "decision": e.Decision, "isolation_level": e.IsolationLevel,
		"enforcement_level": e.EnforcementLevel, "backend": e.Backend, "tx_id": e.TxID, "via": e.Via,
		"key_id": e.KeyID, "prev_hash": e.PrevHash,
	} {
		setNonEmpty(labels, k, v)
	}
	switch {
	case class == OCSFClassProcess:
		p := map[string]any{"command_line": e.Target}
		setNonEmpty(p, "entity_id", e.ExecutionID)
		if e.ExitCode != nil {
			p["exit_code"] = *e.ExitCode
		}
		out["process"] = p
	case isFileAction(&e) && e.Target != "":
		f := map[string]any{"path": e.Target, "name": path.Base(e.Target)}
		if e.ContentSHA256 != "" {
			f["hash"] = map[string]any{"sha256": e.ContentSHA256}
		}
		out["file"] = f
	default:
		setNonEmpty(labels, "target", e.Target)
	}
	if class != OCSFClassProcess {
		setNonEmpty(labels, "execution_id", e.ExecutionID)
		if e.ExitCode != nil {
			out["process"] = map[string]any{"exit_code": *e.ExitCode}
		}
	}
	if e.Destination != "" || e.Port != 0 {
		d := map[string]any{}
		setNonEmpty(d, "address", e.Destination)
		if e.Port != 0 {
			d["port"] = e.Port
		}
		out["destination"] = d
	}
	if e.Protocol != "" {
		out["network"] = map[string]any{"transport": e.Protocol}
	}
	if e.ContainerID != "" {
		out["container"] = map[string]any{"id": e.ContainerID}
	}
	if e.Actor != "" {
		out["user"] = map[string]any{"name": e.Actor}
	}
	if len(labels) > 0 {
		out["labels"] = labels
	}
	return out
}

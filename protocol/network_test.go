package protocol

import (
	"reflect"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

// TestNetworkRoundTrip: a network event with every field set comes back
// whole through WireNetwork and BackendNetwork. The sample must set every
// field of both structs, so a field added to one of them fails here until
// the conversion (and this sample) carry it.
func TestNetworkRoundTrip(t *testing.T) {
	ev := backend.NetworkEvent{Method: "CONNECT", Host: "api.example.com", Port: 443, Addr: "192.0.2.1:443",
		Allowed: true, Rule: "*.example.com", Reason: "closed by peer", Injected: []string{"TOKEN"},
		Sent: 10, Received: 20, Duration: 1500 * time.Millisecond}
	mustBeFull(t, ev)
	w := WireNetwork([]backend.NetworkEvent{ev})
	if len(w) != 1 {
		t.Fatalf("WireNetwork gave %d events", len(w))
	}
	mustBeFull(t, w[0])
	if w[0].DurationMS != 1500 {
		t.Errorf("duration_ms = %d, want 1500", w[0].DurationMS)
	}
	back := BackendNetwork(w)
	if len(back) != 1 || !reflect.DeepEqual(back[0], ev) {
		t.Fatalf("round trip = %+v, want %+v", back, ev)
	}
	if WireNetwork(nil) != nil || BackendNetwork(nil) != nil {
		t.Error("an empty list must stay nil (omitted from the result)")
	}
}

func mustBeFull(t *testing.T, v any) {
	t.Helper()
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		if rv.Field(i).IsZero() {
			t.Errorf("%T.%s is not set in the sample", v, rv.Type().Field(i).Name)
		}
	}
}

// TestInjectRoundTrip: a secret binding with every field set comes back
// whole through WireInject and BackendInject (the sample must set every
// field of both structs, as above).
func TestInjectRoundTrip(t *testing.T) {
	in := backend.Injection{Name: "TOKEN", Placeholder: goodPlaceholder, Value: "s3cret", Hosts: []string{"api.example.com"}}
	mustBeFull(t, in)
	w := WireInject([]backend.Injection{in})
	if len(w) != 1 {
		t.Fatalf("WireInject gave %d bindings", len(w))
	}
	mustBeFull(t, w[0])
	if w[0].Env != "TOKEN" {
		t.Errorf("env = %q, want the binding's Name", w[0].Env)
	}
	back := BackendInject(w)
	if len(back) != 1 || !reflect.DeepEqual(back[0], in) {
		t.Fatalf("round trip = %+v, want %+v", back, in)
	}
	if WireInject(nil) != nil || BackendInject(nil) != nil {
		t.Error("an empty list must stay nil (omitted from the submit)")
	}
}

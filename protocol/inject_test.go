package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

const goodPlaceholder = "pulse-placeholder-TOKEN-0123456789abcdef0123456789abcdef"

func submitWithInject(inject string) map[string]json.RawMessage {
	return map[string]json.RawMessage{
		"execution_id": json.RawMessage(`"e1"`),
		"command":      json.RawMessage(`"true"`),
		"inject":       json.RawMessage(inject),
	}
}

func TestParseSubmitInject(t *testing.T) {
	r, err := ParseSubmit(submitWithInject(`[{"env":"TOKEN","hosts":["api.example.com","*.example.org"],"placeholder":"` + goodPlaceholder + `","value":"s3cret"}]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Inject) != 1 || r.Inject[0].Value != "s3cret" || r.Inject[0].Placeholder != goodPlaceholder || len(r.Inject[0].Hosts) != 2 {
		t.Fatalf("inject = %+v", r.Inject)
	}
	entry := func(env, hosts, ph, value string) string {
		return fmt.Sprintf(`[{"env":%q,"hosts":%s,"placeholder":%q,"value":%q}]`, env, hosts, ph, value)
	}
	for name, bad := range map[string]string{
		"not a list":            `{"env":"A"}`,
		"unknown field":         `[{"env":"TOKEN","hosts":["a.b"],"placeholder":"` + goodPlaceholder + `","value":"v","extra":1}]`,
		"bad env name":          entry("1X", `["a.b"]`, goodPlaceholder, "v"),
		"no hosts":              entry("TOKEN", `[]`, goodPlaceholder, "v"),
		"an address as host":    entry("TOKEN", `["127.0.0.1"]`, goodPlaceholder, "v"),
		"placeholder too short": entry("TOKEN", `["a.b"]`, "pulse-placeholder-x", "v"),
		"no prefix":             entry("TOKEN", `["a.b"]`, "0123456789abcdef0123456789abcdef", "v"),
		"placeholder not plain": entry("TOKEN", `["a.b"]`, goodPlaceholder+" x", "v"),
		"empty value":           entry("TOKEN", `["a.b"]`, goodPlaceholder, ""),
		"multi-line value":      entry("TOKEN", `["a.b"]`, goodPlaceholder, "a\r\nX-Evil: 1"),
		"twice": `[{"env":"T","hosts":["a.b"],"placeholder":"` + goodPlaceholder + `","value":"v"},` +
			`{"env":"T","hosts":["a.b"],"placeholder":"` + goodPlaceholder + `","value":"v"}]`,
	} {
		if _, err := ParseSubmit(submitWithInject(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	long := entry("TOKEN", `["a.b"]`, goodPlaceholder, strings.Repeat("v", MaxSecretLen+1))
	if _, err := ParseSubmit(submitWithInject(long)); !errors.Is(err, ErrInvalid) {
		t.Errorf("overlong value: err = %v", err)
	}
}

// No way of printing an injection shows its value.
func TestInjectionFormatLeavesTheValueOut(t *testing.T) {
	in := Injection{Env: "TOKEN", Hosts: []string{"a.b"}, Placeholder: goodPlaceholder, Value: "s3cret-value"}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if s := fmt.Sprintf(f, in); strings.Contains(s, "s3cret-value") || !strings.Contains(s, "TOKEN") {
			t.Errorf("%s: %q", f, s)
		}
	}
	if s := fmt.Sprintf("%+v", SubmitRequest{Inject: []Injection{in}}); strings.Contains(s, "s3cret-value") {
		t.Errorf("a submit request prints the value: %q", s)
	}
}

// FuzzParseInject: whatever a client sends, an accepted injection has a
// variable name, host names, a long plain placeholder and a one-line value.
func FuzzParseInject(f *testing.F) {
	f.Add(`[{"env":"TOKEN","hosts":["api.example.com"],"placeholder":"` + goodPlaceholder + `","value":"s3cret"}]`)
	f.Add(`[{"env":"TOKEN","hosts":["*.x.y:443"],"placeholder":"` + goodPlaceholder + `","value":"a\nb"}]`)
	f.Add(`[]`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, data string) {
		ins, err := parseInject(json.RawMessage(data))
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for _, in := range ins {
			if !ValidEnvName(in.Env) || len(in.Hosts) == 0 || in.Value == "" || strings.ContainsAny(in.Value, "\r\n\x00") ||
				!strings.HasPrefix(in.Placeholder, placeholderPrefix) || len(in.Placeholder) < len(placeholderPrefix)+16 ||
				strings.IndexFunc(in.Placeholder, notPlain) >= 0 {
				t.Fatalf("accepted %+v (value %q)", in, in.Value)
			}
		}
	})
}

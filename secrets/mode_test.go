package secrets

import "testing"

func TestModeValid(t *testing.T) {
	for _, m := range []Mode{DenyAll, AllowAll, Allowlist} {
		if !m.Valid() {
			t.Errorf("%q is not Valid", m)
		}
		if err := (Policy{Mode: m}).Validate(); err != nil {
			t.Errorf("Validate(%q) = %v", m, err)
		}
	}
	for _, m := range []Mode{"", "some", "Allow-All"} {
		if m.Valid() {
			t.Errorf("%q is Valid", m)
		}
	}
	if err := (Policy{}).Validate(); err != nil {
		t.Errorf("the zero policy (allows nothing) is refused: %v", err)
	}
	if err := (Policy{Mode: "some"}).Validate(); err == nil {
		t.Error("an unknown mode passes Validate")
	}
}

package bearer

import "testing"

func TestMatch(t *testing.T) {
	tokens := New([]string{"one", "two"})
	for _, tc := range []struct {
		header, token string
		ok            bool
	}{
		{"Bearer one", "one", true},
		{"Bearer two", "two", true},
		{"Bearer three", "", false},
		{"Bearer ", "", false},
		{"one", "", false},
		{"bearer one", "", false},
		{"Bearer one ", "", false},
		{"", "", false},
	} {
		if token, ok := tokens.Match(tc.header); token != tc.token || ok != tc.ok {
			t.Errorf("Match(%q) = %q, %v; want %q, %v", tc.header, token, ok, tc.token, tc.ok)
		}
	}
	if _, ok := New(nil).Match("Bearer one"); ok {
		t.Error("an empty set matched a token")
	}
}

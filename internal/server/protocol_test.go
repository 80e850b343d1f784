package server

import (
	"errors"
	"strings"
	"testing"
)

func TestUTF8Helpers(t *testing.T) {
	euro := []byte("€") // e2 82 ac
	for cut := 0; cut <= len(euro); cut++ {
		head, tail := splitUTF8(append([]byte("ab"), euro[:cut]...))
		wantTail := cut > 0 && cut < len(euro)
		if (len(tail) > 0) != wantTail || string(head)+string(tail) != "ab"+string(euro[:cut]) {
			t.Errorf("cut %d: head %q tail %q", cut, head, tail)
		}
	}
	if head, tail := splitUTF8([]byte{'a', 0xff}); len(tail) != 0 || string(head) != "a\xff" {
		t.Errorf("invalid byte held back: %q %q", head, tail)
	}
	if got := string(toText([]byte("a\xffb\xe2\x82"))); got != "a\uFFFDb\uFFFD\uFFFD" {
		t.Errorf("toText = %q", got)
	}
}

func TestTokens(t *testing.T) {
	if got := ParseTokens(" a, ,b ,"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("ParseTokens = %q", got)
	}
	for tok, ok := range map[string]bool{
		"short":                                 false,
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa":  false, // one character
		"abababababababababababababababababab":  false,
		"my-example-value-for-the-server-01234": false,
		"please-changeme-9f8e7d6c5b4a39281706":  false,
		"Zx8kQ2vLp9mW4nRt7yB3cHs6dF1gJ5aE":      true,
		"3f9a1c7e5b2d8f4a6c0e9b7d5f3a1c8e":      true,
	} {
		if err := CheckTokenStrength(tok); (err == nil) != ok {
			t.Errorf("CheckTokenStrength(%q) = %v, want ok=%v", tok, err, ok)
		} else if err != nil && !errors.Is(err, ErrWeakToken) {
			t.Errorf("%q: %v does not wrap ErrWeakToken", tok, err)
		}
	}
	a := newAuthenticator([]string{"one", "two"})
	for header, want := range map[string]bool{"Bearer one": true, "Bearer two": true, "Bearer three": false,
		"bearer one": false, "Bearer ": false, "one": false, "Basic one": false, "Bearer one ": false} {
		tenant, ok := a.check(header)
		if ok != want || (ok && tenant != TenantOf(strings.TrimPrefix(header, "Bearer "))) {
			t.Errorf("check(%q) = %q, %v", header, tenant, ok)
		}
	}
	if TenantOf("one") == TenantOf("two") || len(TenantOf("one")) != 12 {
		t.Fatalf("TenantOf: %q %q", TenantOf("one"), TenantOf("two"))
	}
}

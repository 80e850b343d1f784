package protocol

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestDecodeBase64: a member is taken up to its limit exactly, whatever
// its padding, and refused (ErrInvalid) one byte over, unpadded, with
// bytes outside the alphabet, or when it is not a string.
func TestDecodeBase64(t *testing.T) {
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	for n := 0; n <= 9; n++ { // every padding: n%3 is 0, 1 and 2
		data := []byte(strings.Repeat("x", n))
		got, err := decodeBase64("m", str(base64.StdEncoding.EncodeToString(data)), 9)
		if err != nil || string(got) != string(data) {
			t.Fatalf("%d bytes at limit 9: %q, %v", n, got, err)
		}
	}
	for _, bad := range []json.RawMessage{
		str(base64.StdEncoding.EncodeToString([]byte("0123456789"))), // 10 > 9
		str(base64.StdEncoding.EncodeToString([]byte(strings.Repeat("y", 30)))),
		str(base64.RawStdEncoding.EncodeToString([]byte("ab"))), // no padding
		str("YWJ$"),
		str("YW=j"),
		json.RawMessage(`12`),
		json.RawMessage(`["YWJj"]`),
	} {
		if _, err := decodeBase64("m", bad, 9); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", bad, err)
		}
	}
}

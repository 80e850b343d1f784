package nsinit

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sameAsJSON decodes data with the init's decoder and with
// encoding/json's Decoder, each into a fresh Config, and fails unless
// both fail or both give the same Config.
func sameAsJSON(t *testing.T, data []byte) {
	t.Helper()
	var want, got Config
	jerr := json.NewDecoder(bytes.NewReader(data)).Decode(&want)
	gerr := newConfigDecoder(bytes.NewReader(data)).decode(&got)
	if (jerr == nil) != (gerr == nil) {
		t.Fatalf("%q: encoding/json says %v, the init's decoder %v", data, jerr, gerr)
	}
	if jerr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\n got %#v\nwant %#v", data, got, want)
	}
}

// configCases are JSON the backend does not write but encoding/json
// reads one way or another: the decoders must agree on each.
var configCases = []string{
	`{}`, `null`, ` {"root" : "/r" , "new_net":true}`, "\t\r\n{\n}",
	`{"root":"a","root":"b"}`, `{"ROOT":"a"}`, `{"Root":"a","root":"b"}`, `{"root":"b","Root":"a"}`,
	`{"LAST_CAP":3}`, `{"new_NET":true}`, "{\"\u212aeep\":1,\"\u017fhell\":\"x\"}",
	`{"unknown":{"a":[1,2,{"b":null}],"c":"d"},"root":"r"}`, `{"x":[[[]]],"y":-0.5e+3,"z":true}`,
	`{"root":null}`, `{"args":null}`, `{"args":[]}`, `{"args":["a",null,"c"]}`,
	`{"args":["a","b"],"args":["c"]}`, `{"args":["a","b"],"args":[null]}`, `{"args":["a","b"],"args":["c"],"args":[null,null]}`,
	`{"args":["a"],"args":[]}`, `{"env":["A=1"],"env":null}`,
	`{"caches":[{"src":"/a","dst":"/b"},{"SRC":"/c"}]}`, `{"caches":[{"src":"/a","dst":"/b"}],"caches":[{"dst":"/x"}]}`,
	`{"caches":[null]}`, `{"caches":null}`,
	`{"egress":{"socket":"/s","port":3128,"forward":["127.0.0.1:8080"]}}`, `{"egress":null}`, `{"egress":{"socket":"/s"},"egress":{"port":1}}`,
	`{"tty":{"rows":24,"cols":80}}`, `{"tty":{"rows":65535}}`, `{"tty":{"rows":65536}}`, `{"tty":{"rows":-1}}`,
	`{"last_cap":40}`, `{"last_cap":4.0}`, `{"last_cap":4e1}`, `{"last_cap":-0}`, `{"last_cap":01}`, `{"last_cap":"4"}`,
	`{"file_size":9223372036854775807}`, `{"file_size":9223372036854775808}`, `{"file_size":-9223372036854775808}`,
	`{"nproc":1,"data":2,"pids_limited":true}`, `{"pids_limited":"true"}`, `{"pids_limited":1}`, `{"new_net":nul}`,
	`{"root":"\"\\\/\b\f\n\r\t\u00e9\u2028\ud83d\ude00"}`, `{"root":"\ud800"}`, `{"root":"\udc00x"}`, `{"root":"\ud800\u0041"}`,
	`{"root":"\ud800\ud800\udc00"}`, `{"root":"\ud83d\\"}`, `{"root":"\u12"}`, `{"root":"\x"}`, "{\"root\":\"a\x01\"}",
	"{\"root\":\"\xff\xfe\xe2\x82\"}", "{\"root\":\"\xe2\x82\xac\xf0\x9f\x98\x80\"}", "{\"root\":\"\xed\xa0\x80\"}",
	`{"seccomp":"AAAAAAAAAAA="}`, `{"seccomp":"AAAAAAAAAAAAAAAAAAAAAA=="}`, `{"seccomp":"AAAAAAAAAA=="}`, `{"seccomp":"!!"}`,
	`{"seccomp":null}`, `{"seccomp":[1,2,3,4,5,6,7,8]}`, `{"seccomp":[1,2,3]}`, `{"seccomp":[256,0,0,0,0,0,0,0]}`, `{"seccomp":5}`,
	"{\"seccomp\":\"AAAA\\nAAAAAAA=\"}",
	`{"root":"a"`, `{"root":"a",}`, `{"root" "a"}`, `{root:"a"}`, `{"root":"a"]`, `[]`, `"x"`, `5`, ``, `{"a":tru}`,
	`{"layers":["/l1","/l2"],"mask":["/etc/shadow"],"read_only":["/opt"],"read_write":["/srv"]}`,
}

func TestDecodeConfigCases(t *testing.T) {
	for _, c := range configCases {
		sameAsJSON(t, []byte(c))
	}
}

// randString mixes what encoding/json escapes, coerces or passes through.
func randString(r *rand.Rand) string {
	parts := []string{"/", "a", "Z", "9", " ", "\"", "\\", "<", ">", "&", "\n", "\t", "\x00", "\x1f", "\x7f", "é", "€", "😀", "\u2028", "\xff", "\xe2\x82", "\ufffd", "=", "PATH"}
	var b strings.Builder
	for range r.IntN(12) {
		b.WriteString(parts[r.IntN(len(parts))])
	}
	return b.String()
}

func randStrings(r *rand.Rand) []string {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return []string{}
	}
	s := make([]string, r.IntN(6))
	for i := range s {
		s[i] = randString(r)
	}
	return s
}

func randConfig(r *rand.Rand) Config {
	c := Config{
		Root: randString(r), Workspace: randString(r), Upper: randString(r), Work: randString(r),
		Dir: randString(r), Home: randString(r), Args: randStrings(r), Shell: randString(r),
		Env: randStrings(r), NewNet: r.IntN(2) == 0, ReadOnly: randStrings(r), Mask: randStrings(r),
		ReadWrite: randStrings(r), Hostname: randString(r), LastCap: r.IntN(64) - 1,
		PidsLimited: r.IntN(2) == 0, FileSize: r.Int64() - r.Int64(), NProc: r.Int64N(1 << 20), Data: -r.Int64N(3),
		Layers: randStrings(r), Scratch: randString(r), ScratchBytes: r.Int64(), ScratchInodes: r.Int64N(1 << 30),
	}
	for range r.IntN(3) {
		c.Caches = append(c.Caches, CacheBind{Src: randString(r), Dst: randString(r)})
	}
	if r.IntN(2) == 0 {
		c.Egress = &EgressConfig{Socket: randString(r), CAFile: randString(r), Port: r.IntN(70000), Forward: randStrings(r)}
	}
	if r.IntN(2) == 0 {
		c.TTY = &TTYConfig{Rows: uint16(r.Uint32()), Cols: uint16(r.Uint32())}
	}
	if n := r.IntN(3); n > 0 {
		for range n * 10 {
			c.Seccomp = append(c.Seccomp, unix.SockFilter{Code: uint16(r.Uint32()), Jt: uint8(r.Uint32()), Jf: uint8(r.Uint32()), K: r.Uint32()})
		}
	}
	return c
}

// TestDecodeConfigRandom: configs as the backend writes them (through
// encoding/json) read the same with both decoders, and as what was sent
// where encoding/json keeps it (every string valid UTF-8).
func TestDecodeConfigRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		c := randConfig(r)
		data, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		sameAsJSON(t, data)
	}
}

// TestDecodeConfigStream: the two configs follow each other on the pipe,
// then the control lines; the decoder reads each config without waiting
// for what follows it, and hands on the bytes it read past the second.
func TestDecodeConfigStream(t *testing.T) {
	pr, pw := io.Pipe()
	defer pr.Close()
	d := newConfigDecoder(pr)
	got := make(chan error, 1)
	var static, req Config
	go func() { got <- d.decode(&static) }()
	go pw.Write([]byte(`{"root":"/r\ud800","last_cap":40}`))
	select {
	case err := <-got:
		if err != nil || static.Root != "/r\ufffd" || static.LastCap != 40 {
			t.Fatalf("static config: %+v, %v", static, err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the decoder waited for bytes past the static config")
	}
	go func() { got <- d.decode(&req) }()
	go pw.Write([]byte(`{"args":["true"],"file_size":7}` + "\nresize 24 80\n"))
	if err := <-got; err != nil || len(req.Args) != 1 || req.FileSize != 7 {
		t.Fatalf("request config: %+v, %v", req, err)
	}
	pw.Close()
	rest, err := io.ReadAll(io.MultiReader(d.buffered(), pr))
	if err != nil || string(rest) != "\nresize 24 80\n" {
		t.Fatalf("after the configs: %q, %v", rest, err)
	}
}

func FuzzDecodeConfig(f *testing.F) {
	for _, c := range configCases {
		f.Add([]byte(c))
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		data, _ := json.Marshal(randConfig(r))
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sameAsJSON(t, data)
	})
}

// fill sets every field of v, recursively, to a value that is not zero.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32:
		v.SetUint(7)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0))
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i))
		}
	default:
		panic("fill: no value for a " + v.Kind().String())
	}
}

// TestDecodeConfigEveryField: a field added to Config (or to a type in
// it) that the init's decoder does not know would be dropped silently in
// the init; a config with every field set must come through whole.
func TestDecodeConfigEveryField(t *testing.T) {
	var c Config
	fill(reflect.ValueOf(&c).Elem())
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var got Config
	if err := newConfigDecoder(bytes.NewReader(data)).decode(&got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("decoded %s as\n%#v, want\n%#v", data, got, c)
	}
}

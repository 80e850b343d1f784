package remote

import (
	"archive/tar"
	"errors"
	"io/fs"
	"testing"

	"github.com/pulse-agent/pulse/pathguard"
)

// FuzzParseFrame: any server frame either parses into exactly one known
// kind or is refused as errFrame; it never panics.
func FuzzParseFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"response","payload":{"status":"STARTING","request_id":"r1","execution_id":"e"}}`,
		`{"type":"error","payload":{"message":"NOT_FOUND","request_id":null,"code":"NOT_FOUND"}}`,
		`{"type":"stream","payload":{"execution_id":"e","stream":"stdout","data":"aGk=","seq":3,"encoding":"base64"}}`,
		`{"type":"stream","payload":{"execution_id":"e","stream":"stderr","data":"text"}}`,
		`{"type":"result","payload":{"execution_id":"e","exit_code":0,"termination_reason":"exited","pid":null}}`,
		`{"type":"response","payload":{"status":"CAPABILITIES","capabilities":{"isolation":"namespace","network":{"deny-all":"strong"}}}}`,
		`{"type":"stream","payload":null}`, `[]`, `null`, `{"type":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := parseFrame(data)
		if err != nil {
			if !errors.Is(err, errFrame) {
				t.Fatalf("error %v is not errFrame", err)
			}
			return
		}
		n := 0
		for _, set := range []bool{fr.reply != nil, fr.stream != nil, fr.result != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("frame %q decoded into %d kinds", data, n)
		}
		if fr.stream != nil && (fr.stream.Stream != "stdout" && fr.stream.Stream != "stderr" || fr.stream.Seq < 0) {
			t.Fatalf("accepted stream event %+v", fr.stream)
		}
	})
}

// FuzzUnpackOverlay: whatever the server sends, an accepted overlay only
// holds clean, relative, unreserved paths of known types within limits.
func FuzzUnpackOverlay(f *testing.F) {
	f.Add(overlayArchive(member{name: "a.txt", typ: tar.TypeReg, data: "a"}, member{name: "d/", typ: tar.TypeDir},
		member{name: "l", typ: tar.TypeSymlink, link: "a.txt"}, manifest))
	f.Add(overlayArchive(member{name: "../x", typ: tar.TypeReg, data: "x"}, manifest))
	f.Add(overlayArchive(member{name: manifestName, typ: tar.TypeReg, data: `{"version":1,"deleted":["a","b/c"]}`}))
	f.Add([]byte{0x1f, 0x8b})
	const limit = 1 << 16
	f.Fuzz(func(t *testing.T, data []byte) {
		ov, err := unpackOverlay(data, overlayLimits{bytes: limit, members: 64})
		if err != nil {
			if !errors.Is(err, ErrOverlay) {
				t.Fatalf("error %v is not ErrOverlay", err)
			}
			return
		}
		var total int
		check := func(p string) {
			c, err := cleanMember(p)
			if err != nil || c != p || pathguard.IsReserved(p) {
				t.Fatalf("accepted path %q", p)
			}
		}
		for _, fl := range ov.Files {
			check(fl.Path)
			total += len(fl.Data)
			switch fl.Mode.Type() {
			case 0, fs.ModeDir, fs.ModeSymlink:
			default:
				t.Fatalf("%q has type %v", fl.Path, fl.Mode.Type())
			}
			if fl.Mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
				t.Fatalf("%q has set-id or sticky bits", fl.Path)
			}
		}
		for _, d := range ov.Deleted {
			check(d)
		}
		if total > limit {
			t.Fatalf("accepted %d bytes over the %d limit", total, limit)
		}
	})
}

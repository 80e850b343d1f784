package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestParseCaches(t *testing.T) {
	p, err := Parse([]byte(`caches:
  - {name: go-mod, env: GOMODCACHE}
  - {name: go-build, env: GOCACHE, path: /cache/go-build2, max_bytes: 4GiB}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Cache{{Name: "go-mod", Env: "GOMODCACHE"}, {Name: "go-build", Env: "GOCACHE", Path: "/cache/go-build2", MaxBytes: 4 << 30}}
	if len(p.Caches) != 2 || p.Caches[0] != want[0] || p.Caches[1] != want[1] {
		t.Fatalf("Caches = %+v, want %+v", p.Caches, want)
	}
	if got := p.Caches[0].MountPath(); got != "/cache/go-mod" {
		t.Errorf("default path = %q", got)
	}
}

// TestParseCachesRefuses is the table of what a caches: entry may not be.
func TestParseCachesRefuses(t *testing.T) {
	bad := map[string]string{
		"not a list":        "caches: {name: x}",
		"no name":           "caches: [{env: GOCACHE}]",
		"empty name":        `caches: [{name: ""}]`,
		"upper case":        "caches: [{name: GoMod}]",
		"slash in name":     "caches: [{name: a/b}]",
		"dot dot":           "caches: [{name: ..}]",
		"dot":               `caches: [{name: "."}]`,
		"space":             `caches: [{name: "a b"}]`,
		"long name":         "caches: [{name: " + strings.Repeat("a", 65) + "}]",
		"unknown key":       "caches: [{name: a, size: 1}]",
		"relative path":     "caches: [{name: a, path: cache/a}]",
		"unclean path":      "caches: [{name: a, path: /cache/../etc}]",
		"trailing slash":    "caches: [{name: a, path: /cache/a/}]",
		"root":              "caches: [{name: a, path: /}]",
		"in /work":          "caches: [{name: a, path: /work/x}]",
		"is /work":          "caches: [{name: a, path: /work}]",
		"in /usr":           "caches: [{name: a, path: /usr/local/cache}]",
		"in /etc":           "caches: [{name: a, path: /etc/x}]",
		"in /proc":          "caches: [{name: a, path: /proc/self}]",
		"in /dev":           "caches: [{name: a, path: /dev/shm/x}]",
		"in /tmp":           "caches: [{name: a, path: /tmp/x}]",
		"comma in path":     "caches: [{name: a, path: \"/c/a,ro\"}]",
		"colon in path":     "caches: [{name: a, path: \"/c/a:ro\"}]",
		"bad env":           "caches: [{name: a, env: 1X}]",
		"env with =":        `caches: [{name: a, env: "A=B"}]`,
		"negative size":     "caches: [{name: a, max_bytes: -1}]",
		"bad size":          "caches: [{name: a, max_bytes: lots}]",
		"twice":             "caches: [{name: a}, {name: a}]",
		"same env":          "caches: [{name: a, env: X}, {name: b, env: X}]",
		"nested paths":      "caches: [{name: a, path: /c}, {name: b, path: /c/b}]",
		"default overlaps":  "caches: [{name: a}, {name: b, path: /cache/a/x}]",
		"alias":             "caches: [&x {name: a}, *x]",
		"name not a string": "caches: [{name: [a]}]",
	}
	for name, src := range bad {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(src))
			if !errors.Is(err, ErrInvalid) || p != nil {
				t.Fatalf("Parse(%q) = %v, %v; want ErrInvalid", src, p, err)
			}
		})
	}
}

func FuzzCache(f *testing.F) {
	for _, s := range []string{"go-mod", "a", "..", "/cache/x", "/work/a", "/c/a,b", "A", "/cache/go-build"} {
		f.Add(s, s, "GOCACHE")
	}
	f.Fuzz(func(t *testing.T, name, path, env string) {
		c := Cache{Name: name, Path: path, Env: env}
		if err := c.Validate(); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		// Whatever validates is a plain directory name and a path no
		// mount option or reserved directory can be confused with.
		if strings.ContainsAny(name, "/\x00") || name == ".." || strings.ContainsAny(c.MountPath(), ",:= \x00\n") ||
			PathWithin(c.MountPath(), "/work") || PathWithin(c.MountPath(), "/etc") || strings.Contains(c.MountPath(), "/../") {
			t.Fatalf("accepted %+v", c)
		}
	})
}

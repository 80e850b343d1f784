package policy

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestLimitKeysMatchFields holds LimitKeys to ResourceLimits: one key per
// field, spelt as the field's JSON name, and IsSet sees exactly that field.
func TestLimitKeysMatchFields(t *testing.T) {
	typ := reflect.TypeFor[ResourceLimits]()
	keys := LimitKeys()
	if len(keys) != typ.NumField() {
		t.Fatalf("%d limit keys for %d ResourceLimits fields", len(keys), typ.NumField())
	}
	byName := map[LimitKey]int{}
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		byName[LimitKey(name)] = i
	}
	for _, k := range keys {
		i, ok := byName[k]
		if !ok {
			t.Errorf("limit key %q is no ResourceLimits JSON field", k)
			continue
		}
		var l ResourceLimits
		if l.IsSet(k) {
			t.Errorf("zero limits set %q", k)
		}
		f := reflect.ValueOf(&l).Elem().Field(i)
		if f.CanFloat() {
			f.SetFloat(1)
		} else {
			f.SetInt(1)
		}
		for _, other := range keys {
			if got := l.IsSet(other); got != (other == k) {
				t.Errorf("with only %s set, IsSet(%s) = %v", k, other, got)
			}
		}
	}
	if (ResourceLimits{Pids: 1}).IsSet("bogus") {
		t.Error("an unknown key is set")
	}
}

func TestLimitKeyDefaulted(t *testing.T) {
	d := ResourceLimits{}.WithDefaults()
	for _, k := range LimitKeys() {
		if k.Defaulted() != d.IsSet(k) {
			t.Errorf("%s: Defaulted() = %v, but WithDefaults sets it: %v", k, k.Defaulted(), d.IsSet(k))
		}
	}
}

// TestDefaultsFillOnlyZero: the defaults replace a zero field and keep
// any other value, including a negative one.
func TestDefaultsFillOnlyZero(t *testing.T) {
	if got, want := (ResourceLimits{}).WithDefaults(), (ResourceLimits{Timeout: DefaultTimeout, OutputBytes: DefaultOutputBytes}); got != want {
		t.Errorf("WithDefaults of zero = %+v, want %+v", got, want)
	}
	if got, want := (ResourceLimits{}).WithIsolationDefaults(), (ResourceLimits{Pids: DefaultPids, MemoryBytes: DefaultMemoryBytes}); got != want {
		t.Errorf("WithIsolationDefaults of zero = %+v, want %+v", got, want)
	}
	set := ResourceLimits{Timeout: time.Second, MemoryBytes: -1, Pids: 3, OutputBytes: 5}
	if got := set.WithDefaults().WithIsolationDefaults(); got != set {
		t.Errorf("defaults changed set limits: %+v, want %+v", got, set)
	}
}

// TestDiskDefault: the default bound on a command's writes is the smaller
// of DefaultDiskBytes and a share of the free space, so that it cannot
// fill a nearly full disk; unknown free space leaves DefaultDiskBytes.
func TestDiskDefault(t *testing.T) {
	for _, c := range []struct{ free, want int64 }{
		{-1, DefaultDiskBytes},
		{1 << 40, DefaultDiskBytes},
		{2 << 30, 1 << 30},
		{0, 0},
	} {
		if got := DiskDefault(c.free); got != c.want {
			t.Errorf("DiskDefault(%d) = %d, want %d", c.free, got, c.want)
		}
	}
}

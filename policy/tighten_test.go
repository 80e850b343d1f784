package policy

import (
	"errors"
	"testing"
	"time"
)

func TestTightenTakesTheSmallerOfEachField(t *testing.T) {
	ceil := ResourceLimits{Timeout: 5 * time.Minute, MemoryBytes: 256 << 20, Pids: 32, OutputBytes: 1 << 20}
	cases := []struct {
		name string
		req  ResourceLimits
		want ResourceLimits
		bad  []LimitKey // fields refused
	}{
		{"nothing asked keeps the ceiling", ResourceLimits{}, ceil, nil},
		{"a shorter timeout keeps pids and memory",
			ResourceLimits{Timeout: time.Minute},
			ResourceLimits{Timeout: time.Minute, MemoryBytes: 256 << 20, Pids: 32, OutputBytes: 1 << 20}, nil},
		{"equal is allowed", ResourceLimits{Pids: 32}, ceil, nil},
		{"an unlimited field may be set",
			ResourceLimits{CPUs: 1.5, FileSizeBytes: 4096},
			ResourceLimits{Timeout: 5 * time.Minute, MemoryBytes: 256 << 20, Pids: 32, OutputBytes: 1 << 20, CPUs: 1.5, FileSizeBytes: 4096}, nil},
		{"more pids is refused", ResourceLimits{Pids: 100}, ceil, []LimitKey{LimitPids}},
		{"each field over is named",
			ResourceLimits{Timeout: time.Hour, MemoryBytes: 1 << 30, Pids: 8}, ceil, []LimitKey{LimitTimeout, LimitMemoryBytes}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ceil.Tighten(c.req)
			if len(c.bad) == 0 {
				if err != nil || got != c.want {
					t.Fatalf("Tighten = %+v, %v; want %+v", got, err, c.want)
				}
				return
			}
			if !errors.Is(err, ErrLimitExceeded) {
				t.Fatalf("err = %v, want ErrLimitExceeded", err)
			}
			if got != ceil {
				t.Fatalf("a refused request returned %+v, want the ceiling back", got)
			}
			var fields []LimitKey
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var le *LimitError
				if !errors.As(e, &le) {
					t.Fatalf("%v is not a *LimitError", e)
				}
				fields = append(fields, le.Field)
			}
			if len(fields) != len(c.bad) {
				t.Fatalf("refused %v, want %v", fields, c.bad)
			}
			for i := range fields {
				if fields[i] != c.bad[i] {
					t.Fatalf("refused %v, want %v", fields, c.bad)
				}
			}
		})
	}
}

func TestTightenRefusesMalformedRequests(t *testing.T) {
	if _, err := (ResourceLimits{}).Tighten(ResourceLimits{Pids: -1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
}

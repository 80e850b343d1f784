package host

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// The tag trees are named by is this process's pid and start time, as
// reconcileTrees reads them back: read once, the same every time.
func TestSelfTagIsOwnerTag(t *testing.T) {
	want := ownerTag(os.Getpid())
	if strings.HasSuffix(want, "-") {
		t.Fatalf("ownerTag(self) = %q: no start time", want)
	}
	for range 3 {
		if got := selfTag(); got != want {
			t.Fatalf("selfTag() = %q, want %q", got, want)
		}
	}
	pid, start, _ := strings.Cut(want, "-")
	if pid != strconv.Itoa(os.Getpid()) || procStart(os.Getpid()) != start {
		t.Errorf("tag %q: pid %s start %s", want, pid, start)
	}
}

package worker

import "time"

// SetAttachQuiet sets how long an unrefused stream waits before "attached"
// is logged without a relay frame, and returns the restore function.
func SetAttachQuiet(d time.Duration) (restore func()) {
	old := attachQuiet
	attachQuiet = d
	return func() { attachQuiet = old }
}

package sandbox

// Every string the facade hands back — Result fields, returned errors,
// passed-over reasons, transaction descriptions — passes the sandbox's
// scrubber first: a secret in a command line, a path or a backend's error
// message must not reach the caller (or a log the caller writes) any more
// than it may reach the audit log.

// scrubbedError is an error whose message has been redacted. It unwraps
// to the original, so that errors.Is and errors.As keep working; only
// Error() is rewritten.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrubErr returns err with its message redacted, or err itself when the
// message holds no configured secret.
func (s *Sandbox) scrubErr(err error) error {
	if err == nil || s.scrubber == nil {
		return err
	}
	msg := err.Error()
	if red := s.scrubber.Redact(msg); red != msg {
		return &scrubbedError{msg: red, err: err}
	}
	return err
}

// scrubAll redacts every string of list in place and returns it.
func (s *Sandbox) scrubAll(list []string) []string {
	for i, v := range list {
		list[i] = s.scrubber.Redact(v)
	}
	return list
}

// scrubResult redacts the strings of res that may carry a caller's or a
// command's data. Stdout and Stderr were scrubbed as they streamed.
func (s *Sandbox) scrubResult(res *Result) {
	if res == nil {
		return
	}
	r := s.scrubber.Redact
	res.ExecutionID = r(res.ExecutionID)
	res.Command = r(res.Command)
	res.Staged = s.scrubAll(res.Staged)
	res.Committed = s.scrubAll(res.Committed)
	res.RunsOnHost = s.scrubAll(res.RunsOnHost)
	res.NetworkRefused = s.scrubAll(res.NetworkRefused)
	for i := range res.NetworkRefusals {
		res.NetworkRefusals[i].Destination = r(res.NetworkRefusals[i].Destination)
		res.NetworkRefusals[i].Reason = r(res.NetworkRefusals[i].Reason)
	}
	res.Changed = s.scrubAll(res.Changed)
	res.Deleted = s.scrubAll(res.Deleted)
	for i := range res.Refused {
		res.Refused[i].Path = r(res.Refused[i].Path)
		res.Refused[i].Reason = r(res.Refused[i].Reason)
	}
	res.CommitErr = s.scrubErr(res.CommitErr)
}

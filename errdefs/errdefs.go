// Package errdefs holds the error classes every layer of pulse shares, as
// containerd's errdefs does: a caller tests an error with errors.Is
// against a class here (or against a package's name for it, which is the
// same value or one of the class), whichever layer returned it. It
// imports nothing of the module, so every package may import it.
//
// A package names its own errors with New, keeping its message and
// joining a class:
//
//	var ErrClosed = errdefs.New("cowfs: closed", errdefs.ErrClosed)
//
// and errors.Is(err, errdefs.ErrClosed) then holds for cowfs's, the
// backend's, the audit logger's and the sandbox's alike. Classes cross
// the pulse-server wire as codes in one place, package protocol
// (CodeOf, ErrorOf).
package errdefs

import "errors"

// The classes. Their messages are short because they end a chain that
// says what was tried ("remote: dial ...: unavailable").
var (
	// ErrNotFound: what was named does not exist (a transaction, a
	// cache, an execution).
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a name to create is taken.
	ErrAlreadyExists = errors.New("already exists")
	// ErrConflict: the state changed under the operation (a file
	// changed since it was staged); retrying on the new state may work.
	ErrConflict = errors.New("conflict")
	// ErrInvalidArgument: the request is malformed; nothing was done.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUnavailable: what would do the work cannot now (no engine, a
	// server unreachable); another time or another backend may.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnsupported: what would do the work cannot do this at all.
	ErrUnsupported = errors.New("unsupported")
	// ErrClosed: used after Close.
	ErrClosed = errors.New("closed")
	// ErrLimit: over a configured bound (size, count, a policy's limit).
	ErrLimit = errors.New("over a limit")
	// ErrDataLoss: stored state is damaged, or results were lost.
	ErrDataLoss = errors.New("data lost or damaged")
)

// New returns an error with message msg that is of class: errors.Is
// holds for it and class (and for anything wrapping it). A package names
// its own sentinels with it, so its messages stay its own.
func New(msg string, class error) error { return &classed{msg: msg, class: class} }

type classed struct {
	msg   string
	class error
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }

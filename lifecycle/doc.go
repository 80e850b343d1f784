// Package lifecycle is the state machine of one sandbox execution.
//
// An Execution starts in Created and moves only along the transition table
// below; any other move is refused with an error wrapping
// ErrInvalidTransition that names both states, and changes nothing.
//
//	Created           -> Starting, Failed, Cleaning
//	Starting          -> Running, Failed, Cleaning
//	Running           -> Completing, Stopping, Failed
//	Stopping          -> Failed, Cleaning
//	Completing        -> Cleaning, Failed
//	Failed            -> Cleaning
//	Cleaning          -> Finalized, RecoveryRequired
//	Finalized         (terminal)
//	RecoveryRequired  (terminal; needs an operator)
//
// Moving a terminal execution to Failed is a no-op that returns nil, so
// that error paths may report a failure without first checking whether the
// execution already ended; nothing is recorded and no hook runs.
//
// Every transition is appended to the history with its time, and the hook
// given with WithHook (the facade wires it to the audit log; this package
// does not import audit) is called once per transition, in order. An
// Execution is safe for concurrent use. It serialises to the JSON the
// Python implementation wrote: execution_id, state, created_at (Unix
// seconds as a number) and history as [seconds, state] pairs; decoding
// checks that the history follows the table and ends in the state.
package lifecycle

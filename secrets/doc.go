// Package secrets keeps secret values out of what a sandboxed command
// shows: its output, the files it stages and the audit log.
//
// A Scrubber replaces every configured value, and by default its base64,
// hex and URL-encoded forms, with "[REDACTED]" (or "[REDACTED:name]" for
// named secrets). Matching is leftmost-longest over all forms at once, with
// an Aho-Corasick automaton behind a skip filter, so the cost does not grow
// with the number of secrets. Values shorter than MinSecretLen bytes are
// refused, never skipped silently. Optional detectors find well-known
// credential shapes nobody configured (PEM private keys, AWS key ids,
// GitHub tokens, JWTs).
//
// Promises:
//   - Redact, RedactBytes, Contains and NewWriter agree: the output of a
//     Writer is byte for byte Redact of everything written to it, however
//     the input was split into Write calls.
//   - A Writer holds back at most HoldBack() bytes (the longest form minus
//     one, without detectors) and writes them on Close.
//   - A Scrubber is immutable and safe for concurrent use; a nil *Scrubber
//     redacts nothing.
//
// Cost: the automaton is a dense table, about 90 KiB per secret of 16 to
// 48 bytes with its encoded forms (7 MiB and some 40 ms to build for 100
// such secrets); scanning text where no secret occurs runs above 1 GB/s.
//
// Limits, by design: a secret is matched byte for byte, so it is not found
// when it is printed in pieces (one character per line), in base64 wrapped
// across lines, with lower-case percent-escapes (%2f) or otherwise
// transformed. Detectors and literal secrets run in two passes, literal
// first, so that a configured secret keeps its name.
//
// The package also holds the vocabulary of which secrets a command may
// see: Mode and Policy. How strongly a backend enforces a mode is a
// policy.EnforcementLevel, shared with the network modes and limits.
package secrets

package capture

import "embed"

// Source is this package's own source. The programs that run inside a
// box hash it into their identities (package srchash): a program built
// with other code here must not pass for this build's.
//
//go:embed *.go
var Source embed.FS

// Package docs holds Pulse's documentation pages (the Markdown files beside
// this one). It has no code: its tests check the pages against the tree —
// every relative link and #anchor of README.md, CHANGELOG.md, docs/*.md and
// the reference pages beside the code (audit/SCHEMA.md, protocol/PROTOCOL.md,
// the commands' READMEs) resolves, every ```go block builds against the
// current packages, every ```yaml block is a policy file that policy.Parse
// accepts, policy.md names every key of the policy file, and the README
// stays a short front door whose first block runs (cmd/pulse checks that
// one). The generated sections of cli.md are checked by the commands' own
// tests (TestCLIReferenceIsCurrent, TestFlagReferenceIsCurrent); `make docs`
// rewrites them.
package docs

// Package docs holds Pulse's documentation pages (the Markdown files beside
// this one). It has no code: its tests check the pages against the tree —
// every relative link and #anchor of README.md, CHANGELOG.md, docs/*.md
// and the reference pages beside the code (audit/SCHEMA.md,
// protocol/PROTOCOL.md, the commands' READMEs) resolves, every ```go block builds against the current packages, and
// every ```yaml block is a policy file that policy.Parse accepts. The CLI
// reference (cli.md) is checked by cmd/pulse's TestCLIReferenceIsCurrent.
package docs

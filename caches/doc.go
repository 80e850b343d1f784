// Package caches keeps the host side of the named caches a policy declares
// (policy.Cache): one directory per name under Root, created on first use,
// shared by every command and sandbox of the user, measured, trimmed to a
// size cap and pruned.
//
// Nothing in a cache is reviewed or transactional: a command writes there
// directly. The facade audits each command that mounts one. Trim removes
// the least recently modified files first, so a cache over its cap keeps
// what the latest builds wrote; tools that use these caches (go, npm, pip)
// treat a missing entry as a miss.
package caches

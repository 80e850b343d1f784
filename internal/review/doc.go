// Package review serves the local review page of `pulse review`: the
// pending transactions of a workspace with their diffs, per-file accept
// and reject, Commit, Discard and Undo, and the audit timeline with the
// chain's status, updated live (server-sent events) when a command in any
// process stages a transaction.
//
// Promises:
//   - It serves on a loopback address only (ErrNotLoopback), and refuses a
//     request whose Host is not that address (DNS rebinding, 403).
//   - Every request, the page itself and its script included, needs the
//     token (401 without): in the query of the first visit, which sets it
//     as an HttpOnly, SameSite=Strict cookie and redirects to a clean URL,
//     or as a Bearer header.
//   - A state change (POST) also needs the page's own Origin, a JSON body
//     and, when the browser sends it, Sec-Fetch-Site same-origin (CSRF,
//     403). The page is served with a Content-Security-Policy that allows
//     only its own script and style, and builds everything from text
//     (textContent), so a file's content cannot run in the page.
//   - Every decision goes through sandbox.Review, the facade's one audited
//     path, recorded with the OS user and the page's session. Nothing the
//     page can reach touches anything outside the workspace: transaction
//     ids and paths are checked by cowfs, and the assets are embedded.
//
// The combined diff is the transactions' diffs one after another, oldest
// first, not a merged net diff.
package review

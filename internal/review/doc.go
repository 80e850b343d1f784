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
//     token (401 without). The API takes it only as a Bearer header: the
//     first visit carries it in the query and is redirected to a URL whose
//     fragment holds it, which the script moves into the tab's
//     sessionStorage and out of the address bar. That visit also sets an
//     HttpOnly, SameSite=Strict cookie so that a reload shows the page, but
//     the cookie is a key of its own that opens the page's HTML, script
//     and style only: a browser sends the cookies of 127.0.0.1 to every
//     port of it, so any other local server the browser visits gets them.
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
// The pending stack: a transaction that shares paths with another pending
// one cannot be committed or discarded alone (cowfs.StackError); the
// state names, per transaction, the ones it depends on, and the page
// explains that instead of sending a request that would be refused. Commit
// all commits the whole stack, or its ticked files (the stack is squashed
// first, then the ticked paths of the squash committed), as one commit;
// Squash and Discard all act on the stack as the CLI's --all does.
//
// What the page shows is what a program reads: control characters are
// escaped, and the Unicode direction controls (internal/bidi, the set the
// terminal escapes) are shown as markers (⟨U+202E⟩) and flag their file,
// as does a change of an existing entry's permission bits.
//
// The combined diff is the whole stack against the workspace (what Commit
// all would change); each transaction's diff is against the stack below it.
package review

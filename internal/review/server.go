package review

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/internal/bidi"
	"github.com/pulse-agent/pulse/internal/fsmode"
	"github.com/pulse-agent/pulse/internal/randhex"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
)

//go:embed assets
var assets embed.FS

// Errors New returns; test with errors.Is.
var (
	// ErrNotLoopback: the listener is not on a loopback address. The page
	// can commit to the workspace; it is never served beyond this machine.
	ErrNotLoopback = errors.New("review: the page listens on loopback only")
)

// cookieName lets a reload show the page (its HTML, script and style)
// without the token in the address bar. A browser sends a host's cookies
// to every port of it, so this one reaches any other server on 127.0.0.1
// the browser visits: its value is a key of its own (pageKey), never the
// token, and it opens nothing of the API.
const cookieName = "pulse_review"

// tokenFragment is where the token visit's redirect puts the token: a
// fragment is never sent to a server; the script keeps it in the tab's
// sessionStorage (per origin, port included) and sends it as a Bearer
// header with every API request.
const tokenFragment = "#token="

// Config is what a Server serves.
type Config struct {
	// Review is the workspace's audited review path; every decision the
	// page makes goes through it. Required.
	Review *sandbox.Review
	// Token is the secret every request must carry; empty: a random one.
	Token string
	// AuditKey verifies the audit chain for the timeline (nil: unkeyed).
	AuditKey *audit.Key
	// Poll is how often the page's live updates look for a change (the
	// staged state is shared with other processes, so it is polled).
	// Zero: 300ms.
	Poll time.Duration
	// Logger reports request failures; nil discards.
	Logger *slog.Logger
}

// Server is the review page of one workspace.
type Server struct {
	cfg   Config
	token string
	// pageKey is the cookie's value: it opens the page's static shell only.
	pageKey string
	log     *slog.Logger

	mu    sync.Mutex
	hosts map[string]bool // Host headers accepted (DNS rebinding)
	// conflicts remembers the last refused commit of each transaction,
	// so the page can show what changed.
	conflicts map[string]conflictView
}

// New makes a Server; Serve starts it.
func New(cfg Config) (*Server, error) {
	if cfg.Review == nil {
		return nil, errors.New("review: Config.Review is required")
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 300 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	tok := cfg.Token
	if tok == "" {
		var err error
		if tok, err = NewToken(); err != nil {
			return nil, err
		}
	}
	return &Server{cfg: cfg, token: tok, pageKey: randhex.String(24), log: cfg.Logger, hosts: map[string]bool{},
		conflicts: map[string]conflictView{}}, nil
}

// NewToken makes a random access token (192 bits, hex).
func NewToken() (string, error) {
	return randhex.String(24), nil
}

// Token is the secret the page's URL carries.
func (s *Server) Token() string { return s.token }

// SessionID names this page session in the audit log, without revealing
// the token.
func SessionID(token string) string {
	h := sha256.Sum256([]byte("pulse review session\x00" + token))
	return "review-" + hex.EncodeToString(h[:6])
}

// URL is where a person opens the page: the token rides in the query
// once and is then kept by the page's script in the tab.
func URL(ln net.Listener, token string) string {
	return "http://" + ln.Addr().String() + "/?token=" + token
}

// Serve serves the page on ln until ctx ends. ln must be on a loopback
// address (ErrNotLoopback).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ta, ok := ln.Addr().(*net.TCPAddr)
	if !ok || !ta.IP.IsLoopback() {
		return fmt.Errorf("%w: %s", ErrNotLoopback, ln.Addr())
	}
	port := strconv.Itoa(ta.Port)
	s.mu.Lock()
	for _, h := range []string{"127.0.0.1", "localhost", "[::1]", ta.IP.String()} {
		s.hosts[h+":"+port] = true
	}
	if ta.IP.To4() == nil {
		s.hosts["["+ta.IP.String()+"]:"+port] = true
	}
	s.mu.Unlock()
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	// Serve returns only once every handler has returned, so a caller that
	// closes the Review after Serve cannot pull it from under a live
	// event stream (handlers see ctx end through BaseContext).
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-stopped
	return nil
}

// Handler is the page and its API, every route behind the token.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "assets")
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("token") {
			// Keep the token out of the history, and out of every cookie: the
			// script takes it from the fragment and clears the address bar.
			http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.pageKey, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			http.Redirect(w, r, "/"+tokenFragment+s.token, http.StatusSeeOther)
			return
		}
		serveAsset(w, static, "index.html", "text/html; charset=utf-8")
	})
	mux.HandleFunc("GET /app.js", func(w http.ResponseWriter, r *http.Request) {
		serveAsset(w, static, "app.js", "text/javascript; charset=utf-8")
	})
	mux.HandleFunc("GET /app.css", func(w http.ResponseWriter, r *http.Request) {
		serveAsset(w, static, "app.css", "text/css; charset=utf-8")
	})
	mux.HandleFunc("GET /api/state", s.handleState)
	mux.HandleFunc("GET /api/events", s.handleEvents)
	mux.HandleFunc("POST /api/commit", s.handleCommit)
	mux.HandleFunc("POST /api/discard", s.handleDiscard)
	mux.HandleFunc("POST /api/undo", s.handleUndo)
	mux.HandleFunc("POST /api/commit-all", s.handleCommitAll)
	mux.HandleFunc("POST /api/squash", s.handleSquash)
	mux.HandleFunc("POST /api/discard-all", s.handleDiscardAll)
	return s.guard(mux)
}

func serveAsset(w http.ResponseWriter, static fs.FS, name, ctype string) {
	b, err := fs.ReadFile(static, name)
	if err != nil {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.Write(b)
}

// guard refuses, before any route runs: a Host that is not this server's
// loopback address (DNS rebinding), a request without the token (401),
// and a state change that is not from the page's own origin (CSRF, 403).
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		s.mu.Lock()
		hostOK := s.hosts[r.Host]
		s.mu.Unlock()
		if !hostOK {
			http.Error(w, "forbidden: unexpected Host", http.StatusForbidden)
			return
		}
		if !s.authorized(r) {
			http.Error(w, "unauthorized: open the URL pulse review printed", http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if o := r.Header.Get("Origin"); o == "" || !s.hosts[strings.TrimPrefix(o, "http://")] || !strings.HasPrefix(o, "http://") {
				http.Error(w, "forbidden: cross-origin request", http.StatusForbidden)
				return
			}
			if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				http.Error(w, "forbidden: want application/json", http.StatusForbidden)
				return
			}
			if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
				http.Error(w, "forbidden: cross-site request", http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// authorized: the token as a Bearer header opens everything; the page's
// static shell (/, /app.js, /app.css) also opens with the page cookie or,
// for /, the token in the query. The API never opens with a cookie: a
// browser sends cookies to every port of 127.0.0.1, so what one carries is
// known to any local server the browser visits.
func (s *Server) authorized(r *http.Request) bool {
	if a, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return equalSecret(a, s.token)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	switch r.URL.Path {
	case "/":
		if r.URL.Query().Has("token") {
			return equalSecret(r.URL.Query().Get("token"), s.token)
		}
	case "/app.js", "/app.css":
	default:
		return false
	}
	c, err := r.Cookie(cookieName)
	return err == nil && equalSecret(c.Value, s.pageKey)
}

func equalSecret(got, want string) bool {
	return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// --- state -----------------------------------------------------------------

type fileView struct {
	Path    string `json:"path"`
	Kind    string `json:"kind"`
	Size    int64  `json:"size"`
	New     bool   `json:"new"`
	Binary  bool   `json:"binary"`
	OnHost  string `json:"runs_on_host,omitempty"`
	SHA256  string `json:"sha256,omitempty"`
	Diff    string `json:"diff"`
	Implied bool   `json:"implicit,omitempty"`
	// OldMode and Mode are set (octal, "0644") when the change replaces
	// a file or directory the workspace has and changes its permission
	// bits; Widened says who may now write it that could not before.
	OldMode string `json:"old_mode,omitempty"`
	Mode    string `json:"mode,omitempty"`
	Widened string `json:"widened,omitempty"`
	// Bidi is set when the path or its diff holds a bidirectional
	// formatting character (internal/bidi): what the page shows of them
	// is not what a program reads, so the page marks each and flags the
	// file.
	Bidi bool `json:"bidi,omitempty"`
}

type conflictView struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

type txView struct {
	ID          string        `json:"id"`
	Description string        `json:"description"`
	Created     time.Time     `json:"created"`
	Files       []fileView    `json:"files"`
	Diff        string        `json:"diff"`
	Conflict    *conflictView `json:"conflict,omitempty"`
	// CommitDeps and DiscardDeps say why this transaction cannot be
	// committed or discarded alone: the pending transactions that change
	// the same paths (cowfs.StackError). The page explains them instead
	// of sending a request that would be refused.
	CommitDeps  *depView `json:"commit_depends,omitempty"`
	DiscardDeps *depView `json:"discard_depends,omitempty"`
}

// depView is a cowfs.StackError for the page.
type depView struct {
	On      []string `json:"on"`
	Path    string   `json:"path"`
	Explain string   `json:"explain"`
}

// deps turns a stack refusal into what the page shows; nil when err is
// none.
func deps(err error) *depView {
	var se *cowfs.StackError
	if !errors.As(err, &se) {
		return nil
	}
	d := &depView{On: se.Others, Path: se.Path}
	on := strings.Join(se.Others, ", ")
	if se.Op == "discard" {
		d.Explain = fmt.Sprintf("Transaction %s cannot be discarded alone: pending transaction(s) %s were made on top of it and also change %q. Discard those first, or Discard all.", se.ID, on, se.Path)
	} else {
		d.Explain = fmt.Sprintf("Transaction %s cannot be committed alone: it depends on pending transaction(s) %s, which also change %q. Commit all commits the whole stack as one commit; Squash merges it into one transaction.", se.ID, on, se.Path)
	}
	return d
}

type eventView struct {
	Seq      uint64    `json:"seq"`
	Time     time.Time `json:"time"`
	Action   string    `json:"action"`
	Target   string    `json:"target,omitempty"`
	Decision string    `json:"decision,omitempty"`
	Actor    string    `json:"actor,omitempty"`
	Via      string    `json:"via,omitempty"`
	TxID     string    `json:"tx_id,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

type chainView struct {
	Status  string `json:"status"` // verified, broken, unverifiable (keyed, no key), empty
	BadSeq  uint64 `json:"bad_seq,omitempty"`
	Message string `json:"message,omitempty"`
	Events  int    `json:"events"`
	Keyed   bool   `json:"keyed"`
}

type stateView struct {
	Workspace string   `json:"workspace"`
	Session   string   `json:"session"`
	Pending   []txView `json:"pending"`
	// Combined is the whole pending stack against the workspace: what
	// committing everything would change.
	Combined string      `json:"combined"`
	Undoable bool        `json:"undoable"`
	Chain    chainView   `json:"chain"`
	Timeline []eventView `json:"timeline"`
}

// timelineLen is how many of the newest audit events the page shows.
const timelineLen = 200

func (s *Server) state(ctx context.Context) (stateView, error) {
	r := s.cfg.Review
	st := stateView{Workspace: r.FS().Workspace(), Session: SessionID(s.token), Pending: []txView{}}
	pend, err := r.Pending(ctx)
	if err != nil {
		return st, err
	}
	// Each transaction is shown against the stack below it (what its
	// command changed in what it saw), and the stack as a whole against
	// the workspace; without a readable stack, each against the workspace.
	stk, err := r.FS().Stack(ctx)
	if err != nil {
		stk = nil
	} else if st.Combined, err = stk.Diff(); err != nil {
		return st, err
	}
	for _, info := range pend {
		tx, err := r.FS().Tx(ctx, info.ID)
		if err != nil {
			continue // committed or discarded meanwhile
		}
		var d string
		if stk != nil {
			d, err = stk.TxDiff(info.ID)
		}
		if stk == nil || err != nil {
			d, err = tx.Diff(ctx)
		}
		if err != nil {
			return st, err
		}
		tv := txView{ID: info.ID, Description: info.Description, Created: info.Created, Diff: d, Files: []fileView{}}
		if stk != nil {
			tv.CommitDeps, tv.DiscardDeps = deps(stk.CheckCommit(info.ID)), deps(stk.CheckDiscard(info.ID))
		}
		blocks := splitDiff(d)
		hashes := tx.ContentHashes()
		for _, c := range tx.Changes() {
			fv := fileView{Path: c.Path, Kind: string(c.Kind), Size: c.Size, New: c.New, SHA256: hashes[c.Path],
				OnHost: RunsOnHost(c.Path), Implied: c.Implicit, Diff: blocks[c.Path]}
			fv.Binary = strings.Contains(fv.Diff, "\nBinary files ") || strings.HasPrefix(fv.Diff, "Binary files ")
			if c.ModeChanged {
				om, nm := fsmode.ToUnix(c.OldMode), fsmode.ToUnix(c.Mode)
				fv.OldMode, fv.Mode = fmt.Sprintf("%04o", om), fmt.Sprintf("%04o", nm)
				switch nm &^ om & 0o022 {
				case 0o022:
					fv.Widened = "group and others"
				case 0o020:
					fv.Widened = "group"
				case 0o002:
					fv.Widened = "others"
				}
			}
			fv.Bidi = bidi.Contains(c.Path) || bidi.Contains(fv.Diff)
			tv.Files = append(tv.Files, fv)
		}
		s.mu.Lock()
		if c, ok := s.conflicts[info.ID]; ok {
			tv.Conflict = &c
		}
		s.mu.Unlock()
		st.Pending = append(st.Pending, tv)
	}
	all, err := r.FS().List(ctx)
	if err != nil {
		return st, err
	}
	for _, i := range all {
		if i.State == cowfs.StateCommitted {
			st.Undoable = true
		}
	}
	st.Chain, st.Timeline = s.chain(ctx, r.AuditPath())
	return st, nil
}

// chain verifies the audit log and reads its newest events.
func (s *Server) chain(ctx context.Context, path string) (chainView, []eventView) {
	var opts []audit.VerifyOption
	if s.cfg.AuditKey != nil {
		opts = append(opts, audit.VerifyKey(s.cfg.AuditKey))
	}
	rep, err := audit.Verify(ctx, path, opts...)
	cv := chainView{Status: "verified", Events: rep.Events, Keyed: rep.KeyID != ""}
	switch {
	case err == nil && rep.Events == 0:
		cv.Status = "empty"
	case errors.Is(err, audit.ErrKeyRequired):
		cv.Status, cv.BadSeq, cv.Message = "unverifiable", rep.BadSeq, err.Error()
	case err != nil && rep.Events == 0 && rep.BadSeq == 0:
		cv.Status, cv.Message = "empty", err.Error()
	case err != nil:
		cv.Status, cv.BadSeq, cv.Message = "broken", rep.BadSeq, err.Error()
	}
	tl := []eventView{}
	f, err := os.Open(path)
	if err != nil {
		return cv, tl
	}
	defer f.Close()
	st, _ := f.Stat()
	const window = 512 << 10
	off := int64(0)
	if st != nil && st.Size() > window {
		off = st.Size() - window
	}
	f.Seek(off, io.SeekStart)
	br := bufio.NewReaderSize(f, 64<<10)
	if off > 0 {
		br.ReadBytes('\n') // a partial first line
	}
	for {
		line, rerr := br.ReadBytes('\n')
		if e, err := audit.ParseLine(line); err == nil {
			tl = append(tl, eventView{Seq: e.Seq, Time: e.Time, Action: e.Action, Target: e.Target, Decision: e.Decision,
				Actor: e.Actor, Via: e.Via, TxID: e.TxID, Reason: e.Reason, Detail: e.Detail})
		}
		if rerr != nil {
			break
		}
	}
	if len(tl) > timelineLen {
		tl = tl[len(tl)-timelineLen:]
	}
	// Newest first.
	for i, j := 0, len(tl)-1; i < j; i, j = i+1, j-1 {
		tl[i], tl[j] = tl[j], tl[i]
	}
	return cv, tl
}

// splitDiff cuts a git-style diff into its per-file parts, by path.
func splitDiff(d string) map[string]string {
	out := map[string]string{}
	var cur strings.Builder
	name := ""
	flush := func() {
		if name != "" {
			out[name] = cur.String()
		}
		cur.Reset()
	}
	for _, l := range strings.SplitAfter(d, "\n") {
		if strings.HasPrefix(l, "diff --git ") {
			flush()
			name = diffPath(strings.TrimSuffix(l, "\n"))
		} else if p, ok := dirModePath(l); ok {
			// A directory's mode line is a block of its own, not the
			// tail of the file before it.
			flush()
			name = p
		}
		cur.WriteString(l)
	}
	flush()
	return out
}

// dirModePath takes the path out of a directory's mode line,
// `directory "P": old mode 040755, new mode 040777` (P always quoted).
func dirModePath(l string) (string, bool) {
	rest, ok := strings.CutPrefix(l, "directory ")
	if !ok {
		return "", false
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil || !strings.HasPrefix(rest[len(q):], ": old mode ") {
		return "", false
	}
	p, err := strconv.Unquote(q)
	return p, err == nil
}

// diffPath takes the path out of a "diff --git a/P b/P" header (P quoted
// as git quotes unusual names).
func diffPath(h string) string {
	rest := strings.TrimPrefix(h, "diff --git ")
	if strings.HasPrefix(rest, `"`) {
		if q, err := strconv.QuotedPrefix(rest); err == nil {
			if u, err := strconv.Unquote(q); err == nil {
				return strings.TrimPrefix(u, "a/")
			}
		}
	}
	// Unquoted: "a/P b/P" with both halves equal.
	if n := len(rest); n%2 == 1 {
		half := rest[:n/2]
		if rest[n/2] == ' ' && strings.TrimPrefix(half, "a/") == strings.TrimPrefix(rest[n/2+1:], "b/") {
			return strings.TrimPrefix(half, "a/")
		}
	}
	return strings.TrimPrefix(strings.SplitN(rest, " ", 2)[0], "a/")
}

// RunsOnHost says why a path, once committed, runs code on the host the
// next time git (or a shell tool) is used there — or "" when it does not.
// The git paths are policy.RunsOnHost's, which the facade refuses to
// commit without a person; the rest are flagged for the reader only.
func RunsOnHost(p string) string {
	if policy.RunsOnHost(p) {
		if strings.Contains(strings.ToLower(p), "hooks") {
			return "git hook: runs on the next git command on the host"
		}
		return "git directory or configuration: git on the host reads it as instructions (core.fsmonitor, core.hooksPath, filters, aliases, another gitdir)"
	}
	switch path.Base(p) {
	case ".gitattributes", ".gitmodules":
		return "names filters and submodules that git on the host may run"
	case ".envrc":
		return "direnv runs it on entering the directory"
	}
	return ""
}

func (s *Server) handleState(w http.ResponseWriter, r *http.Request) {
	st, err := s.state(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// fingerprint changes whenever the staged state or the audit log does.
func (s *Server) fingerprint(ctx context.Context) string {
	r := s.cfg.Review
	var b strings.Builder
	if all, err := r.FS().List(ctx); err == nil {
		for _, i := range all {
			fmt.Fprintf(&b, "%s %s %d %d %d;", i.ID, i.State, i.Changes, i.Whiteouts, i.Bytes)
		}
	}
	if st, err := os.Stat(r.AuditPath()); err == nil {
		fmt.Fprintf(&b, "audit %d", st.Size())
	}
	return b.String()
}

// handleEvents streams "change" server-sent events whenever a command (in
// any process) adds a transaction, or a decision is made.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	// Taken before the stream opens: a change that lands right after the
	// client sees the first line must still produce an event.
	last := s.fingerprint(r.Context())
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, "retry: 1000\n\n")
	fl.Flush()
	t := time.NewTicker(s.cfg.Poll)
	defer t.Stop()
	ka := time.NewTicker(15 * time.Second)
	defer ka.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ka.C:
			io.WriteString(w, ": keep-alive\n\n")
			fl.Flush()
		case <-t.C:
			if fp := s.fingerprint(r.Context()); fp != last {
				last = fp
				io.WriteString(w, "event: change\ndata: {}\n\n")
				fl.Flush()
			}
		}
	}
}

type decision struct {
	ID     string   `json:"id"`
	Accept []string `json:"accept"`
}

func readDecision(w http.ResponseWriter, r *http.Request) (decision, bool) {
	var d decision
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad request: " + err.Error()})
		return d, false
	}
	return d, true
}

func (s *Server) handleCommit(w http.ResponseWriter, r *http.Request) {
	d, ok := readDecision(w, r)
	if !ok {
		return
	}
	rv := s.cfg.Review
	var paths []string
	var err error
	if d.Accept == nil {
		paths, err = rv.Commit(r.Context(), d.ID)
	} else {
		paths, err = rv.CommitPaths(r.Context(), d.ID, d.Accept)
	}
	var ce *cowfs.ConflictError
	if errors.As(err, &ce) {
		s.mu.Lock()
		s.conflicts[d.ID] = conflictView{Path: ce.Path, Reason: ce.Reason, Error: err.Error()}
		s.mu.Unlock()
		writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error(), "conflict": conflictView{Path: ce.Path, Reason: ce.Reason}})
		return
	}
	if dv := deps(err); dv != nil {
		writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error(), "depends": dv})
		return
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	s.mu.Lock()
	delete(s.conflicts, d.ID)
	s.mu.Unlock()
	if paths == nil {
		paths = []string{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": d.ID, "committed": paths})
}

func (s *Server) handleDiscard(w http.ResponseWriter, r *http.Request) {
	d, ok := readDecision(w, r)
	if !ok {
		return
	}
	err := s.cfg.Review.Discard(r.Context(), d.ID)
	if dv := deps(err); dv != nil {
		writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error(), "depends": dv})
		return
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": d.ID, "discarded": true})
}

func (s *Server) handleUndo(w http.ResponseWriter, r *http.Request) {
	if _, ok := readDecision(w, r); !ok {
		return
	}
	info, err := s.cfg.Review.Undo(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"undone": info.ID})
}

// handleCommitAll commits the whole pending stack as one commit, or
// (accept set) the ticked paths of it (sandbox.Review.CommitAllPaths).
func (s *Server) handleCommitAll(w http.ResponseWriter, r *http.Request) {
	d, ok := readDecision(w, r)
	if !ok {
		return
	}
	if d.ID != "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad request: commit-all takes no id"})
		return
	}
	paths, ids, err := s.cfg.Review.CommitAllPaths(r.Context(), d.Accept)
	var ce *cowfs.ConflictError
	if errors.As(err, &ce) {
		writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error(), "conflict": conflictView{Path: ce.Path, Reason: ce.Reason}})
		return
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	s.mu.Lock()
	for _, id := range ids {
		delete(s.conflicts, id)
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"committed": nonNil(paths), "transactions": nonNil(ids)})
}

func (s *Server) handleSquash(w http.ResponseWriter, r *http.Request) {
	if _, ok := readDecision(w, r); !ok {
		return
	}
	id, gone, err := s.cfg.Review.Squash(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "squashed": nonNil(gone)})
}

func (s *Server) handleDiscardAll(w http.ResponseWriter, r *http.Request) {
	if _, ok := readDecision(w, r); !ok {
		return
	}
	ids, err := s.cfg.Review.DiscardAll(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"discarded": nonNil(ids)})
}

func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

func (s *Server) fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, cowfs.ErrNotFound), errors.Is(err, cowfs.ErrInvalidPath):
		code = http.StatusNotFound
	case errors.Is(err, cowfs.ErrConflict), errors.Is(err, cowfs.ErrStackDependency), errors.Is(err, cowfs.ErrDamaged):
		code = http.StatusConflict
	default:
		s.log.Error("review request failed", "err", err)
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(true)
	if err := enc.Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(b.Bytes())
}

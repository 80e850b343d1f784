"use strict";
// The review page: renders /api/state, posts decisions, and refreshes on
// server-sent "change" events. Everything is built with DOM calls and
// textContent: nothing from the workspace is ever parsed as HTML.
(function () {
  const $ = (id) => document.getElementById(id);
  // User choices per transaction and path survive re-renders.
  const accepted = new Map();
  let state = null;
  let busy = false;

  // The token comes in the fragment of the first visit (never sent to a
  // server), is kept in this tab's sessionStorage (per origin, port
  // included) and goes with every API request as a Bearer header. It is
  // never a cookie: a browser sends cookies to every port of 127.0.0.1.
  const token = (() => {
    const m = /^#token=([0-9a-f]+)$/.exec(location.hash);
    if (m) {
      sessionStorage.setItem("pulse_review_token", m[1]);
      history.replaceState(null, "", "/");
    }
    return sessionStorage.getItem("pulse_review_token") || "";
  })();
  const auth = { Authorization: "Bearer " + token };

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of kids) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  // Control characters (a logged command may hold escape sequences) are
  // shown as escapes, never passed on.
  const clean = (s) => String(s || "").replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g,
    (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));

  // Unicode direction controls (the set of internal/bidi) reorder how the
  // text around them displays, so a name or a line can show something
  // else than what is committed (Trojan Source). Each is shown as a
  // visible marker, never passed to the layout.
  const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
  const hasBidi = (s) => new RegExp(BIDI.source).test(String(s || ""));

  // marked returns the nodes showing s: its text (control characters
  // escaped by clean) with each direction control as a marker.
  function marked(s) {
    const str = clean(s);
    const out = [];
    let last = 0;
    for (const m of str.matchAll(BIDI)) {
      if (m.index > last) out.push(document.createTextNode(str.slice(last, m.index)));
      const cp = "U+" + m[0].codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
      out.push(el("mark", { class: "bidi", title: "Unicode direction control " + cp + ": it reorders how the text around it displays", text: "\u27e8" + cp + "\u27e9" }));
      last = m.index + m[0].length;
    }
    if (last < str.length) out.push(document.createTextNode(str.slice(last)));
    return out;
  }

  // say shows a message: it may name paths (what was committed, a
  // conflict, a refusal the server explains), so it is marked like them.
  function say(text, error) {
    const m = $("message");
    m.replaceChildren(...marked(text));
    m.className = "message" + (error ? " error" : "");
  }

  function diffBlock(text) {
    const pre = el("pre", { class: "diff" });
    for (const line of text.replace(/\n$/, "").split("\n")) {
      let cls = "";
      if (line.startsWith("+++") || line.startsWith("---") || line.startsWith("diff --git") ||
          line.startsWith("index ") || line.startsWith("new file") || line.startsWith("deleted file") ||
          line.startsWith("\\")) cls = "meta";
      else if (line.startsWith("old mode") || line.startsWith("new mode") || line.startsWith("directory \"")) cls = "meta mode";
      else if (line.startsWith("+")) cls = "add";
      else if (line.startsWith("-")) cls = "del";
      else if (line.startsWith("@@")) cls = "hunk";
      const row = el("span", { class: cls }, ...(line === "" ? [" "] : marked(line)));
      if (cls === "meta mode") row.title = "permission bits change";
      pre.append(row);
    }
    return pre;
  }

  function size(n) {
    if (n < 1024) return n + " B";
    if (n < 1 << 20) return (n / 1024).toFixed(1) + " KiB";
    return (n / (1 << 20)).toFixed(1) + " MiB";
  }

  function isAccepted(tx, f) {
    const k = tx.id + "\u0000" + f.path;
    if (accepted.has(k)) return accepted.get(k);
    return !f.runs_on_host; // host-run paths need an explicit tick
  }

  function renderTx(tx) {
    const files = tx.files.filter((f) => !f.implicit);
    const card = el("article", { class: "tx", "aria-label": "transaction " + tx.id, "data-tx": tx.id });
    // A transaction that shares paths with another pending one cannot be
    // committed (or discarded) alone: its buttons say why instead.
    const commit = el("button", { type: "button", class: tx.commit_depends ? "commit depends" : "commit", text: "Commit",
      title: tx.commit_depends ? "depends on " + tx.commit_depends.on.join(", ") : null,
      onclick: () => tx.commit_depends ? say(tx.commit_depends.explain, true) : decide("commit", tx) });
    const discard = el("button", { type: "button", class: "discard", text: "Discard",
      title: tx.discard_depends ? "transactions " + tx.discard_depends.on.join(", ") + " depend on it" : null,
      onclick: () => tx.discard_depends ? say(tx.discard_depends.explain, true) : decide("discard", tx) });
    card.append(el("div", { class: "tx-head" },
      el("h3", { text: "Transaction " + tx.id }),
      el("span", { class: "meta" }, ...marked((tx.description || "") + " · " + new Date(tx.created).toLocaleString() + " · " + files.length + " file(s)")),
      el("span", { class: "actions" }, commit, discard)));
    if (tx.commit_depends) {
      card.append(el("div", { class: "depends" }, ...marked("Depends on transaction(s) " + tx.commit_depends.on.join(", ") +
        " (both change " + tx.commit_depends.path + "): commit it with the stack (Commit all) or Squash.")));
    }
    if (tx.conflict) {
      card.append(el("div", { class: "conflict", role: "alert" },
        ...marked("Conflict: " + tx.conflict.path + " was " + tx.conflict.reason + " in the workspace since it was staged, so the commit was refused and nothing was written. The diff below is against the workspace as it is now: discard, or stage again.")));
    }
    for (const f of files) {
      const k = tx.id + "\u0000" + f.path;
      const box = el("input", { type: "checkbox", "aria-label": "accept " + f.path });
      box.checked = isAccepted(tx, f);
      box.addEventListener("change", () => accepted.set(k, box.checked));
      const head = el("div", { class: "file-head" },
        el("label", {}, box, el("span", { class: "path" }, ...marked(f.path))),
        el("span", { class: "kind", text: f.kind + (f.new ? " (new)" : "") + (f.kind === "write" ? " · " + size(f.size) : "") }));
      if (f.binary) head.append(el("span", { class: "flag binary", text: "binary" }));
      if (f.bidi || hasBidi(f.path)) {
        head.append(el("span", { class: "flag bidi", text: "direction controls" }));
        head.append(el("span", { class: "why", text: "its name or content holds Unicode direction controls, shown as \u27e8U+\u2026\u27e9: the text displays in another order than a program reads it" }));
      }
      if (f.old_mode) {
        head.append(el("span", { class: "flag mode", text: "mode " + f.old_mode + " \u2192 " + f.mode }));
        if (f.widened) head.append(el("span", { class: "why", text: "now writable by " + f.widened }));
      }
      if (f.runs_on_host) {
        head.append(el("span", { class: "flag host", text: "runs on the host" }));
        head.append(el("span", { class: "why", text: f.runs_on_host }));
      }
      const file = el("div", { class: "file" }, head);
      if (f.binary) {
        file.append(el("div", { class: "binary-summary",
          text: "Binary file, " + size(f.size) + (f.sha256 ? ", SHA-256 " + f.sha256 : "") + ": not shown." }));
      } else if (f.diff) {
        file.append(diffBlock(f.diff));
      }
      card.append(file);
    }
    return card;
  }

  function render() {
    const st = state;
    $("workspace").replaceChildren(...marked(st.workspace));
    const chain = $("chain");
    if (st.chain.status === "broken") {
      chain.textContent = "audit chain: broken at seq " + st.chain.bad_seq;
      chain.title = st.chain.message;
      chain.className = "chain broken";
    } else if (st.chain.status === "unverifiable") {
      chain.textContent = "audit chain: keyed, and this page has not got the key (from seq " + st.chain.bad_seq + ")";
      chain.title = st.chain.message;
      chain.className = "chain broken";
    } else if (st.chain.status === "verified") {
      chain.textContent = "audit chain: verified (" + st.chain.events + " events" + (st.chain.keyed ? ", keyed" : ", not keyed") + ")";
      chain.title = "";
      chain.className = "chain verified";
    } else {
      chain.textContent = "audit chain: no events yet";
      chain.className = "chain";
    }
    $("undo").disabled = !st.undoable || busy;
    $("stack-actions").hidden = st.pending.length === 0;
    $("squash").disabled = st.pending.length < 2 || busy;
    $("count").textContent = "(" + st.pending.length + ")";
    const pend = $("pending");
    pend.replaceChildren(...(st.pending.length ? st.pending.map(renderTx) : [el("p", { class: "empty", text: "Nothing pending: no command has left changes to review." })]));
    const comb = $("combined");
    comb.replaceChildren(st.pending.length ? diffBlock(st.combined || "(no textual changes)\n") : el("p", { class: "empty", text: "Nothing pending." }));
    const tl = $("timeline");
    if (!st.timeline.length) {
      tl.replaceChildren(el("tr", {}, el("td", { colspan: "8", class: "empty", text: "No audit events yet." })));
      return;
    }
    tl.replaceChildren(...st.timeline.map((e) => el("tr", { class: st.chain.status === "broken" && e.seq >= st.chain.bad_seq ? "broken" : "" },
      el("td", { text: String(e.seq) }),
      el("td", { text: new Date(e.time).toLocaleString() }),
      el("td", { text: e.action }),
      el("td", { class: e.decision || "", text: e.decision || "" }),
      el("td", { class: "target" }, ...marked(e.target)),
      el("td", { text: [e.actor, e.via].filter(Boolean).join(" via ") }),
      el("td", { class: "target", text: e.tx_id || "" }),
      el("td", { class: "detail" }, ...marked([e.reason, e.detail].filter(Boolean).join(": "))))));
  }

  async function refresh() {
    try {
      const r = await fetch("/api/state", { credentials: "same-origin", cache: "no-store", headers: auth });
      if (!r.ok) throw new Error(r.status + " " + (await r.text()));
      state = await r.json();
      render();
    } catch (err) {
      say("Could not load the review state: " + err.message, true);
    }
  }

  async function post(path, body) {
    const r = await fetch(path, { method: "POST", credentials: "same-origin",
      headers: { ...auth, "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const data = await r.json().catch(() => ({}));
    if (!r.ok) {
      const e = new Error(data.error || r.status);
      if (data.depends) e.explain = data.depends.explain;
      throw e;
    }
    return data;
  }

  async function decide(what, tx) {
    if (busy) return;
    busy = true;
    try {
      if (what === "discard") {
        await post("/api/discard", { id: tx.id });
        say("Discarded transaction " + tx.id + ".");
      } else if (what === "commit-all") {
        const acc = stackAccepted();
        if (acc && acc.length === 0) {
          say("No file of the pending stack is ticked: tick the files to commit, or Discard all.", true);
          return;
        }
        const d = await post("/api/commit-all", acc ? { accept: acc } : {});
        say("Committed the pending stack (" + d.transactions.join(", ") + ") as one commit: " + d.committed.join(", ") + ".");
      } else if (what === "squash") {
        const d = await post("/api/squash", {});
        say(d.squashed.length ? "Squashed transactions " + d.squashed.join(", ") + " into " + d.id + "." : "Nothing to squash.");
      } else if (what === "discard-all") {
        const d = await post("/api/discard-all", {});
        say("Discarded transactions " + d.discarded.join(", ") + ".");
      } else if (what === "undo") {
        const d = await post("/api/undo", {});
        say("Undid transaction " + d.undone + ".");
      } else {
        const files = tx.files.filter((f) => !f.implicit);
        const acc = files.filter((f) => isAccepted(tx, f)).map((f) => f.path);
        if (acc.length === 0) {
          say("No file of transaction " + tx.id + " is ticked: tick the files to commit, or Discard it.", true);
          return;
        }
        const body = acc.length === files.length ? { id: tx.id } : { id: tx.id, accept: acc };
        const d = await post("/api/commit", body);
        say("Committed transaction " + tx.id + ": " + d.committed.join(", ") + ".");
      }
    } catch (err) {
      say(err.explain || (what[0].toUpperCase() + what.slice(1).replace("-", " ") + " failed: " + err.message), true);
    } finally {
      busy = false;
      await refresh();
    }
  }

  // stackAccepted is what Commit all commits: null for everything, else
  // the paths ticked in every transaction that holds them (a path
  // unticked anywhere is left out, as Commit leaves it out of one).
  function stackAccepted() {
    const all = new Set();
    const out = new Set();
    for (const tx of state.pending) {
      for (const f of tx.files.filter((f) => !f.implicit)) {
        all.add(f.path);
        if (!isAccepted(tx, f)) out.add(f.path);
      }
    }
    if (out.size === 0) return null;
    return [...all].filter((p) => !out.has(p));
  }

  $("undo").addEventListener("click", () => decide("undo", null));
  $("commit-all").addEventListener("click", () => decide("commit-all", null));
  $("squash").addEventListener("click", () => decide("squash", null));
  $("discard-all").addEventListener("click", () => decide("discard-all", null));

  // The server-sent events, read with fetch (EventSource cannot send the
  // token): a "change" event refreshes; a lost stream is opened again,
  // and what changed meanwhile is fetched then.
  async function listen() {
    for (let again = false; ; again = true) {
      try {
        const r = await fetch("/api/events", { credentials: "same-origin", cache: "no-store", headers: auth });
        if (r.status === 401) {
          $("live").textContent = "not signed in";
          return; // refresh says why: open the URL pulse review printed
        }
        if (!r.ok) throw new Error(String(r.status));
        $("live").textContent = "live";
        if (again) refresh();
        const rd = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await rd.read();
          if (done) break;
          buf = (buf + value).replace(/\r\n?/g, "\n");
          let i;
          while ((i = buf.indexOf("\n\n")) >= 0) {
            const ev = buf.slice(0, i);
            buf = buf.slice(i + 2);
            if (ev.split("\n").includes("event: change")) refresh();
          }
        }
      } catch (err) {
        // reconnect below
      }
      $("live").textContent = "reconnecting…";
      await new Promise((res) => setTimeout(res, 1000));
    }
  }

  refresh();
  listen();
})();

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

  function say(text, error) {
    const m = $("message");
    m.textContent = text;
    m.className = "message" + (error ? " error" : "");
  }

  function diffBlock(text) {
    const pre = el("pre", { class: "diff" });
    for (const line of text.replace(/\n$/, "").split("\n")) {
      let cls = "";
      if (line.startsWith("+++") || line.startsWith("---") || line.startsWith("diff --git") ||
          line.startsWith("index ") || line.startsWith("new file") || line.startsWith("deleted file") ||
          line.startsWith("old mode") || line.startsWith("new mode") || line.startsWith("\\")) cls = "meta";
      else if (line.startsWith("+")) cls = "add";
      else if (line.startsWith("-")) cls = "del";
      else if (line.startsWith("@@")) cls = "hunk";
      pre.append(el("span", { class: cls, text: line === "" ? " " : line }));
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
    const commit = el("button", { type: "button", class: "commit", text: "Commit", onclick: () => decide("commit", tx) });
    const discard = el("button", { type: "button", class: "discard", text: "Discard", onclick: () => decide("discard", tx) });
    card.append(el("div", { class: "tx-head" },
      el("h3", { text: "Transaction " + tx.id }),
      el("span", { class: "meta", text: (tx.description || "") + " · " + new Date(tx.created).toLocaleString() + " · " + files.length + " file(s)" }),
      el("span", { class: "actions" }, commit, discard)));
    if (tx.conflict) {
      card.append(el("div", { class: "conflict", role: "alert",
        text: "Conflict: " + tx.conflict.path + " was " + tx.conflict.reason + " in the workspace since it was staged, so the commit was refused and nothing was written. The diff below is against the workspace as it is now: discard, or stage again." }));
    }
    for (const f of files) {
      const k = tx.id + "\u0000" + f.path;
      const box = el("input", { type: "checkbox", "aria-label": "accept " + f.path });
      box.checked = isAccepted(tx, f);
      box.addEventListener("change", () => accepted.set(k, box.checked));
      const head = el("div", { class: "file-head" },
        el("label", {}, box, el("span", { class: "path", text: clean(f.path) })),
        el("span", { class: "kind", text: f.kind + (f.new ? " (new)" : "") + (f.kind === "write" ? " · " + size(f.size) : "") }));
      if (f.binary) head.append(el("span", { class: "flag binary", text: "binary" }));
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
    $("workspace").textContent = st.workspace;
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
      el("td", { class: "target", text: clean(e.target) }),
      el("td", { text: [e.actor, e.via].filter(Boolean).join(" via ") }),
      el("td", { class: "target", text: e.tx_id || "" }),
      el("td", { class: "detail", text: clean([e.reason, e.detail].filter(Boolean).join(": ")) }))));
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
    if (!r.ok) throw new Error(data.error || r.status);
    return data;
  }

  async function decide(what, tx) {
    if (busy) return;
    busy = true;
    try {
      if (what === "discard") {
        await post("/api/discard", { id: tx.id });
        say("Discarded transaction " + tx.id + ".");
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
      say(what[0].toUpperCase() + what.slice(1) + " failed: " + err.message, true);
    } finally {
      busy = false;
      await refresh();
    }
  }

  $("undo").addEventListener("click", () => decide("undo", null));

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

// The admin page of a streamkit host: plain JavaScript, no build step, no CDN.
// It polls the status (processors, with their failures before any stall, and
// the hosts), follows one processor's live state as Server-Sent Events
// (applying each JSON patch with the applier below), browses the events of a
// path, and drives the tasks, the schedules and the dead-letter queue wherever
// they run.
// Every value goes into the page as text, never as HTML. The host's token
// comes in the address's fragment (`streamkit admin` prints that address; a
// browser never sends a fragment to a server) or is pasted in; it is kept in
// this tab's sessionStorage, taken out of the address bar, and sent as a
// bearer header (no cookie is ever used).
"use strict";

const TOKEN_KEY = "streamkit-token";

function headers(extra) {
  const h = Object.assign({ "Accept": "application/json" }, extra || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}

function takeTokenFromAddress() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = fragment.get("token");
  if (token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, "", location.pathname + location.search);
  }
}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = headers(opts.headers);
  const response = await fetch(path, opts);
  if (response.status === 401) {
    document.getElementById("token-form").hidden = false;
    throw new Error("the host needs its token");
  }
  const body = await response.json();
  if (!response.ok) {
    const error = new Error(body.detail || response.statusText);
    error.problem = body;
    throw error;
  }
  return body;
}

// -- RFC 6902 ------------------------------------------------------------------------

function pointerTokens(pointer) {
  if (pointer === "") return [];
  if (pointer[0] !== "/") throw new Error("bad JSON pointer: " + pointer);
  return pointer.slice(1).split("/").map((t) => t.replace(/~1/g, "/").replace(/~0/g, "~"));
}

function parentOf(doc, tokens) {
  let node = doc;
  for (const token of tokens.slice(0, -1)) {
    if (node === null || typeof node !== "object" || !(token in node)) {
      throw new Error("path not found: /" + tokens.join("/"));
    }
    node = node[token];
  }
  return node;
}

function arrayIndex(array, token, forInsert) {
  if (forInsert && token === "-") return array.length;
  if (!/^(0|[1-9][0-9]*)$/.test(token)) throw new Error("bad array index: " + token);
  const index = Number(token);
  if (index > array.length || (!forInsert && index === array.length)) {
    throw new Error("array index out of range: " + token);
  }
  return index;
}

function getAt(doc, tokens) {
  let node = doc;
  for (const token of tokens) {
    if (node === null || typeof node !== "object" || !(token in node)) {
      throw new Error("path not found: /" + tokens.join("/"));
    }
    node = node[token];
  }
  return node;
}

function addAt(doc, tokens, value) {
  if (tokens.length === 0) return value;
  const parent = parentOf(doc, tokens);
  const last = tokens[tokens.length - 1];
  if (Array.isArray(parent)) parent.splice(arrayIndex(parent, last, true), 0, value);
  else parent[last] = value;
  return doc;
}

function removeAt(doc, tokens) {
  const parent = parentOf(doc, tokens);
  const last = tokens[tokens.length - 1];
  if (Array.isArray(parent)) {
    const index = arrayIndex(parent, last, false);
    const [removed] = parent.splice(index, 1);
    return removed;
  }
  if (!(last in parent)) throw new Error("path not found: /" + tokens.join("/"));
  const removed = parent[last];
  delete parent[last];
  return removed;
}

function applyPatch(doc, ops) {
  let result = structuredClone(doc);
  for (const op of ops) {
    const path = pointerTokens(op.path);
    switch (op.op) {
      case "add": result = addAt(result, path, structuredClone(op.value)); break;
      case "remove": removeAt(result, path); break;
      case "replace":
        if (path.length === 0) { result = structuredClone(op.value); break; }
        removeAt(result, path);
        result = addAt(result, path, structuredClone(op.value));
        break;
      case "move": {
        const from = pointerTokens(op.from);
        const value = removeAt(result, from);
        result = addAt(result, path, value);
        break;
      }
      case "copy": result = addAt(result, path, structuredClone(getAt(result, pointerTokens(op.from)))); break;
      case "test":
        if (JSON.stringify(getAt(result, path)) !== JSON.stringify(op.value)) throw new Error("test failed");
        break;
      default: throw new Error("unknown op: " + op.op);
    }
  }
  return result;
}

// -- Server-Sent Events over fetch (EventSource cannot send the token) -----------------

async function follow(url, onEvent, signal) {
  let lastId = null;
  while (!signal.aborted) {
    try {
      const extra = { "Accept": "text/event-stream" };
      if (lastId !== null) extra["Last-Event-ID"] = lastId;
      const response = await fetch(url, { headers: headers(extra), signal });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const message = { event: "message", data: [] };
          for (const line of block.split("\n")) {
            if (line.startsWith(":")) continue;
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "data") message.data.push(text);
            else if (field === "event") message.event = text;
            else if (field === "id") lastId = text;
          }
          if (message.data.length) onEvent(message.event, JSON.parse(message.data.join("\n")));
        }
      }
    } catch (error) {
      if (signal.aborted) return;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// -- formatting ----------------------------------------------------------------------

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function cell(text, className) {
  return el("td", text === null || text === undefined || text === "" ? "–" : text, className);
}

function button(label, onClick) {
  const b = el("button", label);
  b.type = "button";
  b.addEventListener("click", (e) => { e.stopPropagation(); onClick(); });
  return b;
}

function replaceRows(table, rows, emptyText) {
  if (!rows.length && emptyText) {
    const td = el("td", emptyText, "muted");
    td.colSpan = table.querySelectorAll("thead th").length;
    const tr = el("tr");
    tr.append(td);
    rows = [tr];
  }
  table.querySelector("tbody").replaceChildren(...rows);
}

// "vm:24921:5c3e78cf" (machine, pid, a random part) as people read it.
function ownerLabel(owner) {
  if (!owner) return null;
  const parts = String(owner).split(":");
  return parts.length >= 3 ? parts.slice(0, -2).join(":") + " (pid " + parts[parts.length - 2] + ")" : owner;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return null;
  if (seconds < 1) return "just now";
  if (seconds < 120) return Math.round(seconds) + " s ago";
  if (seconds < 7200) return Math.round(seconds / 60) + " min ago";
  return Math.round(seconds / 3600) + " h ago";
}

function epochText(epoch) {
  // 0 is "no time set" (a task with no not_before is due at 0): never shown as 1970.
  if (epoch === null || epoch === undefined || epoch === 0) return null;
  const delta = epoch - Date.now() / 1000;
  const at = new Date(epoch * 1000).toISOString().replace(".000Z", "Z");
  if (Math.abs(delta) < 3600) return at + " (" + (delta >= 0 ? "in " + Math.round(delta) + " s" : Math.round(-delta) + " s ago") + ")";
  return at;
}

function shortTime(iso) {
  return iso ? iso.replace("T", " ").replace(/\.(\d{3})\d*Z$/, ".$1") : null;
}

// -- processors and hosts --------------------------------------------------------------

const found = { tasks: null, dlq: null, schedules: null };

function problemOf(p) {
  const notes = [];
  if (p.phase && p.phase !== "serving") {
    const g = p.progress || {};
    const share = g.target ? Math.min(1, (g.through || 0) / g.target) : 0;
    let text = p.phase + " " + (g.through || 0).toLocaleString() + "/" + (g.target || 0).toLocaleString();
    if (g.events_per_second) text += " at " + Math.round(g.events_per_second).toLocaleString() + " ev/s";
    if (g.eta_seconds !== null && g.eta_seconds !== undefined) text += ", eta " + g.eta_seconds + " s";
    if (g.gave_way_seconds) text += ", gave way " + g.gave_way_seconds + " s to serving work";
    notes.push(["progress", text, share]);
  }
  const error = (p.last_error || {}).error;
  if (p.stalled) notes.push(["problem", "STALLED at offset " + p.stalled_at + (error ? ": " + error : "")]);
  else if (p.failures) notes.push(["problem", "failing: " + p.failures + " failed batch" + (p.failures > 1 ? "es" : "") + " in a row, retrying" + (error ? "; last: " + error : "")]);
  else if (error && (p.last_error || {}).code === "LEASE_LOST") notes.push(["warn", "lease lost: " + error]);
  if (p.unserved) notes.push(["problem", "UNSERVED: " + p.unserved.text]);
  if ((p.progress || {}).cutover_held) notes.push(["problem", "CUTOVER HELD: " + p.progress.cutover_held]);
  if (p.cannot_build) notes.push(["problem", "CANNOT-BUILD: " + p.cannot_build.reason + " (" + p.cannot_build.advice + ")"]);
  if (p.malformed_payloads) {
    const last = p.last_malformed || {};
    notes.push(["warn", p.malformed_payloads + " malformed payload(s) skipped (last at offset " + last.offset + ", " + last.type + ")"]);
  }
  for (const kind of p.malformed_by_type || []) {
    notes.push(["warn", kind.count + " skipped as malformed: " + kind.type + " v" + kind.version + " (first at offset " + kind.first_offsets.join(", ") + ")"]);
  }
  if (p.ahead_of_code) {
    const a = p.ahead_of_code;
    notes.push(["problem", "cannot read offset " + a.offset + " (" + a.type + " v" + a.stored + ", this code knows v" + a.version + "): left to a host with newer code"]);
  }
  if (p.stopped_at !== null && p.stopped_at !== undefined) {
    notes.push(["problem", "stopped before offset " + p.stopped_at + " (" + ((p.last_error || {}).code || "see last error") + "): nothing after it is processed"]);
  }
  for (const problem of (p.schema_check || {}).problems || []) {
    notes.push(["problem", "schema check at start: " + problem.text]);
  }
  if (p.dropped_events) {
    notes.push(["warn", p.dropped_events + " event(s) dropped by an upcaster (their type is retired)"]);
  }
  if (p.reduce_failures) {
    const last = p.last_reduce_failure || {};
    notes.push(["warn", p.reduce_failures + " reduce failure(s) (last at offset " + last.offset + ": " + last.error + ")"]);
  }
  if ((p.refusing_cancel || []).length) {
    notes.push(["problem", p.refusing_cancel.length + " cancelled piece(s) of work still running (they ignore cancellation): " + p.refusing_cancel.join("; ")]);
  }
  return notes;
}

// The newest failure of user code a processor row keeps a traceback excerpt of.
function tracebackOf(p) {
  const error = p.last_error || {};
  if (error.traceback) return { title: error.error || error.code || "last error", text: error.traceback };
  const failed = p.last_reduce_failure || {};
  if (failed.traceback) return { title: "reduce at offset " + failed.offset + ": " + failed.error, text: failed.traceback };
  const malformed = p.last_malformed || {};
  if (malformed.traceback) return { title: "payload at offset " + malformed.offset + ": " + malformed.error, text: malformed.traceback };
  return null;
}

// Events per minute over the last hour as bars (failed batches in red on top), newest right.
const SVG = "http://www.w3.org/2000/svg";

function chartCell(hour) {
  const td = el("td", null, "chart");
  if (!hour || !hour.minutes) { td.textContent = "–"; return td; }
  const width = 60, height = 18, slot = width / 60;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  svg.setAttribute("role", "img");
  const most = Math.max(1, ...hour.events);
  const events = hour.events.reduce((a, b) => a + b, 0);
  const failures = hour.failures.reduce((a, b) => a + b, 0);
  const title = document.createElementNS(SVG, "title");
  title.textContent = events.toLocaleString() + " events, " + failures + " failed batch(es) in the last " + hour.minutes + " minute(s); the newest minute is on the right";
  svg.append(title);
  svg.setAttribute("aria-label", title.textContent);
  const offset = 60 - hour.minutes;
  hour.events.forEach((n, i) => {
    const x = (offset + i) * slot;
    if (n > 0) {
      const bar = document.createElementNS(SVG, "rect");
      const h = Math.max(1, Math.round((n / most) * (height - 4)));
      bar.setAttribute("x", String(x));
      bar.setAttribute("y", String(height - h));
      bar.setAttribute("width", String(slot));
      bar.setAttribute("height", String(h));
      bar.setAttribute("class", "events");
      svg.append(bar);
    }
    if (hour.failures[i] > 0) {
      const mark = document.createElementNS(SVG, "rect");
      mark.setAttribute("x", String(x));
      mark.setAttribute("y", "0");
      mark.setAttribute("width", String(slot));
      mark.setAttribute("height", "3");
      mark.setAttribute("class", "failures");
      svg.append(mark);
    }
  });
  td.dataset.events = String(events);
  td.dataset.failures = String(failures);
  td.append(svg);
  return td;
}

// A processor's versions side by side (before a manual cutover), and the version verbs.
function showDetail(title, text) {
  document.getElementById("versions-detail").hidden = false;
  document.getElementById("versions-title").textContent = title;
  document.getElementById("versions").textContent = text;
}

async function showVersions(p, path) {
  try {
    const shown = await api(path);
    const lines = [];
    for (const v of shown.versions) {
      let line = "v" + v.version + "  " + v.role + "  cursor " + v.cursor;
      if (v.differences !== undefined) line += "  (" + v.differences + " difference(s) from the serving state)";
      lines.push(line);
      const k = v.skipped || {};
      lines.push("  skipped over its life: malformed " + (k.malformed_payloads || 0) + ", reduce failures " + (k.reduce_failures || 0) + ", dropped " + (k.dropped_events || 0));
      for (const kind of k.malformed_by_type || []) lines.push("    malformed " + kind.type + " v" + kind.version + ": " + kind.count + " (first at " + kind.first_offsets.join(", ") + ")");
      for (const kind of k.reduce_failures_by_type || []) lines.push("    reduce raised on " + kind.type + ": " + kind.count + " (first at " + kind.first_offsets.join(", ") + ")");
      lines.push("  state " + JSON.stringify(v.state));
      for (const op of v.patch || []) lines.push("  " + op.op + " " + op.path + (op.op === "remove" ? "" : " " + JSON.stringify(op.value)));
    }
    lines.push("counted by the running hosts:");
    for (const h of shown.hosts) {
      if (h.reachable === false) { lines.push("  " + h.socket + "  unreachable: " + h.error); continue; }
      lines.push("  " + ownerLabel(h.owner) + "  v" + h.version + "  " + h.phase + "  malformed " + (h.malformed_payloads || 0) +
        ", reduce failures " + (h.reduce_failures || 0) + ", failed batches " + (h.batch_failures || 0) + ", dropped " + (h.events_dropped || 0));
    }
    showDetail("Versions of " + p.slug + " (v" + shown.serving_version + " serves)", lines.join("\n"));
  } catch (error) {
    showDetail("Versions of " + p.slug, "refused: " + (error.message || error));
  }
}

async function versionAction(p, question, path, body, said) {
  if (!window.confirm(question)) return;
  try {
    const done = await api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    showDetail(p.slug, said(done));
  } catch (error) {
    showDetail(p.slug, "refused: " + (error.message || error));
  }
}

function policyText(record) {
  // One [[retention]] policy as this host's job ran it (docs/retention.md, "Policies").
  if (!record) return "–";
  const keep = [];
  if (record.keep_for !== null) keep.push("keep " + record.keep_for + " s");
  if (record.keep_last !== null) keep.push("keep last " + record.keep_last);
  const run = record.last_run ? "last took " + record.last_run.events + " (stopped by " + record.last_run.stopped_by + ")" : "not run yet";
  const failing = record.last_error ? " · FAILING (" + record.failures + "): " + record.last_error.message : "";
  return keep.join(", ") + ", " + record.mode + " · " + record.runs + " run(s), " + record.events_taken + " taken" + (record.keys_forgotten ? ", " + record.keys_forgotten + " key(s) forgotten" : "") + " · " + run + failing;
}

function renderRetention(rows, job) {
  // What each path's history must keep (docs/retention.md): the horizon and who holds it there.
  const body = document.querySelector("#retention tbody");
  const note = document.getElementById("retention-note");
  body.replaceChildren();
  if (rows === null || rows === undefined) {
    note.textContent = "unknown: the database did not answer";
    return;
  }
  const policies = new Map(((job && job.policies) || []).map((p) => [p.path, p]));
  const runBy = job ? "policies run every " + job.interval + " s by " + (job.holds_lease ? "this host" : (job.holder ? ownerLabel(job.holder) : "no host yet")) : "";
  note.textContent = [rows.length ? "" : "no path holds events yet", runBy].filter(Boolean).join(" · ");
  for (const r of rows) {
    const tr = el("tr");
    tr.dataset.path = r.path;
    const held = r.held_by.map((n) => n.kind + " " + n.name + (n.state ? " (" + n.state + ")" : "") + ": " + n.why).join("; ");
    const archived = r.archived_segments ? r.archived_segments + " segment(s), " + r.archived_bytes + " bytes" : "–";
    // How long keys of taken events answer retries (docs/retention.md, key windows).
    const keys = r.keys_kept_for === null || r.keys_kept_for === undefined ? "forever" : r.keys_kept_for + " s";
    const policy = policies.get(r.path);
    if (policy && policy.last_error) tr.className = "failing";
    tr.append(cell(r.path), cell(r.start, "num start"), cell(r.head, "num"), cell(r.horizon, "num horizon"),
      cell(r.head + 1 - r.horizon, "num kept"), cell(held || "nothing", "held-by"), cell(archived, "archived"),
      cell(keys, "keys"), cell(policyText(policy), "policy"));
    body.append(tr);
  }
}

function renderProcessors(status) {
  const host = status.host || {};
  const uptime = host.uptime === null || host.uptime === undefined ? "" : ", up " + ago(host.uptime).replace(" ago", "");
  const frozen = host.frozen_sessions_ended ? " · ended " + host.frozen_sessions_ended + " frozen database session(s)" : "";
  document.getElementById("host").textContent = (host.db || "") + " · this host: " + (ownerLabel(host.owner) || "?") + uptime + frozen;
  found.tasks = found.dlq = found.schedules = null;
  const rows = (status.processors || []).map((p) => {
    if (p.slug === "tasks" && p.lease_held_here) found.tasks = p.path;
    if (p.slug === "dlq" && p.lease_held_here) found.dlq = p.path;
    if (p.slug === "schedules" && p.lease_held_here) found.schedules = p.path;
    const tr = el("tr");
    tr.dataset.slug = p.slug;
    const notes = problemOf(p);
    if (p.stalled) tr.className = "stalled";
    else if (p.failures) tr.className = "failing";
    const state = p.stalled ? "stalled" : p.failures ? "failing" : p.state;
    const lease = p.lease || {};
    const holder = lease.held ? (p.lease_held_here ? "this host" : ownerLabel(lease.owner)) : (lease.released ? "released" : "none");
    const latency = p.latency_ms && p.latency_ms.samples ? p.latency_ms.p50 + " / " + p.latency_ms.p99 + " ms" : null;
    // What the processor says of itself (its status_summary): a column of its own, not a problem.
    const summary = Object.entries(p.summary || {}).map(([k, v]) => k + " " + (typeof v === "object" ? JSON.stringify(v) : v)).join(", ");
    const problem = el("td", null, "problem-cell");
    if (!notes.length) problem.textContent = "–";
    for (const [kind, text, share] of notes) {
      const note = problem.appendChild(el("div", text, kind));
      if (kind === "progress") {
        const bar = note.appendChild(el("progress"));
        bar.max = 1;
        bar.value = share;
      }
    }
    tr.append(
      cell(p.slug + (p.path !== "/" ? " " + p.path : "")), cell(state, "state"), cell(holder),
      cell(p.cursor, "num cursor"), cell(p.head, "num head"), cell(p.lag, "num lag"),
      cell(p.events_per_second, "num"), cell(latency, "num"), cell(ago(p.last_batch_age)),
      cell(epochText(p.claim_due)), chartCell(p.last_hour), cell(summary || null, "summary"), problem,
    );
    const actions = el("td");
    const traceback = tracebackOf(p);
    if (traceback) {
      const shown = button("traceback", () => showDetail("Traceback: " + p.slug + " · " + traceback.title, traceback.text));
      shown.dataset.action = "traceback";
      actions.append(shown);
    }
    if (p.stalled) {
      actions.append(button("skip " + p.stalled_at, async () => {
        const reason = window.prompt("Why skip offset " + p.stalled_at + " for " + p.slug + "? (it is recorded)");
        if (!reason) return;
        await api("/v1/processors/" + encodeURIComponent(p.slug) + "/skip?path=" + encodeURIComponent(p.path), {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ offset: p.stalled_at, reason, by: "admin page" }),
        });
      }));
    }
    const where = "/v1/processors/" + encodeURIComponent(p.slug);
    const query = "?path=" + encodeURIComponent(p.path);
    if (p.phase === "awaiting-cutover") {
      actions.append(button("compare versions", () => showVersions(p, where + "/versions" + query)));
      actions.append(button("cut over", () => versionAction(
        p, "Cut " + p.slug + " over to version " + p.version + " now? Version " + p.serving_version + " is retired (a rollback brings it back).",
        where + "/cutover" + query, {},
        (done) => "version " + done.version + " serves from offset " + done.offset + " on; version " + done.from_version + " is retired",
      )));
    }
    if (p.state === "retired") {
      actions.append(button("roll back to v" + p.version, () => versionAction(
        p, "Make version " + p.version + " of " + p.slug + " serve again? Hosts running its code build it from its kept checkpoint and cut back over.",
        where + "/rollback" + query, { to: p.version },
        (done) => "version " + done.version + " is reinstated: it builds and cuts over; version " + done.serving_version + " serves until then",
      )));
    }
    tr.append(actions);
    return tr;
  });
  replaceRows(document.getElementById("processors"), rows);
  const select = document.getElementById("live-slug");
  const known = new Set([...select.options].map((o) => o.value));
  for (const p of status.processors || []) {
    if (!known.has(p.slug) && p.lease_held_here) {
      const option = el("option", p.slug + " (" + p.path + ")");
      option.value = p.slug;
      select.append(option);
      if (select.options.length === 1) watch(p.slug);
    }
  }
}

async function refreshHosts() {
  const list = document.getElementById("hosts");
  const hosts = (await api("/v1/hosts")).hosts;
  list.replaceChildren(...hosts.map((h) => {
    const item = el("li", ownerLabel(h.owner) + (h.here ? " (this host)" : "") + ": " + (h.processors.length ? h.processors.join(", ") : "nothing yet"));
    item.dataset.owner = h.owner;
    return item;
  }));
  if (!hosts.length) list.replaceChildren(el("li", "no host has beaten recently", "muted"));
}

// -- live state --------------------------------------------------------------------------

let liveAbort = null;
let live = { rev: null, state: null, changes: 0, at: null };

function showLive() {
  const info = live.at === null ? "waiting for the first state…"
    : live.changes + " change(s) since the seed · updated " + live.at.toISOString().slice(11, 19) + " UTC";
  document.getElementById("live-info").textContent = info;
  document.getElementById("live-state").textContent = JSON.stringify(live.state, null, 2);
}

function watch(slug) {
  if (liveAbort) liveAbort.abort();
  liveAbort = new AbortController();
  live = { rev: null, state: null, changes: 0, at: null };
  showLive();
  follow("/v1/processors/" + encodeURIComponent(slug) + "/live", (event, data) => {
    if (event === "seed") {
      live = { rev: data.rev, state: data.state, changes: 0, at: new Date() };
    } else if (event === "delta") {
      if (data.from !== live.rev || data.patch === null) return;  // the stream re-seeds on a gap
      live = { rev: data.to, state: applyPatch(live.state, data.patch), changes: live.changes + 1, at: new Date() };
    }
    showLive();
  }, liveAbort.signal);
}

// -- events ------------------------------------------------------------------------------

const PAGE = 50;
const browse = { path: "/", after: null, first: null, last: null, mode: "newest", selected: null };

function isoFrom(localValue) {
  return localValue ? localValue + (localValue.length === 16 ? ":00" : "") + "Z" : "";
}

async function refreshPaths() {
  const select = document.getElementById("events-path");
  const paths = (await api("/v1/paths")).paths;
  const wanted = paths.map((p) => p.path);
  if (!wanted.includes("/")) wanted.unshift("/");
  const have = [...select.options].map((o) => o.value);
  if (have.join("\n") !== wanted.join("\n")) {
    const current = select.value || browse.path;
    select.replaceChildren(...wanted.map((path) => { const o = el("option", path); o.value = path; return o; }));
    select.value = wanted.includes(current) ? current : "/";
  }
  return paths;
}

async function loadEvents() {
  const path = document.getElementById("events-path").value || "/";
  browse.path = path;
  const query = new URLSearchParams({ path, limit: String(PAGE) });
  const type = document.getElementById("events-type").value.trim();
  for (const t of type.split(/[ ,]+/).filter(Boolean)) query.append("type", t);
  const since = isoFrom(document.getElementById("events-since").value);
  const until = isoFrom(document.getElementById("events-until").value);
  if (since) query.set("since", since);
  if (until) query.set("until", until);
  let after = browse.after;
  if (browse.mode === "newest") {
    const heads = await refreshPaths();
    const head = (heads.find((h) => h.path === path) || { head: 0 }).head;
    after = since ? 0 : Math.max(0, head - PAGE);
  }
  query.set("after", String(after || 0));
  const page = await api("/v1/events?" + query.toString());
  const events = page.events;
  browse.first = events.length ? events[0].offset : after;
  browse.last = page.scanned_through_offset;
  const note = [];
  note.push(events.length ? "offsets " + events[0].offset + "–" + events[events.length - 1].offset : "no events here");
  if (page.at_head) note.push("up to the head");
  if (page.until_reached) note.push("up to the end of the time range");
  if (type) note.push("types " + type);
  document.getElementById("events-note").textContent = note.join(" · ");
  replaceRows(document.getElementById("events"), events.map((e) => {
    const tr = el("tr", null, "clickable" + (browse.selected === e.offset ? " selected" : ""));
    tr.dataset.offset = String(e.offset);
    tr.append(cell(e.offset, "num"), cell(shortTime(e.created_at)), cell(e.type), cell(e.idempotency_key), cell(preview(e.payload), "payload"));
    tr.addEventListener("click", () => showEvent(path, e.offset));
    return tr;
  }), "no events in this range");
}

// The start of a payload, one line: enough to tell events apart without opening each.
const PREVIEW = 80;

function preview(payload) {
  if (payload === null || payload === undefined) return null;
  const text = JSON.stringify(payload);
  return text.length > PREVIEW ? text.slice(0, PREVIEW - 1) + "…" : text;
}

async function showEvent(path, offset) {
  browse.selected = offset;
  const answer = await api("/v1/events/" + offset + "?path=" + encodeURIComponent(path));
  const e = answer.event;
  document.getElementById("event-detail").hidden = false;
  document.getElementById("event-title").textContent = "Event " + e.offset + " of " + e.path + " · " + e.type + " · " + shortTime(e.created_at) + " UTC";
  const passed = answer.processors.map((p) => p.slug + (p.passed ? " ✓" : " ✗ (at " + p.cursor + ")"));
  document.getElementById("event-processors").textContent = passed.length
    ? "processors on this path: " + passed.join(", ") + " (✓ has processed it)" : "no processor runs on this path";
  const body = { payload: e.payload, metadata: e.metadata, source: e.source || null, idempotency_key: e.idempotency_key || null };
  document.getElementById("event-body").textContent = JSON.stringify(body, null, 2);
  for (const tr of document.querySelectorAll("#events tbody tr")) tr.classList.toggle("selected", tr.dataset.offset === String(offset));
}

// The section of a first-party processor (tasks, dead letters): hidden while the host runs
// none (`at` null, and `load` is not called), else shown with its path once `load` answered.
async function fillSection(kind, at, load) {
  const section = document.getElementById(kind + "-section");
  if (at === null) { section.hidden = true; return null; }
  const listing = await load();
  section.hidden = false;
  document.getElementById(kind + "-path").textContent = at === "/" ? "" : "on " + at;
  return listing;
}

// -- tasks -------------------------------------------------------------------------------

let shownTask = null;

function tasksUrl(suffix) {
  return "/v1/tasks" + (suffix || "") + "?path=" + encodeURIComponent(found.tasks);
}

async function refreshTasks() {
  const listing = await fillSection("tasks", found.tasks, () => api(tasksUrl()));
  if (listing === null) return;
  replaceRows(document.getElementById("tasks"), listing.tasks.map((t) => {
    const tr = el("tr", null, "clickable");
    tr.dataset.task = t.task_id;
    tr.append(
      cell(t.task_id), cell(t.name), cell(t.status, "status"), cell(t.attempt || 0, "num"),
      cell(epochText(t.due)), cell(t.last_error),
    );
    const actions = el("td");
    actions.append(button("cancel", async () => {
      if (!window.confirm("Cancel task " + t.task_id + " (" + t.name + ")? A running attempt is left to finish; no new attempt starts.")) return;
      await api(tasksUrl("/" + encodeURIComponent(t.task_id) + "/cancel"), {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ by: "admin page", reason: "cancelled from the admin page" }),
      });
    }));
    tr.append(actions);
    tr.addEventListener("click", () => showTask(t.task_id));
    return tr;
  }), "no live tasks (find a finished one by its id)");
  await refreshFinished();
  if (shownTask !== null) await showTask(shownTask, true);
}

// The tasks that ended lately (newest first), filtered by how they ended and by name.
async function refreshFinished() {
  const query = new URLSearchParams({ path: found.tasks, limit: "20" });
  const status = document.getElementById("finished-status").value;
  const name = document.getElementById("finished-name").value.trim();
  if (status) query.set("status", status);
  if (name) query.set("name", name);
  const listing = await api("/v1/finished-tasks?" + query.toString());
  replaceRows(document.getElementById("finished-tasks"), listing.tasks.map((t) => {
    const tr = el("tr", null, "clickable " + t.status);
    tr.dataset.task = t.task_id;
    tr.append(
      cell(t.task_id), cell(t.name), cell(t.status, "status"), cell(t.attempts, "num"),
      cell(shortTime(t.finished_at)), cell(seconds(t.seconds), "num"), cell(seconds(t.ran_seconds), "num"), cell(t.error),
    );
    tr.addEventListener("click", () => showTask(t.task_id));
    return tr;
  }), "no task finished among the newest events" + (status || name ? " (with these filters)" : ""));
}

function seconds(value) {
  return value === null || value === undefined ? null : value.toFixed(3) + " s";
}

async function showTask(taskId, quiet) {
  shownTask = taskId;
  const detail = document.getElementById("task-detail");
  let answer;
  try {
    answer = await api(tasksUrl("/" + encodeURIComponent(taskId)));
  } catch (error) {
    if (quiet) return;
    detail.hidden = false;
    document.getElementById("task-title").textContent = String(error.message || error);
    replaceRows(document.getElementById("task-timeline"), []);
    return;
  }
  detail.hidden = false;
  document.getElementById("task-title").textContent = "Task " + answer.task_id + ": " + answer.status;
  const started = {};
  replaceRows(document.getElementById("task-timeline"), answer.events.map((e) => {
    const p = e.payload || {};
    // An attempt ends in attempt-failed, succeeded or (the last one) dead-lettered.
    const attempt = p.attempt !== undefined ? p.attempt : p.attempts;
    let took = null;
    if (e.type === "task.attempt-started") started[attempt] = Date.parse(e.created_at);
    else if (attempt !== undefined && started[attempt] !== undefined) {
      took = ((Date.parse(e.created_at) - started[attempt]) / 1000).toFixed(3) + " s";
      delete started[attempt];
    }
    const tr = el("tr");
    tr.dataset.type = e.type;
    tr.append(cell(shortTime(e.created_at)), cell(e.type.replace(/^task\./, "")), cell(attempt, "num"), cell(took, "num"), cell(p.error || p.reason));
    return tr;
  }));
  // The newest failure's traceback excerpt (kept in its event: innermost frames, no locals).
  const failed = answer.events.filter((e) => (e.payload || {}).traceback).pop();
  document.getElementById("task-traceback-box").hidden = !failed;
  if (failed) {
    const p = failed.payload;
    const attempt = p.attempt !== undefined ? p.attempt : p.attempts;
    document.getElementById("task-traceback-title").textContent = "Traceback of attempt " + attempt + " (" + failed.type.replace(/^task\./, "") + ", offset " + failed.offset + ")";
    document.getElementById("task-traceback").textContent = p.traceback;
  }
}

// -- schedules ---------------------------------------------------------------------------

function schedulesUrl(suffix) {
  return "/v1/schedules" + (suffix || "") + "?path=" + encodeURIComponent(found.schedules);
}

function timingText(timing) {
  if (timing.cron !== undefined) return "cron " + timing.cron + " " + (timing.tz || "UTC");
  return "every " + timing.every_seconds + " s";
}

async function changeSchedule(name, verb, question) {
  if (question && !window.confirm(question)) return;
  await api(schedulesUrl("/" + encodeURIComponent(name) + "/" + verb), {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ by: "admin page" }),
  });
}

async function backfillSchedule(name) {
  const hourAgo = new Date(Date.now() - 3600 * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
  const first = window.prompt("Backfill " + name + ": fire the slots that did not fire, from (ISO 8601, UTC)", hourAgo);
  if (!first) return;
  const last = window.prompt("... to (ISO 8601, UTC)", new Date().toISOString().replace(/\.\d{3}Z$/, "Z"));
  if (!last) return;
  await api(schedulesUrl("/" + encodeURIComponent(name) + "/backfill"), {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ from: first, to: last, by: "admin page" }),
  });
}

// A timing with spaces or an @alias is a cron expression; anything else an interval ("5m").
async function addSchedule() {
  const value = (id) => document.getElementById(id).value.trim();
  const timing = value("schedule-timing");
  const request = { name: value("schedule-name"), task: value("schedule-task"), by: "admin page" };
  if (timing.includes(" ") || timing.startsWith("@")) Object.assign(request, { cron: timing, tz: value("schedule-tz") || "UTC" });
  else request.every = timing;
  const note = document.getElementById("schedule-add-note");
  try {
    await api(schedulesUrl(), {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(request),
    });
    note.textContent = "schedule " + request.name + " defined";
    note.className = "muted";
  } catch (error) {
    note.textContent = String(error.message || error);
    note.className = "problem";
  }
  await refreshSchedules();
}

async function refreshSchedules() {
  const listing = await fillSection("schedules", found.schedules, () => api(schedulesUrl()));
  if (listing === null) return;
  replaceRows(document.getElementById("schedules"), listing.schedules.map((s) => {
    const tr = el("tr");
    tr.dataset.schedule = s.name;
    const d = s.definition || {};
    const reasons = Object.entries(s.missed_by || {}).map(([r, n]) => r + " " + n).join(", ");
    const state = s.backfill ? "backfilling"
      : s.paused ? "paused"
      : (s.running || []).length ? (s.running.length + " running" + ((s.buffered || []).length ? ", " + s.buffered.length + " waiting" : ""))
      : "active";
    tr.append(
      cell(s.name), cell(timingText(d.timing || {})),
      cell((d.action || {}).kind === "append_event" ? "event " + d.action.type : (d.action || {}).name),
      cell(epochText(s.next_slot)), cell(epochText(s.last_fired_at)), cell(s.fired || 0, "num"),
      cell((s.missed || 0) + (reasons ? " (" + reasons + ")" : ""), "missed"),
      cell(s.lateness_p99 === null ? null : s.lateness_p99.toFixed(3) + " s", "num"),
      cell(state, "status"),
    );
    const actions = el("td");
    actions.append(s.paused
      ? button("resume", () => changeSchedule(s.name, "resume"))
      : button("pause", () => changeSchedule(s.name, "pause", "Pause schedule " + s.name + "? Its slots are recorded as missed until it is resumed.")));
    actions.append(button("backfill", () => backfillSchedule(s.name)));
    actions.append(button("delete", () => changeSchedule(s.name, "delete", "Delete schedule " + s.name + "? It fires no more; its history stays on the log.")));
    tr.append(actions);
    return tr;
  }), "no schedules (define one with `streamkit schedules add` or sync)");
}

// -- dead letters ------------------------------------------------------------------------

let shownRecord = null;
let awaitedReplay = null;

function dlqUrl(suffix, params) {
  const query = new URLSearchParams(Object.assign({ path: found.dlq }, params || {}));
  return "/v1/dlq" + (suffix || "") + "?" + query.toString();
}

async function requestReplay(ids) {
  const body = { by: "admin page" };
  if (ids) body.ids = ids;
  const answer = await api(dlqUrl("/replay"), {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  awaitedReplay = answer.event.offset;
  const outcome = document.getElementById("dlq-outcome");
  outcome.textContent = "replay requested (offset " + awaitedReplay + "); waiting for the DLQ's report…";
  outcome.className = "muted";
}

function describeReplay(last, records) {
  const r = last.report || {};
  const count = (kind) => (r.counts && r.counts[kind] !== undefined ? r.counts[kind] : (r[kind] || []).length);
  if (last.error) return ["problem", "The replay requested at offset " + last.request_offset + " was refused: " + last.error];
  const parts = ["replayed", "retried", "abandoned", "skipped"].map((k) => count(k) + " " + k);
  // A replayed record that is pending again failed again: its latest error says why.
  const replayed = new Set(r.replayed || []);
  const again = records.filter((rec) => replayed.has(rec.record_id) && rec.status === "pending" && rec.replays > 0);
  const bad = count("abandoned") + count("skipped") + again.length;
  let text = "Replay requested at offset " + last.request_offset + " by " + (last.requested_by || "?") + ": " + parts.join(", ");
  if (count("abandoned") + count("skipped")) text += " (abandoned: out of replays; skipped: no handler and no request to re-append)";
  if (again.length) text += ". Failed again after the replay: " + again.map((rec) => rec.record_id + " (" + rec.error + ")").join("; ");
  return [bad ? "warn" : "", text];
}

async function refreshDlq() {
  const listing = await fillSection("dlq", found.dlq, () => api(dlqUrl("", { limit: "50" })));
  if (listing === null) return;
  replaceRows(document.getElementById("dlq"), listing.records.map((r) => {
    const tr = el("tr", null, "clickable");
    tr.dataset.record = r.record_id;
    tr.append(
      cell(r.record_id), cell(r.origin), cell(r.operation), cell(r.status, "status"),
      cell(r.replays, "num"), cell(shortTime(r.dead_lettered_at)), cell(r.error),
    );
    const actions = el("td");
    if (r.status === "pending") actions.append(button("replay", () => requestReplay([r.record_id])));
    tr.append(actions);
    tr.addEventListener("click", () => showRecord(r.record_id));
    return tr;
  }), "no dead letters");
  const replays = (await api(dlqUrl("/replays", { limit: "1" }))).replays;
  if (replays.length) {
    const last = replays[0];
    if (awaitedReplay === null || last.request_offset >= awaitedReplay) {
      awaitedReplay = null;
      const [kind, text] = describeReplay(last, listing.records);
      const outcome = document.getElementById("dlq-outcome");
      outcome.textContent = text;
      outcome.className = kind;
      const report = document.getElementById("dlq-report");
      report.textContent = JSON.stringify(last.error ? { error: last.error } : last.report, null, 2);
      report.className = "";
    }
  }
  if (shownRecord !== null) await showRecord(shownRecord, true);
}

async function showRecord(recordId, quiet) {
  shownRecord = recordId;
  let answer;
  try {
    answer = await api(dlqUrl("/record", { id: recordId }));
  } catch (error) {
    if (quiet) return;
    throw error;
  }
  const r = answer.record;
  document.getElementById("dlq-detail").hidden = false;
  document.getElementById("dlq-title").textContent = "Record " + r.record_id + ": " + r.status + ", " + r.replays + " replay(s), dead-lettered " + shortTime(r.dead_lettered_at) + " UTC";
  const history = answer.history.map((e) => ({ offset: e.offset, at: e.created_at, type: e.type, payload: e.payload }));
  document.getElementById("dlq-traceback-box").hidden = !r.traceback;
  document.getElementById("dlq-traceback").textContent = r.traceback || "";
  const shown = Object.assign({}, r);
  delete shown.traceback;  // shown above, as text
  document.getElementById("dlq-body").textContent = JSON.stringify({ record: shown, history }, null, 2);
}

// -- the loop ----------------------------------------------------------------------------

let ticks = 0;

async function refresh() {
  const connection = document.getElementById("connection");
  try {
    const status = await api("/v1/processors");
    renderProcessors(status);
    renderRetention(status.retention, status.retention_job);
    const work = [refreshDlq(), refreshTasks(), refreshSchedules()];
    if (ticks % 5 === 0) work.push(refreshHosts());
    if (browse.mode === "newest" && ticks % 2 === 0) work.push(loadEvents());
    await Promise.all(work);
    ticks += 1;
    connection.textContent = "live";
    connection.className = "ok";
  } catch (error) {
    connection.textContent = String(error.message || error);
    connection.className = "down";
  }
}

function browseFrom(mode, after) {
  browse.mode = mode;
  browse.after = after;
  loadEvents().catch((error) => { document.getElementById("events-note").textContent = String(error.message || error); });
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("live-slug").addEventListener("change", (e) => watch(e.target.value));
  document.getElementById("dlq-replay").addEventListener("click", () => requestReplay(null).then(refresh));
  document.getElementById("events-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const since = document.getElementById("events-since").value;
    browseFrom(since ? "range" : "newest", 0);
  });
  document.getElementById("events-path").addEventListener("change", () => browseFrom("newest", null));
  document.getElementById("events-newest").addEventListener("click", () => browseFrom("newest", null));
  document.getElementById("events-older").addEventListener("click", () => browseFrom("range", Math.max(0, (browse.first || 1) - 1 - PAGE)));
  document.getElementById("events-newer").addEventListener("click", () => browseFrom("range", browse.last || 0));
  document.getElementById("schedule-add").addEventListener("submit", (e) => {
    e.preventDefault();
    addSchedule();
  });
  document.getElementById("finished-filter").addEventListener("submit", (e) => {
    e.preventDefault();
    if (found.tasks !== null) refreshFinished();
  });
  document.getElementById("task-search").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = document.getElementById("task-id").value.trim();
    if (id) showTask(id);
  });
  takeTokenFromAddress();
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
    document.getElementById("token-form").hidden = true;
    refresh();
  });
  refresh();
  setInterval(refresh, 1000);
});

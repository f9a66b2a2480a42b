// The admin page of a streamkit host: plain JavaScript, no build step, no CDN.
// It polls the status, follows one processor's live state as Server-Sent
// Events (applying each JSON patch with the applier below), and drives the
// dead-letter queue and the tasks. Every value goes into the page as text,
// never as HTML. The token, when the host needs one, is kept in this tab's
// sessionStorage and sent as a bearer header (no cookie is ever used).
"use strict";

const TOKEN_KEY = "streamkit-token";

function headers(extra) {
  const h = Object.assign({ "Accept": "application/json" }, extra || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
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

// -- rendering -----------------------------------------------------------------------

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (className) td.className = className;
  return td;
}

function button(label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}

function replaceRows(table, rows) {
  const body = table.querySelector("tbody");
  body.replaceChildren(...rows);
}

function renderProcessors(status) {
  const host = status.host || {};
  document.getElementById("host").textContent = (host.db || "") + "  " + (host.owner || "");
  const rows = (status.processors || []).map((p) => {
    const tr = document.createElement("tr");
    tr.dataset.slug = p.slug;
    if (p.stalled) tr.className = "stalled";
    const problem = p.stalled ? "stalled at " + p.stalled_at + ": " + ((p.last_error || {}).error || "") : "";
    tr.append(
      cell(p.slug), cell(p.path), cell(p.state), cell(p.cursor, "num cursor"), cell(p.head, "num head"),
      cell(p.lag, "num lag"), cell(p.events_per_second, "num"), cell(problem),
    );
    const actions = document.createElement("td");
    if (p.stalled) {
      actions.append(button("skip " + p.stalled_at, async () => {
        const reason = window.prompt("Why skip offset " + p.stalled_at + "?");
        if (!reason) return;
        await api("/v1/processors/" + encodeURIComponent(p.slug) + "/skip?path=" + encodeURIComponent(p.path), {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ offset: p.stalled_at, reason, by: "admin page" }),
        });
      }));
    }
    tr.append(actions);
    return tr;
  });
  replaceRows(document.getElementById("processors"), rows);
  const select = document.getElementById("live-slug");
  const known = new Set([...select.options].map((o) => o.value));
  for (const p of status.processors || []) {
    if (!known.has(p.slug) && p.lease_held_here) {
      const option = document.createElement("option");
      option.value = p.slug;
      option.textContent = p.slug + " (" + p.path + ")";
      select.append(option);
      if (select.options.length === 1) watch(p.slug);
    }
  }
}

let liveAbort = null;
let live = { rev: null, state: null };

function showLive() {
  document.getElementById("live-rev").textContent = live.rev === null ? "–" : String(live.rev);
  document.getElementById("live-state").textContent = JSON.stringify(live.state, null, 2);
}

function watch(slug) {
  if (liveAbort) liveAbort.abort();
  liveAbort = new AbortController();
  live = { rev: null, state: null };
  showLive();
  follow("/v1/processors/" + encodeURIComponent(slug) + "/live", (event, data) => {
    if (event === "seed") {
      live = { rev: data.rev, state: data.state };
    } else if (event === "delta") {
      if (data.from !== live.rev || data.patch === null) return;  // the stream re-seeds on a gap
      live = { rev: data.to, state: applyPatch(live.state, data.patch) };
    }
    showLive();
  }, liveAbort.signal);
}

async function refreshDlq() {
  const section = document.getElementById("dlq-section");
  let listing;
  try {
    listing = await api("/v1/dlq?status=pending&limit=50");
  } catch (error) {
    section.hidden = true;
    return;
  }
  section.hidden = false;
  replaceRows(document.getElementById("dlq"), listing.records.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.record = r.record_id;
    tr.append(cell(r.record_id), cell(r.origin), cell(r.operation), cell(r.status), cell(r.error));
    return tr;
  }));
  const replays = (await api("/v1/dlq/replays?limit=1")).replays;
  if (replays.length) {
    const last = replays[0];
    const report = document.getElementById("dlq-report");
    report.textContent = JSON.stringify(last.error ? { error: last.error } : last.report, null, 2);
    report.className = "";
  }
}

async function refreshTasks() {
  const section = document.getElementById("tasks-section");
  let listing;
  try {
    listing = await api("/v1/tasks");
  } catch (error) {
    section.hidden = true;
    return;
  }
  section.hidden = false;
  replaceRows(document.getElementById("tasks"), listing.tasks.map((t) => {
    const tr = document.createElement("tr");
    tr.dataset.task = t.task_id;
    tr.append(cell(t.task_id), cell(t.name), cell(t.status), cell(t.attempt || 0), cell(t.last_error));
    const actions = document.createElement("td");
    actions.append(button("cancel", () => api("/v1/tasks/" + encodeURIComponent(t.task_id) + "/cancel", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ by: "admin page" }),
    })));
    tr.append(actions);
    return tr;
  }));
}

async function refresh() {
  const connection = document.getElementById("connection");
  try {
    renderProcessors(await api("/v1/processors"));
    await Promise.all([refreshDlq(), refreshTasks()]);
    connection.textContent = "live";
    connection.className = "ok";
  } catch (error) {
    connection.textContent = String(error.message || error);
    connection.className = "down";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("live-slug").addEventListener("change", (e) => watch(e.target.value));
  document.getElementById("dlq-replay").addEventListener("click", async () => {
    await api("/v1/dlq/replay", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ by: "admin page" }),
    });
    refresh();
  });
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
    document.getElementById("token-form").hidden = true;
    refresh();
  });
  refresh();
  setInterval(refresh, 1000);
});

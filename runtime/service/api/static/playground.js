// companion playground: a worked example of the public HTTP API (/v1/...).
// Every string from the server is put on the page with textContent, never parsed as markup.
// The app key stays in this browser (localStorage) and goes out only as the Bearer header.
"use strict";

const KEY_STORE = "companion.playground.key";
const SOURCES = ["persona", "summary", "memory", "retrieval", "recent"];
const FINAL_PARSE = new Set(["ready", "empty", "needs_ocr", "failed"]);

const state = {
  key: localStorage.getItem(KEY_STORE) || "",
  user: null,        // the app's id for the user
  session: null,     // SessionOut
  pending: [],       // FileOut of files to send with the next message
  files: new Map(),  // file id -> FileOut, for naming attachments
  editing: null,     // seq of the user turn being edited
  busy: false,
  character: null,   // the character a new session talks as (a CharacterOut id)
  avatarUrl: null,   // an object URL of the shown avatar
};

const $ = (id) => document.getElementById(id);

// el("li", {className: "x"}, "text", child) -- strings become text nodes, never markup
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (name === "dataset") Object.assign(node.dataset, value);
    else if (name === "style") Object.assign(node.style, value);
    else node[name] = value;
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setStatus(text, kind) {
  const status = $("status");
  status.textContent = text || "";
  status.className = kind || "";
}

class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || "";
  }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.key}` };
  const init = { method, headers };
  if (body instanceof FormData) init.body = body;
  else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

const enc = encodeURIComponent;

function report(err) {
  if (err instanceof ApiError && err.status === 401) setStatus(`Key refused: ${err.message}`, "error");
  else setStatus(err.message || String(err), "error");
}

// -- server-sent events over fetch (EventSource cannot POST or send a header) ---------------
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const event = { event: "message", data: [] };
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "data") event.data.push(val);
        else if (field === "event") event.event = val;
      }
      if (event.data.length) yield { event: event.event, data: JSON.parse(event.data.join("\n")) };
    }
  }
}

// -- users and sessions ---------------------------------------------------------------------
async function loadUsers(select) {
  const users = await api("GET", "/v1/users");
  const box = $("user-select");
  box.replaceChildren(el("option", { value: "", disabled: true }, users.length ? "pick a user" : "no users yet: add one"));
  for (const u of users) box.append(el("option", { value: u.id }, u.id));
  const want = select || state.user;
  if (want && users.some((u) => u.id === want)) {
    box.value = want;
    await pickUser(want);
  } else {
    box.value = "";
    await pickUser(null);
  }
}

async function pickUser(userId, sessionId) {
  state.user = userId;
  state.files.clear();
  const box = $("session-select");
  box.replaceChildren();
  if (!userId) {
    await pickSession(null);
    return;
  }
  const [sessions, files] = await Promise.all([
    api("GET", `/v1/users/${enc(userId)}/sessions`),
    api("GET", `/v1/users/${enc(userId)}/files`),
  ]);
  for (const f of files) state.files.set(f.id, f);
  box.append(el("option", { value: "", disabled: true }, sessions.length ? "pick a session" : "no sessions: start one"));
  for (const s of sessions.slice().reverse()) {
    const label = `${s.id} · ${s.persona} · ${s.closed_at ? "closed" : "open"} · ${new Date(s.last_activity_at).toLocaleString()}`;
    box.append(el("option", { value: s.id }, label));
  }
  const want = sessionId || (sessions.length ? sessions[sessions.length - 1].id : "");
  box.value = want;
  await pickSession(want || null);
}

async function pickSession(sessionId) {
  state.session = sessionId ? await api("GET", `/v1/sessions/${enc(sessionId)}`) : null;
  cancelEdit();
  renderSessionInfo();
  if (state.session) {
    $("character-select").value = state.session.character_id;
    state.character = state.session.character_id;
  }
  await Promise.all([loadTurns(), loadContext(), showAvatar(), loadMemories()]);
}

// -- memories: GET /v1/users/{id}/memories, DELETE /v1/memories/{id} ----------------------------
async function loadMemories() {
  const list = $("memories");
  const learned = $("learned");
  list.replaceChildren();
  learned.replaceChildren();
  if (!state.user || !state.session) return;
  const query = `?character_id=${enc(state.session.character_id)}&limit=50`;
  const page = await api("GET", `/v1/users/${enc(state.user)}/memories${query}`);
  if (!page.data.length) list.append(el("li", { className: "empty" }, "nothing archived yet"));
  for (const m of page.data) {
    const forget = el("button", { type: "button", className: "quiet forget" }, "Forget");
    forget.addEventListener("click", guarded(async () => {
      const out = await api("DELETE", `/v1/memories/${enc(m.id)}`);
      setStatus(`forgot ${m.id}: ${out.deleted.summaries} summaries rewritten`, "ok");
      await Promise.all([loadMemories(), loadContext()]);
    }));
    list.append(
      el(
        "li",
        { className: "card memory", dataset: { id: m.id } },
        el("div", { className: "card-head" }, `${m.date.slice(0, 10)} · turns ${m.first_seq}–${m.last_seq} `, forget),
        el("pre", { className: "content" }, m.content),
      ),
    );
  }
  for (const fact of page.learned) learned.append(el("li", {}, `learned: ${fact}`));
}

// -- characters: GET /v1/characters, POST /v1/characters (a card file), the avatar ----------------
async function loadCharacters(select) {
  const query = state.user ? `?user_id=${enc(state.user)}&limit=200` : "?limit=200";
  const page = await api("GET", `/v1/characters${query}`);
  const box = $("character-select");
  box.replaceChildren();
  for (const c of page.data) box.append(el("option", { value: c.id }, `${c.name} (${c.scope})`));
  const want = select || state.character;
  if (want && page.data.some((c) => c.id === want)) box.value = want;
  state.character = box.value || null;
  await showAvatar();
}

async function showAvatar() {
  const img = $("avatar");
  if (state.avatarUrl) URL.revokeObjectURL(state.avatarUrl);
  state.avatarUrl = null;
  img.hidden = true;
  const id = state.character;
  if (!id) return;
  const query = state.user ? `?user_id=${enc(state.user)}` : "";
  const response = await fetch(`/v1/characters/${enc(id)}/avatar${query}`, {
    headers: { Authorization: `Bearer ${state.key}` },
  });
  if (!response.ok || id !== state.character) return;
  state.avatarUrl = URL.createObjectURL(await response.blob());
  img.src = state.avatarUrl;
  img.alt = `avatar of ${$("character-select").selectedOptions[0]?.textContent || "the character"}`;
  img.hidden = false;
}

async function uploadCard() {
  const input = $("character-file");
  const file = input.files[0];
  input.value = "";
  if (!file) return;
  const form = new FormData();
  form.append("file", file, file.name);
  const made = await api("POST", "/v1/characters", form);
  await loadCharacters(made.id);
  setStatus(`character ${made.name} added (revision ${made.revision}); start a new session to talk with it`, "ok");
}

function renderSessionInfo() {
  const s = state.session;
  $("persona").textContent = s ? s.persona : "";
  $("session-info").textContent = s
    ? `${s.id}${s.carried_from ? ` (carried from ${s.carried_from})` : ""}${s.closed_at ? ` · closed by ${s.closed_by}` : ""}`
    : "no session";
  const open = !!s && !s.closed_at;
  $("close-session").disabled = !open;
  $("reset-breaker").disabled = !s;
  $("send").disabled = !open || state.busy;
  $("message").disabled = !open;
  $("file").disabled = !state.user;
}

// -- the chat -------------------------------------------------------------------------------
function fileChip(id) {
  const f = state.files.get(id);
  const name = f ? f.name : id;
  return el("li", { className: "chip", title: id }, name, f ? el("span", { className: "muted" }, ` ${f.parse_state}`) : null);
}

function turnNode(turn) {
  const item = el("li", { className: `turn ${turn.role}`, dataset: { seq: turn.seq ?? "", role: turn.role } });
  const head = el("div", { className: "turn-head" },
    el("span", { className: "role" }, turn.role),
    turn.seq !== undefined ? el("span", { className: "muted" }, ` #${turn.seq}`) : null,
    turn.state && turn.state !== "context" ? el("span", { className: "badge" }, turn.state) : null,
    turn.interrupted ? el("span", { className: "badge warn" }, "interrupted") : null);
  if (turn.role === "user" && turn.state === "context" && state.session && !state.session.closed_at) {
    head.append(el("button", { type: "button", className: "quiet edit", onclick: () => startEdit(turn) }, "edit"));
  }
  item.append(head, el("div", { className: "content" }, turn.content));
  if (turn.attachments && turn.attachments.length) {
    item.append(el("ul", { className: "chips" }, turn.attachments.map(fileChip)));
  }
  return item;
}

async function loadTurns() {
  const list = $("messages");
  if (!state.session) {
    list.replaceChildren();
    return;
  }
  const turns = await api("GET", `/v1/sessions/${enc(state.session.id)}/turns`);
  list.replaceChildren(...turns.map(turnNode));
  list.scrollTop = list.scrollHeight;
}

function startEdit(turn) {
  state.editing = turn.seq;
  $("editing-seq").textContent = `#${turn.seq}`;
  $("editing").hidden = false;
  $("message").value = turn.content;
  $("message").focus();
}

function cancelEdit() {
  state.editing = null;
  $("editing").hidden = true;
}

async function send(event) {
  event.preventDefault();
  const text = $("message").value;
  if (!state.session || state.busy || !text.trim()) return;
  const body = { content: text, stream: true, attachments: state.pending.map((f) => f.id) };
  const path = state.editing !== null
    ? `/v1/sessions/${enc(state.session.id)}/turns/${state.editing}/resend`
    : `/v1/sessions/${enc(state.session.id)}/messages`;
  const list = $("messages");
  if (state.editing !== null) {
    for (const node of [...list.children]) if (Number(node.dataset.seq) >= state.editing) node.remove();
  }
  list.append(turnNode({ role: "user", content: text, attachments: body.attachments }));
  const reply = turnNode({ role: "assistant", content: "" });
  reply.classList.add("streaming");
  list.append(reply);
  list.scrollTop = list.scrollHeight;
  const content = reply.querySelector(".content");
  state.busy = true;
  renderSessionInfo();
  setStatus("replying…");
  try {
    const response = await fetch(path, {
      method: "POST",
      headers: { Authorization: `Bearer ${state.key}`, "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify(body),
    });
    if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
    $("message").value = "";
    state.pending = [];
    cancelEdit();
    renderPending();
    let done = null;
    for await (const ev of sseEvents(response)) {
      if (ev.event === "delta") {
        content.textContent += ev.data.text;
        list.scrollTop = list.scrollHeight;
      } else if (ev.event === "done") {
        done = ev.data;
      } else if (ev.event === "error") {
        throw new ApiError(500, ev.data);
      }
    }
    if (done) {
      const u = done.usage;
      setStatus(`reply stored as turn #${done.assistant_seq}: prompt ≈ ${u.prompt_estimate_tokens} of ${u.window} tokens` +
        (u.prompt_tokens !== null ? ` (provider: ${u.prompt_tokens})` : "") +
        (done.compactions ? `, ${done.compactions} compaction(s)` : ""), "ok");
    }
  } catch (err) {
    report(err);
  } finally {
    reply.classList.remove("streaming");
    await Promise.all([loadTurns(), loadContext()]).catch(report);
    state.busy = false;  // Send comes back once the turns and the context view show the new turn
    renderSessionInfo();
  }
}

// -- files ------------------------------------------------------------------------------------
function renderPending() {
  $("attachments").replaceChildren(...state.pending.map((f) => {
    const chip = fileChip(f.id);
    chip.append(el("button", {
      type: "button", className: "quiet", title: "do not send", onclick: () => {
        state.pending = state.pending.filter((p) => p.id !== f.id);
        renderPending();
      },
    }, "×"));
    return chip;
  }));
}

async function upload() {
  const input = $("file");
  const file = input.files[0];
  if (!file || !state.user) return;
  const form = new FormData();
  form.append("file", file, file.name);
  setStatus(`uploading ${file.name}…`);
  try {
    let stored = await api("POST", `/v1/users/${enc(state.user)}/files`, form);
    state.files.set(stored.id, stored);
    if (!state.pending.some((p) => p.id === stored.id)) state.pending.push(stored);
    renderPending();
    setStatus(`${stored.name}: ${stored.size_bytes} bytes, ${stored.mime}; it goes with your next message`, "ok");
    for (let i = 0; i < 40 && !FINAL_PARSE.has(stored.parse_state); i++) {
      await new Promise((r) => setTimeout(r, 250));
      stored = await api("GET", `/v1/files/${enc(stored.id)}`);
      state.files.set(stored.id, stored);
      renderPending();
    }
  } catch (err) {
    report(err);
  } finally {
    input.value = "";
  }
}

// -- the context view -------------------------------------------------------------------------
async function loadContext() {
  if (!state.session) {
    renderContext(null, null);
    return;
  }
  const id = enc(state.session.id);
  const [context, summary] = await Promise.all([api("GET", `/v1/sessions/${id}/context`), api("GET", `/v1/sessions/${id}/summary`)]);
  renderContext(context, summary);
}

function pct(tokens, window) {
  return `${Math.max(0, (100 * tokens) / window).toFixed(3)}%`;
}

function segmentCard(r, extra = "") {
  const why = r.reasons.map((reason) => el("span", { className: `badge why-${reason}` }, reason.replace("_", " ")));
  const ranks = [r.vector_rank ? `vector #${r.vector_rank}` : "", r.text_rank ? `full text #${r.text_rank}` : "",
    r.neighbour_of !== null ? `next to segment ${r.neighbour_of}` : ""].filter(Boolean).join(", ");
  return el("li", { className: extra ? `card ${extra}` : "card" },
    el("div", { className: "card-head" }, el("span", { className: "date" }, r.session_date.slice(0, 10)), ...why,
      el("span", { className: "muted" }, ` score ${r.score.toFixed(3)} · ${ranks} · ${r.tokens} tok`)),
    el("div", { className: "content" }, r.content));
}

function renderContext(ctx, summary) {
  const pane = $("context-pane");
  pane.classList.toggle("empty", !ctx);
  for (const id of ["bar", "legend", "notices", "recalled", "withheld", "lore", "context-files", "source-text-list"]) $(id).replaceChildren();
  $("sources").tBodies[0].replaceChildren();
  $("summary").textContent = "";
  $("context-total").textContent = ctx ? "" : "Pick a session to see its context.";
  $("last-reply").textContent = "";
  if (!ctx) return;
  pane.dataset.total = ctx.total_tokens;

  const bySource = SOURCES.filter((s) => ctx.sources[s]).map((s) => [s, ctx.sources[s].tokens]);
  const counted = bySource.reduce((a, [, t]) => a + t, 0);
  // overhead: what the provider adds per request, the file tool's schema, image pixels;
  // priming: the tokens that start the reply
  const priming = Math.max(ctx.total_tokens - counted - ctx.overhead_tokens, 0);
  const free = Math.max(ctx.window - ctx.total_tokens - ctx.reply_reserve, 0);
  const parts = [...bySource, ["overhead", ctx.overhead_tokens], ["priming", priming], ["reserve", ctx.reply_reserve], ["free", free]];
  $("context-total").textContent =
    `${ctx.total_tokens} tokens + ${ctx.reply_reserve} reserved for the reply, of a ${ctx.window}-token window (${free} free)`;
  const last = ctx.last_reply;
  $("last-reply").textContent = last && last.prompt_tokens !== null
    ? `last reply: ${last.prompt_tokens} prompt tokens, ${last.cached_tokens ?? "?"} from the provider's cache` +
      (last.cache_write_tokens ? `, ${last.cache_write_tokens} written to it` : "") +
      (last.cost_usd !== null && last.cost_usd !== undefined ? `, $${last.cost_usd.toFixed(6)}` : "")
    : "";
  $("bar").setAttribute("aria-label", parts.map(([n, t]) => `${n} ${t}`).join(", "));
  for (const [name, tokens] of parts) {
    if (tokens <= 0) continue;
    $("bar").append(el("span", { className: `seg s-${name}`, title: `${name}: ${tokens} tokens`, style: { width: pct(tokens, ctx.window) } }));
    $("legend").append(el("li", {}, el("span", { className: `swatch s-${name}` }), `${name} ${tokens}`));
  }

  const rows = $("sources").tBodies[0];
  for (const name of SOURCES) {
    const s = ctx.sources[name];
    if (!s) continue;
    const meter = el("span", { className: "meter" },
      el("span", { className: `fill s-${name}${s.tokens > s.cap ? " over" : ""}`, style: { width: `${Math.min(100, s.cap ? (100 * s.tokens) / s.cap : 0)}%` } }));
    rows.append(el("tr", { dataset: { source: name } },
      el("td", {}, name), el("td", { className: "num" }, `${s.tokens} / ${s.cap}`), el("td", {}, meter),
      el("td", { className: "num" }, String(s.items)), el("td", { className: "cut" }, s.cut || "")));
    if (s.text) {
      $("source-text-list").append(el("h4", {}, name), el("pre", { className: "text" }, s.text));
    }
  }

  const notices = $("notices");
  if (!ctx.notices.length) notices.append(el("li", { className: "muted" }, "nothing was cut"));
  for (const n of ctx.notices) notices.append(el("li", {}, el("span", { className: "badge" }, n.source), " ", n.text));

  const recalled = $("recalled");
  if (!ctx.recalled.length) recalled.append(el("li", { className: "muted" }, "nothing recalled for this message"));
  for (const r of ctx.recalled) recalled.append(segmentCard(r));
  // the cache layout's kept recall block stayed: what recall selected beyond what it shows
  const withheld = $("withheld");
  const notShown = ctx.withheld || [];
  if (!notShown.length) withheld.append(el("li", { className: "muted" }, "the prompt shows all recall selected"));
  for (const r of notShown) withheld.append(segmentCard(r, "withheld"));

  const lore = $("lore");
  if (!ctx.retrieved.length) lore.append(el("li", { className: "muted" }, "no lorebook entry fired, no knowledge matched"));
  for (const item of ctx.retrieved) {
    const why = item.kind === "lore"
      ? (item.key ? el("span", {}, "fired by key ", el("code", {}, item.key)) : el("span", {}, "constant entry"))
      : el("span", {}, `knowledge, distance ${item.distance.toFixed(3)}`);
    lore.append(el("li", { className: "card" },
      el("div", { className: "card-head" }, el("span", { className: "badge" }, item.kind), ` ${item.label} · `, why),
      el("div", { className: "content" }, item.text)));
  }

  const files = $("context-files");
  if (!ctx.attached_files.length) files.append(el("li", { className: "muted" }, "no files in this prompt"));
  for (const id of ctx.attached_files) {
    const folded = (ctx.sources.retrieval && ctx.sources.retrieval.text || "").includes(id);
    const f = state.files.get(id);
    files.append(el("li", { dataset: { file: id } }, f ? f.name : id, " ",
      el("span", { className: "badge" }, folded ? "folded (retrieval)" : "with its message (recent)")));
  }

  $("summary").textContent = summary && summary.content ? summary.content : "no summary yet (nothing has rolled out)";
}

// -- wiring -----------------------------------------------------------------------------------
async function useKey(event) {
  if (event) event.preventDefault();
  const typed = $("key").value.trim();
  const previous = state.key;
  if (typed) state.key = typed;
  if (!state.key) {
    setStatus("Paste an app key (companion apps create NAME) to start.");
    return;
  }
  try {
    await loadUsers();
    await loadCharacters();
    localStorage.setItem(KEY_STORE, state.key);
    $("key").value = "";
    $("key").placeholder = "key saved in this browser";
    setStatus("connected", "ok");
  } catch (err) {
    if (typed) state.key = previous;  // a refused key is not kept
    report(err);
  }
}

function forgetKey() {
  localStorage.removeItem(KEY_STORE);
  state.key = "";
  state.user = null;
  $("key").placeholder = "ck_… from companion apps create NAME";
  $("user-select").replaceChildren();
  pickUser(null).catch(report);
  setStatus("key forgotten");
}

function guarded(fn) {
  return (...args) => fn(...args).catch(report);
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", useKey);
  $("forget-key").addEventListener("click", forgetKey);
  $("user-select").addEventListener("change", guarded(async (e) => {
    await pickUser(e.target.value);
    await loadCharacters();
  }));
  $("character-select").addEventListener("change", guarded(async (e) => {
    state.character = e.target.value;
    await showAvatar();
  }));
  $("character-file").addEventListener("change", guarded(uploadCard));
  $("session-select").addEventListener("change", guarded((e) => pickSession(e.target.value)));
  $("create-user").addEventListener("click", guarded(async () => {
    const id = $("new-user").value.trim();
    if (!id) return;
    await api("POST", "/v1/users", { id });
    $("new-user").value = "";
    await loadUsers(id);
  }));
  $("new-session").addEventListener("click", guarded(async () => {
    if (!state.user) return setStatus("Pick or add a user first.", "error");
    const created = await api("POST", "/v1/sessions", { user_id: state.user, character_id: state.character });
    await pickUser(state.user, created.id);
    setStatus(`session ${created.id} started${created.carried_from ? ` from ${created.carried_from}'s summary` : ""}`, "ok");
  }));
  $("close-session").addEventListener("click", guarded(async () => {
    const out = await api("POST", `/v1/sessions/${enc(state.session.id)}/close`);
    await pickUser(state.user, out.session.id);
    setStatus(`closed: ${out.rolled_turns} turns rolled out, ${out.segments} segments archived`, "ok");
  }));
  $("reset-breaker").addEventListener("click", guarded(async () => {
    const out = await api("POST", `/v1/sessions/${enc(state.session.id)}/breaker/reset`);
    setStatus(`breaker ${out.state}; ${out.consecutive_failures} failures, ${out.compactions} compactions`, "ok");
  }));
  $("refresh-context").addEventListener("click", guarded(loadContext));
  $("refresh-memories").addEventListener("click", guarded(loadMemories));
  $("cancel-edit").addEventListener("click", cancelEdit);
  $("composer").addEventListener("submit", send);
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("composer").requestSubmit();
  });
  $("file").addEventListener("change", upload);
  renderSessionInfo();
  renderContext(null, null);
  if (state.key) useKey();
  else setStatus("Paste an app key (companion apps create NAME) to start.");
});

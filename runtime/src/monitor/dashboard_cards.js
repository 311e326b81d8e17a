// The dashboard's cards beyond the charts (loaded after dashboard_charts.js): the Text card, the
// Cluster card (workers, heartbeats, last lines, membership changes, failures), the Parameter
// servers card and the Actors card. Everything that came from the trainer or the network is
// shown with textContent only, never markup. Served without the token (/dashboard_cards.js).
"use strict";
function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}
// The trainer's text summaries (Monitor::publish_text): the newest of each tag, with its step. The
// text is the trainer's (made printable there) and is shown with textContent only, never markup.
let textsSeen = 0;
function showTexts(texts) {
  for (const t of texts || []) {
    if (t.sequence <= textsSeen) continue;
    textsSeen = t.sequence;
    let el = window.troupe.texts[t.tag];
    if (!el) {
      const h = document.createElement("h3");
      h.className = "text-tag";
      const pre = document.createElement("pre");
      pre.className = "text-sample";
      pre.dataset.tag = t.tag;
      $("texts").append(h, pre);
      $("texts-card").style.display = "";
      el = window.troupe.texts[t.tag] = { h, pre };
    }
    el.step = t.step;
    el.text = t.text;
    el.sequence = t.sequence;
    el.h.textContent = t.tag + " ";
    el.h.appendChild(Object.assign(document.createElement("span"), { className: "dim", textContent: "at step " + t.step }));
    el.pre.textContent = t.text;
  }
}
// Cells built with textContent only: a task name, an address or a fault's text came from the
// network and is never markup.
function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}
// The heartbeat ages tick between polls: the age the server gave, plus the time since it gave it.
let heartbeats = { at: 0, ages: [] };
function ageText(i) {
  const a = heartbeats.ages[i];
  if (a === null || a === undefined) return "-";
  return Math.round(a + (performance.now() - heartbeats.at)) + " ms";
}
function tickAges() {
  if (ended) return;
  document.querySelectorAll("#workers td.hb-age").forEach((td, i) => { td.textContent = ageText(i); });
}
function showWorkers(workers, members) {
  const body = $("workers");
  body.textContent = "";
  // An elastic cluster's workers no longer in the ring (lost, or left) follow, marked.
  const gone = members.filter(m => m.ring_rank === null);
  heartbeats = { at: performance.now(), ages: workers.map(w => w.heartbeat_age_ms ?? null).concat(gone.map(m => m.heartbeat_age_ms ?? null)) };
  workers.forEach((w, i) => {
    const row = body.insertRow();
    row.dataset.worker = w.worker;
    cell(row, String(w.worker));
    cell(row, w.task || "-");
    cell(row, w.replicas.join(", "));
    cell(row, w.devices.join(", "));
    cell(row, w.step ?? "-", "num");
    cell(row, ended ? window.troupe.status : w.paused ? "paused" : "running", "run-state");
    cell(row, w.state || "-", "hb-state hb-" + (w.state || "none"));
    cell(row, ageText(i), "hb-age num");
    // The process serving this page measures itself; every other worker's come with its heartbeat.
    const cpu = cell(row, w.cpu_percent === null || w.cpu_percent === undefined ? "-" : Math.round(w.cpu_percent) + " %", "cpu num");
    const memory = cell(row, bytes(w.rss_bytes), "memory num");
    cpu.title = memory.title = w.usage_from === "self" ? "measured by the process serving this page"
      : w.usage_from === "heartbeat" ? "as of worker " + w.worker + "'s last heartbeat" : "no report from worker " + w.worker + " yet";
    const button = document.createElement("button");
    button.textContent = "last lines";
    button.className = "logs";
    button.onclick = () => showLogs(w.worker);
    row.insertCell().appendChild(button);
  });
  gone.forEach((m, i) => {
    const row = body.insertRow();
    row.className = "gone";
    cell(row, "-");
    cell(row, m.task || "-");
    cell(row, "-");
    cell(row, "-");
    cell(row, "-", "num");
    cell(row, "out of the ring", "run-state");
    cell(row, m.state || "-", "hb-state hb-" + (m.state || "none"));
    cell(row, ageText(workers.length + i), "hb-age num");
    cell(row, "-", "cpu num");
    cell(row, "-", "memory num");
    cell(row, "");
  });
}
// An elastic cluster's changes, newest first (peer text: never markup).
function showChanges(changes) {
  const list = $("changes");
  list.textContent = "";
  if (!changes.length) {
    const li = document.createElement("li");
    li.className = "none";
    li.textContent = "none";
    list.appendChild(li);
    return;
  }
  changes.slice().reverse().forEach(c => {
    const li = document.createElement("li");
    const parts = [];
    if (c.left.length) parts.push(c.left.join(", ") + (c.leave ? " left (asked to leave; nothing rolled back)" : " lost"));
    if (c.joined.length) parts.push(c.joined.join(", ") + " joined");
    li.textContent = "step " + c.step + ": " + parts.join("; ") + "; " + c.workers + " workers as ring generation " +
      c.generation + ", paused " + c.paused_ms + " ms" + (c.state_bytes ? " (state " + bytes(c.state_bytes) + ")" : "");
    list.appendChild(li);
  });
}
async function showLogs(worker) {
  const pre = $("logs");
  pre.style.display = "block";
  try {
    const r = await fetch(withToken("/api/logs?worker=" + worker));
    const body = await r.json();
    // textContent only: another worker's lines came over the network and are never markup.
    const from = body.from === "heartbeat" ? " (the last " + body.lines.length + " of " + body.lines_total + ", from its heartbeat)" : "";
    pre.textContent = r.ok ? "worker " + worker + ", last lines" + from + ":\n" + (body.lines.length ? body.lines.join("\n") : "(none yet)") : body.error;
  } catch (e) { pre.textContent = "the trainer does not answer"; }
}
const kindNames = { worker_late: "late", worker_back: "back", worker_lost: "lost", fault_reported: "fault",
                    connection_refused: "refused", collective_error: "collective error", stall: "stall", stall_cleared: "stall cleared", membership_changed: "membership changed", worker_joined: "joined", monitor: "monitor" };
function showFailures(failures, cluster) {
  const list = $("failures");
  list.textContent = "";
  $("failures-count").textContent =
    cluster && cluster.events_total > failures.length ? "(newest " + failures.length + " of " + cluster.events_total + ")" : "";
  if (!failures.length) {
    const li = document.createElement("li");
    li.className = "none";
    li.textContent = "none";
    list.appendChild(li);
    return;
  }
  for (const f of failures) {  // newest first, as the server sends them
    const li = document.createElement("li");
    li.className = "failure";
    li.dataset.kind = f.kind;
    const when = document.createElement("span");
    when.className = "when";
    when.textContent = new Date(f.time_unix_ms).toLocaleTimeString();
    const kind = document.createElement("span");
    kind.className = "kind";
    kind.textContent = (kindNames[f.kind] || f.kind) + (f.worker !== null && f.worker !== undefined ? " (worker " + f.worker + ")" : "");
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = (f.address ? f.address + ": " : "") + f.text;
    li.append(when, kind, text);
    list.appendChild(li);
  }
}
// A parameter-server cluster (the chief of ParameterServerStrategy): the closure queue, every
// worker and ps task, and the closures lost, retried and cancelled as events. Task names and
// event texts are shown with textContent only.
const psKindNames = { worker_lost: "worker lost", worker_back: "worker back", closures_retried: "retried",
                      closures_cancelled: "cancelled", closure_failed: "failed", stall: "stall", ps_lost: "ps task lost",
                      ps_back: "ps task back" };
let psLastX = -1;
function rate(v, unit) { return v === null || v === undefined ? "-" : (unit ? bytes(v) + "/s" : Number(v).toFixed(1)); }
function showPs(ps, progress) {
  if (!ps) return;
  window.troupe.ps = ps;
  $("ps-card").style.display = "";
  $("ps-rate").textContent = rate(ps.closures_per_s);
  $("ps-queued").textContent = ps.queued;
  $("ps-in-flight").textContent = ps.in_flight;
  $("ps-done").textContent = ps.done;
  $("ps-retried").textContent = ps.retried;
  $("ps-cancelled").textContent = ps.cancelled;
  $("ps-failed").textContent = ps.failed;
  $("ps-workers-lost").textContent = ps.workers_lost;
  const x = progress ? Math.round(progress.elapsed_s * 10) / 10 : null;
  if (x !== null && x > psLastX) {
    psLastX = x;
    const [r, q, f] = psChart.data.datasets;
    push(psChart, r, x, ps.closures_per_s);
    push(psChart, q, x, ps.queued);
    push(psChart, f, x, ps.in_flight);
    if (r.raw.length > MAX_POINTS) psChart.data.datasets.forEach(ds => { ds.raw = ds.raw.filter((_, i) => i % 2 === 0); ds.data = ds.raw.slice(); });
  }
  const workers = $("ps-workers");
  workers.textContent = "";
  for (const w of ps.workers) {
    const row = workers.insertRow();
    row.dataset.worker = w.worker;
    cell(row, String(w.worker));
    cell(row, w.task);
    cell(row, w.state, "ps-state ps-" + w.state);
    cell(row, String(w.in_flight), "num");
    cell(row, String(w.closures_done), "num ps-done");
    cell(row, rate(w.closures_per_s), "num ps-rate");
    cell(row, w.samples_per_s === null || w.samples_per_s === undefined ? "-" : String(Math.round(w.samples_per_s)), "num ps-samples-rate");
    cell(row, w.last_result_age_ms === null ? "-" : Math.round(w.last_result_age_ms) + " ms ago", "num");
    cell(row, String(w.times_lost), "num");
  }
  const tasks = $("ps-tasks");
  tasks.textContent = "";
  for (const p of ps.ps) {
    const row = tasks.insertRow();
    row.dataset.ps = p.ps;
    cell(row, String(p.ps));
    cell(row, p.task);
    cell(row, p.state, "ps-state ps-" + p.state);
    cell(row, p.shards ?? "-", "num");
    cell(row, bytes(p.bytes_held), "num ps-bytes");
    cell(row, p.updates ?? "-", "num ps-updates");
    cell(row, rate(p.updates_per_s), "num ps-update-rate");
    cell(row, rate(p.bytes_in_per_s, true), "num");
    cell(row, rate(p.bytes_out_per_s, true), "num");
    cell(row, p.report_age_ms === null ? "-" : Math.round(p.report_age_ms) + " ms", "num");
  }
  const list = $("ps-events");
  list.textContent = "";
  $("ps-events-count").textContent = ps.events_total > ps.events.length ? "(newest " + ps.events.length + " of " + ps.events_total + ")" : "";
  if (!ps.events.length) {
    list.appendChild(Object.assign(document.createElement("li"), { className: "none", textContent: "none" }));
    return;
  }
  for (const e of ps.events) {  // newest first, as the server sends them
    const li = document.createElement("li");
    li.className = "ps-event";
    li.dataset.kind = e.kind;
    const when = Object.assign(document.createElement("span"), { className: "when", textContent: new Date(e.time_unix_ms).toLocaleTimeString() });
    const kind = Object.assign(document.createElement("span"), { className: "kind",
      textContent: (psKindNames[e.kind] || e.kind) + (e.worker !== null ? " (worker " + e.worker + ")" : "") + (e.ps !== null ? " (ps " + e.ps + ")" : "") +
                   (e.step !== null ? " at step " + e.step : "") });
    const text = Object.assign(document.createElement("span"), { className: "text", textContent: e.text });
    li.append(when, kind, text);
    list.appendChild(li);
  }
}
// The actors an application's ActorCluster spawned (Monitor::actor_events, describe_actor): where
// each lives, its state, restarts and last reply, and the application's numbers for it; the first
// number of each label drawn over the steps. Labels, tasks and causes are shown as text only.
// Rows are kept by actor id and updated in place, so that a poll never replaces a button under a
// person's click; the actions the trainer offers (Monitor::add_actor_action) are a button each on
// every running row.
const actorRows = new Map();
function actionTitle(name) { const t = name.replace(/_/g, " "); return t.charAt(0).toUpperCase() + t.slice(1); }
function actorRow(body, r, columns, actions) {
  let row = actorRows.get(r.id);
  if (row && row.cells.length === columns) return row;
  if (row) row.remove();
  row = document.createElement("tr");
  row.dataset.id = r.id;
  for (let i = 0; i < columns; i++) row.insertCell();
  if (actions.length) {
    const td = row.cells[columns - 1];
    td.className = "actor-actions";
    for (const a of actions) {
      const button = document.createElement("button");
      button.id = "actor-" + r.id + "-" + a.name;
      button.dataset.action = a.name;
      button.textContent = actionTitle(a.name);
      button.title = a.help || a.name;
      button.onclick = () => postActorCommand(r.id, a.name);
      td.appendChild(button);
    }
  }
  actorRows.set(r.id, row);
  return row;
}
function setCell(td, text, className) {
  if (td.textContent !== text) td.textContent = text;
  td.className = className || "";
  return td;
}
function showActors(a) {
  if (!a) return;
  window.troupe.actors = a;
  $("actors-card").style.display = "";
  $("actors-running").textContent = a.running;
  $("actors-spawned").textContent = a.spawned;
  $("actors-down").textContent = a.down;
  $("actors-stopped").textContent = a.stopped;
  $("actors-restarts").textContent = a.restarts;
  const names = [];
  for (const r of a.actors) for (const n of Object.keys(r.values)) if (!names.includes(n)) names.push(n);
  const actions = a.actions || [];
  const head = $("actors-head");
  const wanted = names.concat(actions.length ? ["actions"] : []);
  if (Array.from(head.cells).slice(7).map(c => c.textContent).join("\n") !== wanted.join("\n")) {
    while (head.cells.length > 7) head.deleteCell(7);
    for (const n of wanted) head.appendChild(Object.assign(document.createElement("th"), { textContent: n }));
  }
  const columns = 7 + names.length + (actions.length ? 1 : 0);
  const body = $("actors");
  const shown = new Set();
  a.actors.forEach((r, i) => {
    const row = actorRow(body, r, columns, actions);
    shown.add(r.id);
    if (body.rows[i] !== row) body.insertBefore(row, body.rows[i] || null);
    const c = row.cells;
    setCell(c[0], r.label === null ? "#" + r.id : r.label, "actor-label");
    setCell(c[1], r.type);
    setCell(c[2], r.task, "actor-task");
    const state = c[3];
    state.textContent = r.state;
    state.className = "actor-state actor-" + r.state;
    if (r.cause && r.state !== "stopped") state.appendChild(Object.assign(document.createElement("div"), { className: "actor-cause", textContent: r.cause }));
    setCell(c[4], String(r.restarts), "num actor-restarts");
    setCell(c[5], r.last_reply_age_ms === null ? "-" : Math.round(r.last_reply_age_ms) + " ms ago", "num");
    setCell(c[6], r.step === null ? "-" : String(r.step), "num");
    names.forEach((n, k) => {
      const v = r.values[n];
      setCell(c[7 + k], v === undefined || v === null ? "-" : Number(v).toPrecision(4), "num actor-value");
    });
    if (actions.length) {
      const td = c[columns - 1];
      const asked = (a.pending || []).filter(p => p.id === r.id).map(p => p.action);
      // A button whose action waits for the trainer stays disabled until it is taken.
      td.querySelectorAll("button").forEach(b => {
        const waiting = asked.includes(b.dataset.action);
        b.disabled = ended || r.state !== "running" || waiting;
        b.title = ended ? "the training has ended" : r.state !== "running" ? "actions are for running actors" :
          waiting ? b.dataset.action + " asked: the trainer applies it at its next boundary" :
          (actions.find(x => x.name === b.dataset.action) || {}).help || b.dataset.action;
      });
    }
  });
  for (const [id, row] of actorRows) {
    if (!shown.has(id)) { row.remove(); actorRows.delete(id); }
  }
  // What the trainer did with the actions asked (newest first); a refusal in red.
  const list = $("actors-answers");
  list.textContent = "";
  list.style.display = (a.answers || []).length ? "" : "none";
  for (const x of a.answers || []) {
    const li = document.createElement("li");
    if (x.refused) li.className = "refused";
    li.append(Object.assign(document.createElement("span"), { className: "when", textContent: "step " + x.step }),
              Object.assign(document.createElement("span"), { className: "text", textContent: x.text }));
    list.appendChild(li);
  }
  // One line per label: its first number (the one named first) over the steps.
  const first = names[0];
  actorsChart.options.scales.y.title = { display: !!first, text: first || "" };
  a.history.forEach((h, i) => {
    let ds = actorsChart.data.datasets.find(d => d.label === h.label);
    if (!ds) {
      ds = dataset(h.label, colors[i % colors.length], { showLine: true });
      actorsChart.data.datasets.push(ds);
    }
    ds.raw = h.points.filter(p => first in p.values && p.values[first] !== null).map(p => ({ x: p.step, y: p.values[first] }));
    ds.data = ds.raw.slice();
  });
}
// An action on one actor: the server's refusal (an unknown id or action, an actor no longer
// running, the training over) is shown on the Actors card.
async function postActorCommand(id, action) {
  try {
    const r = await fetch(withToken("/api/actor_command?id=" + encodeURIComponent(id) + "&action=" + encodeURIComponent(action)),
                          { method: "POST" });
    const body = await r.json().catch(() => ({}));
    $("actors-message").textContent = r.ok ? "" : (body.error || ("HTTP " + r.status));
  } catch (e) { $("actors-message").textContent = "the trainer does not answer"; }
  pollState();
}

// The dashboard's state and controls (loaded last, after dashboard_charts.js and
// dashboard_cards.js): the header, the status and the end of the run, the control bar and the
// trainer's own controls, the polls of /api/state, the event stream, and the start. Served
// without the token (/dashboard.js): it holds no data, it fetches it with the page's token.
"use strict";
function fmt(v, digits) { return v === null || v === undefined ? "-" : Number(v).toPrecision(digits); }
function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "-";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), sec = s % 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + sec + "s";
}
// The header shows the newest step heard of: events that arrive after a state poll which already
// named a later step (the stream pushes every 100 ms, the state is read every 500 ms) leave it be.
let headerStep = -1;
function showHeader(s) {
  if (s.step < headerStep) return;
  headerStep = s.step;
  $("step").textContent = s.step;
  $("loss").textContent = fmt(s.loss, 5);
  $("lr").textContent = fmt(s.learning_rate, 4);
  if (s.samples_per_s !== undefined) $("rate").textContent = s.samples_per_s === null ? "-" : Math.round(s.samples_per_s);
}
function setStatus(status, reason) {
  window.troupe.status = status;
  $("status").textContent = status;
  $("status").className = status;
  $("end-reason").textContent = reason || "";
  const over = status === "finished" || status === "failed" || status === "stopped";
  if (over) {
    document.querySelectorAll(".controls button, #actors button").forEach(b => { b.disabled = true; b.title = "the training has ended"; });
    $("eta").textContent = "-";
    $("message").textContent = "";
    document.querySelectorAll("#workers td.run-state").forEach(td => { td.textContent = status; });
  }
}
let ended = false;
function showEnd(end) {
  if (ended) return;
  ended = true;
  setStatus(end.status, end.reason);
  if (source) source.close();
  clearInterval(pollTimer);
  scheduleRedraw();
}
let startUnixMs = null;  // the run's start, shown once it is known
function showProgress(p) {
  if (!p) return;
  if (p.start_unix_ms && startUnixMs === null) {
    startUnixMs = p.start_unix_ms;
    $("started").textContent = new Date(p.start_unix_ms).toLocaleTimeString();
  }
  $("epoch").textContent = p.epoch ? p.epoch + (p.epochs ? " / " + p.epochs : "") : "-";
  $("total-steps").textContent = p.total_steps ? " / " + p.total_steps : "";
  $("elapsed").textContent = duration(p.elapsed_s);
  if (!ended) $("eta").textContent = duration(p.eta_s);
}
function showControls(s) {
  if (ended) return;
  const why = "this trainer saves no checkpoints (start it with a checkpoint directory)";
  for (const id of ["checkpoint", "stop"]) {
    $(id).disabled = !s.can_checkpoint;
    $(id).title = s.can_checkpoint ? "" : why;
  }
}
// A poll answered after the end message (sent before it, answered late) is older than what the
// page shows: only the end message's own state is taken then.
function showState(s, final) {
  if (ended && !final) return;
  showHeader(s);
  showProgress(s.progress);
  showControls(s);
  (s.marks || []).forEach(addMark);
  (s.epochs || []).forEach(addEpoch);
  (s.metric_names || []).forEach(metricChart);
  if (s.status === "finished" || s.status === "failed" || s.status === "stopped") showEnd({ status: s.status, reason: s.end_reason });
  else setStatus(s.status);
  const c = s.cluster || {};
  $("cluster-summary").textContent = s.workers.length + (s.workers.length === 1 ? " worker, " : " workers, ") + s.replicas_in_sync + " replicas" +
    (c.incarnation ? ", incarnation " + c.incarnation.slice(0, 8) + (c.restart_count ? " (restart " + c.restart_count + ")" : "") : "");
  const stall = $("cluster-stall");
  stall.textContent = c.stall || "";  // the inspector's line (peer text: never markup)
  stall.style.display = c.stall ? "" : "none";
  showWorkers(s.workers, c.members || []);
  showChanges(c.changes || []);
  showAppControls(s.controls);
  showTexts(s.texts);
  const select = $("breakdown-worker");
  if (select.options.length !== s.workers.length) {
    select.innerHTML = s.workers.map(w => "<option value=\"" + w.worker + "\">worker " + w.worker + "</option>").join("");
    select.value = String(breakdownWorker);
  }
  showFailures(s.failures, s.cluster);
  markLost(s.failures);
  showPs(s.ps_cluster, s.progress);
  showActors(s.actors);
  const link = $("trace-link");
  if (s.trace.file) { link.style.display = ""; link.href = withToken("/api/trace"); link.textContent = "download trace (" + s.trace.file + ")"; }
  scheduleRedraw();
}
// The trainer's own controls (Monitor::add_control): a field and Set each, with the value in use
// (and one set but not yet applied). Names and help are the trainer's, shown as text only.
function showAppControls(controls) {
  const box = $("app-controls");
  for (const c of controls || []) {
    let el = window.troupe.controls[c.name];
    if (!el) {
      const wrap = document.createElement("span");
      wrap.className = "app-control";
      const label = document.createElement("label");
      label.textContent = c.name + " ";
      const input = document.createElement("input");
      input.type = "text";
      input.id = "control-" + c.name + "-input";
      input.placeholder = String(c.value);
      label.appendChild(input);
      const button = document.createElement("button");
      button.id = "control-" + c.name + "-set";
      button.textContent = "Set";
      button.onclick = () => post("/api/control?name=" + encodeURIComponent(c.name) + "&value=" + encodeURIComponent(input.value));
      const now = document.createElement("span");
      now.className = "now";
      now.id = "control-" + c.name + "-value";
      wrap.title = (c.help ? c.help + "; " : "") + c.min + " to " + c.max;
      wrap.append(label, button, now);
      box.append(Object.assign(document.createElement("span"), { className: "sep" }), wrap);
      el = window.troupe.controls[c.name] = { now };
    }
    el.value = c.value;
    el.pending = c.pending;
    el.now.textContent = "(" + c.value + (c.pending !== null && c.pending !== undefined ? ", " + c.pending + " next step" : "") + ")";
  }
}
async function post(path) {
  try {
    const r = await fetch(withToken(path), { method: "POST" });
    const body = await r.json().catch(() => ({}));
    $("message").textContent = r.ok ? "" : (body.error || ("HTTP " + r.status));
  } catch (e) { $("message").textContent = "the trainer does not answer"; }
  pollState();
}
$("pause").onclick = () => post("/api/pause");
$("resume").onclick = () => post("/api/resume");
$("checkpoint").onclick = () => post("/api/checkpoint");
$("stop").onclick = () => post("/api/stop");
$("stop-now").onclick = () => post("/api/stop?checkpoint=0");
$("lr-set").onclick = () => post("/api/learning_rate?value=" + encodeURIComponent($("lr-input").value));
$("trace").onclick = () => post("/api/trace?steps=" + encodeURIComponent($("trace-steps").value));
$("breakdown-worker").onchange = (ev) => { breakdownWorker = Number(ev.target.value); timeChart.data.datasets.forEach(d => { d.data = []; d.raw = []; }); };
$("smoothing").oninput = (ev) => { view.smoothing = Number(ev.target.value); $("smoothing-value").textContent = view.smoothing.toFixed(2); resmooth(); scheduleRedraw(); };
$("log-scale").onchange = (ev) => { view.log = ev.target.checked; scheduleRedraw(); };
$("ignore-outliers").onchange = (ev) => { view.ignoreOutliers = ev.target.checked; scheduleRedraw(); };
// The trainer gone without saying it ended (killed, crashed): after a few unanswered polls the
// page says so, and keeps what it has.
let unanswered = 0;
async function pollState() {
  if (ended) return;
  try {
    const r = await fetch(withToken("/api/state?epochs_after=" + epochsSeen + "&marks_after=" + marksSeen + "&texts_after=" + textsSeen));
    if (r.ok) { unanswered = 0; showState(await r.json()); }
  } catch (e) {
    if (++unanswered >= 4) showEnd({ status: "failed", reason: "the trainer stopped answering" });
    else if (!ended) $("message").textContent = "the trainer does not answer";
  }
}
let source = null, pollTimer = null;
async function start() {
  // Live events first (held back until the history is in), so that no step falls between them.
  let held = [];
  source = new EventSource(withToken("/api/events"));
  source.onmessage = (m) => {
    const data = JSON.parse(m.data);
    if (!Array.isArray(data)) {  // {"end": {...}}: the trainer's last word
      if (data.state) showState(data.state, true);
      if (data.end) showEnd(data.end);
      return;
    }
    if (held) { held.push(...data); return; }
    data.forEach(addEvent);
    scheduleRedraw();
  };
  try {
    const r = await fetch(withToken("/api/history"));
    if (r.ok) (await r.json()).events.forEach(addEvent);
  } catch (e) {}
  held.forEach(addEvent);
  held = null;
  scheduleRedraw();
  pollState();
  pollTimer = setInterval(pollState, 500);
  setInterval(tickAges, 100);
  setInterval(() => { $("clock").textContent = new Date().toLocaleTimeString(); }, 1000);
  $("clock").textContent = new Date().toLocaleTimeString();
}
start();

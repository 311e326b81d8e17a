// The dashboard's charts (dashboard.html loads this first, then dashboard_cards.js, then
// dashboard.js): what every part of the page shares (the token from the page's address, $), the
// step charts with their marks, smoothing, axes and thinning, and the step events and epochs drawn
// on them. Served without the token (/dashboard_charts.js): it holds no data, it fetches it.
"use strict";
const token = new URLSearchParams(location.search).get("token");
const withToken = (path) => token ? path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : path;
const $ = (id) => document.getElementById(id);
const MAX_POINTS = 1000;  // per line; beyond, every other point goes (the page stays light)
const colors = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

// What happened at a step (pause, resume, learning rate, checkpoint, stop, worker lost), drawn as
// a dashed line with a letter on every chart whose x axis is the step.
const marks = [];
const markStyle = { pause: ["P", "#b45309"], resume: ["R", "#047857"], learning_rate: ["LR", "#7c3aed"],
                    checkpoint: ["C", "#2563eb"], stop: ["S", "#b91c1c"], worker_lost: ["L", "#b91c1c"],
                    control: ["V", "#0891b2"] };
const marksPlugin = {
  id: "troupeMarks",
  afterDatasetsDraw(chart) {
    const x = chart.scales.x, area = chart.chartArea, ctx = chart.ctx;
    if (!x || !area) return;
    ctx.save();
    ctx.font = "bold 10px system-ui, sans-serif";
    ctx.textAlign = "center";
    for (const m of marks) {
      if (m.step < x.min || m.step > x.max) continue;
      const px = x.getPixelForValue(m.step);
      const [letter, color] = markStyle[m.kind] || ["?", "#6b7280"];
      ctx.strokeStyle = color;
      ctx.fillStyle = color;
      ctx.setLineDash([4, 3]);
      ctx.beginPath();
      ctx.moveTo(px, area.top + 10);
      ctx.lineTo(px, area.bottom);
      ctx.stroke();
      ctx.fillText(letter, px, area.top + 8);
    }
    ctx.restore();
  },
};

const view = { smoothing: 0.6, log: false, ignoreOutliers: true };
const lineOptions = (stacked, title) => ({
  animation: false, responsive: true, maintainAspectRatio: false, parsing: false, normalized: true,
  elements: { point: { radius: 0 }, line: { borderWidth: 1.5 } },
  interaction: { mode: "nearest", intersect: false },
  // The axes' bounds, set by scaleX and scaleY, carry no tick of their own.
  scales: { x: { type: "linear", ticks: { includeBounds: false }, title: { display: true, text: "step" } },
            y: { stacked: stacked, beginAtZero: stacked, ticks: { includeBounds: false }, title: { display: !!title, text: title || "" } } },
  plugins: { legend: { labels: { boxWidth: 10 } } },
});
// A line: `raw` keeps what arrived, `data` what is drawn (smoothed when the chart smooths).
const dataset = (label, color, extra) => Object.assign({ label, data: [], raw: [], borderColor: color, backgroundColor: color }, extra || {});
// An epoch line: dots while they are few, a dashed line once they crowd.
const epochDataset = (label, color) => dataset(label, color, { epochs: true, showLine: true, borderDash: [5, 3], borderWidth: 1.5,
  pointRadius: (ctx) => ctx.dataset.data.length > 40 ? 0 : 3 });
function makeChart(canvas, datasets, kind) {
  const chart = new Chart(canvas, { type: "line", data: { datasets }, options: lineOptions(kind === "stacked"), plugins: [marksPlugin] });
  chart.troupeKind = kind;  // "smooth": smoothing, log scale and outliers apply; "rate": scaled to its values; "stacked"
  return chart;
}
const lossChart = makeChart($("loss-chart"), [dataset("mean", "#111827", { borderWidth: 2.5 })], "smooth");
const rateChart = makeChart($("rate-chart"), [dataset("samples/s", colors[0])], "smooth");
const parts = [["input_ms", "input wait"], ["compute_ms", "compute"], ["all_reduce_ms", "all-reduce"], ["other_ms", "other"]];
const timeChart = makeChart($("time-chart"), parts.map((p, i) => dataset(p[1], colors[i], { fill: i === 0 ? "origin" : "-1", backgroundColor: colors[i] + "88" })), "stacked");
const lrChart = makeChart($("lr-chart"), [dataset("learning rate", colors[3], { stepped: true })], "rate");
// A parameter-server cluster's closures per second and queue depth, by the seconds since the
// start (the state polls'), since closures are not steps.
const psChart = new Chart($("ps-chart"), { type: "line", data: { datasets: [dataset("closures/s", colors[0], { ps: true }),
  dataset("queue depth", colors[1], { stepped: true, ps: true }), dataset("in flight", colors[2], { stepped: true, ps: true })] },
  options: lineOptions(false) });
psChart.options.scales.x.title.text = "seconds";
psChart.troupeKind = "rate";
// The actors' first number (a trial's accuracy) over the steps, one line per label.
const actorsChart = new Chart($("actors-chart"), { type: "line", data: { datasets: [] }, options: lineOptions(false) });
actorsChart.troupeKind = "rate";
const charts = [lossChart, lrChart, rateChart, timeChart, psChart, actorsChart];
const metricCharts = {};  // by compiled metric: its chart, with the epochs' val_<metric>
window.troupe = { lossChart, rateChart, timeChart, lrChart, psChart, actorsChart, actors: null, metricCharts, charts, marks, events: 0, lastStep: 0, status: "running", ps: null,
                  texts: Object.create(null), controls: Object.create(null) };  // by the trainer's names

// A card with a chart for a compiled metric ("accuracy"): its steps, and val_<metric> per epoch.
function metricChart(name) {
  if (metricCharts[name]) return metricCharts[name];
  const card = document.createElement("div");
  card.className = "card";
  const h = document.createElement("h2");
  h.textContent = name + " (per step; val_" + name + " at each epoch's end)";
  const box = document.createElement("div");
  box.className = "chart-box";
  const canvas = document.createElement("canvas");
  canvas.id = "metric-" + name;
  box.appendChild(canvas);
  card.append(h, box);
  $("grid").insertBefore(card, $("lr-chart").closest(".card"));
  const chart = makeChart(canvas, [dataset(name, colors[2])], "smooth");
  metricCharts[name] = chart;
  charts.push(chart);
  return chart;
}
function epochLine(chart, label, color) {
  let ds = chart.data.datasets.find(d => d.label === label);
  if (!ds) { ds = epochDataset(label, color); chart.data.datasets.push(ds); }
  return ds;
}

// TensorBoard's smoothing: an exponential moving average, debiased so the first points are not
// pulled towards zero.
function smoothed(raw, weight) {
  if (!(weight > 0)) return raw.slice();
  let last = 0, n = 0;
  return raw.map(p => {
    if (p.y === null || !isFinite(p.y)) return p;
    last = last * weight + (1 - weight) * p.y;
    n++;
    return { x: p.x, y: last / (1 - Math.pow(weight, n)) };
  });
}
function push(chart, ds, x, y) {
  if (y === null || y === undefined) return;
  ds.raw.push({ x, y });
  if (chart.troupeKind !== "smooth" || ds.epochs || !(view.smoothing > 0)) { ds.data.push({ x, y }); return; }
  // Carries the average on from the last drawn point.
  const s = ds.ema || { last: 0, n: 0 };
  if (isFinite(y)) { s.last = s.last * view.smoothing + (1 - view.smoothing) * y; s.n++; }
  ds.ema = s;
  ds.data.push({ x, y: s.n ? s.last / (1 - Math.pow(view.smoothing, s.n)) : y });
}
function resmooth() {
  for (const c of charts) {
    if (c.troupeKind !== "smooth") continue;
    for (const ds of c.data.datasets) {
      if (ds.epochs) continue;
      ds.data = smoothed(ds.raw, view.smoothing);
      let last = 0, n = 0;
      for (const p of ds.raw) if (p.y !== null && isFinite(p.y)) { last = last * view.smoothing + (1 - view.smoothing) * p.y; n++; }
      ds.ema = { last, n };
    }
  }
}

// The y axis: with "ignore outliers", the 2nd to 98th percentile of what is drawn (a spike of
// the first steps does not flatten the rest); the learning rate always to its own values.
function quantile(sorted, q) { return sorted[Math.min(sorted.length - 1, Math.max(0, Math.floor(q * (sorted.length - 1))))]; }
// Bounds on a round step, so the axis's end ticks read as numbers a person would write.
function niceBounds(lo, hi) {
  const range = hi - lo;
  const step = Math.pow(10, Math.floor(Math.log10(range))) / 2;
  return [Math.floor(lo / step) * step, Math.ceil(hi / step) * step];
}
// The x axis from a round step at or before the first point to the last point (not to the next
// round tick, which would leave an empty band after the newest step).
function scaleX(chart) {
  let lo = Infinity, hi = -Infinity;
  for (const ds of chart.data.datasets) if (ds.data.length) { lo = Math.min(lo, ds.data[0].x); hi = Math.max(hi, ds.data[ds.data.length - 1].x); }
  const x = chart.options.scales.x;
  if (!(hi > lo)) { delete x.min; delete x.max; return; }
  x.min = Math.max(0, niceBounds(lo, hi)[0]);
  x.max = hi;
}
function scaleY(chart) {
  const y = chart.options.scales.y;
  if (chart.troupeKind === "stacked") {
    // The stacked parts' totals: with "ignore outliers" the axis ends at their 98th percentile.
    const totals = [];
    chart.data.datasets.forEach(ds => ds.data.forEach((p, i) => { totals[i] = (totals[i] || 0) + (isFinite(p.y) ? p.y : 0); }));
    const sorted = totals.filter(v => v > 0).sort((a, b) => a - b);
    y.min = 0;
    if (view.ignoreOutliers && sorted.length >= 20) y.max = niceBounds(0, quantile(sorted, 0.98) * 1.1)[1];
    else delete y.max;
    return;
  }
  const log = view.log && chart.troupeKind === "smooth";
  y.type = log ? "logarithmic" : "linear";
  const values = [];
  for (const ds of chart.data.datasets) for (const p of ds.data) if (p.y !== null && isFinite(p.y) && (!log || p.y > 0)) values.push(p.y);
  if (!values.length) { delete y.min; delete y.max; return; }
  values.sort((a, b) => a - b);
  let lo = values[0], hi = values[values.length - 1];
  if (view.ignoreOutliers && chart.troupeKind === "smooth" && values.length >= 20) { lo = quantile(values, 0.02); hi = quantile(values, 0.98); }
  if (log) { y.min = lo / 1.2; y.max = hi * 1.2; return; }
  // A constant (a learning rate never changed) sits in the middle of an axis half its value wide.
  const pad = hi > lo ? (hi - lo) * 0.08 : Math.abs(hi) * 0.5 || 1;
  let [min, max] = niceBounds(lo - pad, hi + pad);
  if (lo >= 0 && min < 0) min = 0;  // a positive quantity's axis does not go below zero
  y.min = min;
  y.max = max;
}

// Like the server's history: when a line is full, every other point goes, and from then on only
// every 2nd (4th, ...) step is drawn, so the charts span the whole run evenly.
let stride = 1, offered = 0;
function thin() {
  const all = charts.flatMap(c => c.data.datasets).filter(ds => !ds.epochs && !ds.ps);  // the ps card's chart thins its own
  if (!all.some(ds => ds.raw.length > MAX_POINTS)) return;
  all.forEach(ds => { ds.raw = ds.raw.filter((_, i) => i % 2 === 0); });
  stride *= 2;
  resmooth();
  charts.forEach(c => { if (c.troupeKind !== "smooth") c.data.datasets.forEach(ds => { if (!ds.epochs) ds.data = ds.raw.slice(); }); });
}
let breakdownWorker = 0;
function addEvent(e) {
  const x = e.step;
  if (x <= window.troupe.lastStep) return;  // already shown
  window.troupe.lastStep = x;
  showHeader(e);
  if (offered++ % stride !== 0) return;
  push(lossChart, lossChart.data.datasets[0], x, e.loss);
  (e.replica_loss || []).forEach((l, r) => {
    let ds = lossChart.data.datasets.find(d => d.replica === r);
    if (!ds) { ds = dataset("replica " + r, colors[r % colors.length], { replica: r, borderWidth: 1 }); lossChart.data.datasets.push(ds); }
    push(lossChart, ds, x, l);
  });
  for (const [name, value] of Object.entries(e.metrics || {})) {
    const c = metricChart(name);
    push(c, c.data.datasets[0], x, value);
  }
  push(rateChart, rateChart.data.datasets[0], x, e.samples_per_s);
  const w = (e.workers || [])[breakdownWorker];
  if (w) parts.forEach((p, i) => push(timeChart, timeChart.data.datasets[i], x, w[p[0]]));
  push(lrChart, lrChart.data.datasets[0], x, e.learning_rate);
  window.troupe.events++;
  thin();
}
// Each epoch's logs: val_loss on the loss chart, <metric> and val_<metric> on the metric's chart.
let epochsSeen = 0;
function addEpoch(ep) {
  if (ep.epoch <= epochsSeen) return;
  epochsSeen = ep.epoch;
  for (const [name, value] of Object.entries(ep.logs)) {
    if (value === null || name === "learning_rate") continue;
    if (name === "val_loss") { push(lossChart, epochLine(lossChart, "val_loss", "#f59e0b"), ep.step, value); continue; }
    if (name.startsWith("val_")) {
      const c = metricChart(name.slice(4));
      push(c, epochLine(c, name, "#f59e0b"), ep.step, value);
    }
  }
}
let marksSeen = 0;
function addMark(m) {
  if (m.sequence <= marksSeen) return;
  marksSeen = m.sequence;
  marks.push(m);
}
// A worker lost is marked at the step the chief was at when it learned of it (the event's own
// step; one before the first step is marked at the first).
const lostSeen = new Set();
function markLost(failures) {
  for (const f of failures) {
    if (f.kind !== "worker_lost" || lostSeen.has(f.sequence)) continue;
    lostSeen.add(f.sequence);
    marks.push({ step: f.step ?? 0, kind: "worker_lost", text: f.text });
  }
}

// Events arrive every 100 ms; the charts redraw at most every 200 ms, so a slow machine keeps up.
let redraw = false;
function scheduleRedraw() {
  if (redraw) return;
  redraw = true;
  setTimeout(() => requestAnimationFrame(() => {
    redraw = false;
    charts.forEach(c => {
      // A chart whose card is hidden, or whose lines, marks and view are as last drawn, is left
      // alone: redrawing every chart five times a second kept a browser busy on a loaded machine.
      if (c.canvas.offsetParent === null) { c.troupeDrawn = null; return; }
      const drawn = chartSignature(c);
      if (drawn === c.troupeDrawn) return;
      scaleX(c); scaleY(c); c.update("none");
      c.troupeDrawn = drawn;
    });
  }), 200);
}
// What a chart shows: every line's length, last point and visibility, the marks, the view's
// settings and whether the training has ended.
function chartSignature(c) {
  const lines = c.data.datasets.map((ds, i) => {
    const last = ds.data[ds.data.length - 1];
    return ds.data.length + ":" + (last ? last.x + "," + last.y : "") + ":" + c.isDatasetVisible(i);
  });
  return [view.smoothing, view.log, view.ignoreOutliers, marks.length, ended, lines.join(";")].join("|");
}

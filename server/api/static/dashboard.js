// trickle fleet dashboard: no build step, no dependencies. Reads the server's event stream
// (/v1/dashboard/stream) with fetch, so the bearer token stays in a header, and draws its charts as SVG.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { token: sessionStorage.getItem("trickle-token") || "", page: 0, perPage: 50, search: "",
                stream: null, last: null, device: null };

function headers() { return { Authorization: `Bearer ${state.token}` }; }

function text(el, value) { el.textContent = value; }

function fmtPct(right, known) { return known ? `${(100 * right / known).toFixed(1)} %` : "–"; }

function ago(seconds, now) {
  if (seconds == null) return "never";
  const s = Math.max(0, now - seconds);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function showError(message) {
  const el = $("error");
  el.hidden = !message;
  text(el, message || "");
}

function setLive(on, message) {
  const el = $("live");
  el.className = `badge ${on ? "on" : "off"}`;
  text(el, message);
}

// ---- SVG charts ----------------------------------------------------------------------------
// Every chart has a labelled time axis in the devices' own time and a labelled value axis with
// its unit. A device time before 2001-09-09 (1e9 s) is a simulation's virtual clock (seconds since
// it started): such charts say "simulated time" and count hours or minutes from its start.
const SVG = "http://www.w3.org/2000/svg";
const VIRTUAL_BEFORE_S = 1e9;
const MARGIN = { left: 58, right: 12, top: 10, bottom: 38 };
const isVirtual = (t) => t < VIRTUAL_BEFORE_S;

function svgEl(name, attrs) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

function label(svg, x, y, value, attrs = {}) {
  const t = svgEl("text", { x, y, "font-size": 11, fill: "#4a5360", ...attrs });
  t.textContent = value;
  svg.appendChild(t);
  return t;
}

function niceStep(span, ticks) {  // 1, 2 or 5 × a power of ten, giving about `ticks` ticks
  const raw = Math.max(span, 1e-12) / ticks;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw * 0.999);
}

function fmtNumber(v, step) {
  const digits = Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9)));
  return v.toFixed(digits);
}

// a value axis: [lo, hi] widened to at least `minSpan` (never below `floor`), ticks at round values
function valueAxis(values, { minSpan = 1, floor = -Infinity, zero = false } = {}) {
  let lo = Math.min(...values), hi = Math.max(...values);
  if (zero) lo = Math.min(lo, 0);
  if (hi - lo < minSpan) { const mid = (hi + lo) / 2; lo = mid - minSpan / 2; hi = mid + minSpan / 2; }
  if (lo < floor) { hi += floor - lo; lo = floor; }
  const step = niceStep(hi - lo, 4);
  lo = Math.floor(lo / step + 1e-9) * step;
  hi = Math.ceil(hi / step - 1e-9) * step;
  const ticks = [];
  for (let v = lo; v <= hi + step / 2; v += step) ticks.push(v);
  return { lo, hi, ticks, fmt: (v) => fmtNumber(v, step) };
}

const WALL_STEPS_S = [60, 300, 600, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400];

// a time axis over [t0, t1] (device seconds): virtual clocks in s, min or h since the start;
// real clocks at round local times
function timeAxis(t0, t1) {
  const span = Math.max(t1 - t0, 1e-9);
  if (isVirtual(t0)) {
    const [unit, name] = span >= 3 * 3600 ? [3600, "h"] : span >= 180 ? [60, "min"] : [1, "s"];
    const step = niceStep(span / unit, 6) * unit;
    const ticks = [];
    for (let t = Math.ceil(t0 / step - 1e-9) * step; t <= t1 + 1e-9; t += step) {
      ticks.push([t, fmtNumber(t / unit, step / unit)]);
    }
    return { title: `simulated time (${name} since the start)`, ticks, clock: "virtual", unit: name };
  }
  const step = WALL_STEPS_S.find((s) => s * 7 >= span) || WALL_STEPS_S[WALL_STEPS_S.length - 1];
  const offset = new Date(t0 * 1000).getTimezoneOffset() * 60;  // round to local midnight-aligned steps
  const ticks = [];
  for (let t = Math.ceil((t0 - offset) / step) * step + offset; t <= t1 + 1e-9; t += step) {
    const d = new Date(t * 1000);
    const hm = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    ticks.push([t, step >= 86400 ? d.toLocaleDateString() : hm]);
  }
  return { title: "device time (local)", ticks, clock: "wall", unit: "" };
}

// axes, grid and titles; returns the scales. `x`: a timeAxis plus [x0, x1]; `y`: a valueAxis
function frame(svg, w, h, x0, x1, xAxis, y, yTitle) {
  svg.replaceChildren();
  const [l, r, t, b] = [MARGIN.left, w - MARGIN.right, MARGIN.top, h - MARGIN.bottom];
  const sx = (v) => l + (r - l) * (v - x0) / Math.max(x1 - x0, 1e-9);
  const sy = (v) => b - (b - t) * (v - y.lo) / Math.max(y.hi - y.lo, 1e-12);
  for (const v of y.ticks) {
    svg.appendChild(svgEl("line", { x1: l, x2: r, y1: sy(v), y2: sy(v), stroke: "#dde3ea" }));
    label(svg, l - 4, sy(v) + 4, y.fmt(v), { "text-anchor": "end", class: "y-tick" });
  }
  for (const [v, text] of xAxis.ticks) {
    svg.appendChild(svgEl("line", { x1: sx(v), x2: sx(v), y1: b, y2: b + 4, stroke: "#4a5360" }));
    label(svg, sx(v), b + 15, text, { "text-anchor": "middle", class: "x-tick" });
  }
  svg.appendChild(svgEl("line", { x1: l, x2: r, y1: b, y2: b, stroke: "#4a5360" }));
  svg.appendChild(svgEl("line", { x1: l, x2: l, y1: t, y2: b, stroke: "#4a5360" }));
  label(svg, (l + r) / 2, h - 4, xAxis.title, { "text-anchor": "middle", class: "axis-title x-title" });
  label(svg, 12, (t + b) / 2, yTitle, { "text-anchor": "middle", class: "axis-title y-title",
                                         transform: `rotate(-90 12 ${(t + b) / 2})` });
  svg.dataset.yMin = y.lo; svg.dataset.yMax = y.hi; svg.dataset.clock = xAxis.clock;
  return { sx, sy };
}

function empty(svg, message) {
  svg.replaceChildren();
  label(svg, 10, 20, message, { "font-size": 12 });
}

// results counted per bin of device time (a series of Store.results_over_time)
function bars(svg, series) {
  const [w, h] = [720, 150];
  const { start_s: start, bin_s: bin, counts } = series;
  const end = start + bin * counts.length;
  const xAxis = timeAxis(start, end);
  const y = valueAxis(counts, { minSpan: 4, floor: 0, zero: true });
  const { sx, sy } = frame(svg, w, h, start, end, xAxis, y, "results");
  counts.forEach((v, i) => {
    const x = sx(start + i * bin);
    const rect = svgEl("rect", { x: x + 0.5, y: sy(v), width: Math.max(sx(start + (i + 1) * bin) - x - 1, 1),
                                 height: sy(0) - sy(v), fill: "#0b5cad", class: "bar" });
    const title = svgEl("title", {});
    title.textContent = `${v} results`;
    rect.appendChild(title);
    svg.appendChild(rect);
  });
}

const BIN_NAMES = { 1: "second", 60: "minute", 3600: "hour", 86400: "day" };

function binName(series) {  // "5 min", "hour", "2 h": the bin as people say it
  const b = series.bin_s;
  if (BIN_NAMES[b]) return BIN_NAMES[b];
  return b % 86400 === 0 ? `${b / 86400} d` : b % 3600 === 0 ? `${b / 3600} h` : b % 60 === 0 ? `${b / 60} min` : `${b} s`;
}

function resultCharts(container, over) {
  const figures = document.createDocumentFragment();
  for (const series of over) {
    const figure = document.createElement("figure");
    figure.className = "chart";
    figure.dataset.clock = series.clock;
    const caption = document.createElement("figcaption");
    caption.textContent = series.clock === "virtual"
      ? `Results per ${binName(series)} of simulated time (the devices' own clock)`
      : `Results per ${binName(series)}, last 24 hours (device time)`;
    const svg = svgEl("svg", { role: "img", viewBox: "0 0 720 150", "aria-label": caption.textContent });
    figure.append(caption, svg);
    figures.appendChild(figure);
    bars(svg, series);
  }
  if (!over.length) {
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = "No results yet.";
    figures.appendChild(p);
  }
  container.replaceChildren(figures);
}

// the time span a device's charts share: from its clock's start (0 for a virtual clock) to its last report
function span(times) {
  if (!times.length) return null;
  const [lo, hi] = [Math.min(...times), Math.max(...times)];
  return [isVirtual(lo) ? Math.min(lo, 0) : lo, Math.max(hi, lo + 1)];
}

// a measured value over device time; `opts` as valueAxis's
function line(svg, points, range, yTitle, opts) {
  const [w, h] = [720, 160];
  const pts = points.filter((p) => p[1] != null);
  if (pts.length < 2) { empty(svg, "not enough telemetry yet"); return; }
  const [x0, x1] = range;
  const { sx, sy } = frame(svg, w, h, x0, x1, timeAxis(x0, x1), valueAxis(pts.map((p) => p[1]), opts), yTitle);
  svg.appendChild(svgEl("polyline", { points: pts.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" "),
                                      fill: "none", stroke: "#0b5cad", "stroke-width": 1.5, class: "series" }));
}

function timeline(svg, results, range) {
  const [w, h] = [720, 90];
  if (!results.length) { empty(svg, "no results yet"); return; }
  const [x0, x1] = range;
  const y = { lo: 0, hi: 1, ticks: [], fmt: String };
  const { sx } = frame(svg, w, h, x0, x1, timeAxis(x0, x1), y, "");
  for (const r of results) {
    const fill = r.correct === true ? "#16703a" : r.correct === false ? "#b3261e" : "#6b7280";
    svg.appendChild(svgEl("rect", { x: sx(r.ts_s) - 1, y: MARGIN.top + 4, width: 2, height: h - MARGIN.top - MARGIN.bottom - 8,
                                    fill }));
  }
}

function fmtTime(t) {
  if (!isVirtual(t)) return new Date(t * 1000).toISOString();
  return t >= 3 * 3600 ? `t = ${(t / 3600).toFixed(2)} h` : t >= 180 ? `t = ${(t / 60).toFixed(1)} min` : `t = ${t.toFixed(1)} s`;
}

function fmtDuration(seconds) {
  if (seconds == null) return "–";
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  if (seconds < 2 * 3600) return `${(seconds / 60).toFixed(1)} min`;
  return `${(seconds / 3600).toFixed(2)} h`;
}

// ---- the fleet -----------------------------------------------------------------------------
// Two clocks, kept apart: the server's (when a message was received: online, last heard) and the
// device's own (when it measured: its last report, its last hour of results). A simulated fleet
// replays hours of its own time in seconds of the server's, then signs off.
function deviceState(d) {
  if (d.online) return "online";
  if (d.signed_off) return "offline (signed off)";
  return d.last_seen_s == null ? "offline (never heard)" : "offline (silent)";
}

function cell(row, value, cls) {
  const td = document.createElement("td");
  if (value instanceof Node) td.appendChild(value); else td.textContent = value;
  if (cls) td.className = cls;
  row.appendChild(td);
}

function renderFleet(snap) {
  state.last = snap;
  const t = snap.totals;
  text(document.querySelector('[data-testid="devices-total"]'), t.devices);
  text(document.querySelector('[data-testid="devices-online"]'), t.online);
  text(document.querySelector('[data-testid="devices-signed-off"]'), t.signed_off);
  text(document.querySelector('[data-testid="results-hour"]'), t.results_device_hour);
  text(document.querySelector('[data-testid="results-received-hour"]'), t.results_received_hour);
  text(document.querySelector('[data-testid="results-total"]'), t.results);
  text(document.querySelector('[data-testid="accuracy"]'), fmtPct(t.correct, t.labelled));
  text(document.querySelector('[data-testid="labelled"]'), t.labelled);
  const rejected = Object.values(snap.rejected).reduce((a, b) => a + b, 0);
  text(document.querySelector('[data-testid="rejected-total"]'), rejected);
  text(document.querySelector('[data-testid="rejected-reasons"]'),
       Object.entries(snap.rejected).map(([k, v]) => `${k} ${v}`).join(", ") || "none");
  resultCharts($("results-charts"), snap.results_over_time);

  const first = snap.matching ? snap.page * snap.per_page + 1 : 0;
  const last = snap.page * snap.per_page + snap.devices.length;
  text($("range"), `${first}–${last} of ${snap.matching}`);
  $("prev").disabled = snap.page === 0;
  $("next").disabled = last >= snap.matching;

  const body = document.createDocumentFragment();
  for (const d of snap.devices) {
    const tr = document.createElement("tr");
    tr.dataset.device = d.device;
    const link = document.createElement("a");
    link.href = `#/device/${encodeURIComponent(d.device)}`;
    link.textContent = d.device;
    cell(tr, link);
    cell(tr, d.fleet);
    cell(tr, deviceState(d), d.online ? "online" : "offline");
    cell(tr, ago(d.last_seen_s, snap.now_s));
    cell(tr, d.reported_s == null ? "–" : isVirtual(d.reported_s) ? `${fmtTime(d.reported_s)} (simulated)`
                                                                   : ago(d.reported_s, snap.now_s));
    cell(tr, d.running_version ?? "–");
    cell(tr, d.assigned_version ?? "–");
    cell(tr, d.ota);
    cell(tr, `${d.results_device_hour} / ${d.results}`);
    cell(tr, fmtPct(d.correct, d.labelled));
    cell(tr, d.power_cycles ?? "–");
    cell(tr, fmtDuration(d.on_time_s));
    if (d.on_time_s != null) tr.lastChild.dataset.seconds = d.on_time_s;
    body.appendChild(tr);
  }
  $("devices").replaceChildren(body);

  $("admin-only").hidden = !snap.admin;
  if (snap.admin) {
    const rows = document.createDocumentFragment();
    const select = $("ota-version");
    const chosen = select.value;
    select.replaceChildren();
    for (const b of snap.bundles) {
      const tr = document.createElement("tr");
      cell(tr, b.version); cell(tr, b.model); cell(tr, b.sha256.slice(0, 16) + "…");
      rows.appendChild(tr);
      const opt = document.createElement("option");
      opt.value = b.version; opt.textContent = `v${b.version} (${b.model})`;
      select.appendChild(opt);
    }
    if (chosen) select.value = chosen;
    $("bundles").replaceChildren(rows);
    const items = document.createDocumentFragment();
    for (const [target, version] of Object.entries(snap.assignments)) {
      const li = document.createElement("li");
      li.textContent = `${target} → v${version}`;
      items.appendChild(li);
    }
    $("assignments").replaceChildren(items);
    renderJobs(snap.jobs);
    renderKeys(snap.llm_keys || []);
  }
  if (state.device && Date.now() - (state.deviceLoaded || 0) > 5000) loadDevice(state.device);
}

function renderJobs(jobs) {
  const rows = document.createDocumentFragment();
  for (const j of jobs) {
    const tr = document.createElement("tr");
    tr.dataset.job = j.id;
    cell(tr, j.id); cell(tr, j.kind); cell(tr, j.what);
    cell(tr, j.cancel_requested && j.state === "running" ? "cancelling" : j.state, `job-${j.state}`);
    const bar = document.createElement("progress");
    bar.max = 1; bar.value = j.progress || 0;
    bar.setAttribute("aria-label", `job ${j.id} progress`);
    const label = document.createElement("span");
    label.textContent = ` ${Math.round(100 * (j.progress || 0))} % ${j.state === "running" ? j.step || "" : ""}`;
    const progress = document.createElement("span");
    progress.append(bar, label);
    cell(tr, progress);
    cell(tr, j.attempts);
    cell(tr, j.state === "done" ? `bundle v${j.bundle_version}` + (j.student_accuracy != null ?
         `, student ${(100 * j.student_accuracy).toFixed(1)} %` : "") : j.error || "–");
    if ((j.state === "queued" || j.state === "running") && !j.cancel_requested) {
      const button = document.createElement("button");
      button.type = "button"; button.textContent = "Cancel";
      button.setAttribute("aria-label", `cancel job ${j.id}`);
      button.addEventListener("click", () => cancelJob(j.id));
      cell(tr, button);
    } else cell(tr, "");
    rows.appendChild(tr);
  }
  $("jobs").replaceChildren(rows);
}

function renderKeys(keys) {
  const rows = document.createDocumentFragment();
  for (const k of keys) {
    const tr = document.createElement("tr");
    tr.dataset.key = k.name;
    cell(tr, k.name); cell(tr, k.revoked_s ? "revoked" : "live"); cell(tr, k.requests);
    cell(tr, k.prompt_tokens); cell(tr, k.completion_tokens);
    cell(tr, k.last_used_s ? new Date(1000 * k.last_used_s).toLocaleString() : "never");
    rows.appendChild(tr);
  }
  $("llm-keys").replaceChildren(rows);
  $("llm-usage").hidden = keys.length === 0;
}

async function cancelJob(id) {
  const r = await fetch(`/v1/jobs/${id}/cancel`, { method: "POST", headers: headers() });
  const body = await r.json().catch(() => ({}));
  text($("job-result"), r.ok ? `job ${id}: ${body.state === "cancelled" ? "cancelled" : "cancelling"}`
                             : `job ${id}: refused: ${body.detail || r.status}`);
}

// ---- one device ----------------------------------------------------------------------------
async function loadDevice(device) {
  state.deviceLoaded = Date.now();
  const r = await fetch(`/v1/dashboard/devices/${encodeURIComponent(device)}`, { headers: headers() });
  if (r.status === 404 || r.status === 422) { notFound(`There is no device “${device}”.`); return; }
  if (!r.ok) { showError(`device ${device}: ${await problem(r)}`); return; }
  const d = await r.json();
  text($("device-title"), `${d.device} (fleet ${d.fleet})`);
  const known = d.results.filter((x) => x.correct !== null && x.correct !== undefined);
  text(document.querySelector('[data-testid="device-results"]'), d.results.length);
  text(document.querySelector('[data-testid="device-accuracy"]'),
       fmtPct(known.filter((x) => x.correct).length, known.length));
  const lastT = d.telemetry[d.telemetry.length - 1];
  text(document.querySelector('[data-testid="device-failures"]'), lastT?.power_cycles ?? "–");
  text(document.querySelector('[data-testid="device-on-time"]'), fmtDuration(lastT?.on_time_s));
  text(document.querySelector('[data-testid="device-voltage"]'),
       lastT?.voltage_v != null ? `${lastT.voltage_v.toFixed(2)} V` : "–");
  const range = span([...d.telemetry, ...d.results].map((x) => x.ts_s));
  line($("voltage"), d.telemetry.map((x) => [x.ts_s, x.voltage_v]), range, "voltage (V)", { minSpan: 0.5, floor: 0 });
  line($("failures"), d.telemetry.map((x) => [x.ts_s, x.power_cycles]), range, "power failures",
       { minSpan: 5, floor: 0, zero: true });
  timeline($("timeline"), d.results, range);
  const rows = document.createDocumentFragment();
  for (const [name, count] of Object.entries(d.variants)) {
    const tr = document.createElement("tr");
    cell(tr, name); cell(tr, count);
    rows.appendChild(tr);
  }
  $("variants").replaceChildren(rows);
  const events = document.createDocumentFragment();
  for (const e of d.events.slice(-50)) {
    const li = document.createElement("li");
    li.textContent = `${fmtTime(e.ts_s)} ${e.event}` +
      (e.bundle_version != null ? ` v${e.bundle_version}` : "") + (e.detail ? `: ${e.detail}` : "");
    events.appendChild(li);
  }
  $("events").replaceChildren(events);
}

// ---- the event stream ----------------------------------------------------------------------
async function connect() {
  if (state.stream) state.stream.abort();
  const controller = new AbortController();
  state.stream = controller;
  const params = new URLSearchParams({ page: state.page, per_page: state.perPage, q: state.search });
  try {
    const r = await fetch(`/v1/dashboard/stream?${params}`, { headers: headers(), signal: controller.signal });
    if (r.status === 401 || r.status === 403) {
      showError("the server refused this token");
      signOut();
      return;
    }
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    showError("");
    // "live" once the first snapshot is on the page, not when the headers arrive: until then
    // the cards still show "–", and a reader (or a test) told "live" would read stale numbers
    setLive(false, "connecting…");
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (data) {
          renderFleet(JSON.parse(data));
          setLive(true, "live");
        }
      }
    }
    throw new Error("stream closed");
  } catch (err) {
    if (controller.signal.aborted) return;
    setLive(false, "reconnecting…");
    setTimeout(() => { if (state.stream === controller) connect(); }, 2000);
  }
}

// "#/" the fleet, "#/device/NAME" one device; anything else is a plain "not found"
function route() {
  const hash = location.hash || "#/";
  const match = hash.match(/^#\/device\/([^/]+)$/);
  let device = null;
  try { device = match ? decodeURIComponent(match[1]) : null; } catch (err) { device = null; }
  state.device = device;
  showError("");
  if (!state.token) return;
  if (hash !== "#/" && hash !== "#" && device === null) { notFound(`There is no page “${hash.slice(1)}” here.`); return; }
  $("not-found").hidden = true;
  $("fleet-view").hidden = !!device;
  $("device-view").hidden = !device;
  if (device) loadDevice(device);
}

function notFound(message) {
  state.device = null;
  $("fleet-view").hidden = true;
  $("device-view").hidden = true;
  $("not-found").hidden = false;
  text($("not-found-detail"), message);
}

// the reason an HTTP reply gives, as one line of text whatever its shape
async function problem(r) {
  const body = await r.json().catch(() => ({}));
  const detail = body.detail;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map((d) => d.msg || JSON.stringify(d)).join("; ");
  return `HTTP ${r.status}`;
}

function signedIn() {
  $("login").hidden = true;
  $("logout").hidden = false;
  route();
  connect();
}

function signOut() {
  state.token = "";
  sessionStorage.removeItem("trickle-token");
  if (state.stream) state.stream.abort();
  state.stream = null;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("fleet-view").hidden = true;
  $("device-view").hidden = true;
  $("not-found").hidden = true;
  setLive(false, "not connected");
}

$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  state.token = $("token").value.trim();
  sessionStorage.setItem("trickle-token", state.token);
  $("token").value = "";
  signedIn();
});
$("logout").addEventListener("click", signOut);
$("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); connect(); });
$("next").addEventListener("click", () => { state.page += 1; connect(); });
let searchTimer = null;
$("search").addEventListener("input", (e) => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => { state.search = e.target.value; state.page = 0; connect(); }, 300);
});
$("ota").addEventListener("submit", async (e) => {
  e.preventDefault();
  const body = { target: $("ota-target").value.trim(), bundle_version: Number($("ota-version").value) };
  const r = await fetch("/v1/assignments", { method: "POST", body: JSON.stringify(body),
                                             headers: { ...headers(), "Content-Type": "application/json" } });
  const answer = await r.json();
  text($("ota-result"), r.ok ? `assigned v${answer.bundle_version} to ${answer.target}; notified ${answer.notified.length}`
                             : `refused: ${typeof answer.detail === "string" ? answer.detail : JSON.stringify(answer.detail)}`);
});
window.addEventListener("hashchange", route);
if (state.token) signedIn(); else signOut();

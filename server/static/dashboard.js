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
const SVG = "http://www.w3.org/2000/svg";
function svgEl(name, attrs) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

function bars(svg, values) {
  svg.replaceChildren();
  const [w, h] = [720, 120];
  const top = Math.max(1, ...values);
  const bw = w / Math.max(values.length, 1);
  values.forEach((v, i) => {
    const bh = (h - 16) * v / top;
    const rect = svgEl("rect", { x: i * bw + 2, y: h - 12 - bh, width: bw - 4, height: bh, fill: "#0b5cad" });
    const title = svgEl("title", {});
    title.textContent = `${values.length - i} h ago: ${v} results`;
    rect.appendChild(title);
    svg.appendChild(rect);
  });
  const label = svgEl("text", { x: 4, y: 12, "font-size": 11, fill: "#4a5360" });
  label.textContent = `max ${top}`;
  svg.appendChild(label);
}

function line(svg, points, unit) {
  svg.replaceChildren();
  const [w, h] = [720, 140];
  const pts = points.filter((p) => p[1] != null);
  if (pts.length < 2) {
    const t = svgEl("text", { x: 10, y: 20, "font-size": 12, fill: "#4a5360" });
    t.textContent = "no data yet";
    svg.appendChild(t);
    return;
  }
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = (x) => 30 + (w - 40) * (x - x0) / Math.max(x1 - x0, 1e-9);
  const sy = (y) => h - 15 - (h - 30) * (y - y0) / Math.max(y1 - y0, 1e-9);
  svg.appendChild(svgEl("polyline", { points: pts.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" "),
                                      fill: "none", stroke: "#0b5cad", "stroke-width": 1.5 }));
  for (const [y, v] of [[sy(y1), y1], [sy(y0), y0]]) {
    const t = svgEl("text", { x: 2, y: y + 4, "font-size": 10, fill: "#4a5360" });
    t.textContent = `${v.toPrecision(3)}${unit}`;
    svg.appendChild(t);
  }
}

function timeline(svg, results) {
  svg.replaceChildren();
  if (!results.length) return;
  const xs = results.map((r) => r.ts_s);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  for (const r of results) {
    const x = 10 + 700 * (r.ts_s - x0) / Math.max(x1 - x0, 1e-9);
    const fill = r.correct === true ? "#16703a" : r.correct === false ? "#b3261e" : "#6b7280";
    svg.appendChild(svgEl("rect", { x, y: 10, width: 2, height: 40, fill }));
  }
}

// ---- the fleet -----------------------------------------------------------------------------
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
  text(document.querySelector('[data-testid="results-hour"]'), t.results_last_hour);
  text(document.querySelector('[data-testid="results-total"]'), t.results);
  text(document.querySelector('[data-testid="accuracy"]'), fmtPct(t.correct, t.labelled));
  text(document.querySelector('[data-testid="labelled"]'), t.labelled);
  const rejected = Object.values(snap.rejected).reduce((a, b) => a + b, 0);
  text(document.querySelector('[data-testid="rejected-total"]'), rejected);
  text(document.querySelector('[data-testid="rejected-reasons"]'),
       Object.entries(snap.rejected).map(([k, v]) => `${k} ${v}`).join(", ") || "none");
  bars($("hours"), snap.results_per_hour);

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
    cell(tr, d.online ? "online" : "offline", d.online ? "online" : "offline");
    cell(tr, ago(d.last_seen_s, snap.now_s));
    cell(tr, d.running_version ?? "–");
    cell(tr, d.assigned_version ?? "–");
    cell(tr, d.ota);
    cell(tr, `${d.results_last_hour} / ${d.results}`);
    cell(tr, fmtPct(d.correct, d.labelled));
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
  if (!r.ok) { showError(`device ${device}: ${(await r.json()).detail || r.status}`); return; }
  const d = await r.json();
  text($("device-title"), `${d.device} (fleet ${d.fleet})`);
  const known = d.results.filter((x) => x.correct !== null && x.correct !== undefined);
  text(document.querySelector('[data-testid="device-results"]'), d.results.length);
  text(document.querySelector('[data-testid="device-accuracy"]'),
       fmtPct(known.filter((x) => x.correct).length, known.length));
  const lastT = d.telemetry[d.telemetry.length - 1];
  text(document.querySelector('[data-testid="device-failures"]'), lastT?.power_cycles ?? "–");
  text(document.querySelector('[data-testid="device-voltage"]'),
       lastT?.voltage_v != null ? `${lastT.voltage_v.toFixed(2)} V` : "–");
  line($("voltage"), d.telemetry.map((x) => [x.ts_s, x.voltage_v]), " V");
  line($("failures"), d.telemetry.map((x) => [x.ts_s, x.power_cycles]), "");
  timeline($("timeline"), d.results);
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
    li.textContent = `${new Date(e.ts_s * 1000).toISOString()} ${e.event}` +
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
    setLive(true, "live");
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
        if (data) renderFleet(JSON.parse(data));
      }
    }
    throw new Error("stream closed");
  } catch (err) {
    if (controller.signal.aborted) return;
    setLive(false, "reconnecting…");
    setTimeout(() => { if (state.stream === controller) connect(); }, 2000);
  }
}

function route() {
  const match = location.hash.match(/^#\/device\/(.+)$/);
  state.device = match ? decodeURIComponent(match[1]) : null;
  $("fleet-view").hidden = !!state.device;
  $("device-view").hidden = !state.device;
  if (state.device && state.token) loadDevice(state.device);
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

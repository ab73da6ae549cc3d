// mrc-emu view: draws /api/topology once and every state from /api/events (docs/view.md).
// Live: one state per interval over server-sent events; replay: a slider (/api/state?t=) and
// "play" (the same event stream, played at ?speed=). Clicks on links and spines POST /api/action.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#3f6fd8", "#d8603f", "#2e9d6a", "#9b4fd8", "#d8b53f", "#3fb6d8", "#d83f8a", "#6b7385"];
const MAX_HOSTS_DRAWN = 24;  // more hosts than this per plane (large, huge): the planes are drawn without them
const view = { topo: null, state: null, received: [], chart: null, chartKey: "", series: {}, source: null,
               links: new Map(), ports: new Map(), nodes: new Map() };  // the drawn elements by link key, port, node
window.mrcView = view;  // for scripts and tests: the last topology and state the page drew

const $ = (sel) => document.querySelector(sel);
function el(tag, attrs = {}, parent = null, ns = null) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  if (parent) parent.appendChild(node);
  return node;
}
const fmtBytes = (b) => b >= 2 ** 20 ? (b / 2 ** 20).toFixed(1) + " MiB" : b >= 1024 ? (b / 1024).toFixed(0) + " KiB" : b + " B";
const fmtNum = (x) => x == null ? "-" : Math.round(x).toLocaleString("en");

function message(text, ok) {
  const m = $("#message");
  m.textContent = text;
  m.className = ok ? "ok" : "error";
  m.dataset.ok = ok ? "true" : "false";
}

// ---- the fabric, per plane ------------------------------------------------------------------

function drawTopology() {
  const topo = view.topo, box = $("#planes");
  box.innerHTML = "";
  const allHosts = topo.nodes.filter((n) => n.role === "host").map((n) => n.name);
  const hosts = allHosts.length <= MAX_HOSTS_DRAWN ? allHosts : [];
  if (!hosts.length && allHosts.length) el("p", { class: "note", text: `${allHosts.length} hosts per plane: drawn without them (spines and leaves only)` }, box);
  for (let p = 0; p < topo.planes; p++) {
    const spines = topo.nodes.filter((n) => n.role === "spine" && n.plane === p).map((n) => n.name);
    const leaves = topo.nodes.filter((n) => n.role === "leaf" && n.plane === p).map((n) => n.name);
    const columns = Math.max(spines.length, leaves.length, hosts.length);
    const width = Math.max(260, columns * 56 + 40), height = 250;
    const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, class: "plane", "data-plane": p }, box, SVG);
    svg.style.width = `min(100%, ${width}px)`;  // a large plane shrinks to the panel, a small one keeps its size
    el("text", { x: 8, y: 14, class: "plane-title", text: `plane ${p}` }, svg, SVG);
    const pos = {};
    const place = (names, y) => names.forEach((n, i) => { pos[n] = [(i + 0.5) * width / names.length, y]; });
    place(spines, 45); place(leaves, 130); place(hosts, 215);
    if (!hosts.length) svg.setAttribute("viewBox", `0 0 ${width} 165`);
    const linkLayer = el("g", {}, svg, SVG), portLayer = el("g", {}, svg, SVG), nodeLayer = el("g", {}, svg, SVG);
    for (const link of topo.links.filter((l) => l.plane === p && pos[l.a] && pos[l.b])) {
      const [x1, y1] = pos[link.a], [x2, y2] = pos[link.b];
      const g = el("g", {}, linkLayer, SVG);
      const line = el("line", { x1, y1, x2, y2, class: "link", "data-link": link.key, "data-state": "up" }, g, SVG);
      const hit = el("line", { x1, y1, x2, y2, class: "link-hit", "data-link-hit": link.key }, g, SVG);
      const title = el("title", { text: link.key }, hit, SVG);
      const label = el("text", { x: (x1 + x2) / 2 + 4, y: (y1 + y2) / 2, class: "link-label", "data-link-label": link.key }, g, SVG);
      hit.addEventListener("click", (ev) => linkMenu(link, ev));
      view.links.set(link.key, { line, title, label });
      for (const [node, intf, far] of [[link.a, link.a_intf, link.b], [link.b, link.b_intf, link.a]]) {
        const [xa, ya] = pos[node], [xb, yb] = pos[far];
        const dot = el("circle", { cx: xa + (xb - xa) * 0.22, cy: ya + (yb - ya) * 0.22, r: 4.5, class: "port",
                                   "data-port": `${node}:${intf}`, fill: "#ffffff" }, portLayer, SVG);
        el("title", { text: `${node} ${intf} -> ${far}` }, dot, SVG);
        view.ports.set(`${node}:${intf}`, dot);
      }
    }
    for (const name of [...spines, ...leaves, ...hosts]) {
      const role = spines.includes(name) ? "spine" : leaves.includes(name) ? "leaf" : "host";
      const [x, y] = pos[name];
      const g = el("g", { class: `node ${role}`, "data-node": name }, nodeLayer, SVG);
      view.nodes.set(name, g);
      if (role === "host") el("circle", { cx: x, cy: y, r: 14 }, g, SVG);
      else el("rect", { x: x - 22, y: y - 11, width: 44, height: 22, rx: 4 }, g, SVG);
      el("text", { x, y, text: name }, g, SVG);
      if (role === "spine") g.addEventListener("click", (ev) => spineMenu(name, ev));
    }
  }
}

function heat(port) {  // 0..1: the queue against its ECN kmax (or buffer), CE marks and trims push it up
  const q = port.kmax ? port.queue / port.kmax : port.buffer ? port.queue / port.buffer : 0;
  const marks = Math.min(1, (port.ce_marked_per_s || 0) / 2000), trims = (port.trimmed_per_s || 0) > 0 ? 1 : 0;
  return Math.min(1, Math.max(q || 0, marks, trims));
}
function heatColor(h) { return `hsl(${Math.round(120 - 120 * h)}, 75%, ${Math.round(88 - 35 * h)}%)`; }

function drawLinks(state) {
  for (const [key, link] of Object.entries(state.links || {})) {
    const drawn = view.links.get(key);
    if (!drawn) continue;  // a host's link on a plane drawn without hosts
    const { line, label, title } = drawn;
    const kinds = link.faults.map((f) => f.kind);
    const gbps = link.bps == null ? 0 : link.bps / 1e9;
    const text = link.state === "up" ? "" : link.state === "down" ? "down" : kinds.join(" ");
    line.dataset.state = link.state;
    line.dataset.faults = kinds.join(",");
    line.style.strokeWidth = (2.5 + Math.min(5, gbps * 2)).toFixed(1);
    label.textContent = text;
    label.classList.toggle("down", link.state === "down");
    title.textContent = `${key}: ${link.state}` + (kinds.length ? ` (${link.faults.map((f) => `${f.kind} ${f.params || ""} by ${f.by}`).join("; ")})` : "")
      + (link.bps != null ? `, ${(gbps).toFixed(2)} Gbit/s` : "");
  }
  for (const [name, spine] of Object.entries(state.spines || {})) {
    const g = view.nodes.get(name);
    if (g) g.dataset.drained = spine.drained ? "true" : "false";
  }
  const ports = Object.values(state.ports || {});
  for (const [name, dot] of view.ports) {
    const port = (state.ports || {})[name];
    dot.setAttribute("fill", port && port.queue != null ? heatColor(heat(port)) : "#ffffff");
    dot.setAttribute("r", port && (port.trimmed_per_s || port.dropped_per_s) ? 6 : 4.5);
    if (port) dot.firstChild.textContent = `${port.node} ${port.ifname} -> ${port.peer}: queue ${fmtNum(port.queue)} B, `
      + `CE ${fmtNum(port.ce_marked)} trimmed ${fmtNum(port.trimmed)} dropped ${fmtNum(port.dropped)}`;
  }
  $("#ports-note").textContent = state.ports_note || "";
  const score = (p) => (p.queue || 0) + (p.ce_marked_per_s || 0) + 10 * (p.trimmed_per_s || 0) + (p.ce_marked || 0) / 1e3
    + (p.packets_per_s || 0) / 1e3;
  const body = $("#ports tbody");
  body.innerHTML = "";
  for (const p of ports.sort((a, b) => score(b) - score(a)).slice(0, 8)) {
    const tr = el("tr", {}, body);
    for (const [v, num] of [[`${p.node} ${p.ifname}`], [p.peer || ""], [p.packets_per_s, 1], [p.queue, 1], [p.ce_marked_per_s, 1],
                            [p.trimmed_per_s, 1], [p.dropped_per_s, 1], [p.ce_marked, 1], [p.trimmed, 1], [p.dropped, 1]]) {
      el("td", { text: num ? fmtNum(v) : v, class: num ? "num" : "" }, tr);
    }
  }
  const faults = $("#faults");
  faults.innerHTML = "";
  for (const f of state.faults || []) el("li", { text: `${f.kind} ${f.target} ${f.params || ""} (by ${f.by}${f.id ? ", fault " + f.id : ""})` }, faults);
  if (!(state.faults || []).length) el("li", { text: "none", class: "note" }, faults);
}

// ---- transfers, EVs, goodput, EV events -----------------------------------------------------

function drawTransfers(state) {
  const box = $("#transfers");
  box.innerHTML = "";
  if (!state.transfers.length) el("p", { class: "note", text: "no transfer on this fabric yet (mrc-emu send ... shows here while it runs)" }, box);
  state.transfers.slice(-8).forEach((t) => {
    const div = el("div", { class: "transfer", "data-transfer": t.id }, box);
    const head = el("div", { class: "head" }, div);
    el("span", { text: `${t.src} → ${t.dst}` }, head);
    el("span", { text: fmtBytes(t.size) }, head);
    el("span", { text: t.goodput_gbps != null ? `${t.goodput_gbps.toFixed(2)} Gbit/s` : "" }, head);
    if (t.time_dilation && t.time_dilation !== 1) el("span", { class: "run", text: `(emulated, K = ${t.time_dilation})` }, head);
    el("span", { class: "run", text: `${t.run}${t.error ? ": " + t.error : ""} · ${(100 * t.progress).toFixed(1)} %` }, head);
    el("div", {}, el("div", { class: "progress" }, div)).style.width = `${(100 * t.progress).toFixed(1)}%`;
    if (!t.evs) return;
    const shares = el("div", { class: "shares" }, div);
    const evs = el("div", { class: "evs" }, div);
    const recent = t.evs.some((e) => e.share_recent != null);  // the bar: where the spray goes now, if known
    t.evs.forEach((e, i) => {
      const now = e.share_recent != null ? ` · now ${(100 * e.share_recent).toFixed(0)}%` : "";
      const part = el("div", { title: `EV ${e.ev}: ${(100 * e.share).toFixed(1)} % of all sent${now}` }, shares);
      part.style.width = `${100 * (recent ? e.share_recent || 0 : e.share)}%`;
      part.style.background = e.state === "GOOD" ? COLORS[i % COLORS.length] : e.state === "DENIED" ? "#b0b6c2" : "#c62828";
      el("span", { class: `ev ${e.state}`, "data-ev": e.ev, "data-ev-state": e.state,
                   text: `EV ${e.ev} ${e.spine || ""} ${(100 * e.share).toFixed(1)}%${now} ${e.state === "GOOD" ? "" : e.state}` }, evs);
    });
  });
}

function drawEvLog(state) {
  const body = $("#ev-log tbody");
  body.innerHTML = "";
  for (const e of [...state.ev_log].reverse().slice(0, 40)) {
    const tr = el("tr", { class: e.new, "data-ev-event": `${e.transfer}:${e.ev}:${e.new}` }, body);
    el("td", { class: "num", text: (e.run_ms != null ? e.run_ms : e.time_ms).toFixed(3) }, tr);
    el("td", { text: `${e.src}→${e.dst}` }, tr);
    el("td", { text: e.ev }, tr);
    el("td", { text: `${e.old} → ${e.new}` }, tr);
    el("td", { text: e.reason }, tr);
  }
  if (!state.ev_log.length) el("td", { colspan: 5, class: "note", text: "no EV event" }, el("tr", {}, body));
}

function makeChart(ids, data, xLabel) {
  const box = $("#chart");
  box.innerHTML = "";
  const opts = { width: Math.max(320, box.clientWidth - 4), height: 200, scales: { x: { time: false } }, legend: { live: false },
    axes: [{ label: xLabel }, { label: "Gbit/s" }],
    series: [{}, ...ids.map((id, i) => ({ label: id, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true }))] };
  view.chart = new uPlot(opts, data, box);
  view.cursor = el("div", { style: "position:absolute;top:0;width:1px;background:#c62828;pointer-events:none" }, view.chart.over);
}

function chartLive(state) {  // the last 60 s of each transfer's goodput, as the states arrived
  const now = state.time_unix;
  for (const t of state.transfers) {
    if (t.goodput_gbps == null) continue;
    (view.series[t.id] = view.series[t.id] || []).push([now, t.goodput_gbps]);
  }
  const ids = Object.keys(view.series).filter((id) => view.series[id].some((p) => now - p[0] < 60));
  if (!ids.length) return;
  const tables = ids.map((id) => { const pts = view.series[id].filter((p) => now - p[0] < 60); return [pts.map((p) => p[0] - now), pts.map((p) => p[1])]; });
  const data = uPlot.join(tables);
  const key = ids.join(",");
  if (key !== view.chartKey) { view.chartKey = key; makeChart(ids.map((id) => id + " " + labelOf(state, id)), data, "s (0 = now)"); }
  else view.chart.setData(data);
}
const labelOf = (state, id) => { const t = state.transfers.find((x) => x.id === id); return t ? `${t.src}→${t.dst}` : ""; };

function chartReplay(run) {
  const series = view.topo.replay[run].series;
  const data = uPlot.join(series.map((s) => [s.points.map((p) => p[0]), s.points.map((p) => p[1])]));
  makeChart(series.map((s) => `${s.id} ${s.src}→${s.dst}`), data, "ms since the run started");
}

function render(state) {
  view.state = state;
  view.received.push(performance.now());
  if (state.error) { message(state.error, false); return; }
  $("#what").textContent = state.mode === "replay" ? `replay of ${state.fabric} (${state.run})` : `fabric ${state.fabric || "-"}`;
  if (state.note) $("#mode").textContent = state.note;
  drawLinks(state);
  drawTransfers(state);
  drawEvLog(state);
  if (state.mode === "live") chartLive(state);
  else {
    $("#replay-time").textContent = `${state.t_ms.toFixed(3)} / ${state.duration_ms.toFixed(1)} ms`;
    $("#replay-t").value = state.t_ms;
    if (view.chart) view.cursor.style.left = `${view.chart.valToPos(state.t_ms, "x")}px`, view.cursor.style.height = `${view.chart.over.clientHeight}px`;
  }
  document.body.dataset.seq = state.seq || state.t_ms;
}

// ---- actions -------------------------------------------------------------------------------

function openMenu(title, buttons, ev) {
  const menu = $("#menu");
  menu.innerHTML = "";
  el("div", { class: "title", text: title }, menu);
  if (view.topo.read_only) el("div", { class: "note", text: "read-only view: no actions" }, menu);
  else for (const [label, run, extra] of buttons) {
    const b = el("button", { "data-action": label, text: label }, menu);
    if (extra) menu.appendChild(extra);
    b.addEventListener("click", () => { menu.hidden = true; run(); });
  }
  menu.style.left = `${ev.pageX + 6}px`;
  menu.style.top = `${ev.pageY + 6}px`;
  menu.hidden = false;
  ev.stopPropagation();
}

async function act(body) {
  try {
    const r = await fetch("/api/action", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const answer = await r.json();
    message(answer.ok ? answer.message : answer.error, answer.ok);
  } catch (e) { message(`the view did not answer: ${e}`, false); }
}

function linkMenu(link, ev) {
  const state = ((view.state || {}).links || {})[link.key];
  const rate = el("input", { type: "number", min: "0.05", max: "0.95", step: "0.05", value: "0.25", title: "fraction of the link rate kept" });
  const target = { link: [link.a, link.b] };
  openMenu(`link ${link.key}: ${state ? state.state : "?"}`, [
    ["down", () => act({ ...target, action: "down" })],
    ["up", () => act({ ...target, action: "up" })],
    ["blackhole", () => act({ ...target, action: "blackhole" })],
    ["degrade", () => act({ ...target, action: "degrade", rate: parseFloat(rate.value) }), rate],
    ["clear", () => act({ ...target, action: "clear" })],
  ], ev);
}

function spineMenu(name, ev) {
  const spine = ((view.state || {}).spines || {})[name];
  openMenu(`spine ${name}${spine && spine.drained ? " (drained)" : ""}`, [
    ["drain", () => act({ spine: name, action: "drain" })],
    ["undrain", () => act({ spine: name, action: "undrain" })],
  ], ev);
}
document.addEventListener("click", (ev) => { if (!$("#menu").contains(ev.target)) $("#menu").hidden = true; });

// ---- start ---------------------------------------------------------------------------------

function listen(url) {
  if (view.source) view.source.close();
  view.source = new EventSource(url);
  view.source.addEventListener("state", (e) => render(JSON.parse(e.data)));
  view.source.addEventListener("end", () => { view.source.close(); view.source = null; $("#replay-play").textContent = "play"; });
  view.source.addEventListener("problem", (e) => message(JSON.parse(e.data).error, false));  // a sample failed
  view.source.addEventListener("error", () => { if (view.topo.mode === "live") $("#mode").textContent = "reconnecting..."; });
}

setInterval(() => {
  const now = performance.now();
  view.received = view.received.filter((t) => now - t < 1000);
  $("#rate").textContent = `${view.received.length} updates/s`;
}, 500);

async function start() {
  view.topo = await (await fetch("/api/topology")).json();
  $("#mode").textContent = view.topo.mode === "replay" ? `replaying ${view.topo.results}` : (view.topo.read_only ? "read-only" : "click a link or a spine to act on it");
  drawTopology();
  if (view.topo.mode === "live") {
    render(await (await fetch("/api/state")).json());
    listen("/api/events");
    return;
  }
  const bar = $("#replay-bar"), select = $("#replay-run"), slider = $("#replay-t");
  bar.hidden = false;
  for (const run of Object.keys(view.topo.replay)) el("option", { value: run, text: run }, select);
  const show = async (t) => render(await (await fetch(`/api/state?run=${select.value}&t=${t}`)).json());
  const reset = () => { slider.max = view.topo.replay[select.value].duration_ms; chartReplay(select.value); };
  select.addEventListener("change", () => { reset(); show(slider.value); });
  slider.addEventListener("input", () => show(slider.value));
  $("#replay-play").addEventListener("click", () => {
    if (view.source) { view.source.close(); view.source = null; $("#replay-play").textContent = "play"; return; }
    const from = Number(slider.value) >= Number(slider.max) ? 0 : slider.value;
    $("#replay-play").textContent = "pause";
    listen(`/api/events?run=${select.value}&from=${from}`);
  });
  reset();
  const query = new URLSearchParams(location.search), t = query.get("t");
  if (query.get("run") in view.topo.replay) { select.value = query.get("run"); }
  await show(t != null ? t : view.topo.replay[select.value].duration_ms);
}
start();

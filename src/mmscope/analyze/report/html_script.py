"""The HTML report's style and script, inlined into every report (one file that opens offline).

The script draws from the analysis JSON embedded in the page: an icicle of the stage tree per
role (click a node to zoom, hover for its figures), self time by stage, host against device time
by stage, and the per-step view (with each step's device time where the profile has one).
"""

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em 2em;max-width:1250px;color:#222}
h1{font-size:1.3em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}h3{font-size:1.05em}
table{border-collapse:collapse;font-size:12.5px;margin:.4em 0}
td,th{border:1px solid #d4d4d4;padding:2px 7px;text-align:right;vertical-align:top}
td:first-child,th:first-child{text-align:left}.name{white-space:pre;font-family:monospace}
.ok{color:#080}.fail{color:#b00;font-weight:bold}.note{color:#555;font-size:.92em}
svg{display:block;margin:.3em 0 1em}svg text{font-size:11px;pointer-events:none}
svg .node rect{stroke:#fff;stroke-width:.5}svg .node:hover rect{stroke:#000}
#tip{position:fixed;display:none;background:#fffff0;border:1px solid #999;padding:4px 7px;
font-size:12px;white-space:pre;pointer-events:none;box-shadow:1px 1px 4px #aaa}
.legend span{display:inline-block;margin-right:1em;font-size:12px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:3px;vertical-align:-1px}
"""

JS = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("analysis").textContent);
const NS = "http://www.w3.org/2000/svg";
const tip = document.getElementById("tip");

function fmtNs(ns) {
  if (ns === null || ns === undefined) return "-";
  for (const [unit, scale] of [["s", 1e9], ["ms", 1e6], ["µs", 1e3]]) {
    if (Math.abs(ns) >= scale) return +(ns / scale).toPrecision(3) + " " + unit;
  }
  return Math.round(ns) + " ns";
}
function pct(share) { return share === null ? "" : (100 * share).toFixed(1) + "%"; }
function el(name, attrs, parent) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}
function hue(name) {
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) % 360;
  return h;
}
function hover(target, text) {
  el("title", {}, target).textContent = text;
  target.addEventListener("mousemove", ev => {
    tip.textContent = text; tip.style.display = "block";
    tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 10) + "px";
  });
  target.addEventListener("mouseleave", () => { tip.style.display = "none"; });
}

function nodeText(n, byId) {
  const up = n.parent === null ? null : byId[n.parent];
  return n.name + "\n" +
    "total " + fmtNs(n.total_ns) + (up ? " (" + pct(n.share_of_parent) + " of " + up.name + ")" : "") +
    ", self " + fmtNs(n.self_ns) + "\n" + n.count + " ranges, mean " + fmtNs(n.mean_ns) +
    ", p50 " + fmtNs(n.p50_ns) + ", p90 " + fmtNs(n.p90_ns) + ", p99 " + fmtNs(n.p99_ns);
}

function icicle(holder, nodes, focus) {
  holder.textContent = "";
  const byId = {}, kids = {};
  for (const n of nodes) { byId[n.id] = n; (kids[n.parent] = kids[n.parent] || []).push(n); }
  const width = 1200, row = 20;
  const roots = focus === null ? (kids[null] || []) : [byId[focus]];
  const whole = roots.reduce((s, n) => s + n.total_ns, 0) || 1;
  const placed = [];
  let x = 0, depth0 = focus === null ? 0 : byId[focus].depth;
  (function place(list, x0, w, scale) {
    let at = x0;
    for (const n of list) {
      const nw = Math.min(n.total_ns * scale, x0 + w - at);
      placed.push([n, at, nw]);
      place(kids[n.id] || [], at, nw, n.total_ns ? nw / n.total_ns : 0);
      at += nw;
    }
  })(roots, 0, width, width / whole);
  const depth = placed.reduce((d, [n]) => Math.max(d, n.depth - depth0), 0);
  const svg = el("svg", {width: width, height: (depth + 1) * row + 2, class: "icicle"}, holder);
  for (const [n, nx, nw] of placed) {
    if (nw < 0.5) continue;
    const g = el("g", {class: "node", "data-id": n.id, transform:
      "translate(" + nx.toFixed(2) + "," + ((n.depth - depth0) * row) + ")"}, svg);
    const light = 80 - 35 * (n.total_ns ? n.self_ns / n.total_ns : 0);
    el("rect", {width: Math.max(nw, 0.5).toFixed(2), height: row - 1,
                fill: "hsl(" + hue(n.name) + ",55%," + light.toFixed(0) + "%)"}, g);
    if (nw > 40) {
      const label = el("text", {x: 3, y: row - 6}, g);
      label.textContent = n.name.slice(0, Math.floor(nw / 6.5));
    }
    hover(g, nodeText(n, byId));
    g.addEventListener("click", () => icicle(holder, nodes, n.id === focus ? null : n.id));
  }
}

function selfBars(holder, nodes) {
  const byStage = {};
  for (const n of nodes) byStage[n.name] = (byStage[n.name] || 0) + n.self_ns;
  const rows = Object.entries(byStage).filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1])
    .slice(0, 15);
  if (!rows.length) return;
  const total = Object.values(byStage).reduce((a, b) => a + b, 0);
  const svg = el("svg", {width: 1200, height: rows.length * 18 + 4, class: "self"}, holder);
  rows.forEach(([name, ns], i) => {
    const g = el("g", {class: "self-bar", "data-stage": name, transform: "translate(0," + i * 18 + ")"}, svg);
    el("rect", {x: 330, width: Math.max(760 * ns / rows[0][1], 0.5).toFixed(2), height: 16,
                fill: "hsl(" + hue(name) + ",55%,60%)"}, g);
    const t = el("text", {x: 325, y: 12, "text-anchor": "end"}, g);
    t.textContent = name.slice(0, 52);
    const v = el("text", {x: 335 + 760 * ns / rows[0][1], y: 12}, g);
    v.textContent = fmtNs(ns) + " (" + pct(ns / total) + ")";
    hover(g, name + ": self " + fmtNs(ns) + ", " + pct(ns / total) + " of this role's self time");
  });
}

const HOST_COLOR = "#4477aa", DEVICE_COLOR = "#ee6677";

function hostDevice(holder, stages) {
  const big = s => Math.max(s.total_ns, s.device_ns);
  const rows = stages.filter(s => big(s) > 0).sort((a, b) => big(b) - big(a)).slice(0, 15);
  if (!rows.length) return;
  const top = big(rows[0]) || 1, scale = ns => Math.max(620 * ns / top, 0.5);
  const svg = el("svg", {width: 1200, height: rows.length * 30 + 4, class: "hostdev"}, holder);
  rows.forEach((s, i) => {
    const g = el("g", {class: "hostdev-bar", "data-stage": s.name, "data-host-ns": s.total_ns,
                       "data-device-ns": s.device_ns, transform: "translate(0," + i * 30 + ")"}, svg);
    el("rect", {x: 330, y: 1, width: scale(s.total_ns).toFixed(2), height: 12, fill: HOST_COLOR,
                class: "host"}, g);
    el("rect", {x: 330, y: 14, width: scale(s.device_ns).toFixed(2), height: 12,
                fill: DEVICE_COLOR, class: "device"}, g);
    el("text", {x: 325, y: 17, "text-anchor": "end"}, g).textContent = s.name.slice(0, 52);
    el("text", {x: 335 + scale(big(s)), y: 17}, g).textContent =
      "host " + fmtNs(s.total_ns) + ", device " + fmtNs(s.device_ns);
    hover(g, s.name + "\nhost " + fmtNs(s.total_ns) + "\ndevice " + fmtNs(s.device_ns) +
      " (kernels " + fmtNs(s.kernel_ns) + ")");
  });
  const legend = document.createElement("div");
  legend.className = "legend";
  legend.innerHTML = "<span><i style='background:" + HOST_COLOR + "'></i>host</span><span><i " +
    "style='background:" + DEVICE_COLOR + "'></i>device</span>";
  holder.appendChild(legend);
}

const KIND_COLOR = {prefill: "#cc3311", mixed: "#ee7733", decode: "#0077bb", idle: "#999999",
                    unknown: "#bbbbbb"};

function perStep(holder, s) {
  const W = 1200, H = 300, left = 60, bottom = 40, plotW = W - left - 10, plotH = H - bottom - 10;
  const ends = s.start_ns.map((t, i) => t + s.ns[i].reduce((a, b) => a + b, 0));
  const span = Math.max(...ends) - Math.min(...s.start_ns) || 1, t0 = Math.min(...s.start_ns);
  const device = s.device_ns || null;
  const tallest = Math.max(...s.ns.map(p => p.reduce((a, b) => a + b, 0)),
                           ...(device || [])) || 1;
  const svg = el("svg", {width: W, height: H, class: "steps"}, holder);
  const barW = Math.max(1, Math.min(12, 0.8 * plotW / s.shown));
  const colors = s.parts.map((p, i) => i === 0 ? "#aa3377" : "hsl(" + hue(p) + ",50%,55%)");
  for (let k = 0; k <= 4; k++) {
    const y = 10 + plotH - k * plotH / 4;
    el("line", {x1: left, x2: W - 10, y1: y, y2: y, stroke: "#eee"}, svg);
    el("text", {x: left - 4, y: y + 4, "text-anchor": "end"}, svg).textContent =
      fmtNs(k * tallest / 4);
    const tx = left + k * plotW / 4;
    el("text", {x: tx, y: H - bottom + 16, "text-anchor": "middle"}, svg).textContent =
      fmtNs(t0 + k * span / 4);
  }
  el("text", {x: left + plotW / 2, y: H - 6, "text-anchor": "middle"}, svg).textContent =
    "step start, from the profile's first range";
  s.ns.forEach((parts, i) => {
    const x = left + (s.start_ns[i] - t0) / span * (plotW - barW);
    const total = parts.reduce((a, b) => a + b, 0);
    const g = el("g", {class: "step", "data-step": i, "data-total-ns": total, "data-kind": s.kind[i]}, svg);
    let y = 10 + plotH;
    parts.forEach((ns, j) => {
      const h = ns / tallest * plotH;
      if (h <= 0) return;
      y -= h;
      el("rect", {x: x.toFixed(2), y: y.toFixed(2), width: barW, height: h.toFixed(2),
                  fill: colors[j], "data-part": s.parts[j], "data-ns": ns}, g);
    });
    el("rect", {x: x.toFixed(2), y: H - bottom + 2, width: barW, height: 4,
                fill: KIND_COLOR[s.kind[i]]}, g);
    if (device) {
      el("rect", {x: x.toFixed(2), y: (10 + plotH - device[i] / tallest * plotH - 1).toFixed(2),
                  width: barW, height: 2, fill: DEVICE_COLOR, class: "device",
                  "data-ns": device[i]}, g);
    }
    hover(g, s.kind[i] + " step at " + fmtNs(s.start_ns[i]) + ": " + fmtNs(total) +
      (device ? ", device " + fmtNs(device[i]) : "") +
      "\nprefill " + s.prefill[i] + ", decode " + s.decode[i] + " tokens, " + s.reqs[i] +
      " requests\n" + s.parts.map((p, j) => p + " " + fmtNs(parts[j])).join("\n"));
  });
  const legend = document.createElement("div");
  legend.className = "legend";
  legend.innerHTML = s.parts.map((p, j) => "<span><i style='background:" + colors[j] +
    "'></i>" + p.replace(/</g, "&lt;") + "</span>").join("") +
    (device ? "<span><i style='background:" + DEVICE_COLOR + "'></i>device time (line)</span>"
     : "") + " kind: " +
    Object.entries(KIND_COLOR).filter(([k]) => s.kind.includes(k)).map(([k, c]) =>
      "<span><i style='background:" + c + "'></i>" + k + "</span>").join("");
  holder.appendChild(legend);
}

for (const holder of document.querySelectorAll(".icicle-holder")) {
  const role = holder.dataset.role;
  icicle(holder, DATA.tree.filter(n => n.role === role), null);
}
for (const holder of document.querySelectorAll(".self-holder")) {
  selfBars(holder, DATA.tree.filter(n => n.role === holder.dataset.role));
}
const hostDeviceHolder = document.getElementById("host-device");
if (hostDeviceHolder && DATA.stages) hostDevice(hostDeviceHolder, DATA.stages);
const stepHolder = document.getElementById("per-step");
if (stepHolder && DATA.per_step) perStep(stepHolder, DATA.per_step);
document.body.dataset.rendered = "yes";
"""

// Megha GM dashboard: polls GET /v1/overview and GET /v1/jobs, draws with plain DOM and SVG (no libraries).
"use strict";

const EVERY_MS = 2000;
const HISTORY = 150; // usage samples kept per queue (5 minutes at one every 2 s)
const LATEST = 15; // jobs shown in the table
const COLOURS = ["#2f6fde", "#d9622b", "#2e9e5b", "#a63fbf", "#c9a227", "#1b9aaa", "#b3261e", "#6b7385"];
const history = new Map(); // queue -> [[time, consumption], ...]

function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function pct(fraction) {
  return `${(100 * fraction).toFixed(1)} %`;
}

function seconds(s) {
  if (s < 1) return `${+(s * 1000).toFixed(1)} ms`;
  if (s < 120) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function heat(fraction) {
  // white (idle) to the accent blue (full); text turns white past half
  const light = Math.round(97 - 50 * fraction);
  return `hsl(218, 72%, ${light}%)`;
}

// An operator's API token (GMs with MEGHA_AUTH=on ask for one): from the address's fragment, #token=..., which
// browsers never send to the server, or typed into the form the page shows when the GM answers 401 or 403. It is
// kept in this tab's sessionStorage only.
const TOKEN_KEY = "megha-token";
const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get("token")) {
  sessionStorage.setItem(TOKEN_KEY, fragment.get("token"));
  window.history.replaceState(null, "", location.pathname + location.search); // off the address bar and history
}

class Refused extends Error {}

async function getJSON(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetch(path, { cache: "no-store", headers });
  if (response.status === 401 || response.status === 403) throw new Refused(`${response.status}`);
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  return response.json();
}

function askForToken(status, why) {
  const form = document.getElementById("token-form");
  form.hidden = false;
  status.className = "error";
  status.textContent =
    why === "401"
      ? "this GM needs an operator's API token (MEGHA_AUTH=on)"
      : "this token's user is not an operator (MEGHA_OPERATORS)";
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  event.target.hidden = true;
  refresh();
});

function drawGrid(partitions) {
  const lms = [...new Set(partitions.map((p) => p.lm))].sort((a, b) => a - b);
  const gms = [...new Set(partitions.map((p) => p.gm))].sort((a, b) => a - b);
  const table = el("table", { class: "grid" });
  const head = el("tr");
  head.append(el("th", {}, "LM \\ partition of"));
  for (const gm of gms) head.append(el("th", { class: "num" }, `GM ${gm}`));
  table.append(head);
  for (const lm of lms) {
    const row = el("tr");
    row.append(el("th", {}, `LM ${lm}`));
    for (const gm of gms) {
      const p = partitions.find((q) => q.lm === lm && q.gm === gm);
      const cell = el("td", {
        class: "cell",
        "data-testid": `partition-${lm}-${gm}`,
        "data-used": p.used_fraction,
        "data-nodes": p.nodes,
        title: `${p.nodes} nodes`,
      }, pct(p.used_fraction));
      cell.style.background = heat(p.used_fraction);
      if (p.used_fraction > 0.5) cell.style.color = "#fff";
      row.append(cell);
    }
    table.append(row);
  }
  document.getElementById("grid").replaceChildren(table);
}

function drawCounts(id, label, counts, order) {
  const box = document.getElementById(id);
  box.replaceChildren(el("span", {}, label));
  for (const state of order) {
    const n = counts[state] || 0;
    const count = el("span", { class: "count", "data-testid": `${id === "job-counts" ? "jobs" : "tasks"}-${state}`, "data-value": n });
    count.append(`${state} `, el("b", {}, n.toLocaleString("en")));
    box.append(count);
  }
}

function drawQueues(queues, at) {
  const body = document.querySelector("#queue-table tbody");
  body.replaceChildren();
  for (const q of queues) {
    const row = el("tr", { "data-testid": `queue-${q.queue}` });
    row.append(
      el("td", {}, q.queue),
      el("td", { class: "num" }, q.share === null ? "—" : pct(q.share)),
      el("td", { class: "num" }, pct(q.consumption)),
      el("td", { class: "num", "data-testid": `queue-${q.queue}-pending` }, q.pending),
      el("td", { class: "num", "data-testid": `queue-${q.queue}-running` }, q.running),
    );
    body.append(row);
    const samples = history.get(q.queue) || [];
    samples.push([at, q.consumption]);
    if (samples.length > HISTORY) samples.shift();
    history.set(q.queue, samples);
  }
  const chart = document.getElementById("usage-chart");
  chart.replaceChildren();
  const all = [...history.values()].flat();
  if (all.length < 2) return;
  const t1 = Math.max(...all.map((s) => s[0]));
  const span = (HISTORY * EVERY_MS) / 1000; // the newest sample at the right edge, the window's start at the left
  const top = Math.max(0.01, ...all.map((s) => s[1]), ...queues.map((q) => q.share || 0));
  const x = (t) => Math.max(40, 580 - (540 * (t1 - t)) / span);
  const y = (v) => 140 - (130 * v) / top;
  chart.append(svg("line", { x1: 40, y1: 140, x2: 580, y2: 140, stroke: "#d8dce5" }));
  chart.append(svg("text", { x: 0, y: 14 }, pct(top)), svg("text", { x: 0, y: 143 }, "0 %"));
  [...history.keys()].forEach((queue, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const points = history.get(queue).map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", { points, fill: "none", stroke: colour, "stroke-width": 2 }));
    const share = queues.find((q) => q.queue === queue)?.share;
    if (share !== null && share !== undefined) {
      chart.append(svg("line", { x1: 40, x2: 580, y1: y(share), y2: y(share), stroke: colour, "stroke-dasharray": "4 3" }));
    }
    chart.append(svg("text", { x: 45 + 90 * i, y: 156, fill: colour }, `— ${queue}`));
  });
}

// What kind of job a row is (GET /v1/jobs/{id} has the details): gang, array size, parents, retry rule.
function kindOf(job) {
  const parents = job.depends_on.length;
  const markers = [];
  if (job.gang) markers.push(["gang", "every task starts, or none does"]);
  if (job.array !== null) markers.push([`array of ${job.array}`, "one task template run as many tasks"]);
  if (parents) markers.push([`after ${parents} job${parents === 1 ? "" : "s"}`, `waits for ${job.depends_on.join(", ")}`]);
  if (job.retry) markers.push(["retry", "failed runs run again under the job's retry rule"]);
  return markers;
}

function drawLatest(list) {
  const body = document.querySelector("#latest tbody");
  body.replaceChildren();
  for (const job of list.jobs.slice().reverse()) {
    const perState = Object.entries(job.task_states).map(([s, n]) => `${s} ${n}`).join(", ");
    const markers = kindOf(job);
    const kind = el("td", {});
    kind.append(...markers.map(([text, title]) => el("span", { class: "tag", title }, text)));
    const row = el("tr", {
      "data-testid": `job-${job.job_id}`,
      "data-state": job.state,
      "data-class": job.priority_class ?? "",
      "data-kind": markers.map(([text]) => text).join(", "),
    });
    row.append(el("td", {}, job.job_id), el("td", {}, job.user), el("td", { class: `state-${job.state}` }, job.state),
      el("td", {}, job.priority_class ?? "—"), kind, el("td", { class: "num" }, job.tasks), el("td", {}, perState));
    body.append(row);
  }
}

function drawHistogram(h) {
  const chart = document.getElementById("alloc-chart");
  chart.replaceChildren();
  const summary = document.getElementById("alloc-summary");
  summary.setAttribute("data-count", h.count);
  if (!h.count) {
    summary.textContent = "no task placed yet";
    return;
  }
  summary.textContent = `${h.count.toLocaleString("en")} placements, mean ${seconds(h.sum / h.count)}`;
  let first = h.counts.findIndex((c) => c > 0);
  let last = h.counts.length - 1 - [...h.counts].reverse().findIndex((c) => c > 0);
  first = Math.max(0, first - 1);
  last = Math.min(h.counts.length - 1, last + 1);
  const shown = h.counts.slice(first, last + 1);
  const top = Math.max(...shown);
  const width = 560 / shown.length;
  const every = Math.max(1, Math.ceil(52 / width)); // a bound label every few bars, so that labels never overlap
  shown.forEach((count, k) => {
    const i = first + k;
    const height = (128 * count) / top;
    const label = i < h.bounds.length ? `≤ ${seconds(h.bounds[i])}` : `> ${seconds(h.bounds[h.bounds.length - 1])}`;
    chart.append(svg("rect", {
      x: 30 + k * width + 2, y: 150 - height, width: Math.max(1, width - 4), height,
      fill: "#2f6fde", "data-testid": `alloc-bucket-${i}`, "data-count": count,
    }));
    if (k % every === 0) chart.append(svg("text", { x: 30 + k * width + 2, y: 165 }, label));
    if (count) chart.append(svg("text", { x: 30 + k * width + 2, y: 146 - height }, count.toLocaleString("en")));
  });
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const view = await getJSON("/v1/overview");
    const page = await getJSON("/v1/jobs?limit=1");
    const latest = await getJSON(`/v1/jobs?limit=${LATEST}&offset=${Math.max(0, page.total - LATEST)}`);
    document.getElementById("gm-title").textContent = `GM ${view.gm}`;
    document.title = `Megha GM ${view.gm}`;
    drawGrid(view.partitions);
    drawCounts("job-counts", "jobs:", view.jobs, ["waiting", "queued", "running", "finished", "failed", "cancelled"]);
    drawCounts("task-counts", "tasks:", view.tasks, ["queued", "launched", "finished", "failed", "cancelled"]);
    drawQueues(view.queues, view.at);
    drawLatest(latest);
    drawHistogram(view.allocation_time);
    status.className = "";
    status.textContent = `updated ${new Date(view.at * 1000).toLocaleTimeString()} · every ${EVERY_MS / 1000} s`;
    status.setAttribute("data-at", view.at);
  } catch (err) {
    if (err instanceof Refused) {
      askForToken(status, err.message);
      return;
    }
    status.className = "error";
    status.textContent = `cannot read the GM (${err.message}); retrying`;
  }
}

refresh();
setInterval(refresh, EVERY_MS);

// tidegate dashboard: polls the admin API every 2 s. All data goes into the
// page through textContent (never parsed as HTML): journal rows carry provider
// error text, which must not become markup.
"use strict";

const KEY = "tidegate-admin-key";
const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);
let timer = null;
let openId = null;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

class Unauthorized extends Error {}

async function api(path) {
  const key = sessionStorage.getItem(KEY);
  const resp = await fetch(path, { headers: { authorization: `Bearer ${key}` }, cache: "no-store" });
  if (resp.status === 401) throw new Unauthorized("the gateway refused this admin key");
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(body?.error?.message ?? `HTTP ${resp.status}`);
  return body;
}

function showLogin(message) {
  sessionStorage.removeItem(KEY);
  clearInterval(timer);
  timer = null;
  $("dashboard").hidden = true;
  $("detail").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message ?? "";
  $("status").textContent = "";
}

function showDashboard() {
  $("login").hidden = true;
  $("dashboard").hidden = false;
  $("logout").hidden = false;
  refresh();
  timer = setInterval(refresh, POLL_MS);
}

const ms = (v) => (v === null || v === undefined ? "-" : v < 1000 ? `${v.toFixed(0)} ms` : `${(v / 1000).toFixed(1)} s`);

function healthText(h) {
  switch (h.state) {
    case "cooling_down":
      return `cooling down until ${new Date(Date.now() + h.for_ms).toLocaleTimeString()}`;
    case "open":
      return `breaker open, probe in ${ms(h.for_ms)}`;
    case "half_open":
      return "half-open (one probe)";
    case "benched":
      return `benched (${h.reason || "cannot serve"}), probe in ${ms(h.for_ms)}`;
    default:
      return "ok";
  }
}

const SVG = "http://www.w3.org/2000/svg";

function chart(buckets) {
  const w = 4, gap = 1, height = 32;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", String(buckets.length * (w + gap)));
  svg.setAttribute("height", String(height));
  const total = (b) => b.completed + b.incomplete + b.failed + b.cancelled;
  const absorbed = (b) => b.capacity + b.transient + b.request + b.auth + b.entitlement;
  const max = Math.max(1, ...buckets.map((b) => Math.max(total(b), absorbed(b))));
  buckets.forEach((b, i) => {
    const x = i * (w + gap);
    let y = height;
    for (const [cls, n] of [["ok", b.completed], ["bad", b.failed + b.incomplete], ["gone", b.cancelled]]) {
      if (!n) continue;
      const h = Math.max(1, (n / max) * (height - 2));
      y -= h;
      const r = document.createElementNS(SVG, "rect");
      r.setAttribute("class", cls);
      r.setAttribute("x", String(x));
      r.setAttribute("y", String(y));
      r.setAttribute("width", String(w));
      r.setAttribute("height", String(h));
      svg.appendChild(r);
    }
    const a = absorbed(b);
    if (a) {
      const r = document.createElementNS(SVG, "rect");
      r.setAttribute("class", "absorbed");
      r.setAttribute("x", String(x));
      r.setAttribute("y", String(height - 2 - (a / max) * (height - 2)));
      r.setAttribute("width", String(w));
      r.setAttribute("height", "2");
      svg.appendChild(r);
    }
    const t = document.createElementNS(SVG, "title");
    t.textContent = `${new Date(b.t_ms).toLocaleTimeString()}: ${b.completed} completed, ${b.failed} failed, ${b.incomplete} cut, ${b.cancelled} cancelled; failed attempts: ${b.capacity} capacity, ${b.transient} transient, ${b.request + b.auth + b.entitlement} other`;
    svg.appendChild(t);
  });
  return svg;
}

function totals(buckets) {
  const sum = (k) => buckets.reduce((s, b) => s + b[k], 0);
  const parts = [`${sum("completed")} ok`];
  for (const k of ["failed", "incomplete", "cancelled", "capacity", "transient", "request", "auth", "entitlement"]) {
    const n = sum(k);
    if (n) parts.push(`${n} ${k}`);
  }
  return parts.join(", ");
}

// What the provider told: advertised rate limits (left of limit) and a
// subscription's windows (share used, time to reset, the trend).
function told(u) {
  const parts = [];
  const models = Object.entries(u.advertised ?? {});
  for (const [model, buckets] of models) {
    for (const [kind, b] of Object.entries(buckets ?? {})) {
      if (b) parts.push(`${models.length > 1 ? model + " " : ""}${kind} ${b.left}/${b.limit}`);
    }
  }
  for (const [name, w] of Object.entries(u.windows ?? {})) {
    if (!w) continue;
    const reset = w.resets_in_s == null ? "" : ` (resets in ${Math.round(w.resets_in_s / 60)} min)`;
    const trend = (w.history ?? []).slice(-8).map(([, used]) => Math.round(used * 100)).join("→");
    parts.push(`${name} ${Math.round(w.used * 100)}%${w.exhausted ? " used up" : ""}${reset}${trend ? " " + trend : ""}`);
  }
  return parts.join("; ") || "-";
}

function renderUpstreams(state, stats) {
  const body = $("upstreams").tBodies[0];
  const series = new Map((stats.upstreams ?? []).map((u) => [u.name, u.buckets]));
  const rows = state.upstreams.map((u) => {
    const tr = el("tr");
    tr.dataset.upstream = u.name;
    tr.appendChild(el("td", `${u.name} (${u.protocol})`));
    const health = el("td");
    health.appendChild(el("span", healthText(u.health), `badge ${u.health.state}`));
    tr.appendChild(health);
    tr.appendChild(el("td", `${u.in_flight} / ${u.effective_limit} / ${u.max_concurrent ?? "-"}`));
    tr.appendChild(el("td", u.queued));
    tr.appendChild(el("td", told(u)));
    const buckets = series.get(u.name) ?? [];
    const c = el("td");
    c.appendChild(chart(buckets));
    tr.appendChild(c);
    tr.appendChild(el("td", totals(buckets)));
    return tr;
  });
  body.replaceChildren(...rows);
}

function renderClients(state) {
  const list = state.clients ?? [];
  const rows = list.map((c) => {
    const tr = el("tr");
    tr.dataset.client = c.name;
    tr.appendChild(el("td", c.name));
    tr.appendChild(el("td", `${c.priority} / ${c.weight}`));
    tr.appendChild(el("td", `${c.in_flight} / ${c.limits.max_concurrent ?? "-"}`));
    tr.appendChild(el("td", `${c.queued} / ${c.queued_upstream}`));
    const rate = (used, limit) => (limit ? `${used ?? 0}/${limit}` : "-");
    tr.appendChild(el("td", `${rate(c.rpm_used, c.limits.rpm)} · ${rate(c.tpm_used, c.limits.tpm)}`));
    tr.appendChild(el("td", c.penalised_ms ? `${Math.ceil(c.penalised_ms / 1000)} s left` : "-"));
    return tr;
  });
  $("clients").tBodies[0].replaceChildren(...rows);
  $("clients-note").textContent = list.length ? "" : "no client keys configured: every request shares one lane";
}

function renderRequests(list) {
  const body = $("requests").tBodies[0];
  const rows = list.map((r) => {
    const tr = el("tr");
    tr.dataset.id = r.id;
    tr.appendChild(el("td", new Date(r.ts_ms).toLocaleTimeString()));
    const outcome = el("td");
    outcome.appendChild(el("span", r.outcome, `badge ${r.outcome}`));
    tr.appendChild(outcome);
    tr.appendChild(el("td", r.status));
    tr.appendChild(el("td", r.model ?? "-"));
    tr.appendChild(el("td", r.targets || "-"));
    tr.appendChild(el("td", r.n_attempts));
    tr.appendChild(el("td", ms(r.total_ms)));
    tr.appendChild(el("td", `${r.tokens_in ?? "-"} / ${r.tokens_out ?? "-"}`));
    tr.appendChild(el("td", r.error ?? "", "error-cell"));
    tr.addEventListener("click", () => openDetail(r.id));
    return tr;
  });
  body.replaceChildren(...rows);
}

async function refresh() {
  const outcome = $("outcome").value;
  const query = `/admin/requests?limit=50${outcome ? `&outcome=${encodeURIComponent(outcome)}` : ""}`;
  try {
    const [state, stats, clients] = await Promise.all([
      api("/admin/upstreams"),
      api("/admin/stats"),
      api("/admin/clients"),
    ]);
    renderUpstreams(state, stats);
    renderClients(clients);
    try {
      renderRequests((await api(query)).requests ?? []);
      $("journal-note").textContent = state.journal_dropped_rows ? `${state.journal_dropped_rows} journal rows dropped` : "";
    } catch (err) {
      if (err instanceof Unauthorized) throw err;
      $("journal-note").textContent = `requests unavailable: ${err.message}`;
    }
    $("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    if (err instanceof Unauthorized) return showLogin(err.message);
    $("status").textContent = `cannot reach the gateway: ${err.message}`;
  }
}

async function openDetail(id) {
  openId = id;
  let r;
  try {
    r = await api(`/admin/requests/${encodeURIComponent(id)}`);
  } catch (err) {
    if (err instanceof Unauthorized) return showLogin(err.message);
    $("status").textContent = `cannot load request ${id}: ${err.message}`;
    return;
  }
  if (openId !== id) return;
  $("detail-id").textContent = r.id;
  const fields = [
    ["time", new Date(r.ts_ms).toLocaleString()],
    ["outcome", r.outcome],
    ["status", r.status],
    ["model", r.model ?? "-"],
    ["client", r.client ?? "-"],
    ["stream", r.stream ? "yes" : "no"],
    ["class", r.class ?? "-"],
    ["error", r.error ?? "-"],
    ["upstreams", r.targets || "-"],
    ["queue wait", ms(r.queue_ms)],
    ["first byte", ms(r.ttfb_ms)],
    ["total", ms(r.total_ms)],
    ["tokens in / out", `${r.tokens_in ?? "-"} / ${r.tokens_out ?? "-"}`],
    ["of which cached / written to cache / reasoning",
      `${r.tokens_cached ?? "-"} / ${r.tokens_cache_written ?? "-"} / ${r.tokens_reasoning ?? "-"}`],
    ["anomaly", r.anomaly ? "flagged" : "no"],
  ];
  $("detail-fields").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", k), el("dd", v)]));
  const rows = (r.attempts ?? []).map((a, i) => {
    const tr = el("tr");
    for (const v of [i + 1, a.upstream, a.status ?? "-", a.class ?? "-", a.verdict, ms(a.wait_ms), a.summary || "-"]) {
      tr.appendChild(el("td", v));
    }
    return tr;
  });
  $("attempts").tBodies[0].replaceChildren(...rows);
  $("partial").textContent = r.partial ?? "(none)";
  $("detail").hidden = false;
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("key").value);
  $("key").value = "";
  try {
    await api("/admin/upstreams");
    showDashboard();
  } catch (err) {
    showLogin(err instanceof Unauthorized ? "That key was refused." : `Cannot reach the gateway: ${err.message}`);
  }
});
$("logout").addEventListener("click", () => showLogin());
$("close-detail").addEventListener("click", () => {
  openId = null;
  $("detail").hidden = true;
});
$("outcome").addEventListener("change", refresh);

if (sessionStorage.getItem(KEY)) showDashboard();
else showLogin();

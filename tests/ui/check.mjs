// Browser test of the dashboard: Debian's headless chromium, driven by
// playwright-core, against a real tidegate in front of `tidegate simulate`.
//
// Usage: node tests/ui/check.mjs path/to/tidegate   (run from target/ui-js
// so playwright-core resolves; .ci/run copies it there)
// Saves target/ui-dashboard.png (dashboard with a failed request's detail).

import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const binary = resolve(process.argv[2] ?? "target/debug/tidegate");
const shots = resolve(process.env.SCREENSHOT_DIR ?? "target");
const ADMIN = "ui-admin-secret";
const tmp = mkdtempSync(join(tmpdir(), "tidegate-ui-"));
const procs = [];
let failures = 0;

function check(ok, what) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures++;
}

function freePort() {
  return new Promise((done, fail) => {
    const s = createServer();
    s.on("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => done(port));
    });
  });
}

async function waitFor(url) {
  for (let i = 0; i < 200; i++) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing answered at ${url}`);
}

function start(args, log) {
  const p = spawn(binary, args, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, NO_COLOR: "1" } });
  p.stderr.on("data", (d) => log.push(d.toString()));
  procs.push(p);
  return p;
}

const simPort = await freePort();
const gwPort = await freePort();
// A failing upstream (500: transient, so max_attempts bounds it; a
// capacity error would be retried until the deadline).
writeFileSync(join(tmp, "sim.yaml"), "models:\n  broken: { status: 500, error_body: '{\"error\":{\"message\":\"internal error\",\"type\":\"server_error\"}}' }\n");
writeFileSync(
  join(tmp, "tidegate.yaml"),
  `listen: 127.0.0.1:${gwPort}
admin_key: ${ADMIN}
client_keys:
  - { name: ide, key: k-ide, weight: 3 }
  - { name: nightly, key: k-nightly, priority: batch, max_concurrent: 2 }
journal: ${join(tmp, "journal.db")}
defaults:
  retry: { max_attempts: 3, base_delay: 20ms, max_delay: 50ms }
upstreams:
  - { name: sim-openai, protocol: openai, base_url: "http://127.0.0.1:${simPort}/v1", max_concurrent: 8 }
  - { name: sim-anthropic, protocol: anthropic, base_url: "http://127.0.0.1:${simPort}" }
models:
  gpt: { targets: [{ upstream: sim-openai }] }
  broken: { targets: [{ upstream: sim-openai }] }
  claude: { targets: [{ upstream: sim-anthropic }] }
`,
);
const logs = [];
start(["simulate", "--listen", `127.0.0.1:${simPort}`, "--config", join(tmp, "sim.yaml")], logs);
start(["serve", "--config", join(tmp, "tidegate.yaml")], logs);
const base = `http://127.0.0.1:${gwPort}`;
await waitFor(`${base}/healthz`);

const post = (path, body, headers = {}) =>
  fetch(`${base}${path}`, { method: "POST", headers: { "content-type": "application/json", authorization: "Bearer k-ide", ...headers }, body: JSON.stringify(body) });

let browser;
try {
  for (const path of ["/admin/upstreams", "/admin/stats", "/admin/requests", "/admin/clients"]) {
    const r = await fetch(`${base}${path}`);
    check(r.status === 401, `${path} without the key: 401 (got ${r.status})`);
  }

  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const offsite = [];
  page.on("request", (r) => {
    if (!r.url().startsWith(base)) offsite.push(r.url());
  });
  const consoleErrors = [];
  page.on("console", (m) => m.type() === "error" && !m.text().includes("401") && consoleErrors.push(m.text()));

  await page.goto(`${base}/ui`);
  check(await page.isVisible("#login-form"), "without a key the page shows the login form");
  check(await page.isHidden("#dashboard"), "and no dashboard");

  await page.fill("#key", "not-the-key");
  await page.click("#login-form button");
  await page.waitForSelector("#login-error:has-text('refused')", { timeout: 5000 });
  check(true, "a wrong key is refused on the form");

  await page.fill("#key", ADMIN);
  await page.click("#login-form button");
  await page.waitForSelector("#upstreams tbody tr[data-upstream='sim-anthropic']", { timeout: 10000 });
  const names = await page.$$eval("#upstreams tbody tr", (rows) => rows.map((r) => r.dataset.upstream));
  check(names.join(",") === "sim-openai,sim-anthropic", `both upstreams listed (${names})`);
  await page.waitForSelector("#clients tbody tr[data-client='nightly']", { timeout: 10000 });
  const lanes = await page.$$eval("#clients tbody tr", (rows) => rows.map((r) => r.textContent));
  check(
    lanes.length === 2 && lanes[0].includes("interactive / 3") && lanes[1].includes("batch / 1") && lanes[1].includes("0 / 2"),
    `client keys listed with priority, weight and cap (${lanes.join(" | ")})`,
  );
  check(!lanes.join(" ").includes("k-ide"), "client keys themselves are never shown");
  check(!page.url().includes(ADMIN), "the key is not in the URL");
  check((await page.evaluate(() => sessionStorage.getItem("tidegate-admin-key"))) === ADMIN, "the key is in session storage");

  const ok = await post("/v1/chat/completions", { model: "gpt", messages: [{ role: "user", content: "hi" }] });
  check(ok.status === 200, "a normal request succeeds");
  const claude = await post("/v1/messages", { model: "claude", max_tokens: 16, messages: [{ role: "user", content: "hi" }] },
    { "anthropic-version": "2023-06-01" });
  check(claude.status === 200, "an Anthropic request succeeds");
  const bad = await post("/v1/chat/completions", { model: "broken", messages: [{ role: "user", content: "hi" }] });
  const badId = bad.headers.get("x-tidegate-request-id");
  check(bad.status === 502, `the failing request fails (${bad.status})`);

  // It appears without a reload (the page polls).
  await page.waitForSelector(`#requests tbody tr[data-id='${badId}']`, { timeout: 10000 });
  const outcome = await page.textContent(`#requests tbody tr[data-id='${badId}'] .badge`);
  check(outcome === "failed", `the failing request appears as failed (${outcome})`);
  await page.waitForFunction(
    () => [...document.querySelectorAll("#upstreams tbody tr[data-upstream='sim-openai'] td")].some((td) => td.textContent.includes("failed")),
    null,
    { timeout: 10000 },
  );
  check(true, "the upstream's 5-minute totals count the failure");

  await page.selectOption("#outcome", "failed");
  await page.waitForFunction(
    () => {
      const rows = [...document.querySelectorAll("#requests tbody tr .badge")];
      return rows.length > 0 && rows.every((b) => b.textContent === "failed");
    },
    null,
    { timeout: 10000 },
  );
  check(true, "the outcome filter shows only failed requests");

  await page.click(`#requests tbody tr[data-id='${badId}']`);
  await page.waitForSelector("#detail:not([hidden])", { timeout: 5000 });
  const attempts = await page.$$eval("#attempts tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  check(attempts.length === 3, `the detail lists each attempt (${attempts.length})`);
  check(attempts.every((a) => a[2] === "500" && a[3] === "transient"), `each attempt's status and class (${JSON.stringify(attempts[0])})`);
  check((await page.textContent("#detail-id")) === badId, "the detail is that request's");

  mkdirSync(shots, { recursive: true });
  await page.screenshot({ path: join(shots, "ui-dashboard.png"), fullPage: true });
  console.log(`screenshot: ${join(shots, "ui-dashboard.png")}`);

  await page.reload();
  await page.waitForSelector("#upstreams tbody tr", { timeout: 10000 });
  check(await page.isHidden("#login-form"), "a reload keeps the session");
  await page.click("#logout");
  check(await page.isVisible("#login-form"), "log out shows the login form");
  check((await page.evaluate(() => sessionStorage.getItem("tidegate-admin-key"))) === null, "and forgets the key");

  check(offsite.length === 0, `nothing fetched from elsewhere (${offsite.slice(0, 3)})`);
  check(consoleErrors.length === 0, `no script errors (${consoleErrors.slice(0, 3)})`);
} catch (err) {
  check(false, `unexpected: ${err.stack ?? err}`);
} finally {
  await browser?.close();
  for (const p of procs) p.kill("SIGTERM");
}
console.log(`${failures === 0 ? "all passed" : `${failures} failed`}`);
if (failures) {
  console.log(logs.join("").slice(-3000));
  process.exit(1);
}

// SPDX-License-Identifier: BSD-2-Clause
// Drive sluice's console (GET / on admin_listen) in headless Chromium for
// tests/e2e/test_console.py. A line protocol: one JSON command per line on
// stdin, one JSON answer per line on stdout ({"ok": true, ...} or
// {"ok": false, "error": "..."}). The test keeps every assertion.
//
//   {"op": "open", "url": U, "width": W, "height": H}   load the page
//   {"op": "snapshot"}        what the page shows now (see snapshot())
//   {"op": "click", "selector": S}
//   {"op": "screenshot", "path": P, "fullPage": bool}
//   {"op": "quit"}
//
// Usage: node console.mjs [CHROMIUM]   (default /usr/bin/chromium)
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

const executablePath = process.argv[2] || "/usr/bin/chromium";
const browser = await chromium.launch({
  executablePath, headless: true,
  // Root in a container has no user namespace for the sandbox.
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
let page = null;
const problems = [];    // console errors, page errors, CSP violations

function say(o) {
  process.stdout.write(JSON.stringify(o) + "\n");
}

// Everything a test asserts on, read from the DOM as a user sees it.
function snapshot() {
  const text = (e) => (e ? e.textContent.trim() : null);
  const cells = (tr, names) => {
    const o = {};
    for (const n of names) o[n] = text(tr.querySelector("td." + n + " .v") ||
                                       tr.querySelector("td." + n));
    return o;
  };
  const tenants = [...document.querySelectorAll("#tenants tbody tr")].map((tr) =>
    Object.assign({
      name: tr.dataset.tenant,
      classes: [...tr.classList],
      max: text(tr.querySelector("td.streams .max")),
      badge: text(tr.querySelector(".badge")),
      sparkPoints: (tr.querySelector("td.spark polyline") || { getAttribute: () => "" })
        .getAttribute("points").split(" ").filter(Boolean).length,
    }, cells(tr, ["streams", "waiting", "tokens", "rejected"])));
  const replicas = [...document.querySelectorAll("#replicas tbody tr")].map((tr) =>
    Object.assign({
      upstream: tr.dataset.upstream,
      url: tr.dataset.url,
      classes: [...tr.classList],
      max: text(tr.querySelector("td.streams .max")),
      sparkPoints: (tr.querySelector("td.spark polyline") || { getAttribute: () => "" })
        .getAttribute("points").split(" ").filter(Boolean).length,
    }, cells(tr, ["state", "streams", "queue", "kv", "requests", "errors"])));
  const models = [...document.querySelectorAll("#models tbody tr")].map((tr) =>
    Object.assign({ name: tr.dataset.model }, cells(tr, ["p50", "p99", "requests"])));
  const banner = document.getElementById("stale");
  return {
    bodyClasses: [...document.body.classList],
    stale: banner.hidden ? null : banner.textContent,
    live: text(document.getElementById("live")),
    node: text(document.getElementById("node")),
    summary: {
      streams: text(document.getElementById("sum-streams")),
      cap: text(document.getElementById("sum-cap")),
      down: text(document.getElementById("sum-down")),
    },
    sorted: [...document.querySelectorAll("th.sorted")].map((th) =>
      th.closest("table").id + ":" + th.dataset.key + (th.classList.contains("desc") ? ":desc" : "")),
    tenants, replicas, models,
    modelsHidden: document.getElementById("models").hidden,
    layout: {
      width: window.innerWidth,
      scrollWidth: document.documentElement.scrollWidth,
      replicasPanel: (() => {
        const sc = document.querySelector("#replicas-panel .scroll");
        const t = document.getElementById("replicas");
        return { table: t.offsetHeight, visible: sc.clientHeight, scrollWidth: sc.scrollWidth,
                 width: sc.clientWidth };
      })(),
      tenantsPanel: (() => {
        const sc = document.querySelector("#tenants-panel .scroll");
        const r = document.querySelector("#tenants tbody tr");
        return { visible: sc.clientHeight, scrollWidth: sc.scrollWidth, width: sc.clientWidth,
                 rowHeight: r ? r.offsetHeight : 0 };
      })(),
    },
  };
}

async function run(cmd) {
  switch (cmd.op) {
  case "open": {
    const ctx = await browser.newContext({
      viewport: { width: cmd.width || 1366, height: cmd.height || 768 },
    });
    page = await ctx.newPage();
    page.on("console", (m) => {
      if (m.type() === "error") problems.push("console: " + m.text());
    });
    page.on("pageerror", (e) => problems.push("pageerror: " + e.message));
    const resp = await page.goto(cmd.url, { waitUntil: "load" });
    const headers = await resp.allHeaders();
    return { status: resp.status(), headers };
  }
  case "snapshot":
    return { snapshot: await page.evaluate(snapshot), problems };
  case "click":
    await page.click(cmd.selector);
    return {};
  case "screenshot":
    await page.screenshot({ path: cmd.path, fullPage: !!cmd.fullPage });
    return {};
  case "quit":
    await browser.close();
    say({ ok: true });
    process.exit(0);
  }
  throw new Error("unknown op " + cmd.op);
}

say({ ok: true, version: browser.version() });
const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  try {
    say(Object.assign({ ok: true }, await run(JSON.parse(line))));
  } catch (e) {
    say({ ok: false, error: String(e && e.stack || e) });
  }
}
await browser.close();

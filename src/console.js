// SPDX-License-Identifier: BSD-2-Clause
// sluice console: polls /status.json once a second, keeps the last five
// minutes in the page, and draws it. Nothing else is fetched; everything is
// built with DOM calls (no HTML from data), so names show as text.
"use strict";

(function () {
  const POLL_MS = 1000;
  const TIMEOUT_MS = 2500;
  const KEEP_MS = 5 * 60 * 1000;
  const SVG = "http://www.w3.org/2000/svg";
  const SPARK_W = 100, SPARK_H = 18;

  const $ = (id) => document.getElementById(id);
  const history = new Map();      // "t:NAME" or "r:UPSTREAM URL" -> [[ms, streams]...]
  const sort = {
    tenants: { key: "name", desc: false },
    replicas: { key: "upstream", desc: false },
    models: { key: "name", desc: false },
  };
  let last = null;                // the last status that arrived
  let lastOk = 0;                 // Date.now() of it
  let failingSince = 0;           // first failed poll after a good one; 0: none
  let failReason = "";

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function hhmmss(ms) {
    const d = new Date(ms);
    return [d.getHours(), d.getMinutes(), d.getSeconds()]
      .map((n) => String(n).padStart(2, "0")).join(":");
  }

  function duration(s) {
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600),
      m = Math.floor(s % 3600 / 60);
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + String(m).padStart(2, "0") + "m";
    if (m) return m + "m " + String(s % 60).padStart(2, "0") + "s";
    return s + "s";
  }

  function num(n) {
    if (n === null || n === undefined) return "–";
    if (n >= 1e6) return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1) + "M";
    if (n >= 1e4) return (n / 1e3).toFixed(n >= 1e5 ? 0 : 1) + "k";
    return String(n);
  }

  function remember(key, now, v) {
    let h = history.get(key);
    if (!h) history.set(key, h = []);
    h.push([now, v]);
    while (h.length && h[0][0] < now - KEEP_MS) h.shift();
  }

  // A sparkline of the last five minutes; cap (if any and in range) dashed.
  function spark(key, cap) {
    const s = document.createElementNS(SVG, "svg");
    s.setAttribute("class", "spark");
    s.setAttribute("width", SPARK_W);
    s.setAttribute("height", SPARK_H);
    s.setAttribute("viewBox", "0 0 " + SPARK_W + " " + SPARK_H);
    const h = history.get(key) || [];
    if (!h.length) return s;
    const now = h[h.length - 1][0];
    // Five minutes once the page has them; until then the time it has
    // (at least 30 seconds), so a fresh page shows a line, not a dot.
    const span = Math.min(KEEP_MS, Math.max(30 * 1000, now - h[0][0]));
    let top = 1;
    for (const p of h) top = Math.max(top, p[1]);
    if (cap && cap <= top * 1.5) top = Math.max(top, cap);
    const x = (t) => SPARK_W - (now - t) / span * SPARK_W;
    const y = (v) => SPARK_H - 1 - v / top * (SPARK_H - 2);
    const pts = h.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1));
    const area = document.createElementNS(SVG, "polygon");
    area.setAttribute("points", x(h[0][0]).toFixed(1) + "," + SPARK_H + " " +
      pts.join(" ") + " " + SPARK_W + "," + SPARK_H);
    s.appendChild(area);
    if (cap && cap <= top) {
      const l = document.createElementNS(SVG, "line");
      l.setAttribute("class", "cap");
      l.setAttribute("x1", 0); l.setAttribute("x2", SPARK_W);
      l.setAttribute("y1", y(cap)); l.setAttribute("y2", y(cap));
      s.appendChild(l);
    }
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", pts.join(" "));
    s.appendChild(line);
    const dot = document.createElementNS(SVG, "circle");   // now
    dot.setAttribute("cx", SPARK_W - 1.5);
    dot.setAttribute("cy", y(h[h.length - 1][1]).toFixed(1));
    dot.setAttribute("r", 1.5);
    s.appendChild(dot);
    return s;
  }

  // "v / max" with the parts in spans the tests (and CSS) can find.
  function ofMax(v, max) {
    const td = el("td", "streams");
    td.appendChild(el("span", "v", String(v)));
    td.appendChild(el("span", "max", " / " + (max === null ? "∞" : max)));
    return td;
  }

  function numCell(cls, v) {
    const td = el("td", cls, num(v));
    if (v === 0) td.classList.add("zero");
    return td;
  }

  function cmp(a, b, key, desc) {
    let x = a[key], y = b[key];
    if (x === null || x === undefined) x = -Infinity;
    if (y === null || y === undefined) y = -Infinity;
    let r;
    if (typeof x === "string" || typeof y === "string")
      r = String(x).localeCompare(String(y), undefined, { numeric: true });
    else
      r = x < y ? -1 : x > y ? 1 : 0;
    if (r === 0 && key !== "name" && a.name !== undefined)
      r = String(a.name).localeCompare(String(b.name), undefined, { numeric: true });
    return desc ? -r : r;
  }

  function sorted(rows, which) {
    const s = sort[which];
    return rows.slice().sort((a, b) => cmp(a, b, s.key, s.desc));
  }

  function atCap(t) {
    return t.max_streams > 0 && t.streams >= t.max_streams;
  }

  function replicaState(r) {
    if (!r.up) return "down";
    if (r.ejected) return "ejected";
    if (r.busy) return "busy";
    return "up";
  }

  function drawTenants(st) {
    const filter = $("filter").value.trim().toLowerCase();
    const rows = st.tenants.map((t) => Object.assign({}, t, {
      load: t.max_streams > 0 ? t.streams / t.max_streams : t.streams,
    }));
    const body = document.querySelector("#tenants tbody");
    const frag = document.createDocumentFragment();
    for (const t of sorted(rows, "tenants")) {
      const tr = el("tr");
      tr.dataset.tenant = t.name;
      flash(tr, "t:" + t.name);
      if (atCap(t)) tr.classList.add("at-cap");
      if (filter && !t.name.toLowerCase().includes(filter)) tr.classList.add("hidden");
      const name = el("td", "l name", t.name);
      name.title = t.name;
      if (atCap(t)) name.appendChild(el("span", "badge", "at cap"));
      tr.appendChild(name);
      tr.appendChild(ofMax(t.streams, t.max_streams));
      const sp = el("td", "spark");
      sp.appendChild(spark("t:" + t.name, t.max_streams));
      tr.appendChild(sp);
      tr.appendChild(numCell("waiting", t.waiting));
      const tok = el("td", "tokens");
      tok.appendChild(el("span", "v", num(t.tokens_last_minute)));
      if (t.tokens_per_minute !== null)
        tok.appendChild(el("span", "max", " / " + num(t.tokens_per_minute)));
      tr.appendChild(tok);
      const rej = numCell("rejected", t.rejected_last_minute);
      if (t.rejected_last_minute > 0) rej.classList.add("err-some");
      tr.appendChild(rej);
      frag.appendChild(tr);
    }
    body.replaceChildren(frag);
    $("tenants-count").textContent = "(" + st.tenants.length + ")";
  }

  function flatReplicas(st) {
    const out = [];
    for (const u of st.upstreams)
      for (const r of u.replicas)
        out.push(Object.assign({}, r, {
          upstream: u.name, state: replicaState(r),
          load: r.max_streams ? r.streams / r.max_streams : r.streams,
        }));
    return out;
  }

  function drawReplicas(st) {
    const rows = flatReplicas(st);
    const body = document.querySelector("#replicas tbody");
    const frag = document.createDocumentFragment();
    for (const r of sorted(rows, "replicas")) {
      const tr = el("tr");
      tr.dataset.upstream = r.upstream;
      tr.dataset.url = r.url;
      flash(tr, "r:" + r.upstream + " " + r.url);
      if (r.state !== "up") tr.classList.add(r.state);
      if (r.max_streams !== null && r.streams >= r.max_streams) tr.classList.add("full");
      tr.appendChild(el("td", "l upstream", r.upstream));
      const url = el("td", "l url", r.url.replace(/^https?:\/\//, ""));
      url.title = r.url;
      tr.appendChild(url);
      tr.appendChild(el("td", "l state " + r.state, r.state));
      tr.appendChild(ofMax(r.streams, r.max_streams));
      const sp = el("td", "spark");
      sp.appendChild(spark("r:" + r.upstream + " " + r.url, r.max_streams));
      tr.appendChild(sp);
      tr.appendChild(numCell("queue", r.queue));
      tr.appendChild(el("td", "kv", r.kv_cache === null ? "–" :
        Math.round(r.kv_cache * 100) + "%"));
      tr.appendChild(numCell("requests", r.requests_last_minute));
      const err = numCell("errors", r.errors_last_minute);
      if (r.errors_last_minute > 0) err.classList.add("err-some");
      tr.appendChild(err);
      frag.appendChild(tr);
    }
    body.replaceChildren(frag);
    $("replicas-count").textContent = "(" + rows.length + " in " +
      st.upstreams.length + " upstream" + (st.upstreams.length === 1 ? "" : "s") + ")";
  }

  function drawModels(st) {
    const table = $("models");
    if (!st.models || !st.models.length) { table.hidden = true; return; }
    table.hidden = false;
    const frag = document.createDocumentFragment();
    const ms = (v) => v === null ? "–" : v >= 1000 ? (v / 1000).toFixed(2) + " s" :
      v.toFixed(v < 10 ? 1 : 0) + " ms";
    for (const m of sorted(st.models, "models")) {
      const tr = el("tr");
      tr.dataset.model = m.name;
      tr.appendChild(el("td", "l name", m.name));
      tr.appendChild(el("td", "p50", ms(m.ttft_p50_ms)));
      tr.appendChild(el("td", "p99", ms(m.ttft_p99_ms)));
      tr.appendChild(numCell("requests", m.requests_last_minute));
      frag.appendChild(tr);
    }
    table.tBodies[0].replaceChildren(frag);
  }

  function drawSummary(st) {
    let streams = 0, waiting = 0, rejected = 0;
    const caps = [], bad = [];
    for (const t of st.tenants) {
      streams += t.streams;
      waiting += t.waiting;
      rejected += t.rejected_last_minute;
      if (atCap(t)) caps.push(t.name);
    }
    const reps = flatReplicas(st);
    for (const r of reps)
      if (r.state === "down" || r.state === "ejected") bad.push(r);
    $("sum-streams").textContent = num(streams);
    $("sum-waiting").textContent = num(waiting);
    $("sum-rejected").textContent = num(rejected);
    $("sum-cap").textContent = caps.length + " / " + st.tenants.length;
    $("sum-down").textContent = bad.length + " / " + reps.length;
    $("sum-cap").parentNode.classList.toggle("warn", caps.length > 0);
    $("sum-down").parentNode.classList.toggle("bad", bad.length > 0);
    $("sum-rejected").parentNode.classList.toggle("warn", rejected > 0);
    const alerts = $("alerts");
    const frag = document.createDocumentFragment();
    for (const r of bad) {
      const a = el("span", "a " + r.state, r.state + ": " + r.upstream + " " +
        r.url.replace(/^https?:\/\//, ""));
      a.addEventListener("click", () => reveal("#replicas tbody tr", (tr) =>
        tr.dataset.upstream === r.upstream && tr.dataset.url === r.url));
      frag.appendChild(a);
    }
    for (const n of caps) {
      const a = el("span", "a cap", "at cap: " + n);
      a.addEventListener("click", () => {
        $("filter").value = "";
        draw();
        reveal("#tenants tbody tr", (tr) => tr.dataset.tenant === n);
      });
      frag.appendChild(a);
    }
    alerts.replaceChildren(frag);
  }

  // An alert's row, scrolled into view and outlined for two seconds (the
  // tables are redrawn every second: the mark is kept by key).
  const flashed = new Map();
  function reveal(rows, match) {
    for (const tr of document.querySelectorAll(rows))
      if (match(tr)) {
        tr.scrollIntoView({ block: "center" });
        flashed.set(tr.dataset.tenant !== undefined ? "t:" + tr.dataset.tenant :
          "r:" + tr.dataset.upstream + " " + tr.dataset.url, Date.now() + 2000);
        tr.classList.add("flash");
      }
  }
  function flash(tr, key) {
    if ((flashed.get(key) || 0) > Date.now()) tr.classList.add("flash");
    else flashed.delete(key);
  }

  function drawHeader(st) {
    $("node").textContent = st.node;
    $("version").textContent = st.version;
    $("uptime").textContent = duration(st.uptime_seconds);
    $("generation").textContent = st.generation;
    $("workers").textContent = st.workers;
    $("cluster").textContent = st.cluster ? st.cluster.mode + ", " + st.cluster.nodes +
      " node" + (st.cluster.nodes === 1 ? "" : "s") + ", " + st.cluster.leases + " leases, Redis " +
      (st.cluster.master || "unknown") + (st.cluster.failovers ? " (" + st.cluster.failovers +
      " failover" + (st.cluster.failovers === 1 ? "" : "s") + ")" : "") : "off";
    document.title = "sluice " + st.node;
  }

  function draw() {
    if (!last) return;
    drawHeader(last);
    drawSummary(last);
    drawTenants(last);
    drawReplicas(last);
    drawModels(last);
  }

  function setLive() {
    const stale = failingSince !== 0;
    document.body.classList.remove("loading");
    document.body.classList.toggle("stale", stale);
    document.body.classList.toggle("live", !stale && last !== null);
    const banner = $("stale");
    if (stale) {
      banner.hidden = false;
      banner.textContent = "gateway not answering since " + hhmmss(failingSince) +
        (last ? " — data below is stale (last received " + hhmmss(lastOk) + "; " +
        failReason + ")" : " — no data yet (" + failReason + ")");
      $("live").textContent = "stale";
    } else {
      banner.hidden = true;
      banner.textContent = "";
      $("live").textContent = "live · " + hhmmss(lastOk);
    }
  }

  async function poll() {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), TIMEOUT_MS);
    try {
      const r = await fetch("/status.json", { cache: "no-store", signal: ctl.signal });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const st = await r.json();
      const now = Date.now();
      for (const t of st.tenants) remember("t:" + t.name, now, t.streams);
      for (const u of st.upstreams)
        for (const rep of u.replicas) remember("r:" + u.name + " " + rep.url, now, rep.streams);
      // A tenant or replica a reload removed: forgotten after five minutes.
      for (const [k, h] of history)
        if (h[h.length - 1][0] < now - KEEP_MS) history.delete(k);
      last = st;
      lastOk = now;
      failingSince = 0;
      draw();
    } catch (e) {
      if (!failingSince) failingSince = Date.now();
      failReason = e.name === "AbortError" ? "no answer in " + TIMEOUT_MS / 1000 + " s" :
        e instanceof TypeError ? "connection failed" : e.message;
    } finally {
      clearTimeout(timer);
      setLive();
      setTimeout(poll, POLL_MS);
    }
  }

  function sortable(id, which) {
    for (const th of document.querySelectorAll("#" + id + " thead th")) {
      th.addEventListener("click", () => {
        const s = sort[which];
        if (s.key === th.dataset.key) s.desc = !s.desc;
        else { s.key = th.dataset.key; s.desc = th.classList.contains("l") ? false : true; }
        for (const o of th.parentNode.children) o.classList.remove("sorted", "desc");
        th.classList.add("sorted");
        th.classList.toggle("desc", s.desc);
        draw();
      });
      if (th.dataset.key === sort[which].key) th.classList.add("sorted");
    }
  }

  sortable("tenants", "tenants");
  sortable("replicas", "replicas");
  sortable("models", "models");
  $("filter").addEventListener("input", draw);
  poll();
})();

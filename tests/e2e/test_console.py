# SPDX-License-Identifier: BSD-2-Clause
"""The operator's console (issue 26): GET / and GET /status.json on
admin_listen.

/status.json is pinned value by value against what the test did (streams
held on stub replicas, 429s, a killed replica, queued waiters, tokens), like
/metrics in test_metrics.py. The page itself is loaded in headless
Chromium (the system `chromium`, driven through playwright-core from
tests/js/console.mjs) and checked on what it shows: every tenant and
replica with the right numbers, a tenant at its cap marked, a killed
replica shown down within its probe time, and the "not answering" state
after the gateway stops. Screenshots go to the build directory
(console-*.png).
"""

import json
import os
import re
import select
import shutil
import signal
import subprocess
import time

import harness as h
from harness import ACME_KEY, BETA_KEY, UPSTREAM_KEY, Gateway, Stub

CT = {"Content-Type": "application/json"}
JS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "js")
CHROMIUM = os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium")
HEALTH = {"path": "/health", "interval": "100ms", "timeout": "80ms", "fall": 2, "rise": 2}


# ------------------------------------------------------------------ helpers

def console_config(replicas, workers=2, upstream=None, **over):
    """Tenants acme (max 2) and beta (max 5, tokens_per_minute 5000) on a
    pool `main` of `replicas` (URLs or replica mappings); `upstream`: more
    keys of the pool."""
    cfg = h.gateway_config(None, workers=workers, log_level="info",
                           admin_listen="%s:%d" % (h.HOST, h.free_port()))
    cfg["upstreams"] = {"main": {
        "replicas": [r if isinstance(r, dict) else {"url": r} for r in replicas],
        "api_key": UPSTREAM_KEY}}
    cfg["upstreams"]["main"].update(upstream or {})
    cfg["tenants"]["acme"]["max_streams"] = 2
    cfg["tenants"]["beta"]["max_streams"] = 5
    cfg["tenants"]["beta"]["tokens_per_minute"] = 5000
    return h.deep_merge(cfg, over)


def status(gw, timeout=5.0):
    """GET /status.json: (parsed document, AdminResponse)."""
    r = h.admin_request(h.admin_port(gw), "GET", "/status.json", timeout)
    assert r.status == 200, "GET /status.json: %d %r" % (r.status, r.body[:200])
    return json.loads(r.body), r


def tenant(doc, name):
    found = [t for t in doc["tenants"] if t["name"] == name]
    assert len(found) == 1, "tenant %s listed %d times: %r" % (name, len(found), doc)
    return found[0]


def replica(doc, url, upstream="main"):
    up = [u for u in doc["upstreams"] if u["name"] == upstream]
    assert len(up) == 1, doc
    found = [r for r in up[0]["replicas"] if r["url"] == url]
    assert len(found) == 1, "replica %s listed %d times: %r" % (url, len(found), doc)
    return found[0]


def wait_status(gw, pred, timeout=5.0, msg="status"):
    """Poll /status.json until pred(doc) is true; returns the document."""
    last = [None]

    def ok():
        last[0] = status(gw)[0]
        return last[0] if pred(last[0]) else None
    try:
        return h.wait_until(ok, timeout, interval=0.05, msg=msg)
    except AssertionError as e:
        raise AssertionError("%s; last /status.json: %s" % (e, json.dumps(last[0])))


def hang(gw, stubs, tag, n, key=ACME_KEY):
    """n requests the stubs never answer (X-Stub-Hang), each admitted and
    arrived at one of the stubs. Returns the clients."""
    base = sum(s.tag(tag)["inflight"] for s in stubs)
    held = []
    for i in range(n):
        c, _ = gw.open_stream(key=key, hang=True, tag=tag, read_head=False)
        held.append(c)
        h.wait_until(lambda: sum(s.tag(tag)["inflight"] for s in stubs) >= base + i + 1,
                     5, interval=0.01, msg="request %d of %d to reach a stub" % (i + 1, n))
    return held


def post(gw, key=ACME_KEY, hdrs=None, **stub_kw):
    hd = dict(CT)
    hd.update(h.stub_headers(**stub_kw))
    hd.update(hdrs or {})
    return gw.request("POST", "/v1/chat/completions", hd, h.stream_body(), key=key)


def quantile(cum, q):
    """Prometheus' histogram_quantile() over [(le, cumulative count)]."""
    rank = q * cum[-1][1]
    prev_le, prev_n = 0.0, 0
    for le, n in cum:
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_n) / (n - prev_n)
        prev_le, prev_n = le, n
    return prev_le


def close_all(clients):
    for c in clients:
        c.close()


def expected_doc_keys():
    return {"node", "version", "uptime_seconds", "generation", "workers", "tenants",
            "upstreams", "cluster"}


TENANT_KEYS = {"name", "streams", "max_streams", "waiting", "tokens_last_minute",
               "tokens_per_minute", "rejected_last_minute"}
REPLICA_KEYS = {"url", "up", "ejected", "busy", "streams", "max_streams", "queue",
                "kv_cache", "requests_last_minute", "errors_last_minute"}
MODEL_KEYS = {"name", "ttft_p50_ms", "ttft_p99_ms", "requests_last_minute"}


# ------------------------------------------------------------------ /status.json

def test_status_json_lists_every_tenant_and_replica_with_its_streams():
    with Stub("ra") as a, Stub("rb") as b:
        cfg = console_config([{"url": a.url, "max_streams": 3}, b.url])
        with Gateway(cfg) as gw:
            doc, r = status(gw)
            assert r.headers["content-type"] == "application/json", r.headers
            assert r.headers["cache-control"] == "no-store", r.headers
            assert set(doc) == expected_doc_keys(), sorted(doc)   # no models: section
            v = subprocess.run([h.sluice_bin(), "-V"], capture_output=True, text=True).stdout
            assert v.startswith("sluice %s " % doc["version"]), (v, doc["version"])
            assert doc["node"] == os.uname().nodename, doc["node"]
            assert doc["generation"] == 1 and doc["workers"] == 2, doc
            assert isinstance(doc["uptime_seconds"], int) and 0 <= doc["uptime_seconds"] < 60
            assert doc["cluster"] is None
            assert [t["name"] for t in doc["tenants"]] == ["acme", "beta"]
            for t in doc["tenants"]:
                assert set(t) == TENANT_KEYS, t
            assert tenant(doc, "acme") == {
                "name": "acme", "streams": 0, "max_streams": 2, "waiting": 0,
                "tokens_last_minute": 0, "tokens_per_minute": None,
                "rejected_last_minute": 0}
            assert tenant(doc, "beta")["tokens_per_minute"] == 5000
            assert [u["name"] for u in doc["upstreams"]] == ["main"]
            assert doc["upstreams"][0]["waiting"] == 0
            assert [x["url"] for x in doc["upstreams"][0]["replicas"]] == [a.url, b.url]
            assert replica(doc, a.url) == {
                "url": a.url, "up": True, "ejected": False, "busy": False, "streams": 0,
                "max_streams": 3, "queue": None, "kv_cache": None,
                "requests_last_minute": 0, "errors_last_minute": 0}
            assert replica(doc, b.url)["max_streams"] is None

            held = hang(gw, [a, b], "acme", 2) + hang(gw, [a, b], "beta", 3, key=BETA_KEY)
            doc = status(gw)[0]
            assert tenant(doc, "acme")["streams"] == 2
            assert tenant(doc, "beta")["streams"] == 3
            ra, rb = replica(doc, a.url), replica(doc, b.url)
            assert ra["streams"] == a.stats()["inflight"], (ra, a.stats())
            assert rb["streams"] == b.stats()["inflight"], (rb, b.stats())
            assert ra["streams"] + rb["streams"] == 5
            # A try counts once answered: none of these is yet.
            assert ra["requests_last_minute"] == rb["requests_last_minute"] == 0
            close_all(held)
            doc = wait_status(gw, lambda d: all(t["streams"] == 0 for t in d["tenants"]) and all(
                x["streams"] == 0 for x in d["upstreams"][0]["replicas"]),
                msg="every stream to end")
            assert tenant(doc, "acme")["rejected_last_minute"] == 0
            for _ in range(4):
                r = post(gw, events=1, interval=0, tag="done")
                assert r.status == 200 and r.complete, r.status
            doc = status(gw)[0]
            ra, rb = replica(doc, a.url), replica(doc, b.url)
            assert ra["requests_last_minute"] == a.tag("done")["requests"], (ra, a.stats())
            assert rb["requests_last_minute"] == b.tag("done")["requests"], (rb, b.stats())
            assert ra["errors_last_minute"] == rb["errors_last_minute"] == 0


def test_status_json_marks_the_429s_of_a_tenant_at_its_cap():
    with Stub() as s:
        with Gateway(console_config([s.url])) as gw:
            held = hang(gw, [s], "cap", 2)
            for _ in range(3):
                r = post(gw, events=1, interval=0)
                assert r.status == 429, r.status
            doc = status(gw)[0]
            acme = tenant(doc, "acme")
            assert (acme["streams"], acme["max_streams"]) == (2, 2), acme
            assert acme["rejected_last_minute"] == 3, acme
            assert tenant(doc, "beta")["rejected_last_minute"] == 0
            close_all(held)
            # The refused requests reached no replica.
            assert s.stats()["requests"] == 2


@h.skip_under("valgrind")
@h.timeout(150)
def test_status_json_last_minute_numbers_forget_what_is_older_than_a_minute():
    with Stub() as s:
        with Gateway(console_config([s.url])) as gw:
            held = hang(gw, [s], "cap", 2)
            assert post(gw, events=1, interval=0).status == 429
            close_all(held)
            wait_status(gw, lambda d: tenant(d, "acme")["streams"] == 0,
                        msg="the held streams to end")
            r = post(gw, events=1, interval=0, tag="done")
            assert r.status == 200 and r.complete
            t0 = time.monotonic()
            # The two held ones never had an answer: one try counted.
            doc = wait_status(gw, lambda d: replica(d, s.url)["requests_last_minute"] == 1,
                              msg="the try answered")
            assert tenant(doc, "acme")["rejected_last_minute"] == 1
            time.sleep(max(0.0, 45 - (time.monotonic() - t0)))
            doc = status(gw)[0]                  # well inside the minute
            assert tenant(doc, "acme")["rejected_last_minute"] == 1, doc
            assert replica(doc, s.url)["requests_last_minute"] == 1, doc
            doc = wait_status(gw, lambda d: tenant(d, "acme")["rejected_last_minute"] == 0,
                              timeout=30, msg="the 429 to leave the last minute")
            assert replica(doc, s.url)["requests_last_minute"] == 0, doc
            assert doc["uptime_seconds"] >= 60, doc


def test_status_json_counts_tokens_of_the_last_minute_against_the_budget():
    with Stub() as s:
        with Gateway(console_config([s.url])) as gw:
            for key in (ACME_KEY, BETA_KEY, BETA_KEY):
                r = post(gw, key=key, hdrs={"X-Stub-Usage": "10,5"}, events=5, interval=0)
                assert r.status == 200 and r.complete, r.status
            doc = wait_status(gw, lambda d: tenant(d, "beta")["tokens_last_minute"] == 30,
                              msg="beta's tokens")
            assert tenant(doc, "acme")["tokens_last_minute"] == 15
            assert tenant(doc, "acme")["tokens_per_minute"] is None
            assert tenant(doc, "beta")["tokens_per_minute"] == 5000


@h.skip_under("valgrind")
def test_status_json_shows_a_killed_replica_down_within_its_probe_time():
    with Stub("ra") as a, Stub("rb") as b:
        with Gateway(console_config([a.url, b.url], upstream={"health": HEALTH})) as gw:
            wait_status(gw, lambda d: replica(d, a.url)["up"] and replica(d, b.url)["up"],
                        msg="both replicas up")
            b.kill()
            t0 = time.monotonic()
            # interval x fall + timeout = 0.28 s; allow for a loaded machine.
            doc = wait_status(gw, lambda d: not replica(d, b.url)["up"], timeout=3,
                              msg="the killed replica to show down")
            assert time.monotonic() - t0 < 3
            assert replica(doc, a.url)["up"] is True
            assert replica(doc, b.url)["streams"] == 0


def test_status_json_counts_a_replicas_failed_tries():
    with Stub() as s:
        dead = "http://%s:%d" % (h.HOST, h.closed_port())
        with Gateway(console_config([dead, s.url], workers=1,
                                    upstream={"balance": "round_robin"})) as gw:
            for _ in range(4):
                r = post(gw, events=1, interval=0)
                assert r.status == 200 and r.complete, r.status
            doc = status(gw)[0]
            d, ok = replica(doc, dead), replica(doc, s.url)
            assert ok["requests_last_minute"] == 4 and ok["errors_last_minute"] == 0, ok
            # Every try of the dead one failed (connect), then moved on.
            assert d["requests_last_minute"] >= 1, d
            assert d["errors_last_minute"] == d["requests_last_minute"], d


def test_status_json_counts_queued_requests_per_tenant_and_pool():
    with Stub() as s:
        cfg = console_config([{"url": s.url, "max_streams": 1}],
                             upstream={"queue": {"max": 10, "timeout": "20s"}})
        with Gateway(cfg) as gw:
            held = hang(gw, [s], "q", 1, key=BETA_KEY)
            waiters = []
            for key in (ACME_KEY, ACME_KEY, BETA_KEY):
                c, _ = gw.open_stream(key=key, events=1, interval=0, read_head=False)
                waiters.append(c)
            # The pool's and the tenants' counts move a moment apart (each
            # one atomic, read without a lock): wait for all three.
            doc = wait_status(gw, lambda d: d["upstreams"][0]["waiting"] == 3 and
                              tenant(d, "acme")["waiting"] == 2 and
                              tenant(d, "beta")["waiting"] == 1,
                              msg="three waiters, two of acme, one of beta")
            assert tenant(doc, "acme")["waiting"] == 2
            assert tenant(doc, "beta")["waiting"] == 1
            assert tenant(doc, "acme")["streams"] == 2     # a waiter holds its slot
            close_all(held)
            for c in waiters:
                r = c.read_response(timeout=10)
                assert r.status == 200, r.status
                r.read_all(timeout=10)
            doc = wait_status(gw, lambda d: d["upstreams"][0]["waiting"] == 0,
                              msg="no waiter")
            assert tenant(doc, "acme")["waiting"] == 0
            close_all(waiters)


def test_status_json_gives_each_model_its_ttft_of_the_last_minute():
    with Stub() as s:
        cfg = console_config([s.url], models={
            "llama": {"targets": [{"upstream": "main", "model": "org/llama"}]},
            "idle": {"targets": [{"upstream": "main", "model": "org/idle"}]}})
        with Gateway(cfg) as gw:
            for _ in range(3):
                r = gw.request("POST", "/v1/chat/completions",
                               dict(CT, **h.stub_headers(events=2, interval=0, delay=120)),
                               h.stream_body(model="llama"))
                assert r.status == 200 and r.complete, r.status
            doc = wait_status(gw, lambda d: d["models"][0]["requests_last_minute"] == 3,
                              msg="three requests of llama")
            assert [m["name"] for m in doc["models"]] == ["llama", "idle"]
            llama, idle = doc["models"]
            assert set(llama) == MODEL_KEYS, llama
            # The same buckets as /metrics, read as histogram_quantile() does.
            text = h.admin_request(h.admin_port(gw), "GET", "/metrics").text
            cum = [(float(le.replace("+Inf", "inf")), int(n)) for le, n in re.findall(
                r'^sluice_time_to_first_token_seconds_bucket\{model="llama",le="([^"]+)"\} '
                r'(\d+)$', text, re.M)]
            assert cum[-1][1] == 3, cum
            for q, key in ((0.5, "ttft_p50_ms"), (0.99, "ttft_p99_ms")):
                assert llama[key] == round(quantile(cum, q) * 1000, 1), (key, llama, cum)
            # The first content came 120 ms and a little after the head.
            assert 100 <= llama["ttft_p50_ms"] <= llama["ttft_p99_ms"], llama
            assert idle == {"name": "idle", "ttft_p50_ms": None, "ttft_p99_ms": None,
                            "requests_last_minute": 0}


def test_status_json_lists_a_hundred_tenants_and_twenty_replicas_in_order():
    with Stub() as s:
        # The tenants use `live` (the stub); `spare` has 20 replicas that
        # take no traffic here.
        cfg = console_config([s.url])
        cfg["upstreams"] = {"live": {"url": s.url}, "spare": {"replicas": [
            {"url": "http://%s:%d" % (h.HOST, 1 + i)} for i in range(20)]}}
        cfg["tenants"] = {"t%03d" % i: {"keys": ["sk-t%03d" % i], "max_streams": i + 1,
                                        "upstream": "live"} for i in range(100)}
        with Gateway(cfg) as gw:
            doc = status(gw)[0]
            assert [t["name"] for t in doc["tenants"]] == ["t%03d" % i for i in range(100)]
            assert [t["max_streams"] for t in doc["tenants"]] == list(range(1, 101))
            assert [u["name"] for u in doc["upstreams"]] == ["live", "spare"]
            assert [x["url"] for x in doc["upstreams"][1]["replicas"]] == [
                x["url"] for x in cfg["upstreams"]["spare"]["replicas"]]
            held = hang(gw, [s], "t", 1, key="sk-t042")
            doc = status(gw)[0]
            assert [t["streams"] for t in doc["tenants"]] == [int(i == 42) for i in range(100)]
            assert replica(doc, s.url, "live")["streams"] == 1
            assert [x["streams"] for x in doc["upstreams"][1]["replicas"]] == [0] * 20
            close_all(held)


def test_console_page_is_self_contained_with_a_strict_policy_and_no_key():
    with Stub() as s:
        cfg = console_config([s.url])
        with Gateway(cfg) as gw:
            port = h.admin_port(gw)
            page = h.admin_request(port, "GET", "/")
            assert page.status == 200
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            css = h.admin_request(port, "GET", "/console.css")
            js = h.admin_request(port, "GET", "/console.js")
            assert css.status == 200 and css.headers["content-type"] == "text/css; charset=utf-8"
            assert js.status == 200 and \
                js.headers["content-type"] == "text/javascript; charset=utf-8"
            doc = h.admin_request(port, "GET", "/status.json")
            for r in (page, css, js, doc, h.admin_request(port, "GET", "/metrics")):
                assert r.headers["content-security-policy"] == "default-src 'self'", r.headers
                assert r.headers["x-content-type-options"] == "nosniff", r.headers
            html = page.text
            # Nothing inline (the policy would refuse it), nothing from elsewhere.
            assert sorted(re.findall(r'\b(?:src|href)="([^"]*)"', html)) == [
                "/console.css", "/console.js", "/favicon.svg"], html
            assert "<style" not in html and "style=" not in html
            assert re.findall(r"<script\b[^>]*>([^<]*)</script>", html) == [""]
            assert not re.search(r"\son[a-z]+=", html), "an inline handler"
            for body in (css.text, js.text):
                assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}/(?!2000/svg)",
                                     body), "a URL elsewhere"
                assert "@import" not in body and "url(" not in body
            assert re.findall(r"fetch\(([^,)]*)", js.text) == ['"/status.json"']
            # No key anywhere: the tenants', nor the upstream's.
            for r in (page, css, js, doc):
                for key in (ACME_KEY, h.ACME_KEY2, BETA_KEY, UPSTREAM_KEY, "sk-"):
                    assert key.encode() not in r.body, (key, r.body[:200])
            head = h.admin_request(port, "HEAD", "/")
            assert head.status == 200 and head.body == b""
            assert int(head.headers["content-length"]) == len(page.body)
            assert h.admin_request(port, "POST", "/status.json").status == 405
            assert h.admin_request(port, "GET", "/console.jsx").status == 404


# ------------------------------------------------------------------ the page in Chromium

class Browser:
    """tests/js/console.mjs: headless Chromium through playwright-core."""

    def __init__(self):
        node = shutil.which("node")
        assert node, "node is not installed (./quickstart build installs it)"
        self.proc = subprocess.Popen([node, os.path.join(JS, "console.mjs"), CHROMIUM],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(h.tmpfile("browser", ".stderr"), "wb"),
                                     cwd=JS)
        h._register(self.proc.pid)
        self.buf = b""
        hello = self._read(30)
        assert hello.get("ok"), hello

    def _read(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the browser script said nothing in %.0fs" % timeout)
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if r:
                d = os.read(self.proc.stdout.fileno(), 65536)
                if not d:
                    raise AssertionError("the browser script exited (%s)" % self.proc.wait())
                self.buf += d
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def do(self, timeout=30, **cmd):
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        res = self._read(timeout)
        assert res.get("ok"), "browser %s: %s" % (cmd.get("op"), res.get("error"))
        return res

    def snapshot(self):
        return self.do(op="snapshot")

    def wait(self, pred, timeout=5.0, msg="page"):
        last = [None]

        def ok():
            last[0] = self.snapshot()["snapshot"]
            return last[0] if pred(last[0]) else None
        try:
            return h.wait_until(ok, timeout, interval=0.1, msg=msg)
        except AssertionError as e:
            raise AssertionError("%s; the page shows %s" % (e, json.dumps(last[0])))

    def close(self):
        if self.proc.poll() is None:
            try:
                self.do(op="quit", timeout=10)
            except AssertionError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                h.kill_pid(self.proc.pid)
        h._unregister(self.proc.pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def browser_missing():
    """Why the browser test cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return "%s is missing (apt-get install chromium; ./quickstart build)" % CHROMIUM
    if not os.path.isdir(os.path.join(JS, "node_modules", "playwright-core")):
        return "tests/js/node_modules/playwright-core is missing (./quickstart build)"
    if not shutil.which("node"):
        return "node is missing (./quickstart build)"
    return None


def build_dir():
    return os.path.dirname(h.sluice_bin())


def row(snap, name):
    found = [t for t in snap["tenants"] if t["name"] == name]
    return found[0] if len(found) == 1 else None


def rrow(snap, url):
    found = [r for r in snap["replicas"] if r["url"] == url]
    return found[0] if len(found) == 1 else None


@h.skip_under("valgrind")
@h.timeout(120)
def test_console_in_chromium_shows_streams_caps_a_down_replica_and_a_stopped_gateway():
    why = browser_missing()
    if why:
        h.skip(why)
    with Stub("ra") as a, Stub("rb") as b:
        cfg = console_config([{"url": a.url, "max_streams": 4}, b.url],
                             upstream={"health": HEALTH})
        cfg["tenants"]["gamma"] = {"keys": ["sk-gamma-1"], "max_streams": 10,
                                   "upstream": "main"}
        gw = Gateway(cfg)
        gw.start()
        held = []
        try:
            with Browser() as br:
                url = "http://%s:%d/" % (h.HOST, h.admin_port(gw))
                opened = br.do(op="open", url=url, width=1366, height=768)
                assert opened["status"] == 200
                assert opened["headers"]["content-security-policy"] == "default-src 'self'"
                snap = br.wait(lambda s: len(s["tenants"]) == 3 and len(s["replicas"]) == 2,
                               msg="the page to list the tenants and replicas")
                assert [t["name"] for t in snap["tenants"]] == ["acme", "beta", "gamma"]
                assert {r["url"] for r in snap["replicas"]} == {a.url, b.url}
                assert snap["stale"] is None and "live" in snap["bodyClasses"]
                assert snap["modelsHidden"] is True

                held = hang(gw, [a, b], "acme", 2) + \
                    hang(gw, [a, b], "beta", 3, key=BETA_KEY)
                sa, sb = a.stats()["inflight"], b.stats()["inflight"]
                snap = br.wait(lambda s: row(s, "acme")["streams"] == "2" and
                               row(s, "beta")["streams"] == "3" and
                               rrow(s, a.url)["streams"] == str(sa) and
                               rrow(s, b.url)["streams"] == str(sb),
                               msg="the page to show the held streams")
                acme, beta, gamma = (row(snap, n) for n in ("acme", "beta", "gamma"))
                assert "at-cap" in acme["classes"] and acme["badge"] == "at cap", acme
                assert acme["max"] == "/ 2", acme
                assert "at-cap" not in beta["classes"] and beta["badge"] is None, beta
                assert beta["tokens"] == "0" and gamma["streams"] == "0"
                assert rrow(snap, a.url)["max"] == "/ 4"
                assert rrow(snap, b.url)["max"] == "/ ∞"
                assert snap["summary"]["cap"] == "1 / 3", snap["summary"]
                assert snap["summary"]["streams"] == "5", snap["summary"]
                assert all(r["state"] == "up" for r in snap["replicas"]), snap["replicas"]
                assert acme["sparkPoints"] >= 2, acme     # a line of samples

                # A refused request shows in the 429 column.
                assert post(gw, events=1, interval=0).status == 429
                br.wait(lambda s: row(s, "acme")["rejected"] == "1",
                        msg="acme's 429 on the page")

                # Sort by streams (a click on the head), most first; again: least first.
                br.do(op="click", selector="#tenants th[data-key=streams]")
                snap = br.snapshot()["snapshot"]
                assert [t["name"] for t in snap["tenants"]] == ["beta", "acme", "gamma"]
                assert "tenants:streams:desc" in snap["sorted"]
                br.do(op="click", selector="#tenants th[data-key=streams]")
                snap = br.snapshot()["snapshot"]
                assert [t["name"] for t in snap["tenants"]] == ["gamma", "acme", "beta"]

                # The alert of a tenant at its cap leads to its row.
                br.do(op="click", selector="#alerts .a.cap")
                snap = br.snapshot()["snapshot"]
                assert "flash" in row(snap, "acme")["classes"], row(snap, "acme")
                br.do(op="screenshot", path=os.path.join(build_dir(), "console-live.png"))

                # A replica killed shows down within its probe time.
                close_all(held)
                held = []
                b.kill()
                t0 = time.monotonic()
                snap = br.wait(lambda s: rrow(s, b.url)["state"] == "down", timeout=4,
                               msg="the killed replica to show down")
                assert time.monotonic() - t0 < 4
                assert "down" in rrow(snap, b.url)["classes"]
                assert rrow(snap, a.url)["state"] == "up"
                assert snap["summary"]["down"] == "1 / 2"
                br.do(op="screenshot", path=os.path.join(build_dir(), "console-down.png"))
                # No script error and no policy violation so far.
                problems = br.snapshot()["problems"]
                assert problems == [], problems

                # The gateway stops: the page says so, and keeps what it had.
                assert gw.stop() == 0
                stopped = time.localtime()
                snap = br.wait(lambda s: s["stale"] is not None, timeout=6,
                               msg="the page to say the gateway stopped answering")
                m = re.match(r"^gateway not answering since (\d\d):(\d\d):(\d\d) "
                             r"— data below is stale \(last received \d\d:\d\d:\d\d; "
                             r"connection failed\)$", snap["stale"])
                assert m, snap["stale"]
                since = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
                at = stopped.tm_hour * 3600 + stopped.tm_min * 60 + stopped.tm_sec
                assert 0 <= (since - at) % 86400 <= 5, (snap["stale"], at)
                assert "stale" in snap["bodyClasses"] and "live" not in snap["bodyClasses"]
                assert len(snap["tenants"]) == 3 and len(snap["replicas"]) == 2
                br.do(op="screenshot", path=os.path.join(build_dir(), "console-stale.png"))
        finally:
            close_all(held)
            if gw.running():
                gw.kill()


FIRMS = ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell",
         "cyberdyne", "soylent", "aperture", "massive", "oscorp", "vandelay", "wonka",
         "gringotts", "monarch", "dunder", "pied-piper", "nakatomi", "virtucon", "duff",
         "krusty", "sirius", "blue-sun"]


@h.skip_under("valgrind")
@h.timeout(180)
def test_console_in_chromium_fits_fifty_tenants_and_twenty_replicas_on_a_laptop_screen():
    """A fleet of 20 replicas in three pools (one replica dead) and 50
    tenants with changing load: every row listed, nothing wider than a
    1366x768 screen, the replicas' table whole without scrolling. The
    screenshot (build/console-50x20.png) is the one in docs/console.png."""
    why = browser_missing()
    if why:
        h.skip(why)
    import random
    rng = random.Random(26)
    stubs = []
    try:
        for i in range(8):
            stubs.append(Stub("r%d" % i, args=("--prefix-cache", 64)).start())
        dead = "http://%s:%d" % (h.HOST, h.closed_port())
        health = {"path": "/health", "interval": "500ms", "timeout": "400ms", "fall": 2,
                  "rise": 2}
        names = ["%s-%s" % (f, e) for e in ("prod", "batch") for f in FIRMS]
        caps = {n: rng.choice((4, 8, 8, 16, 16, 32, 64)) for n in names}
        for n in names[:4]:
            caps[n] = 4
        cfg = {
            "listen": "%s:%d" % (h.HOST, h.free_port()),
            "admin_listen": "%s:%d" % (h.HOST, h.free_port()),
            "workers": 2, "drain_timeout": "2s", "log_level": "warn",
            "upstreams": {
                "llama-70b": {"replicas": [{"url": s.url, "max_streams": 12}
                                           for s in stubs], "health": health,
                              "load_metrics": {"interval": "500ms"}},
                "qwen-32b": {"replicas": [{"url": s.url, "max_streams": 3} for s in stubs],
                             "health": health, "queue": {"max": 100, "timeout": "60s"}},
                "embed": {"replicas": [{"url": s.url} for s in stubs[:3]] + [{"url": dead}],
                          "health": health},
            },
            "models": {
                "llama-3.3-70b": {"targets": [{"upstream": "llama-70b", "model": "llama"}]},
                "qwen3-32b": {"targets": [{"upstream": "qwen-32b", "model": "qwen"}]},
                "bge-m3": {"targets": [{"upstream": "embed", "model": "bge"}]},
            },
            "tenants": {n: {"keys": ["sk-%s" % n], "max_streams": caps[n],
                            "tokens_per_minute": rng.choice((0, 0, 200000, 1000000))}
                        for n in names},
        }
        models = ["llama-3.3-70b"] * 3 + ["qwen3-32b"] * 2 + ["bge-m3"]
        with Gateway(cfg) as gw, Browser() as br:
            br.do(op="open", url="http://%s:%d/" % (h.HOST, h.admin_port(gw)),
                  width=1366, height=768)
            br.wait(lambda s: len(s["tenants"]) == 50 and len(s["replicas"]) == 20,
                    msg="50 tenants and 20 replicas listed")
            held = []

            def hold(name, model):
                hd = {"X-Stub-Hang": "1"}
                c, _ = gw.open_stream(key="sk-" + name, read_head=False,
                                      body=h.stream_body(model=model), headers=hd)
                held.append(c)

            # Load that changes: streams come and go, some finish with
            # usage (tokens) after a first-token delay (TTFT), some are 429s.
            busy = names[:30]
            for rnd in range(16):
                for _ in range(rng.randint(6, 14) if rnd < 10 else rng.randint(2, 6)):
                    hold(rng.choice(busy), rng.choice(models))
                rng.shuffle(held)
                k = rng.randint(1, 5) if rnd < 10 else rng.randint(3, 9)
                close_all(held[:k])
                del held[:k]
                for _ in range(3):
                    n = rng.choice(busy)
                    gw.request("POST", "/v1/chat/completions", dict(CT, **{
                        "X-Stub-Delay-Ms": str(rng.randint(40, 350)), "X-Stub-Events": "20",
                        "X-Stub-Interval-Ms": "0", "X-Stub-Usage": "%d,20" % rng.randint(50, 900)}),
                        h.stream_body(model=rng.choice(models)), key="sk-" + n)
                time.sleep(0.6)
            for n in names[:4]:                  # four tenants at their cap of 4
                for _ in range(6):
                    hold(n, "llama-3.3-70b")
            for _ in range(30):                  # qwen's pool full: some wait
                hold(rng.choice(names[10:40]), "qwen3-32b")
            snap = br.wait(lambda s: sum("at-cap" in t["classes"] for t in s["tenants"]) >= 4
                           and rrow(s, dead)["state"] == "down", timeout=10,
                           msg="four tenants at cap and the dead replica down")
            time.sleep(1.2)
            br.do(op="screenshot", path=os.path.join(build_dir(), "console-50x20.png"))
            assert len(snap["tenants"]) == 50 and len(snap["replicas"]) == 20
            for n in names[:4]:
                t = row(snap, n)
                assert "at-cap" in t["classes"] and t["streams"] == "4", t
            lay = snap["layout"]
            assert lay["scrollWidth"] <= lay["width"], lay          # no sideways scroll
            for p in ("tenantsPanel", "replicasPanel"):
                assert lay[p]["scrollWidth"] <= lay[p]["width"], lay
            assert lay["replicasPanel"]["table"] <= lay["replicasPanel"]["visible"], lay
            assert lay["tenantsPanel"]["rowHeight"] >= 18, lay      # readable rows
            problems = br.snapshot()["problems"]
            assert problems == [], problems
            close_all(held)
    finally:
        for s in stubs:
            s.kill()

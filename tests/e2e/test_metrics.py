# SPDX-License-Identifier: BSD-2-Clause
"""The admin listener: /healthz, and /metrics values that match exactly what
the test did (Prometheus text format, counters that never go backwards)."""

import os
import selectors
import signal
import socket
import threading
import time

import harness as h
from harness import ACME_KEY, ACME_KEY2, BETA_KEY, UPSTREAM_KEY, Gateway, Stub, expected_events

FAMILIES = {
    "sluice_tenant_streams": "gauge",
    "sluice_tenant_max_streams": "gauge",
    "sluice_requests_total": "counter",
    "sluice_rejected_total": "counter",
    "sluice_upstream_paused_streams": "gauge",
    "sluice_stream_buffer_bytes": "gauge",
    "sluice_upstream_errors_total": "counter",
    "sluice_workers": "gauge",
    "sluice_reloads_total": "counter",
    "sluice_ttfb_seconds": "histogram",
    "sluice_stream_duration_seconds": "histogram",
    "sluice_connections": "gauge",
    "sluice_upstream_streams": "gauge",
    "sluice_admitted_total": "counter",
    "sluice_upstream_pauses_total": "counter",
    "sluice_bytes_out_total": "counter",
}
UPSTREAM_ERROR_KINDS = ("connect", "timeout", "reset", "bad_response", "idle")


def _admin_gw(stub, **kw):
    return Gateway(stub=stub, admin_listen="%s:%d" % (h.HOST, h.free_port()), **kw)


def _stream_ok(gw, key=ACME_KEY, events=3, tag=None):
    r = gw.request("POST", "/v1/chat/completions",
                   dict(h.stub_headers(events=events, interval=0, tag=tag),
                        **{"Content-Type": "application/json"}), h.stream_body(), key=key)
    assert r.status == 200 and r.complete, (r.status, bytes(r.data[:200]))
    assert bytes(r.data) == expected_events(events)
    return r


def _status(gw, key, **stub_kw):
    r = gw.request("POST", "/v1/chat/completions",
                   dict(h.stub_headers(**stub_kw), **{"Content-Type": "application/json"}),
                   h.stream_body(), key=key)
    return r.status


def test_healthz_is_ok_while_running_and_503_while_draining():
    with Stub() as stub, _admin_gw(stub, drain_timeout="10s") as gw:
        port = h.admin_port(gw)
        r = h.admin_request(port, "GET", "/healthz")
        assert r.status == 200, r.status
        assert r.body == b"ok\n", r.body
        c, s = gw.open_stream(events=25, interval=100, timeout=15, tag="drain")
        assert s.status == 200
        s.read_events(1, timeout=5)
        os.kill(gw.pid, signal.SIGTERM)
        r = h.wait_until(lambda: (lambda x: x if x.status == 503 else None)(
            h.admin_request(port, "GET", "/healthz")), 2, interval=0.02,
            msg="/healthz to answer 503 while draining")
        assert r.body == b"draining\n", r.body
        body = s.read_all(timeout=15)
        assert s.complete and body == expected_events(25), "drained stream cut or differs"
        assert gw.wait_exit(8) == 0


def test_metrics_is_valid_prometheus_text_with_every_documented_family():
    with Stub() as stub, _admin_gw(stub) as gw:
        _stream_ok(gw)
        assert _status(gw, "sk-nope", events=1) == 401
        r = h.admin_request(h.admin_port(gw), "GET", "/metrics")
        assert r.status == 200, r.status
        ct = r.headers.get("content-type", "")
        assert ct.startswith("text/plain") and "version=0.0.4" in ct, ct
        m = h.Metrics(r.text)      # strict: every line parses, HELP/TYPE first
        for name, kind in FAMILIES.items():
            assert m.types.get(name) == kind, "family %s: TYPE %r, want %s" % (
                name, m.types.get(name), kind)
            assert m.helps.get(name), "family %s has no HELP text" % name
        for fam in m.types:
            assert fam.startswith("sluice_"), "unexpected family %s" % fam
        # Histograms: cumulative buckets ending in +Inf == _count.
        for hist in ("sluice_ttfb_seconds", "sluice_stream_duration_seconds"):
            buckets = sorted(((float(dict(lb)["le"]), v) for lb, v in
                              m.series(hist + "_bucket").items()), key=lambda x: x[0])
            assert len(buckets) >= 2 and buckets[-1][0] == float("inf"), buckets
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), "%s buckets not cumulative: %r" % (hist, buckets)
            assert buckets[-1][1] == m.get(hist + "_count") == 1, (hist, buckets[-1],
                                                                  m.get(hist + "_count"))
            assert m.get(hist + "_sum") is not None and m.get(hist + "_sum") > 0
            assert buckets[0][0] == 0.005 and buckets[-2][0] == 600, \
                "buckets from 5 ms to 600 s documented, got %r" % [b for b, _ in buckets]
        for kind in UPSTREAM_ERROR_KINDS:
            assert m.get("sluice_upstream_errors_total", upstream="main", kind=kind) == 0, kind
        assert m.get("sluice_reloads_total", result="ok") == 0
        assert m.get("sluice_reloads_total", result="failed") == 0
        # HEAD gets the head only.
        hr = h.admin_request(h.admin_port(gw), "HEAD", "/metrics")
        assert hr.status == 200 and hr.body == b"", (hr.status, hr.body[:100])


def test_metrics_values_match_a_known_sequence_of_requests():
    with Stub() as stub, _admin_gw(stub, tenants={"acme": {"max_streams": 2},
                                                  "beta": {"max_streams": 5}}) as gw:
        m = h.scrape(gw)
        assert m.get("sluice_tenant_max_streams", tenant="acme") == 2
        assert m.get("sluice_tenant_max_streams", tenant="beta") == 5
        assert m.get("sluice_tenant_streams", tenant="acme") == 0
        # 3 relayed streams for acme, 1 for beta.
        for _ in range(3):
            _stream_ok(gw, ACME_KEY)
        _stream_ok(gw, BETA_KEY)
        # 2 bad keys, 1 missing key: tenant "-".
        assert _status(gw, "sk-wrong", events=1) == 401
        assert _status(gw, "sk-wrong-2", events=1) == 401
        assert _status(gw, None, events=1) == 401
        # Hold acme at its limit with hung upstream requests.
        held = gw.hold_hung(stub, "hung", 2)
        h.wait_metric(gw, "sluice_tenant_streams", 2, tenant="acme")
        for _ in range(4):
            assert _status(gw, ACME_KEY, events=1) == 429
        m = h.wait_metric(gw, "sluice_rejected_total", 4, tenant="acme", reason="max_streams")
        assert m.get("sluice_tenant_streams", tenant="acme") == 2
        assert m.get("sluice_tenant_streams", tenant="beta") == 0
        for c in held:
            c.close()
        m = h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme", timeout=3)
        # The held requests ended without a response: counted as 499.
        m = h.wait_metric(gw, "sluice_requests_total", 2, tenant="acme", code="499")
        want = {
            ("acme", "200"): 3, ("beta", "200"): 1, ("-", "401"): 3,
            ("acme", "429"): 4, ("acme", "499"): 2,
        }
        got = {(dict(lb)["tenant"], dict(lb)["code"]): v
               for lb, v in m.series("sluice_requests_total").items() if v != 0}
        assert got == want, "sluice_requests_total %r, want %r" % (got, want)
        assert m.get("sluice_rejected_total", tenant="acme", reason="max_streams") == 4
        assert m.get("sluice_rejected_total", tenant="beta", reason="max_streams") == 0
        assert m.get("sluice_admitted_total") == 6, m.get("sluice_admitted_total")
        assert m.get("sluice_ttfb_seconds_count") == 4, m.get("sluice_ttfb_seconds_count")
        assert m.get("sluice_stream_duration_seconds_count") == 4
        assert m.get("sluice_tenant_streams", tenant="acme") == 0
        assert m.get("sluice_tenant_streams", tenant="beta") == 0
        assert m.get("sluice_bytes_out_total") > 4 * len(expected_events(3))


def test_upstream_errors_are_counted_by_upstream_and_kind():
    with Stub() as stub:
        dead = "http://%s:%d" % (h.HOST, h.closed_port())
        ups = {"main": None, "u": {"url": dead}, "s": {"url": stub.url}}
        with _admin_gw(stub, upstreams=ups, timeouts={"upstream_first_byte": "1s"},
                       tenants={"acme": {"upstream": "u"}, "beta": {"upstream": "s"}}) as gw:
            r = gw.request("POST", "/v1/chat/completions", {"Content-Type": "application/json"},
                           h.stream_body(), key=ACME_KEY)
            h.assert_error(r, 502, "upstream_unreachable", read=False)
            m = h.wait_metric(gw, "sluice_upstream_errors_total", 1, upstream="u", kind="connect")
            c, r = gw.open_stream(key=BETA_KEY, hang=True, tag="hang", timeout=10)
            h.assert_error(r, 504, "upstream_timeout")
            c.close()
            h.wait_metric(gw, "sluice_upstream_errors_total", 1, upstream="s", kind="timeout")
            # The request is counted when its answer is out, a moment later.
            m = h.wait_metric(gw, "sluice_requests_total", 1, tenant="beta", code="504")
            got = {(dict(lb)["upstream"], dict(lb)["kind"]): v
                   for lb, v in m.series("sluice_upstream_errors_total").items()}
            want = {(u, k): 0 for u in ("u", "s") for k in UPSTREAM_ERROR_KINDS}
            want[("u", "connect")] = 1
            want[("s", "timeout")] = 1
            assert got == want, "sluice_upstream_errors_total %r, want %r" % (got, want)
            assert m.get("sluice_requests_total", tenant="acme", code="502") == 1
            assert m.get("sluice_requests_total", tenant="beta", code="504") == 1
            # Neither was relayed: the latency histograms saw nothing.
            assert m.get("sluice_ttfb_seconds_count") == 0
            assert m.get("sluice_stream_duration_seconds_count") == 0


def test_workers_gauge_equals_configured_worker_count():
    with Stub() as stub, _admin_gw(stub, workers=3) as gw:
        assert len(gw.worker_pids()) == 3
        assert h.scrape(gw).get("sluice_workers") == 3
    with Stub() as stub, _admin_gw(stub, workers=1) as gw:
        assert h.scrape(gw).get("sluice_workers") == 1


def _paused_gauges(kind):
    """The pause gauges for a slow client on the relay path `kind`
    (harness.RELAY_PATHS)."""
    body, extra = h.relay_path_request(kind)
    with Stub() as stub, _admin_gw(stub, stream_buffer="64KiB",
                                   timeouts={"client_stall": "60s"},
                                   **h.relay_path_config(kind)) as gw:
        m = h.scrape(gw)
        assert m.get("sluice_upstream_paused_streams") == 0
        assert m.get("sluice_stream_buffer_bytes") == 0
        c, r = gw.open_stream(rcvbuf=4096, timeout=30, body=body, headers=extra, events=40000,
                              size=1000, interval=0, tag="slow")
        assert r.status == 200
        # Gauges are published once a second: poll, bounded.
        m = h.wait_until(lambda: (lambda x: x if x.get("sluice_upstream_paused_streams") >= 1
                                  else None)(h.scrape(gw)), 20, interval=0.2,
                         msg="sluice_upstream_paused_streams >= 1")
        assert m.get("sluice_upstream_paused_streams") == 1, m.get("sluice_upstream_paused_streams")
        buffered = m.get("sluice_stream_buffer_bytes")
        assert 0 < buffered <= 64 * 1024 + 64, "sluice_stream_buffer_bytes %r" % buffered
        assert m.get("sluice_upstream_pauses_total") >= 1
        assert m.get("sluice_upstream_streams") == 1
        assert m.get("sluice_tenant_streams", tenant="acme") == 1
        c.close()
        h.wait_until(lambda: stub.tag("slow")["aborted_by_client"] == 1, 5,
                     msg="the upstream to be closed")
        h.wait_until(lambda: (lambda x: x if x.get("sluice_upstream_paused_streams") == 0
                              and x.get("sluice_stream_buffer_bytes") == 0 else None)(
            h.scrape(gw)), 3, interval=0.1, msg="paused/buffer gauges back to 0")
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")


@h.timeout(90)
def test_paused_streams_and_buffer_bytes_while_a_slow_client_stalls_a_fast_stream():
    _paused_gauges("injected")


@h.timeout(120)
def test_paused_streams_and_buffer_bytes_on_every_plain_relay_path():
    # Issue 22: the plain path (no usage scanner holding events) pauses on
    # its own; a lost pause there was caught by one indirect test only.
    for kind in h.RELAY_PATHS[1:]:
        _paused_gauges(kind)


@h.skip_under("valgrind")   # "under 250 ms" is a time bound valgrind breaks
def test_latency_histograms_count_every_relayed_response():
    with Stub() as stub, _admin_gw(stub) as gw:
        n = 0
        for key in (ACME_KEY, ACME_KEY2, BETA_KEY):
            for _ in range(3):
                _stream_ok(gw, key)
                n += 1
        # A relayed upstream error status counts as relayed too.
        assert _status(gw, ACME_KEY, events=1, status=500) == 500
        n += 1
        # Not relayed: no histogram sample.
        assert _status(gw, "sk-unknown", events=1) == 401
        # A relayed stream with a 300 ms head delay lands in the ttfb sum.
        r = gw.request("POST", "/v1/chat/completions",
                       dict(h.stub_headers(events=2, interval=0, delay=300),
                            **{"Content-Type": "application/json"}), h.stream_body())
        assert r.status == 200 and r.complete
        n += 1
        m = h.wait_metric(gw, "sluice_stream_duration_seconds_count", n)
        assert m.get("sluice_ttfb_seconds_count") == n, (m.get("sluice_ttfb_seconds_count"), n)
        assert m.get("sluice_ttfb_seconds_sum") >= 0.3, m.get("sluice_ttfb_seconds_sum")
        assert m.get("sluice_stream_duration_seconds_sum") >= m.get("sluice_ttfb_seconds_sum")
        assert m.get("sluice_ttfb_seconds_bucket", le="0.25") == n - 1, \
            "only the delayed response is slower than 250 ms: %r" % m.series(
                "sluice_ttfb_seconds_bucket")


def test_counters_survive_kill_9_of_a_worker_and_never_go_backwards():
    with Stub() as stub, _admin_gw(stub, allow_worker_changes=True) as gw:
        for _ in range(6):
            _stream_ok(gw, ACME_KEY)
        assert _status(gw, "sk-wrong", events=1) == 401
        before = h.wait_metric(gw, "sluice_requests_total", 6, tenant="acme", code="200")
        before = h.wait_metric(gw, "sluice_requests_total", 1, tenant="-", code="401")
        base = before.counters()
        assert base[("sluice_ttfb_seconds_count", ())] == 6
        workers = gw.worker_pids()
        for w in workers:
            h.kill_pid(w, signal.SIGKILL)
        # Scrape all along while the master reaps and replaces them.
        prev = base
        deadline = time.monotonic() + 8
        scrapes = 0
        while True:
            m = h.scrape(gw)
            scrapes += 1
            cur = m.counters()
            for k, v in prev.items():
                assert k in cur, "counter %r disappeared after kill -9" % (k,)
                assert cur[k] >= v, "counter %r went backwards: %r -> %r" % (k, v, cur[k])
            prev = cur
            now = gw.worker_pids()
            if len(now) == 2 and not set(now) & set(workers) \
                    and m.get("sluice_workers") == 2:
                break
            assert time.monotonic() < deadline, "workers not replaced: %r" % now
            time.sleep(0.05)
        m = h.scrape(gw)
        assert m.get("sluice_requests_total", tenant="acme", code="200") == 6
        assert m.get("sluice_requests_total", tenant="-", code="401") == 1
        assert m.get("sluice_ttfb_seconds_count") == 6
        assert m.get("sluice_admitted_total") == 6
        # And they go on counting from there.
        _stream_ok(gw, ACME_KEY)
        m = h.wait_metric(gw, "sluice_requests_total", 7, tenant="acme", code="200")
        assert m.get("sluice_stream_duration_seconds_count") == 7
        assert scrapes >= 2


def test_unknown_admin_path_is_404_and_other_methods_405():
    with Stub() as stub, _admin_gw(stub) as gw:
        port = h.admin_port(gw)
        for path in ("/index.html", "/metricsx", "/v1/chat/completions", "/healthz/x",
                     "/status.jsonx", "/console.js/x"):
            r = h.admin_request(port, "GET", path)
            assert r.status == 404, "GET %s: %d" % (path, r.status)
        r = h.admin_request(port, "POST", "/metrics")
        assert r.status == 405, r.status
        # Query strings are ignored on the known paths.
        r = h.admin_request(port, "GET", "/healthz?x=1")
        assert r.status == 200 and r.body == b"ok\n", (r.status, r.body)


def test_admin_listener_exposes_no_api_key():
    with Stub() as stub, _admin_gw(stub) as gw:
        _stream_ok(gw, ACME_KEY)
        _stream_ok(gw, ACME_KEY2)
        _stream_ok(gw, BETA_KEY)
        assert _status(gw, "sk-presented-but-unknown", events=1) == 401
        h.wait_metric(gw, "sluice_requests_total", 1, tenant="-", code="401")
        port = h.admin_port(gw)
        secrets = [ACME_KEY, ACME_KEY2, BETA_KEY, UPSTREAM_KEY, "sk-presented-but-unknown"]
        for method, path in (("GET", "/metrics"), ("GET", "/healthz"), ("HEAD", "/metrics"),
                             ("GET", "/nope"), ("POST", "/metrics"), ("GET", "/metrics?x"),
                             ("GET", "/"), ("GET", "/status.json"), ("GET", "/console.js")):
            raw = h.admin_request(port, method, path).raw
            for s in secrets:
                assert s.encode() not in raw, "%s %s exposes %r" % (method, path, s)
        # Tenant names are there, keys are not.
        assert 'tenant="acme"' in h.scrape(gw).text


def test_client_port_does_not_serve_metrics():
    with Stub() as stub, _admin_gw(stub) as gw:
        r = gw.request("GET", "/metrics", key=ACME_KEY)
        h.assert_error(r, 404, "not_found", read=False)
        assert b"sluice_" not in bytes(r.data)



class _IdleConnections:
    """Keeps n connections to port open and idle (or each having sent
    `partial`, an unfinished request), from a thread: one the server
    closes is counted and replaced REOPEN_S later, like a client that
    holds connections on purpose. Connects are non-blocking: a connection
    waiting in the listen queue counts as open."""

    REOPEN_S = 0.1

    def __init__(self, port, n, partial=b""):
        self.port, self.n, self.partial = port, n, partial
        self.closed_by_server = 0
        self.established = 0
        self.sel = selectors.DefaultSelector()
        self.reopen = []                # times at which to open one more
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((h.HOST, self.port))
        self.sel.register(s, selectors.EVENT_WRITE, "connecting")

    def _drop(self, s):
        self.sel.unregister(s)
        s.close()
        self.reopen.append(time.monotonic() + self.REOPEN_S)

    def _run(self):
        for _ in range(self.n):
            self._open()
        while not self.stop.is_set():
            now = time.monotonic()
            while self.reopen and self.reopen[0] <= now:
                self.reopen.pop(0)
                self._open()
            for key, _ in self.sel.select(0.05):
                s = key.fileobj
                if key.data == "connecting":
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                        self._drop(s)
                        continue
                    self.established += 1
                    try:
                        if self.partial:
                            s.send(self.partial)
                    except OSError:
                        pass
                    self.sel.modify(s, selectors.EVENT_READ, "open")
                    continue
                try:
                    d = s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    d = b""
                if d == b"":
                    self.closed_by_server += 1
                    self._drop(s)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        self.sel.close()
        return False


@h.timeout(150)
def test_admin_answers_healthz_and_metrics_with_hundreds_of_idle_connections_open():
    """An orchestrator probing /healthz must get its answer while hundreds of
    connections to admin_listen sit idle or trickle a request and are
    reopened as soon as they are closed: the master closes idle ones soon,
    and at its connection cap makes room for new ones instead of leaving
    them in the listen queue."""
    with Stub() as stub, _admin_gw(stub) as gw:
        port = h.admin_port(gw)
        with _IdleConnections(port, 300) as idle, \
                _IdleConnections(port, 20, b"GET /metrics HTTP/1.1\r\nHost: x\r\n") as slow:
            h.wait_until(lambda: idle.established + slow.established >= 64, 30,
                         msg="idle connections to be established")
            r = h.admin_request(port, "GET", "/healthz", timeout=60)
            assert r.status == 200 and r.body == b"ok\n", (r.status, r.body)
            m = h.scrape(gw, timeout=60)
            assert m.get("sluice_workers") == 2
            # Idle and unfinished connections are closed by the server...
            h.wait_until(lambda: idle.closed_by_server > 0 and slow.closed_by_server > 0, 60,
                         msg="the server to close idle and trickling connections")
            # ...and the admin server keeps answering.
            for _ in range(10):
                assert h.admin_request(port, "GET", "/healthz", timeout=60).status == 200
            assert h.admin_request(port, "GET", "/metrics", timeout=60).status == 200


ODD_TENANTS = ('we"ird\\name ü', "a{b}=c,d", "x y")


def test_metrics_escape_odd_tenant_names_in_every_tenant_family():
    tenants = {"acme": None, "beta": None}
    for i, name in enumerate(ODD_TENANTS):
        tenants[name] = {"keys": ["sk-odd-%d" % i], "max_streams": 5, "upstream": "main",
                         "tokens_per_minute": 1000}
    with Stub() as stub, Gateway(stub=stub, tenants=tenants,
                                 admin_listen="%s:%d" % (h.HOST, h.free_port())) as gw:
        for i, name in enumerate(ODD_TENANTS):
            hd = dict(h.bearer("sk-odd-%d" % i))
            hd.update(h.stub_headers(events=2, interval=0))
            hd["X-Stub-Usage"] = "3,%d" % (i + 1)
            with h.Client(gw.port) as c:
                r = c.request("POST", "/v1/chat/completions", hd,
                              h.stream_body(), timeout=10)
                assert r.read_all() and r.status == 200, r.status
        for i, name in enumerate(ODD_TENANTS):
            h.wait_metric(gw, "sluice_tenant_tokens_total", i + 1, tenant=name,
                          model="-", kind="completion")
        m = h.scrape(gw)   # strict: every line parses, no duplicate series
        for i, name in enumerate(ODD_TENANTS):
            assert m.get("sluice_tenant_streams", tenant=name) == 0, name
            assert m.get("sluice_tenant_max_streams", tenant=name) == 5, name
            assert m.get("sluice_requests_total", tenant=name, code="200") == 1, name
            assert m.get("sluice_tenant_tokens_total", tenant=name, model="-",
                         kind="prompt") == 3
            assert m.get("sluice_tenant_tokens_window", tenant=name) == 4 + i, name


def test_a_tenant_named_dash_is_refused_at_its_place():
    # "-" is the tenant of requests without one (401, 408, overloaded) in the
    # access log and in sluice_requests_total: a tenant of that name would
    # share their series, a duplicate sample in the exposition.
    text = ('listen: "127.0.0.1:%d"\nupstreams:\n  main: {url: "http://127.0.0.1:9"}\n'
            'tenants:\n  acme: {keys: [k1], max_streams: 1}\n'
            '  "-": {keys: [k2], max_streams: 1}\n' % h.free_port())
    path = h.write_config(text)
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 1, (rc, out, err)
    assert err.splitlines() == [
        "%s:6:3: tenants: '-' is not a tenant name: it stands for no tenant in the "
        "access log and metrics" % path], err


def test_an_upstream_url_with_credentials_is_refused_at_its_place():
    # Replicas are named by their URL as written in metrics (no key needed
    # to read them) and in the access log: a password there would leak.
    text = ('listen: "127.0.0.1:%d"\nupstreams:\n  main:\n    replicas:\n'
            '      - url: "http://svc:s3cret@127.0.0.1:9"\n'
            '      - url: "http://127.0.0.1:9/path@v1"\n'
            'tenants:\n  acme: {keys: [k1], max_streams: 1}\n' % h.free_port())
    path = h.write_config(text)
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 1, (rc, out, err)
    assert err.splitlines() == [
        "%s:5:14: upstreams.main.replicas[0].url: must not contain a user or password "
        "(it would show in metrics and the access log); use api_key" % path], err
    assert "s3cret" not in err

# SPDX-License-Identifier: BSD-2-Clause
"""SIGHUP: limits apply at once, a broken file changes nothing, tenants come
and go, and a reload never cuts a stream (not even one longer than
drain_timeout, not even under load with a reload every 200 ms)."""

import os
import re
import signal
import socket
import threading
import time

import harness as h
from harness import ACME_KEY, BETA_KEY, Gateway, Stub, assert_error, expected_events

STREAM_HEADERS = {"Content-Type": "application/json"}


def _gw(stub, **kw):
    kw.setdefault("allow_worker_changes", True)   # a reload replaces the workers
    return Gateway(stub=stub, admin_listen="%s:%d" % (h.HOST, h.free_port()), **kw)


def _with(gw, **over):
    """The gateway's current config dict with `over` merged in."""
    return h.deep_merge(gw.config, over)


def _short(gw, key, tag=None, events=2):
    """A short stream on a fresh connection: (status, response)."""
    with h.Client(gw.port, timeout=10) as c:
        hd = dict(h.bearer(key), **STREAM_HEADERS) if key else dict(STREAM_HEADERS)
        hd.update(h.stub_headers(events=events, interval=0, tag=tag))
        c.send("POST", "/v1/chat/completions", hd, h.stream_body())
        try:
            r = c.read_response(timeout=10)
        except h.StreamCut:
            raise AssertionError("the gateway closed the connection%s without any response"
                                 % (" (reset)" if c.reset else ""))
        r.read_all(timeout=10)
    if r.status == 200:
        assert r.complete and bytes(r.data) == expected_events(events), \
            "short stream cut or differs: %r" % bytes(r.data[-200:])
    return r.status, r


def _every_request_gets(gw, key, want, n=5, tag=None):
    """After a reload (h.reload waits until the old generation stopped
    accepting), every new request with `key` gets `want`."""
    seen = []
    for _ in range(n):
        st, _ = _short(gw, key, tag=tag)
        seen.append(st)
        assert st == want, "key %r: %r after the reload, want %d every time" % (key, seen, want)
    return seen


def _assert_complete(streams, want, what="in-flight stream"):
    for i, (c, r) in enumerate(streams):
        body = r.read_all(timeout=20)
        assert r.complete, "%s %d cut after %d bytes" % (what, i, len(body))
        assert body == want, "%s %d differs (%d bytes, want %d)" % (what, i, len(body), len(want))


@h.skip_under("valgrind")
def test_reload_raising_max_streams_admits_new_streams_at_once_and_keeps_inflight():
    with Stub() as stub, _gw(stub, tenants={"acme": {"max_streams": 2}}) as gw:
        held = [gw.admit(events=30, interval=100, tag="held", timeout=20) for _ in range(2)]
        c, r = gw.open_stream(events=1, interval=0, tag="probe")
        assert_error(r, 429, "concurrency_limit_exceeded")
        t0 = time.monotonic()
        h.reload(gw, _with(gw, tenants={"acme": {"max_streams": 4}}))
        more = [gw.admit(within=1.0, events=10, interval=100, tag="held", timeout=20)]
        dt = time.monotonic() - t0
        assert dt < 1.0, "raised limit admitted a stream %.2fs after SIGHUP" % dt
        more.append(gw.admit(within=1.0, events=10, interval=100, tag="held", timeout=20))
        c, r = gw.open_stream(events=1, interval=0, tag="probe")
        assert_error(r, 429, "concurrency_limit_exceeded")
        assert stub.tag("held")["inflight"] == 4, stub.tag("held")
        m = h.scrape(gw)
        assert m.get("sluice_tenant_max_streams", tenant="acme") == 4
        assert m.get("sluice_tenant_streams", tenant="acme") == 4
        assert m.get("sluice_reloads_total", result="ok") == 1
        _assert_complete(held, expected_events(30))
        _assert_complete(more, expected_events(10))
        assert stub.tag("held")["max_inflight"] == 4, stub.tag("held")
        assert stub.tag("held")["completed"] == 4 and stub.tag("probe")["requests"] == 0
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")


@h.skip_under("valgrind")
@h.timeout(60)
def test_reload_lowering_max_streams_refuses_until_inflight_below_new_limit():
    with Stub() as stub, _gw(stub, tenants={"acme": {"max_streams": 3}}) as gw:
        lengths = {"a": 10, "b": 20, "c": 30}          # x 100 ms
        streams = {t: gw.admit(events=n, interval=100, tag=t, timeout=20)
                   for t, n in lengths.items()}
        h.reload(gw, _with(gw, tenants={"acme": {"max_streams": 1}}))
        assert h.scrape(gw).get("sluice_tenant_max_streams", tenant="acme") == 1
        seen = []
        t_idle = None
        deadline = time.monotonic() + 10
        while True:
            st, r = _short(gw, ACME_KEY, tag="probe", events=1)
            # Read after the answer: what is still in flight now was in
            # flight when the probe was admitted or refused.
            inflight = sum(stub.tag(t)["inflight"] for t in lengths)
            seen.append((st, inflight))
            if inflight >= 1:
                assert st == 429, "admitted with %d in flight and the limit lowered to 1: %r" % (
                    inflight, seen[-10:])
                assert_error(r, 429, "concurrency_limit_exceeded", read=False)
            elif t_idle is None:
                t_idle = time.monotonic()
            if st == 200:
                break
            assert st == 429, "probe got %d" % st
            assert time.monotonic() < deadline, "never admitted again: %r" % seen[-10:]
            time.sleep(0.03)
        waited = time.monotonic() - t_idle
        assert waited < 1.0, "admitted %.2fs after the last in-flight stream ended" % waited
        refused_at = {n for st, n in seen if st == 429}
        assert {3, 2, 1} <= refused_at, "probes refused at in-flight counts %r" % refused_at
        for t, n in lengths.items():
            _assert_complete([streams[t]], expected_events(n), "stream " + t)
        # One probe was admitted (a one-event probe may start and end within
        # one stub loop iteration, where max_inflight does not see it).
        assert stub.tag("probe")["requests"] == 1 and stub.tag("probe")["max_inflight"] <= 1
        for t in lengths:
            assert stub.tag(t)["completed"] == 1 and stub.tag(t)["aborted_by_client"] == 0
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")


def _lines_of(text):
    return text.split("\n")


def _pos(text, line_marker, col_marker):
    """1-based (line, column) of col_marker in the first line holding line_marker."""
    for i, line in enumerate(_lines_of(text), 1):
        if line_marker in line:
            return i, line.index(col_marker) + 1
    raise AssertionError("%r not in the config" % line_marker)


@h.timeout(60)
def test_reload_with_a_broken_file_keeps_the_running_config():
    with Stub() as stub, _gw(stub, tenants={"acme": {"max_streams": 2}}) as gw:
        good = gw.config
        workers = gw.worker_pids()
        # A stream in flight across all the failed reloads.
        bc, br = gw.admit(key=BETA_KEY, events=50, interval=100, tag="beta", timeout=20)
        # Each broken file would also raise acme's limit and add a key if it
        # were (half) applied.
        change = {"tenants": {"acme": {"max_streams": 5, "keys": [ACME_KEY, "sk-acme-new"]}}}
        unknown = h.config_text(h.deep_merge(good, h.deep_merge(
            change, {"tenants": {"acme": {"max_stream": 7}}})))
        bad_value = h.config_text(h.deep_merge(good, h.deep_merge(
            change, {"tenants": {"acme": {"retry_after": "soon"}}})))
        bad_yaml = h.config_text(h.deep_merge(good, change)) + "limits: {max_body_bytes: [1\n"
        cases = [
            ("unknown key", unknown, _pos(unknown, "max_stream: 7", "max_stream"),
             r"unknown key 'max_stream'"),
            ("bad value", bad_value, _pos(bad_value, "retry_after: soon", "soon"),
             r"retry_after"),
            ("bad YAML", bad_yaml, None, r"."),
        ]
        for n, (what, text, pos, msg_re) in enumerate(cases, 1):
            err_before = len(h.stderr_text(gw))
            h.reload(gw, text, expect="failed")
            logged = h.stderr_text(gw)[err_before:]
            rc, out, err = h.run_sluice(["-t", "-c", gw.path])
            assert rc == 1, "%s: sluice -t accepts the file: %r" % (what, out)
            problems = [ln for ln in err.split("\n") if ln.startswith(gw.path + ":")]
            assert problems, "%s: sluice -t printed no FILE:LINE:COL line: %r" % (what, err)
            for p in problems:
                assert re.match(re.escape(gw.path) + r":\d+:\d+: \S", p), p
                assert (" master: error: " + p) in logged, \
                    "%s: reload did not log %r; logged:\n%s" % (what, p, logged)
            if pos is not None:
                want = "%s:%d:%d: " % (gw.path, pos[0], pos[1])
                hit = [p for p in problems if p.startswith(want) and re.search(msg_re, p)]
                assert hit, "%s: no problem reported at %s matching %r: %r" % (
                    what, want, msg_re, problems)
            m = h.scrape(gw)
            assert m.get("sluice_reloads_total", result="failed") == n, what
            assert m.get("sluice_reloads_total", result="ok") == 0, what
            assert m.get("sluice_tenant_max_streams", tenant="acme") == 2, what
            assert gw.worker_pids() == workers, "%s: workers replaced by a failed reload" % what
            # Same keys: the old one works, the new one does not.
            assert _short(gw, ACME_KEY)[0] == 200, what
            assert _short(gw, "sk-acme-new")[0] == 401, what
            # Same limit: 2 held, the third is refused.
            held = gw.hold_hung(stub, "hung%d" % n, 2)
            st, r = _short(gw, ACME_KEY)
            assert st == 429, "%s: limit not kept: %d" % (what, st)
            for c in held:
                c.close()
            h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")
        body = br.read_all(timeout=20)
        assert br.complete and body == expected_events(50), "stream cut by a failed reload"
        # The master still reloads a good file afterwards.
        h.reload(gw, h.deep_merge(good, change))
        _every_request_gets(gw, "sk-acme-new", 200)
        m = h.scrape(gw)
        assert m.get("sluice_reloads_total", result="ok") == 1
        assert m.get("sluice_reloads_total", result="failed") == 3
        assert m.get("sluice_tenant_max_streams", tenant="acme") == 5


def test_reload_adds_a_tenant_and_a_key():
    with Stub() as stub, _gw(stub) as gw:
        assert _short(gw, "sk-gamma-1")[0] == 401
        assert _short(gw, "sk-acme-3")[0] == 401
        h.reload(gw, _with(gw, tenants={
            "acme": {"keys": [h.ACME_KEY, h.ACME_KEY2, "sk-acme-3"]},
            "gamma": {"keys": ["sk-gamma-1"], "max_streams": 1, "upstream": "main"}}))
        _every_request_gets(gw, "sk-gamma-1", 200, tag="gamma")
        _every_request_gets(gw, "sk-acme-3", 200)
        for key in (ACME_KEY, h.ACME_KEY2, BETA_KEY):
            assert _short(gw, key)[0] == 200, key
        assert h.scrape(gw).get("sluice_tenant_max_streams", tenant="gamma") == 1
        held = gw.hold_hung(stub, "gamma-hung", 1, key="sk-gamma-1")
        st, r = _short(gw, "sk-gamma-1")
        assert_error(r, 429, "concurrency_limit_exceeded", read=False)
        for c in held:
            c.close()
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="gamma")
        m = h.scrape(gw)
        assert m.get("sluice_requests_total", tenant="gamma", code="429") == 1
        assert m.get("sluice_requests_total", tenant="gamma", code="200") == 5


def test_reload_removing_a_tenant_refuses_its_key_and_finishes_its_stream():
    with Stub() as stub, _gw(stub) as gw:
        c, r = gw.admit(key=BETA_KEY, events=30, interval=100, tag="beta", timeout=20)
        r.read_events(2, timeout=5)
        h.reload(gw, _with(gw, tenants={"beta": None}))
        _every_request_gets(gw, BETA_KEY, 401)
        assert _short(gw, ACME_KEY)[0] == 200
        m = h.scrape(gw)
        assert m.get("sluice_tenant_max_streams", tenant="beta") == 0, "removed tenant not retired"
        assert m.get("sluice_tenant_streams", tenant="beta") == 1, "its stream is still in flight"
        body = r.read_all(timeout=20)
        assert r.complete and body == expected_events(30), \
            "removed tenant's stream cut after %d bytes" % len(body)
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="beta")
        assert stub.tag("beta")["completed"] == 1
        # Adding it back gives it its slots again.
        h.reload(gw, _with(gw, tenants={"beta": {"keys": [BETA_KEY], "max_streams": 3,
                                                 "upstream": "main"}}))
        _every_request_gets(gw, BETA_KEY, 200)
        assert h.scrape(gw).get("sluice_tenant_max_streams", tenant="beta") == 3


@h.timeout(60)
def test_reload_never_cuts_a_stream_longer_than_drain_timeout():
    with Stub() as stub, _gw(stub, drain_timeout="1s") as gw:
        c, r = gw.admit(events=40, size=200, interval=100, tag="long", timeout=20)
        r.read_events(2, timeout=5)
        old = set(gw.initial_workers)
        h.reload(gw, _with(gw, tenants={"acme": {"retry_after": 3}}))
        # Past the drain_timeout of the retired worker, and a second reload
        # that retires the generation in between.
        r.read_events(18, timeout=10)
        h.reload(gw, _with(gw, tenants={"acme": {"retry_after": 4}}))
        assert old & set(gw.worker_pids()), "the worker holding the stream is gone"
        body = r.read_all(timeout=20)
        assert r.complete, "stream cut by reload after %d bytes (%d events)" % (
            len(body), len(r.events))
        assert body == expected_events(40, 200)
        assert stub.tag("long")["aborted_by_client"] == 0


@h.timeout(60)
def test_reload_changing_listen_keeps_the_old_address_and_applies_the_rest():
    with Stub() as stub, _gw(stub) as gw:
        old_listen = gw.config["listen"]
        new_port = h.free_port()
        h.reload(gw, _with(gw, listen="%s:%d" % (h.HOST, new_port),
                           tenants={"acme": {"keys": [ACME_KEY, "sk-acme-3"], "max_streams": 1}}))
        warn = [ln for ln in h.stderr_text(gw).split("\n")
                if " master: warn: " in ln and "listen" in ln]
        assert warn, "no warning about 'listen' on stderr:\n%s" % gw.stderr_tail(1500)
        assert old_listen in warn[0], "warning does not name the kept address: %r" % warn[0]
        # The rest applied, on the old address.
        _every_request_gets(gw, "sk-acme-3", 200)
        assert h.scrape(gw).get("sluice_tenant_max_streams", tenant="acme") == 1
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect((h.HOST, new_port))
            raise AssertionError("something accepts on the new listen port %d" % new_port)
        except ConnectionRefusedError:
            pass
        finally:
            s.close()
        assert h.scrape(gw).get("sluice_reloads_total", result="ok") == 1


@h.timeout(60)
def test_reload_starts_a_new_worker_generation_and_old_workers_exit_after_their_streams():
    with Stub() as stub, _gw(stub, workers=2) as gw:
        gen1 = set(gw.initial_workers)
        c, r = gw.admit(events=30, interval=100, tag="s", timeout=20)
        r.read_events(1, timeout=5)
        h.reload(gw, _with(gw, tenants={"acme": {"retry_after": 5}}))

        def split():
            now = set(gw.worker_pids())
            new, old = now - gen1, now & gen1
            return (new, old) if len(new) == 2 and len(old) == 1 else None
        # The idle old worker exits at once; the one holding the stream stays.
        gen2, busy = h.wait_until(split, 3, msg="2 new workers and 1 busy old one")
        assert h.scrape(gw).get("sluice_workers") == 2
        for _ in range(4):
            assert _short(gw, ACME_KEY)[0] == 200
        assert set(gw.worker_pids()) == gen2 | busy, "busy old worker gone before its stream ended"
        body = r.read_all(timeout=20)
        assert r.complete and body == expected_events(30)
        h.wait_until(lambda: set(gw.worker_pids()) == gen2, 3,
                     msg="the old worker to exit once its stream ended")
        assert not h.pid_alive(next(iter(busy)))
        # Again: another generation replaces this one.
        h.reload(gw, _with(gw, tenants={"acme": {"retry_after": 6}}))
        gen3 = h.wait_until(lambda: (lambda w: w if len(w) == 2 and not w & gen2 else None)(
            set(gw.worker_pids())), 3, msg="generation 3")
        assert not gen3 & gen1
        assert h.scrape(gw).get("sluice_workers") == 2


class _Load:
    """Client threads, each looping streams on a fresh connection per
    request and checking every answer: a 200 must be complete and
    byte-exact, a 429 a proper refusal; anything else (a cut, a connection
    closed without a response, another status) is a failure."""

    def __init__(self, gw, plan, events, size, interval, retry_after=("1", "2")):
        self.gw = gw
        self.plan = plan                  # [(key, tag)] one per thread
        self.hd = {}
        self.want = expected_events(events, size)
        self.retry_after = retry_after
        self.lock = threading.Lock()
        self.counts = {tag: {"ok": 0, "429": 0} for _, tag in plan}
        self.failures = []
        self.stop = threading.Event()
        for key, tag in plan:
            hd = dict(h.bearer(key), **STREAM_HEADERS)
            hd.update(h.stub_headers(events=events, size=size, interval=interval, tag=tag))
            self.hd[tag] = hd
        self.threads = [threading.Thread(target=self._client, args=(tag,), daemon=True)
                        for _, tag in plan]

    def _fail(self, tag, what):
        with self.lock:
            self.failures.append((tag, what))

    def _client(self, tag):
        while not self.stop.is_set():
            try:
                with h.Client(self.gw.port, timeout=10) as c:
                    c.send("POST", "/v1/chat/completions", self.hd[tag], h.stream_body())
                    try:
                        r = c.read_response(timeout=10)
                    except h.StreamCut:
                        self._fail(tag, "closed%s before any response"
                                   % (" (reset)" if c.reset else ""))
                        continue
                    body = r.read_all(timeout=10)
                if r.status == 200 and r.complete and body == self.want:
                    with self.lock:
                        self.counts[tag]["ok"] += 1
                elif r.status == 429 and r.complete:
                    assert_error(r, 429, "concurrency_limit_exceeded", read=False)
                    assert r.header("retry-after") in self.retry_after, r.headers
                    with self.lock:
                        self.counts[tag]["429"] += 1
                    time.sleep(0.01)
                else:
                    self._fail(tag, "status %d, %s after %d bytes" % (
                        r.status, "complete" if r.complete else "cut", len(body)))
            except Exception as e:  # noqa: BLE001 - every failure is reported
                self._fail(tag, repr(e))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads), "client threads stuck"
        return False

    def total(self, what):
        return sum(c[what] for c in self.counts.values())

    def failure_kinds(self):
        kinds = {}
        for _, what in self.failures:
            kinds[what] = kinds.get(what, 0) + 1
        return kinds


def _reload_every(gw, period, seconds, make_config):
    """Reload every `period` seconds for `seconds`; returns the count."""
    n = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        tick = time.monotonic()
        h.reload(gw, make_config(n))
        n += 1
        time.sleep(max(0.0, period - (time.monotonic() - tick)))
    return n


@h.timeout(60)
def test_reload_answers_every_request_on_a_connection_opened_around_it():
    """A connection accepted by a worker just before a reload retires it
    must still get its answer: retiring may close idle keep-alive
    connections, never one whose request it has not read yet."""
    with Stub() as stub, _gw(stub, tenants={"acme": {"max_streams": 1000}}) as gw:
        with _Load(gw, [(ACME_KEY, "fresh%d" % i) for i in range(12)],
                   events=1, size=0, interval=0) as load:
            reloads = _reload_every(gw, 0.2, 5.0, lambda n: _with(
                gw, tenants={"acme": {"retry_after": 1 + n % 2}}))
        ok = load.total("ok")
        print("new connections around reloads: %d reloads, %d answered byte-exact, "
              "%d failed: %r" % (reloads, ok, len(load.failures), load.failure_kinds()))
        assert ok > 0 and load.total("429") == 0
        assert not load.failures, "%d of %d requests on new connections got no answer: %r" % (
            len(load.failures), ok + len(load.failures), load.failure_kinds())


LOAD_TENANTS = {"t1": 2, "t2": 3, "t3": 4}


def _load_config(gw_config, stub, retry_after):
    cfg = h.gateway_config(stub, tenants={
        "acme": None, "beta": None,
        **{t: {"keys": ["sk-%s-load" % t], "max_streams": n, "retry_after": retry_after,
               "upstream": "main"} for t, n in LOAD_TENANTS.items()}})
    if gw_config is not None:
        cfg["listen"] = gw_config["listen"]
    cfg["admin_listen"] = gw_config["admin_listen"] if gw_config else \
        "%s:%d" % (h.HOST, h.free_port())
    return cfg


@h.skip_under("valgrind")
@h.timeout(90)
def test_reload_every_200ms_for_10s_under_load_cuts_nothing_and_never_exceeds_a_limit():
    with Stub() as stub, Gateway(_load_config(None, stub, 1), allow_worker_changes=True) as gw:
        plan = [("sk-%s-load" % t, t) for t in LOAD_TENANTS]
        plan = [(k, t) for _ in range(7) for k, t in plan][:20]
        load = _Load(gw, plan, events=5, size=100, interval=10)
        # One counter per tenant: threads of a tenant share its tag.
        with load:
            t0 = time.monotonic()
            reloads = _reload_every(gw, 0.2, 10.0,
                                    lambda n: _load_config(gw.config, stub, 1 + (n + 1) % 2))
            elapsed = time.monotonic() - t0
        tags = {t: stub.tag(t) for t in LOAD_TENANTS}
        print("reload under load: %d reloads in %.1fs, %d streams completed byte-exact, "
              "%d x 429, %d failures %r" % (reloads, elapsed, load.total("ok"),
                                            load.total("429"), len(load.failures),
                                            load.failure_kinds()))
        for t, n in LOAD_TENANTS.items():
            print("  tenant %s: limit %d, upstream max in flight %d, 200s %d, 429s %d, "
                  "stub completed %d, aborted %d" % (
                      t, n, tags[t]["max_inflight"], load.counts[t]["ok"],
                      load.counts[t]["429"], tags[t]["completed"], tags[t]["aborted_by_client"]))
        assert reloads >= 40, "only %d reloads in 10 s" % reloads
        for t, n in LOAD_TENANTS.items():
            assert tags[t]["max_inflight"] <= n, \
                "tenant %s: upstream saw %d in flight, limit %d" % (t, tags[t]["max_inflight"], n)
            assert load.counts[t]["ok"] > 0 and load.counts[t]["429"] > 0, (t, load.counts[t])
            assert tags[t]["completed"] == tags[t]["requests"] == load.counts[t]["ok"], \
                (t, tags[t], load.counts[t])
            assert tags[t]["aborted_by_client"] == 0, (t, tags[t])
        m = h.wait_until(lambda: (lambda x: x if all(
            x.get("sluice_tenant_streams", tenant=t) == 0 for t in LOAD_TENANTS)
            else None)(h.scrape(gw)), 3, msg="in flight back to 0 in /metrics")
        print("  /metrics at the end: sluice_tenant_streams %r, reloads ok %d, failed %d" % (
            {t: m.get("sluice_tenant_streams", tenant=t) for t in LOAD_TENANTS},
            m.get("sluice_reloads_total", result="ok"),
            m.get("sluice_reloads_total", result="failed")))
        assert m.get("sluice_reloads_total", result="ok") == reloads
        assert m.get("sluice_reloads_total", result="failed") == 0
        for t in LOAD_TENANTS:
            assert m.get("sluice_requests_total", tenant=t, code="200") == load.counts[t]["ok"]
            assert m.get("sluice_requests_total", tenant=t, code="429") == load.counts[t]["429"]
        # Every retired generation drains and exits.
        h.wait_until(lambda: len(gw.worker_pids()) == 2, 5,
                     msg="only the current generation left")
        # Last, so that the invariants above are checked either way.
        assert not load.failures, "%d requests failed or were cut: %r" % (
            len(load.failures), load.failure_kinds())


def test_reload_with_an_access_log_that_cannot_be_opened_is_refused():
    access = h.tmpfile("access", ".log")
    with Stub() as stub, _gw(stub, access_log=access, log_level="info") as gw:
        assert _short(gw, ACME_KEY)[0] == 200
        h.wait_access_lines(access, 1)
        bad = "/nonexistent-sluice-dir/access.log"
        text = h.config_text(_with(gw, access_log=bad))
        line = [n for n, ln in enumerate(text.splitlines(), 1)
                if ln.startswith("access_log:")][0]
        col = len("access_log: ") + 1       # the value, quoted or not
        err_before = len(h.stderr_text(gw))
        h.reload(gw, text, expect="failed")
        logged = h.stderr_text(gw)[err_before:]
        want = " master: error: %s:%d:%d: access_log: cannot open '%s': " \
            "No such file or directory" % (gw.path, line, col, bad)
        assert want in logged, "no %r in:\n%s" % (want, logged)
        m = h.scrape(gw)
        assert m.get("sluice_reloads_total", result="failed") == 1
        assert m.get("sluice_reloads_total", result="ok") == 0
        # The running configuration, access log included, is kept.
        assert _short(gw, ACME_KEY)[0] == 200
        h.wait_access_lines(access, 2)


def _hup(gw, timeout=10.0):
    """SIGHUP the master and wait for the outcome it logs: "ok" or "failed"."""
    before = h.reload_results(gw)
    h.kill_pid(gw.pid, signal.SIGHUP)

    def outcome():
        ok, failed = h.reload_results(gw)
        return "ok" if ok > before[0] else "failed" if failed > before[1] else None
    return h.wait_until(outcome, timeout, interval=0.01, msg="the master to log the reload")


# The master has 128 worker rows in the shared region (twice the most
# workers a config may ask for): 128 worker processes at most, current and
# draining generations together (sluice.8, SIGNALS).
WORKER_ROWS = 128


@h.timeout(180)
def test_reload_storm_refused_when_draining_workers_hold_every_row_and_current_keeps_serving():
    """One stream held on every generation keeps each retired worker alive.
    With workers: 1 the 128 rows are full after 127 reloads: the next one
    must be refused (counted failed, logged) without retiring the serving
    worker; once an old stream ends, a reload works again."""
    with Stub() as stub, _gw(stub, workers=1, tenants={"acme": {"max_streams": 1000}}) as gw:
        held = []
        outcome, n = "ok", 0
        while outcome == "ok" and n < WORKER_ROWS + 5:
            c, r = gw.admit(events=2, interval=600000, tag="held", timeout=20)
            r.read_events(1, timeout=20)
            held.append((c, r))
            old = gw.worker_pids()
            outcome = _hup(gw)
            n += 1
            if outcome == "ok":
                h.wait_retired(gw, old, timeout=20)
        assert (outcome, n) == ("failed", WORKER_ROWS), \
            "reload %d was %s; stderr tail:\n%s" % (n, outcome, gw.stderr_tail(1500))
        assert re.search(r"master: error: reload failed: .*worker row", h.stderr_text(gw)), \
            gw.stderr_tail(1500)
        m = h.scrape(gw)
        assert m.get("sluice_reloads_total", result="ok") == WORKER_ROWS - 1
        assert m.get("sluice_reloads_total", result="failed") == 1
        assert m.get("sluice_workers") == 1
        assert len(gw.worker_pids()) == WORKER_ROWS
        # The current generation still serves, on new connections.
        for _ in range(3):
            assert _short(gw, ACME_KEY)[0] == 200
        # Every held stream is still in flight.
        assert stub.tag("held")["inflight"] == len(held)
        # The serving worker can always be replaced, rows full or not: its
        # row stays its slot's, no draining worker can take it.
        draining = {int(p) for p in re.findall(r"sluice\[(\d+)\] worker\d+: info: draining ",
                                               h.stderr_text(gw))}
        cur = [p for p in gw.worker_pids() if p not in draining]
        assert len(cur) == 1, cur
        h.kill_pid(cur[0])
        c, r = held.pop()       # the stream it carried is cut with it
        c.close()
        h.wait_until(lambda: (lambda w: len(w) == WORKER_ROWS and cur[0] not in w)(
            gw.worker_pids()), 20, msg="the killed worker to be replaced")
        h.wait_workers_ready(gw, WORKER_ROWS, timeout=20)
        assert h.scrape(gw).get("sluice_workers") == 1
        assert _short(gw, ACME_KEY)[0] == 200
        # One old stream ends: its worker exits, its row is free, and a
        # reload works again.
        c, r = held.pop(0)
        c.close()
        h.wait_until(lambda: len(gw.worker_pids()) == WORKER_ROWS - 1, 20,
                     msg="the worker of the closed stream to exit")
        assert _hup(gw) == "ok"
        m = h.scrape(gw)
        assert m.get("sluice_reloads_total", result="ok") == WORKER_ROWS
        assert m.get("sluice_workers") == 1
        assert _short(gw, ACME_KEY)[0] == 200
        for c, _ in held:
            c.close()
        # 126 workers exit at once; under memcheck each one's leak check at
        # exit reads every mapping (0.3 s of CPU each here: 36 s in all).
        h.wait_until(lambda: len(gw.worker_pids()) == 1, 120 if h.under_valgrind() else 30,
                     msg="the old workers to exit once their streams are gone")


@h.timeout(30)
def test_reload_disabling_a_tenant_answers_403_to_a_head_that_spans_the_reload():
    """The retired worker that finishes reading this head decides with the
    max_streams the master published (0: disabled, 403), not with its own
    configuration's (which would admit it, or say 429)."""
    with Stub() as stub, _gw(stub, workers=1,
                             tenants={"acme": {"max_streams": 5}}) as gw:
        c = gw.client()
        c.send_raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                   b"Authorization: Bearer %s\r\n" % ACME_KEY.encode())
        time.sleep(0.2)
        h.reload(gw, _with(gw, tenants={"acme": {"max_streams": 0}}))
        c.send_raw(b"\r\n")
        r = c.read_response(timeout=10)
        assert_error(r, 403, "tenant_disabled")
        c.close()
        with gw.client() as c2:
            c2.send_raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                        b"Authorization: Bearer %s\r\n\r\n" % ACME_KEY.encode())
            assert_error(c2.read_response(timeout=10), 403, "tenant_disabled")


# ------------------------------------------------------------------ replica rows

def _pool_cfg(gw, urls):
    """The gateway's config with upstream `main` a pool of `urls`."""
    cfg = dict(gw.config)
    cfg["upstreams"] = {"main": {"replicas": [{"url": u} for u in urls],
                                 "api_key": h.UPSTREAM_KEY}}
    return cfg


@h.skip_under("valgrind")
@h.timeout(600)
def test_a_thousand_reloads_of_a_pool_whose_urls_change_all_succeed():
    # Issue 22: every replica URL took a row of the shared region for the
    # master's life; with 32 new URLs per reload the 8th reload failed
    # "tenant and replica capacity (256) exhausted". A removed replica's
    # row is reused once its streams end and its workers exited.
    n, nrep = 1000, 32
    with Stub() as stub:
        gw = _gw(stub, workers=1, log_level="info")
        with gw:
            seen = [0]

            def outcome():
                with open(gw.stderr_path, "rb") as f:
                    f.seek(seen[0])
                    text = f.read().decode("utf-8", "replace")
                if " master: error: reload failed" in text:
                    return "failed"
                if " master: info: reloaded: generation" in text:
                    seen[0] += len(text.encode("utf-8"))
                    return "ok"
                return None
            for i in range(n):
                with open(gw.stderr_path, "rb") as f:
                    seen[0] = len(f.read())
                # 32 replicas on fresh addresses each time (nothing is sent to
                # them: no health probe, no request), the stub first.
                urls = [stub.url] + ["http://127.%d.%d.%d:%d" % (
                    (i >> 8) & 255, i & 255, r, 1000 + r) for r in range(1, nrep)]
                h.rewrite_config(gw, _pool_cfg(gw, urls))
                h.kill_pid(gw.pid, signal.SIGHUP)
                got = h.wait_until(outcome, 20, interval=0.002,
                                   msg="reload %d to be logged" % (i + 1))
                assert got == "ok", "reload %d of %d failed:\n%s" % (
                    i + 1, n, gw.stderr_tail(800))
            assert h.reload_results(gw) == (n, 0)
            m = h.scrape(gw)
            assert m.value("sluice_reloads_total", result="ok") == n
            reps = {dict(lb)["replica"] for lb in m.series("sluice_replica_up")}
            assert reps == set(urls), len(reps)
            h.reload(gw, _pool_cfg(gw, [stub.url]))
            _every_request_gets(gw, ACME_KEY, 200, n=3)


@h.timeout(120)
def test_a_removed_replica_keeps_its_streams_series_until_they_end():
    # Issue 22: a replica removed with streams in flight vanished from
    # sluice_replica_streams while sluice_tenant_streams still counted them.
    # The streams end when their clients go (after the checks).
    with Stub("keep") as a, Stub("gone") as b:
        gw = _gw(a, workers=1, log_level="info", drain_timeout="15s")
        with gw:
            h.reload(gw, _pool_cfg(gw, [a.url, b.url]))
            streams = []
            try:
                for _ in range(4):
                    c, r = gw.open_stream(events=300, interval=100, timeout=20)
                    assert r.status == 200, r.status
                    streams.append((c, r))
                assert a.stats()["inflight"] == 2 and b.stats()["inflight"] == 2
                h.reload(gw, _pool_cfg(gw, [a.url]))
                # Rows of other removed replicas are reused meanwhile (10 x 31
                # new URLs, more than the region holds), never b's.
                for i in range(10):
                    h.reload(gw, _pool_cfg(gw, [a.url] + [
                        "http://127.0.%d.%d:%d" % (i, r, 2000 + r) for r in range(1, 32)]))
                m = h.scrape(gw)
                assert m.value("sluice_tenant_streams", tenant="acme") == 4
                assert m.value("sluice_replica_streams", upstream="main",
                               replica=b.url) == 2, m.series("sluice_replica_streams")
                assert m.value("sluice_replica_streams", upstream="main", replica=a.url) == 2
                # Only the streams: the removed replica is not in the pool.
                assert m.get("sluice_replica_up", upstream="main", replica=b.url) is None
                assert len(m.series("sluice_replica_streams")) == 33, \
                    m.series("sluice_replica_streams")
            finally:
                for c, _ in streams:
                    c.close()
            h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme", timeout=10)
            m = h.scrape(gw)
            assert m.get("sluice_replica_streams", upstream="main", replica=b.url) is None, \
                m.series("sluice_replica_streams")


@h.timeout(120)
def test_a_removed_replicas_row_freed_by_crash_reclaim_is_reused_clean():
    # The old worker holding streams to a removed replica is killed: the
    # master gives its slots back, the row is quiet, and the next new
    # replicas take it with nothing of the old one (streams, requests).
    with Stub("keep") as a, Stub("gone") as b:
        gw = _gw(a, workers=1, log_level="info", drain_timeout="15s")
        with gw:
            h.reload(gw, _pool_cfg(gw, [a.url, b.url]))
            streams = []
            try:
                for _ in range(4):
                    c, r = gw.open_stream(events=300, interval=100, timeout=20)
                    assert r.status == 200, r.status
                    streams.append(c)
                assert b.stats()["inflight"] == 2
                old = gw.worker_pids()
                h.reload(gw, _pool_cfg(gw, [a.url]))
                for pid in old:
                    os.kill(pid, signal.SIGKILL)
                h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme", timeout=10)
            finally:
                for c in streams:
                    c.close()
            # Each new generation's replicas: b's row among them sooner or later.
            for i in range(10):
                h.reload(gw, _pool_cfg(gw, [a.url] + [
                    "http://127.0.%d.%d:%d" % (i, r, 3000 + r) for r in range(1, 32)]))
                m = h.scrape(gw)
                streams = m.series("sluice_replica_streams")
                assert len(streams) == 32 and all(v == 0 for v in streams.values()), streams
                reqs = {dict(lb)["replica"]
                        for lb in m.series("sluice_replica_requests_total")}
                assert reqs == {a.url}, "requests of a removed replica show under %r" % (
                    reqs - {a.url},)

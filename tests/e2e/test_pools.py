# SPDX-License-Identifier: BSD-2-Clause
"""Upstream pools (issue 10): several model-runner replicas per upstream.

Real processes on 127.0.0.1: stub replicas (several Stub instances) and
hostile ones (RawUpstream). What is pinned here is what the workers do on
real traffic: least_loaded and round_robin choice, replica caps, retries
before the first byte (connect, busy, empty), passive ejection, the 503
`upstream_unavailable` answer, crash reclaim of replica slots, reloads that
add or remove replicas, the replica metrics and the access log fields.
Active health probes (`health:`) are pinned at the end, against a replica
whose health answer a test switches (ToggleReplica).
"""

import email.utils
import http.server
import json
import os
import threading
import time

import harness as h
from harness import ACME_KEY, UPSTREAM_KEY, Gateway, RawUpstream, Stub, assert_error, \
    expected_events

CT = {"Content-Type": "application/json"}


# ------------------------------------------------------------------ helpers

def pool_config(replicas, workers=1, access_log=None, drain_timeout="5s", **upstream):
    """A gateway config whose upstream `main` is a pool of `replicas` (URLs
    or replica mappings); `upstream` adds pool keys (balance, retries...)."""
    cfg = h.gateway_config(None, workers=workers, log_level="info",
                           drain_timeout=drain_timeout,
                           admin_listen="%s:%d" % (h.HOST, h.free_port()))
    if access_log is not None:
        cfg["access_log"] = access_log
    up = {"replicas": [r if isinstance(r, dict) else {"url": r} for r in replicas],
          "api_key": UPSTREAM_KEY}
    up.update(upstream)
    cfg["upstreams"] = {"main": up}
    return cfg


def post(gw, key=ACME_KEY, timeout=30.0, **stub_kw):
    """One streaming completion on a fresh connection, whole response read."""
    hd = dict(CT)
    hd.update(h.stub_headers(**stub_kw))
    return gw.request("POST", "/v1/chat/completions", hd, h.stream_body(), key=key,
                      timeout=timeout)


def post_ok(gw, events=3, **stub_kw):
    r = post(gw, events=events, interval=0, **stub_kw)
    assert r.status == 200 and r.complete, (r.status, bytes(r.data[:300]))
    assert bytes(r.data) == expected_events(events), "body differs: %r" % bytes(r.data[:200])
    return r


def rstreams(m, url):
    return m.value("sluice_replica_streams", upstream="main", replica=url)


def rreq(m, url, code):
    return m.value("sluice_replica_requests_total", upstream="main", replica=url, code=code)


def rreq_all(m, url):
    return sum(v for lb, v in m.series("sluice_replica_requests_total").items()
               if dict(lb).get("upstream") == "main" and dict(lb).get("replica") == url)


def retries(m, reason):
    return m.value("sluice_upstream_retries_total", upstream="main", reason=reason)


def ejected(m, url):
    return m.get("sluice_replica_ejected", upstream="main", replica=url)


def raw_posts(raw):
    return [r for r in raw.requests if r.startswith(b"POST ")]


def busy_handler(body, retry_after=5, status=b"503 Service Unavailable"):
    """A replica that refuses the work: a busy head with Retry-After."""
    def handler(sock, req):
        sock.sendall(b"HTTP/1.1 " + status + b"\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Retry-After: %d\r\n"
                     b"Content-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % (retry_after, len(body)) + body)
    return handler


def owner_of(gw, client):
    """Pid of the worker that holds the server side of client's connection."""
    cport = client.sock.getsockname()[1]
    inodes = {ino for loc, rem, _st, ino in h._proc_net_tcp(gw.pid)
              if loc == (h.HOST, gw.port) and rem == (h.HOST, cport)}
    for w in gw.worker_pids():
        try:
            if inodes & h._socket_inodes(w):
                return w
        except OSError:
            pass
    return None


def close_all(clients):
    for c in clients:
        c.close()


# ------------------------------------------------------------------ choice

@h.timeout(180)
def test_pool_least_loaded_spreads_concurrent_streams_by_weight():
    n = 100
    with Stub("r1") as s1, Stub("r2") as s2, Stub("r3") as s3:
        cfg = pool_config([{"url": s1.url, "weight": 1}, {"url": s2.url, "weight": 2},
                           {"url": s3.url, "weight": 1}], workers=2)
        with Gateway(cfg) as gw:
            held = []
            try:
                for i in range(n):
                    c, r = gw.open_stream(events=120, interval=500, tag="ll", timeout=20)
                    assert r.status == 200, "stream %d: %d %r" % (
                        i, r.status, bytes(r.read_all(timeout=5))[:200])
                    held.append(c)
                want = {s1.url: 25, s2.url: 50, s3.url: 25}

                def spread():
                    m = h.scrape(gw)
                    got = {u: rstreams(m, u) for u in want}
                    return got if sum(got.values()) == n else None
                got = h.wait_until(spread, 10, interval=0.1,
                                   msg="sluice_replica_streams to sum to %d" % n)
                stubs = {s1.url: s1, s2.url: s2, s3.url: s3}
                seen = {u: stubs[u].tag("ll")["inflight"] for u in want}
                assert seen == got, "stub in-flight %r but replica_streams %r" % (seen, got)
                # Deterministic: each stream is opened once the last one is
                # counted, and lowest load per weight after every 4 opens is
                # 25, 50, 25 of 100 whatever order equals are taken in.
                assert got == want, "streams %r, weights 1:2:1 of %d give %r" % (
                    got, n, want)
            finally:
                close_all(held)
            h.wait_until(lambda: all(rstreams(h.scrape(gw), u) == 0
                                     for u in (s1.url, s2.url, s3.url)),
                         10, interval=0.1, msg="replica streams back to 0")


def test_pool_round_robin_cycles_in_smooth_weighted_order():
    log = h.tmpfile("access", ".log")
    with Stub("r1") as s1, Stub("r2") as s2, Stub("r3") as s3:
        cfg = pool_config([{"url": s1.url, "weight": 1}, {"url": s2.url, "weight": 2},
                           {"url": s3.url, "weight": 1}],
                          workers=1, balance="round_robin", access_log=log)
        with Gateway(cfg) as gw:
            for _ in range(12):
                post_ok(gw)
            lines = h.wait_access_lines(log, 12)
            order = [ln["replica"] for ln in lines]
            # nginx's smooth weighted round robin over weights 1,2,1.
            cycle = [s2.url, s1.url, s3.url, s2.url]
            assert order == cycle * 3, "round robin order %r, expected %r" % (order, cycle * 3)
            assert (s1.stats()["requests"], s2.stats()["requests"],
                    s3.stats()["requests"]) == (3, 6, 3)


def swrr(weights, lives):
    """nginx's smooth weighted round robin: one pick per entry of `lives`
    (the replicas that can take it); the others are skipped without their
    counters moving."""
    cur = [0] * len(weights)
    out = []
    for live in lives:
        for k in live:
            cur[k] += weights[k]
        best = max(live, key=lambda k: (cur[k], -k))
        cur[best] -= sum(weights[k] for k in live)
        out.append(best)
    return out


def test_pool_least_loaded_sequential_requests_follow_the_weights():
    # Issue 22: ties were drawn uniformly, so one request at a time (every
    # replica at load 0) split 28/33/39 for weights 3:1:1. Equals now go by
    # smooth weighted round robin: every 5 requests give exactly 3, 1, 1.
    with Stub("r1") as s1, Stub("r2") as s2, Stub("r3") as s3:
        cfg = pool_config([{"url": s1.url, "weight": 3}, {"url": s2.url, "weight": 1},
                           {"url": s3.url, "weight": 1}], workers=1)
        with Gateway(cfg) as gw:
            for _ in range(100):
                post_ok(gw, events=1)
            got = (s1.stats()["requests"], s2.stats()["requests"], s3.stats()["requests"])
            assert got == (60, 20, 20), "100 sequential requests split %r over weights " \
                "3:1:1, expected (60, 20, 20)" % (got,)


@h.timeout(60)
def test_pool_round_robin_skips_a_full_replica_without_moving_its_counter():
    # Weights 3:1:1 with the heavy replica at its cap: the others alternate,
    # and the heavy one, once free, resumes where the cycle left it.
    log = h.tmpfile("access", ".log")
    with Stub("a") as a, Stub("b") as b, Stub("c") as c:
        urls = [a.url, b.url, c.url]
        cfg = pool_config([{"url": a.url, "weight": 3, "max_streams": 1},
                           {"url": b.url, "weight": 1}, {"url": c.url, "weight": 1}],
                          workers=1, balance="round_robin", access_log=log)
        with Gateway(cfg) as gw:
            held, r = gw.open_stream(events=120, interval=500, timeout=20)
            try:
                assert r.status == 200 and a.stats()["inflight"] == 1, (r.status, a.stats())
                for _ in range(6):
                    post_ok(gw, events=1)
                order = [ln["replica"] for ln in h.wait_access_lines(log, 6)]
                assert order == [b.url, c.url] * 3, "with the heavy replica full: %r" % (
                    [urls.index(u) if u in urls else u for u in order],)
            finally:
                held.close()
            h.wait_metric(gw, "sluice_replica_streams", 0, upstream="main", replica=a.url)
            for _ in range(10):
                post_ok(gw, events=1)
            lines = h.wait_access_lines(log, 17)
            # The held stream's line came when it ended (client_gone): left out.
            got = [urls.index(ln["replica"]) for ln in lines if ln["end"] == "done"][6:]
            # The model: one pick of all, 6 with the heavy one skipped, 10 of all.
            want = swrr([3, 1, 1], [[0, 1, 2]] + [[1, 2]] * 6 + [[0, 1, 2]] * 10)
            assert want[1:7] == [1, 2] * 3, want
            assert got == want[7:], "after the heavy replica freed: %r, expected %r" % (
                got, want[7:])


@h.timeout(120)
def test_pool_replica_cap_is_never_exceeded():
    n = 30
    with Stub("capped") as s1, Stub("r2") as s2, Stub("r3") as s3:
        cfg = pool_config([{"url": s1.url, "max_streams": 5}, s2.url, s3.url], workers=2)
        with Gateway(cfg) as gw:
            held = []
            try:
                for i in range(n):
                    c, r = gw.open_stream(events=120, interval=500, tag="cap", timeout=20)
                    assert r.status == 200, "stream %d refused: %d %r" % (
                        i, r.status, bytes(r.read_all(timeout=5))[:200])
                    held.append(c)
                m = h.wait_until(lambda: (lambda m: m if sum(
                    rstreams(m, u) for u in (s1.url, s2.url, s3.url)) == n else None)(
                    h.scrape(gw)), 10, interval=0.1, msg="%d replica streams" % n)
                assert rstreams(m, s1.url) == 5, "capped replica carries %r" % rstreams(m, s1.url)
                assert s1.tag("cap")["max_inflight"] == 5, s1.tag("cap")
                assert s2.tag("cap")["inflight"] + s3.tag("cap")["inflight"] == n - 5
            finally:
                close_all(held)
            assert s1.stats()["max_inflight"] <= 5, \
                "capped replica saw %d streams at once" % s1.stats()["max_inflight"]


# ------------------------------------------------------------------ retries

def test_pool_connect_failure_moves_the_request_and_ejects_the_dead_replica():
    dead = "http://%s:%d" % (h.HOST, h.closed_port())
    with Stub("live") as live:
        cfg = pool_config([dead, live.url], workers=1)
        with Gateway(cfg) as gw:
            sent = 0
            for _ in range(80):
                post_ok(gw)
                sent += 1
                m = h.scrape(gw)
                if ejected(m, dead) == 1:
                    break
            m = h.scrape(gw)
            assert ejected(m, dead) == 1, \
                "dead replica not ejected after %d requests: connect tries %r" % (
                    sent, rreq(m, dead, "connect"))
            assert ejected(m, live.url) == 0
            assert rreq(m, dead, "connect") == 5, rreq(m, dead, "connect")
            assert retries(m, "connect") == 5, retries(m, "connect")
            assert live.stats()["requests"] == sent
            # Ejected: no more tries of it, every request served at once.
            for _ in range(5):
                post_ok(gw)
            m = h.scrape(gw)
            assert rreq(m, dead, "connect") == 5 and retries(m, "connect") == 5, \
                (rreq(m, dead, "connect"), retries(m, "connect"))
            assert "ejected" in h.stderr_text(gw)
            assert rstreams(m, dead) == 0 and rstreams(m, live.url) == 0, "slot leaked"


def test_pool_access_log_names_the_replica_and_the_tries():
    dead = "http://%s:%d" % (h.HOST, h.closed_port())
    log = h.tmpfile("access", ".log")
    with Stub("live") as live:
        cfg = pool_config([dead, live.url], workers=1, balance="round_robin",
                          access_log=log)
        with Gateway(cfg) as gw:
            for _ in range(4):
                post_ok(gw)
            lines = h.wait_access_lines(log, 4)
            for ln in lines:
                assert "replica" in ln and "tries" in ln, ln
                assert ln["replica"] == live.url, ln
            # round robin from the dead one: dead+live, live, dead+live, live
            assert [ln["tries"] for ln in lines] == [2, 1, 2, 1], lines


@h.skip_under("valgrind")
def test_pool_busy_head_moves_the_request_and_marks_the_replica_busy():
    body = b'{"error":{"message":"busy","type":"server_error","code":"busy"}}'
    with RawUpstream(busy_handler(body, retry_after=5)) as raw, Stub("live") as live:
        # round robin, one worker: the first request goes to the first replica
        cfg = pool_config([raw.url, live.url], workers=1, balance="round_robin")
        with Gateway(cfg) as gw:
            t0 = time.monotonic()
            post_ok(gw)
            t1 = time.monotonic()     # the busy mark was set before this
            assert len(raw_posts(raw)) == 1, "busy replica got %d requests" % len(raw.requests)
            m = h.scrape(gw)
            assert retries(m, "busy") == 1, retries(m, "busy")
            assert rreq(m, raw.url, "503") == 1, m.series("sluice_replica_requests_total")
            # Busy for 5 s: it takes no try, the other replica serves.
            k = 0
            while time.monotonic() - t0 < 3.5 and k < 6:
                post_ok(gw)
                k += 1
            assert time.monotonic() - t0 < 4.5, "too slow to test the busy window"
            assert len(raw_posts(raw)) == 1, \
                "busy replica (Retry-After: 5) was tried again within %.1fs" % (
                    time.monotonic() - t0)
            assert live.stats()["requests"] == 1 + k
            assert retries(h.scrape(gw), "busy") == 1
            # Past the mark it is tried again (and moved again: still busy).
            time.sleep(max(0.0, 5.3 - (time.monotonic() - t1)))
            for _ in range(2):
                post_ok(gw)
            assert len(raw_posts(raw)) == 2, "replica not tried again after its busy mark"
            assert retries(h.scrape(gw), "busy") == 2


class BusyOnce:
    """A replica whose first POST is refused with `status` and a
    Retry-After of `retry_after` (bytes: seconds or an HTTP-date), and whose
    later POSTs and every GET (health) are answered 200."""

    def __init__(self, retry_after, status=b"429 Too Many Requests"):
        self.retry_after = retry_after
        self.status = status
        self.raw = RawUpstream(self.handle)

    def handle(self, sock, req):
        if req.startswith(b"POST ") and len(raw_posts(self.raw)) == 1:
            body = b'{"error":{"message":"busy","type":"server_error","code":"busy"}}'
            head = b"HTTP/1.1 " + self.status + b"\r\nRetry-After: " + self.retry_after
        else:
            body = b'{"ok":true}'
            head = b"HTTP/1.1 200 OK"
        sock.sendall(head + b"\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)

    def __enter__(self):
        self.raw.__enter__()
        self.url = self.raw.url
        return self

    def __exit__(self, *exc):
        return self.raw.__exit__(*exc)

    def posts(self):
        return len(raw_posts(self.raw))


def busy(gw, url):
    return h.scrape(gw).value("sluice_replica_busy", upstream="main", replica=url)


def test_pool_a_day_long_retry_after_marks_the_replica_busy_for_busy_max_at_most():
    # Issue 22: one "Retry-After: 86400" kept a replica out for a day and
    # every client got 503 with Retry-After: 86398.
    with BusyOnce(b"86400") as rep:
        with Gateway(pool_config([rep.url], workers=1)) as gw:
            r = post(gw, events=1)
            assert r.status == 429 and rep.posts() == 1, (r.status, rep.posts())
            assert busy(gw, rep.url) == 1
            r = post(gw, events=1)
            assert_error(r, 503, "upstream_unavailable", read=False)
            ra = int(r.header("retry-after") or 0)
            assert 25 <= ra <= 30, \
                "Retry-After %r: the busy mark is capped at busy_max (30 s)" % (
                    r.header("retry-after"),)
            assert rep.posts() == 1


@h.skip_under("valgrind")
def test_pool_a_busy_mark_ends_after_busy_max():
    with BusyOnce(b"86400") as rep:
        with Gateway(pool_config([rep.url], workers=1, busy_max="2s")) as gw:
            t0 = time.monotonic()
            r = post(gw, events=1)
            assert r.status == 429 and rep.posts() == 1, (r.status, rep.posts())
            r = post(gw, events=1)
            assert_error(r, 503, "upstream_unavailable", read=False)
            assert r.header("retry-after") in ("1", "2"), r.headers
            h.wait_metric(gw, "sluice_replica_busy", 0, timeout=5.0, upstream="main",
                          replica=rep.url)
            assert time.monotonic() - t0 >= 2.0, "busy mark ended before busy_max"
            r = post(gw, events=1)
            assert r.status == 200 and rep.posts() == 2, (r.status, rep.posts())


def test_pool_retry_after_as_an_http_date_marks_the_replica_busy():
    when = email.utils.formatdate(time.time() + 20, usegmt=True).encode()
    with BusyOnce(when, status=b"503 Service Unavailable") as rep:
        with Gateway(pool_config([rep.url], workers=1)) as gw:
            r = post(gw, events=1)
            assert r.status == 503 and rep.posts() == 1, (r.status, rep.posts())
            assert busy(gw, rep.url) == 1, "Retry-After: %s made no busy mark" % when
            r = post(gw, events=1)
            assert_error(r, 503, "upstream_unavailable", read=False)
            ra = int(r.header("retry-after") or 0)
            assert 15 <= ra <= 20, "Retry-After %r for a date 20 s ahead" % ra
            assert rep.posts() == 1


def test_pool_a_good_health_probe_clears_a_busy_mark():
    with BusyOnce(b"86400") as rep:
        cfg = pool_config([rep.url], workers=1,
                          health={"path": "/health", "interval": "100ms",
                                  "timeout": "80ms", "fall": 1, "rise": 1})
        with Gateway(cfg) as gw:
            r = post(gw, events=1)
            assert r.status == 429 and rep.posts() == 1, (r.status, rep.posts())
            h.wait_metric(gw, "sluice_replica_busy", 0, upstream="main", replica=rep.url)
            r = post(gw, events=1)
            assert r.status == 200 and rep.posts() == 2, (r.status, rep.posts())


def test_pool_a_reload_clears_the_busy_mark_of_a_replica_it_keeps():
    with BusyOnce(b"86400") as rep:
        with Gateway(pool_config([rep.url], workers=1), allow_worker_changes=True) as gw:
            r = post(gw, events=1)
            assert r.status == 429 and busy(gw, rep.url) == 1, r.status
            h.reload(gw)
            assert busy(gw, rep.url) == 0
            r = post(gw, events=1)
            assert r.status == 200 and rep.posts() == 2, (r.status, rep.posts())


def test_pool_every_replica_busy_gives_the_client_the_last_head():
    b1 = b'{"error":{"message":"first busy","type":"server_error","code":"one"}}'
    b2 = b'{"error":{"message":"second busy","type":"server_error","code":"two"}}'
    with RawUpstream(busy_handler(b1, 5)) as r1, RawUpstream(busy_handler(b2, 7)) as r2:
        cfg = pool_config([r1.url, r2.url], workers=1, balance="round_robin")
        with Gateway(cfg) as gw:
            r = post(gw)
            assert r.status == 503, (r.status, bytes(r.data[:300]))
            assert bytes(r.data) == b2, "client got %r, not the last replica's body" % (
                bytes(r.data[:300]),)
            assert r.header("retry-after") == "7", r.headers
            assert len(raw_posts(r1)) == 1 and len(raw_posts(r2)) == 1, \
                (len(r1.requests), len(r2.requests))
            m = h.scrape(gw)
            assert retries(m, "busy") == 1, retries(m, "busy")


def test_pool_empty_response_is_not_retried_by_default():
    with RawUpstream(lambda sock, req: None) as raw, Stub("live") as live:
        cfg = pool_config([raw.url, live.url], workers=1, balance="round_robin")
        with Gateway(cfg) as gw:
            r = post(gw, events=3, interval=0)
            assert_error(r, 502, "upstream_unreachable", read=False)
            assert len(raw.requests) == 1 and len(raw_posts(raw)) == 1, raw.requests
            assert live.stats()["requests"] == 0, "the prompt ran twice"
            m = h.scrape(gw)
            assert retries(m, "empty") == 0
            assert rreq(m, raw.url, "reset") == 1, m.series("sluice_replica_requests_total")


def test_pool_empty_response_is_retried_with_empty_in_retry_on():
    with RawUpstream(lambda sock, req: None) as raw, Stub("live") as live:
        cfg = pool_config([raw.url, live.url], workers=1, balance="round_robin",
                          retry_on=["connect", "busy", "empty"])
        with Gateway(cfg) as gw:
            post_ok(gw)
            assert len(raw_posts(raw)) == 1, raw.requests
            assert live.stats()["requests"] == 1
            m = h.scrape(gw)
            assert retries(m, "empty") == 1, m.series("sluice_upstream_retries_total")


def test_pool_no_retry_once_bytes_reached_the_client():
    part = b'data: {"partial":true}\n\n'

    def handler(sock, req):
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n"
                     + b"%x\r\n" % len(part) + part + b"\r\n")
        time.sleep(0.3)
        h.close_rst(sock)

    with RawUpstream(handler) as raw, Stub("live") as live:
        cfg = pool_config([raw.url, live.url], workers=1, balance="round_robin",
                          retry_on=["connect", "busy", "empty"])
        with Gateway(cfg) as gw:
            c, r = gw.open_stream(events=3, interval=0)
            assert r.status == 200
            data = r.read_all(timeout=10)
            assert r.cut and not r.complete, "stream not visibly cut"
            # What arrived, the failure told (sluice.8), and no second try.
            assert data == part + h.failure_event("chat", "connection reset"), data
            assert len(raw_posts(raw)) == 1
            assert live.stats()["requests"] == 0, "retried after bytes reached the client"
            m = h.scrape(gw)
            assert sum(retries(m, k) for k in ("connect", "busy", "empty")) == 0
            h.wait_until(lambda: rstreams(h.scrape(gw), raw.url) == 0, 5,
                         msg="the cut stream's replica slot back")


def test_pool_failures_must_be_consecutive_to_eject():
    """A success between failures clears the count (eject.failures: 5)."""
    ok = b'{"ok":true}'

    def handler(sock, req):
        if b"x-test-fail: 1" in req.lower():
            return        # close without a response
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(ok) + ok)

    with RawUpstream(handler) as raw:
        cfg = pool_config([raw.url], workers=1,
                          eject={"failures": 5, "duration": "30s", "max_percent": 100})
        with Gateway(cfg) as gw:
            def one(fail):
                hd = dict(CT)
                if fail:
                    hd["X-Test-Fail"] = "1"
                return gw.request("POST", "/v1/chat/completions", hd, h.stream_body())
            for fail in [1, 1, 1, 1, 0, 1, 1, 1, 1]:
                r = one(fail)
                assert r.status == (502 if fail else 200), (fail, r.status, bytes(r.data[:200]))
            m = h.scrape(gw)
            assert ejected(m, raw.url) == 0, \
                "ejected after 4 failures, a success, 4 failures (failures: 5)"
            r = one(0)
            assert r.status == 200, (r.status, bytes(r.data[:300]))


def test_pool_replica_requests_total_counts_response_statuses():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = pool_config([s1.url, s2.url], workers=2)
        with Gateway(cfg) as gw:
            for _ in range(6):
                post_ok(gw)
            post(gw, status=500, events=1)
            m = h.scrape(gw)
            got = {u: {dict(lb)["code"]: v for lb, v in
                       m.series("sluice_replica_requests_total").items()
                       if dict(lb)["replica"] == u} for u in (s1.url, s2.url)}
            assert rreq(m, s1.url, "200") + rreq(m, s2.url, "200") == 6, got
            assert rreq(m, s1.url, "500") + rreq(m, s2.url, "500") == 1, got
            assert rreq_all(m, s1.url) == s1.stats()["requests"], (got, s1.stats())
            assert rreq_all(m, s2.url) == s2.stats()["requests"], (got, s2.stats())


def test_pool_5xx_heads_count_toward_ejection():
    """eject.failures counts 5xx heads too, not only connect errors and resets."""
    with Stub("r1") as s1:
        cfg = pool_config([s1.url], workers=1,
                          eject={"failures": 5, "duration": "30s", "max_percent": 100})
        with Gateway(cfg) as gw:
            for i in range(5):
                r = post(gw, status=500, events=1)
                assert r.status == 500, (i, r.status, bytes(r.data[:200]))
            m = h.scrape(gw)
            assert ejected(m, s1.url) == 1, \
                "not ejected after 5 consecutive 500 heads (eject.failures: 5): %r" % (
                    m.series("sluice_replica_requests_total"),)
            r = post(gw, events=1)
            assert_error(r, 503, "upstream_unavailable", read=False)
            assert s1.stats()["requests"] == 5


def test_pool_retries_zero_answers_the_connect_failure():
    dead = "http://%s:%d" % (h.HOST, h.closed_port())
    with Stub("live") as live:
        cfg = pool_config([dead, live.url], workers=1, balance="round_robin", retries=0)
        with Gateway(cfg) as gw:
            r = post(gw, events=1)
            assert_error(r, 502, "upstream_unreachable", read=False)
            assert live.stats()["requests"] == 0
            post_ok(gw)     # round robin: the live one next
            m = h.scrape(gw)
            assert retries(m, "connect") == 0
            assert rreq(m, dead, "connect") == 1


def test_pool_max_percent_keeps_part_of_the_pool_in():
    d1 = "http://%s:%d" % (h.HOST, h.closed_port())
    d2 = "http://%s:%d" % (h.HOST, h.closed_port())
    with Stub("live") as live:
        cfg = pool_config([d1, d2, live.url], workers=1)   # max_percent 50: 1 of 3 out
        with Gateway(cfg) as gw:
            for _ in range(40):
                post_ok(gw)
                m = h.scrape(gw)
                if rreq(m, d1, "connect") + rreq(m, d2, "connect") >= 14:
                    break
            m = h.scrape(gw)
            out = [u for u in (d1, d2) if ejected(m, u) == 1]
            assert len(out) == 1, "ejected %r (max_percent 50 of 3 replicas: exactly 1); " \
                "connect tries %r" % (out, (rreq(m, d1, "connect"), rreq(m, d2, "connect")))
            assert ejected(m, live.url) == 0


def test_pool_all_ejected_retry_after_is_the_time_left():
    dead = "http://%s:%d" % (h.HOST, h.closed_port())
    with Gateway(pool_config([dead], workers=1,
                             eject={"failures": 2, "duration": "20s",
                                    "max_percent": 100})) as gw:
        for _ in range(2):
            r = post(gw, events=1)
            assert_error(r, 502, "upstream_unreachable", read=False)
        r = post(gw, events=1)
        assert_error(r, 503, "upstream_unavailable", read=False)
        ra = int(r.header("retry-after") or 0)
        assert 15 <= ra <= 20, "Retry-After %r, ejection ends in ~20 s" % r.header("retry-after")


def test_pool_random_balance_follows_weights():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = pool_config([{"url": s1.url, "weight": 1}, {"url": s2.url, "weight": 3}],
                          workers=2, balance="random")
        with Gateway(cfg) as gw:
            n = 80
            for _ in range(n):
                post_ok(gw, events=1)
            a, b = s1.stats()["requests"], s2.stats()["requests"]
            assert a + b == n
            # weight 3 of 4: 60 expected; 5 sigma is ~19
            assert 42 <= b <= 76 and a >= 4, (a, b)


def test_pool_url_alone_is_a_pool_of_one_in_the_metrics():
    with Stub() as stub, Gateway(stub=stub, admin_listen="%s:%d" % (
            h.HOST, h.free_port())) as gw:
        c, r = gw.open_stream(events=50, interval=100)
        assert r.status == 200
        h.wait_until(lambda: rstreams(h.scrape(gw), stub.url) == 1, 5,
                     msg="replica_streams 1 for the url: upstream")
        m = h.scrape(gw)
        assert m.get("sluice_replica_up", upstream="main", replica=stub.url) == 1
        assert ejected(m, stub.url) == 0
        c.close()
        h.wait_until(lambda: rstreams(h.scrape(gw), stub.url) == 0, 5,
                     msg="replica_streams back to 0")


def test_pool_malformed_head_is_502_not_retried_and_leaks_no_slot():
    def handler(sock, req):
        sock.sendall(b"HTTP/1.1 2xx Nonsense\r\nthis is not a header\r\n\r\n")

    with RawUpstream(handler) as raw, Stub("live") as live:
        cfg = pool_config([raw.url, live.url], workers=1, balance="round_robin",
                          retry_on=["connect", "busy", "empty"])
        with Gateway(cfg) as gw:
            r = post(gw, events=1)
            assert_error(r, 502, "upstream_unreachable", read=False)
            assert len(raw_posts(raw)) == 1
            assert live.stats()["requests"] == 0
            m = h.scrape(gw)
            assert rstreams(m, raw.url) == 0 and rstreams(m, live.url) == 0
            h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")
            post_ok(gw)


def test_pool_silent_replica_is_504_not_retried_and_leaks_no_slot():
    with Stub("silent") as s1, Stub("live") as live:
        cfg = pool_config([s1.url, live.url], workers=1, balance="round_robin")
        cfg["timeouts"] = {"upstream_first_byte": "1s"}
        with Gateway(cfg) as gw:
            r = post(gw, hang=True, tag="hang", timeout=15)
            assert_error(r, 504, "upstream_timeout", read=False)
            assert s1.tag("hang")["requests"] == 1
            assert live.stats()["requests"] == 0, "a timed-out prompt was sent again"
            m = h.scrape(gw)
            assert rstreams(m, s1.url) == 0 and rstreams(m, live.url) == 0
            assert sum(retries(m, k) for k in ("connect", "busy", "empty")) == 0
            assert rreq(m, s1.url, "timeout") == 1, m.series("sluice_replica_requests_total")


# ------------------------------------------------------------------ capacity

def test_pool_all_replicas_at_cap_answers_503_upstream_unavailable():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = pool_config([{"url": s1.url, "max_streams": 1},
                           {"url": s2.url, "max_streams": 1}], workers=2)
        with Gateway(cfg) as gw:
            held = []
            try:
                for _ in range(2):
                    c, r = gw.open_stream(events=120, interval=500, timeout=20)
                    assert r.status == 200, r.status
                    held.append(c)
                assert s1.stats()["inflight"] == 1 and s2.stats()["inflight"] == 1
                r = post(gw, events=1)
                assert_error(r, 503, "upstream_unavailable", read=False)
                ra = r.header("retry-after")
                assert ra is not None and int(ra) >= 1, r.headers
                assert s1.stats()["requests"] + s2.stats()["requests"] == 2
                # The refused request kept no tenant slot.
                h.wait_metric(gw, "sluice_tenant_streams", 2, tenant="acme")
            finally:
                close_all(held)
            h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")
            post_ok(gw)


def test_pool_503_upstream_unavailable_is_logged_rejected_as_sluice_8_says():
    log = h.tmpfile("access", ".log")
    with Stub("r1") as s1:
        cfg = pool_config([{"url": s1.url, "max_streams": 1}], workers=1, access_log=log)
        with Gateway(cfg) as gw:
            c, r = gw.open_stream(events=120, interval=500, timeout=20)
            try:
                assert r.status == 200, r.status
                r = post(gw, events=1)
                assert_error(r, 503, "upstream_unavailable", read=False)
                ln = h.wait_access_lines(log, 1)[0]
                assert (ln["status"], ln["end"]) == (503, "rejected"), ln
            finally:
                c.close()
    src = os.environ.get("SLUICE_SRCDIR") or os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(src, "man", "sluice.8")) as f:
        man = f.read()
    item = man.split(".It Cm rejected\n", 1)[1].split(".It Cm ", 1)[0]
    assert "503" in item and "upstream_unavailable" in item, \
        "sluice.8's `end: rejected` omits the 503 upstream_unavailable: %r" % item


# ------------------------------------------------------------------ crash

@h.timeout(120)
def test_pool_killed_worker_gives_its_replica_slots_back():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = pool_config([s1.url, s2.url], workers=2)
        with Gateway(cfg, allow_worker_changes=True) as gw:
            held = []
            try:
                for _ in range(12):
                    c, r = gw.open_stream(events=120, interval=500, timeout=20)
                    assert r.status == 200, r.status
                    held.append(c)
                owners = {c: owner_of(gw, c) for c in held}
                assert None not in owners.values(), owners
                by = {}
                for c, w in owners.items():
                    by.setdefault(w, []).append(c)
                victim = max(by, key=lambda w: len(by[w]))
                survivors = [c for c in held if owners[c] != victim]
                urls = (s1.url, s2.url)
                m = h.scrape(gw)
                assert sum(rstreams(m, u) for u in urls) == 12, \
                    {u: rstreams(m, u) for u in urls}
                h.kill_pid(victim)
                h.wait_until(lambda: sum(rstreams(h.scrape(gw), u) for u in urls)
                             == len(survivors), 10, interval=0.1,
                             msg="replica streams back to the survivor's %d" % len(survivors))
                h.wait_until(lambda: h.scrape(gw).value("sluice_tenant_streams",
                                                        tenant="acme") == len(survivors),
                             10, interval=0.1, msg="tenant streams reclaimed")
            finally:
                close_all(held)
            h.wait_until(lambda: all(rstreams(h.scrape(gw), u) == 0 for u in urls), 10,
                         interval=0.1, msg="replica streams 0 after the streams ended")
            gw.wait_workers(2, timeout=10, exclude=[victim])
            for _ in range(4):
                post_ok(gw)


# ------------------------------------------------------------------ reload

@h.timeout(120)
def test_pool_reload_removing_a_replica_finishes_its_streams_and_sends_it_nothing():
    with Stub("keep") as a, Stub("gone") as b:
        cfg = pool_config([a.url, b.url], workers=2, drain_timeout="15s")
        with Gateway(cfg, allow_worker_changes=True) as gw:
            streams = []
            try:
                for _ in range(4):
                    c, r = gw.open_stream(events=20, interval=100, timeout=20, tag="old")
                    assert r.status == 200
                    streams.append((c, r))
                assert b.tag("old")["inflight"] == 2 and a.tag("old")["inflight"] == 2, \
                    (a.tag("old"), b.tag("old"))
                cfg2 = pool_config([a.url], workers=2, drain_timeout="15s")
                cfg2["listen"], cfg2["admin_listen"] = cfg["listen"], cfg["admin_listen"]
                h.reload(gw, cfg2)
                b_before = b.stats()["requests"]
                for _ in range(6):
                    post_ok(gw, tag="new")
                assert b.stats()["requests"] == b_before, "removed replica took a new request"
                assert a.tag("new")["requests"] == 6
                for c, r in streams:
                    body = r.read_all(timeout=20)
                    assert r.complete and body == expected_events(20), \
                        "a stream in flight was cut by the reload"
                assert b.tag("old")["completed"] == 2, b.tag("old")
                m = h.scrape(gw)
                assert m.get("sluice_replica_streams", upstream="main", replica=b.url) is None
            finally:
                close_all(c for c, _ in streams)


def test_pool_reload_keeps_the_counters_of_replicas_that_stay():
    dead = "http://%s:%d" % (h.HOST, h.closed_port())
    with Stub("r1") as a, Stub("r2") as b:
        def cfg_of(reps, base=None):
            cfg = pool_config(reps, workers=1, balance="round_robin",
                              eject={"failures": 0})
            if base is not None:
                cfg["listen"] = base["listen"]
                cfg["admin_listen"] = base["admin_listen"]
            return cfg
        cfg = cfg_of([dead, a.url, b.url])
        with Gateway(cfg, allow_worker_changes=True) as gw:
            for _ in range(6):
                post_ok(gw)
            m = h.scrape(gw)
            before = rreq(m, dead, "connect")
            assert before == 2, m.series("sluice_replica_requests_total")
            assert retries(m, "connect") == 2
            h.reload(gw, cfg_of([dead, a.url], base=cfg))
            m = h.scrape(gw)
            assert rreq(m, dead, "connect") == before, \
                "a reload reset the counters of a replica that stays: %r" % (
                    m.series("sluice_replica_requests_total"),)
            assert retries(m, "connect") == 2
            post_ok(gw)
            post_ok(gw)
            m = h.scrape(gw)
            assert rreq(m, dead, "connect") == before + 1, m.series(
                "sluice_replica_requests_total")


def test_pool_reload_adding_a_replica_sends_it_new_streams():
    with Stub("a") as a, Stub("b") as b:
        cfg = pool_config([a.url], workers=1, balance="round_robin")
        with Gateway(cfg, allow_worker_changes=True) as gw:
            for _ in range(3):
                post_ok(gw)
            cfg2 = pool_config([a.url, b.url], workers=1, balance="round_robin")
            cfg2["listen"], cfg2["admin_listen"] = cfg["listen"], cfg["admin_listen"]
            h.reload(gw, cfg2)
            for _ in range(6):
                post_ok(gw)
            assert (a.stats()["requests"], b.stats()["requests"]) == (6, 3)
            m = h.scrape(gw)
            assert m.get("sluice_replica_streams", upstream="main", replica=b.url) == 0


# ------------------------------------------------------------ active probes

class ToggleReplica:
    """A replica on 127.0.0.1 whose GET /health answers `health` (settable
    while it runs) and which answers every POST with a small JSON 200,
    counting them. Threaded, loopback, stopped by the test."""

    def __init__(self, health=200):
        self.health = health
        self.posts = 0
        self.probes = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, body):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                with outer._lock:
                    outer.probes += 1
                    st = outer.health
                self._send(st, b'{"status":"%d"}' % st)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                with outer._lock:
                    outer.posts += 1
                self._send(200, json.dumps({"replica": "toggle"}).encode())

        self.server = http.server.ThreadingHTTPServer((h.HOST, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://%s:%d" % (h.HOST, self.port)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)

    def set(self, status):
        with self._lock:
            self.health = status

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


HEALTH = {"path": "/health", "interval": "100ms", "timeout": "80ms", "fall": 2, "rise": 2}


def up_of(gw, url):
    return h.scrape(gw).get("sluice_replica_up", upstream="main", replica=url)


@h.timeout(60)
def test_pool_health_probe_takes_a_failing_replica_out_and_brings_it_back():
    with ToggleReplica() as a, ToggleReplica() as b, \
            Gateway(pool_config([a.url, b.url], balance="round_robin",
                                health=HEALTH)) as gw:
        h.wait_until(lambda: a.probes >= 2 and b.probes >= 2, 10, msg="probes to run")
        assert up_of(gw, a.url) == 1 and up_of(gw, b.url) == 1
        b.set(500)
        h.wait_until(lambda: up_of(gw, b.url) == 0, 10, msg="b to be marked down")
        before = b.posts
        for _ in range(6):
            r = gw.request("POST", "/v1/chat/completions", CT, b"{}", timeout=10)
            assert r.status == 200, r.status
        assert b.posts == before, "a replica down by probe was sent %d request(s)" % (
            b.posts - before)
        assert a.posts >= 6
        assert "replica %s is down: health answered 500" % b.url in gw.stderr_tail(20000)
        b.set(200)
        h.wait_until(lambda: up_of(gw, b.url) == 1, 10, msg="b to come back after rise probes")
        for _ in range(4):
            assert gw.request("POST", "/v1/chat/completions", CT, b"{}",
                              timeout=10).status == 200
        assert b.posts == before + 2, "round robin over two up replicas: %d" % (
            b.posts - before)
        assert "replica %s is up" % b.url in gw.stderr_tail(20000)


@h.timeout(60)
def test_pool_replica_answering_503_on_health_is_loading_not_an_error():
    with ToggleReplica() as a, ToggleReplica(health=503) as b, \
            Gateway(pool_config([a.url, b.url], health=HEALTH)) as gw:
        h.wait_until(lambda: up_of(gw, b.url) == 0, 10, msg="b to be out while loading")
        log = gw.stderr_tail(20000)
        assert "info: upstream main: replica %s is loading" % b.url in log, log
        assert "replica %s is down" % b.url not in log, log
        for _ in range(4):
            assert gw.request("POST", "/v1/chat/completions", CT, b"{}",
                              timeout=10).status == 200
        assert b.posts == 0


@h.timeout(60)
def test_pool_every_replica_down_by_probe_answers_503_with_interval_times_rise():
    with ToggleReplica(health=500) as a, \
            Gateway(pool_config([a.url], health=dict(HEALTH, interval="1s", timeout="500ms",
                                                      fall=1, rise=3))) as gw:
        h.wait_until(lambda: up_of(gw, a.url) == 0, 10, msg="a to be marked down")
        r = gw.request("POST", "/v1/chat/completions", CT, b"{}", timeout=10)
        assert_error(r, 503, "upstream_unavailable", read=False)
        assert r.header("Retry-After") == "3", r.header("Retry-After")
        assert a.posts == 0
        assert h.scrape(gw).get("sluice_tenant_streams", tenant="acme") == 0


@h.timeout(90)
def test_pool_killed_replica_fails_no_unstarted_request_and_returns_after_rise():
    health = {"path": "/health", "interval": "200ms", "timeout": "150ms", "fall": 2,
              "rise": 2}
    with Stub("a") as a, Stub("b") as b, Stub("c") as c, \
            Gateway(pool_config([a.url, b.url, c.url], workers=2, health=health)) as gw:
        h.wait_until(lambda: all(up_of(gw, s.url) == 1 for s in (a, b, c)), 10,
                     msg="every replica up")
        # Six long streams: least_loaded puts two on each replica.
        streams = []
        for i in range(6):
            cl, r = gw.open_stream(events=40, interval=100, tag="long%d" % i, timeout=20)
            assert r.status == 200
            r.read_events(1, timeout=10)
            streams.append((i, cl, r))
        on_c = [i for i in range(6) if c.tag("long%d" % i)["inflight"] == 1]
        assert len(on_c) == 2, "least_loaded put %d of 6 streams on c" % len(on_c)
        port = c.port
        c.kill()
        # Streams that were streaming from c are cut visibly; the rest finish.
        for i, cl, r in streams:
            body = r.read_all(timeout=20)
            if i in on_c:
                assert r.cut and not r.complete, "stream %d from the killed replica " \
                    "did not look cut" % i
            else:
                assert r.complete and body == expected_events(40), "stream %d" % i
            cl.close()
        # Requests that had not started: served by the others, none fails.
        for _ in range(20):
            post_ok(gw)
        h.wait_until(lambda: up_of(gw, c.url) == 0, 10, msg="c marked down by its probes")
        # Restarted on its port: back after `rise` good probes, and used.
        c2 = Stub("c2", args=("-l", "%s:%d" % (h.HOST, port))).start()
        try:
            assert c2.url == c.url
            h.wait_until(lambda: up_of(gw, c.url) == 1, 10, msg="c back after rise probes")
            # Idle replicas tie and least_loaded draws among equals at
            # random: a returned replica gets its first request within a
            # few, and never is a bug (60 misses in a row: (2/3)^60).
            before = c2.stats()["requests"]
            for _ in range(60):
                post_ok(gw)
                if c2.stats()["requests"] > before:
                    break
            assert c2.stats()["requests"] > before, "the returned replica got no traffic"
        finally:
            c2.kill()
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")


@h.timeout(60)
def test_pool_busy_stub_moves_requests_and_loading_stub_gets_none():
    with Stub("ok") as ok, Stub("busy", args=("--busy", "--busy-retry-after", "30")) as busy, \
            Stub("loading", args=("--slow-start", "60")) as loading, \
            Gateway(pool_config([busy.url, loading.url, ok.url], balance="round_robin",
                                # Probes far apart: a good probe of the busy
                                # stub (its /health answers 200) ends its mark.
                                health={"path": "/health", "interval": "20s",
                                        "timeout": "1s", "fall": 1, "rise": 1})) as gw:
        h.wait_until(lambda: up_of(gw, loading.url) == 0, 10, msg="loading replica out")
        for _ in range(6):
            post_ok(gw)
        st = busy.stats()
        assert st["busy_rejected"] == 1, "busy replica asked %d times (marked busy for 30 s " \
            "after the first 503)" % st["busy_rejected"]
        assert loading.stats()["requests"] == 0
        assert ok.stats()["requests"] == 6
        m = h.scrape(gw)
        assert retries(m, "busy") == 1
        assert rreq(m, busy.url, "503") == 1


@h.timeout(60)
def test_pool_stub_health_status_500_keeps_it_out_and_switching_it_brings_it_back():
    health = {"path": "/health", "interval": "100ms", "timeout": "80ms", "fall": 2, "rise": 2}
    with Stub("ok") as ok, Stub("sick", args=("--health-status", "500")) as sick, \
            Gateway(pool_config([ok.url, sick.url], health=health)) as gw:
        h.wait_until(lambda: up_of(gw, sick.url) == 0, 10, msg="sick replica out")
        assert up_of(gw, ok.url) == 1
        for _ in range(6):
            post_ok(gw)
        assert sick.stats()["requests"] == 0
        assert sick.stats()["health_requests"] >= 2
        sick._http("POST", "/stub/health?status=200")
        h.wait_until(lambda: up_of(gw, sick.url) == 1, 10, msg="replica back after rise")
        for _ in range(60):
            post_ok(gw)
            if sick.stats()["requests"] > 0:
                break
        assert sick.stats()["requests"] > 0, "the replica back up got no traffic"

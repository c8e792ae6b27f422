# SPDX-License-Identifier: BSD-2-Clause
"""Faults on either side: every one ends visibly and gives its slot back."""

import os
import select
import signal
import time

import harness as h
from harness import ACME_KEY, Gateway, Stub, assert_error, expected_events


def _short_ok(gw, key=ACME_KEY, tag=None):
    """A short stream on a fresh connection: (status, complete, body)."""
    r = gw.request("POST", "/v1/chat/completions",
                   dict(h.stub_headers(events=2, interval=0, tag=tag),
                        **{"Content-Type": "application/json"}), h.stream_body(), key=key)
    return r.status, r.complete, bytes(r.data)


def _admitted_within(gw, seconds, key=ACME_KEY):
    """The tenant's slot comes back within `seconds` (then a short stream
    completes): returns the statuses seen."""
    deadline = time.monotonic() + seconds
    seen = []
    while True:
        st, complete, body = _short_ok(gw, key)
        seen.append(st)
        if st == 200:
            assert complete and body == expected_events(2), "short stream broken"
            return seen
        assert st == 429, "unexpected status %d" % st
        if time.monotonic() > deadline:
            raise AssertionError("slot not released within %.1fs: %r" % (seconds, seen))
        time.sleep(0.05)


def test_client_disconnect_aborts_upstream_and_frees_slot():
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"max_streams": 1}}) as gw:
        c, r = gw.open_stream(events=1000, interval=50, tag="gone")
        assert r.status == 200
        r.read_events(3, timeout=5)
        assert len(r.events) >= 3
        assert stub.tag("gone")["aborted_by_client"] == 0
        c.close()
        # (Not aborted, the stream would run 50 s more: 20 s tells them apart.)
        h.wait_until(lambda: stub.tag("gone")["aborted_by_client"] == 1, 20, interval=0.01,
                     msg="the stub to see the upstream connection closed")
        st = stub.tag("gone")
        assert st["completed"] == 0 and st["inflight"] == 0, st
        _admitted_within(gw, 1.0)


def test_client_reset_mid_stream_aborts_upstream_and_frees_slot():
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"max_streams": 1}}) as gw:
        c, r = gw.open_stream(events=1000, size=200, interval=20, tag="rst")
        assert r.status == 200
        r.read_events(2, timeout=5)
        c.close(rst=True)
        h.wait_until(lambda: stub.tag("rst")["aborted_by_client"] == 1, 1.0, interval=0.01,
                     msg="the stub to see the upstream connection closed")
        _admitted_within(gw, 1.0)


def test_dead_upstream_is_502_and_frees_slot():
    with Stub() as stub:
        dead = "http://127.0.0.1:%d" % h.closed_port()
        with Gateway(stub=stub, upstreams={"main": {"url": dead}},
                     tenants={"acme": {"max_streams": 1}}) as gw:
            # max_streams 1: a leaked slot would turn every later request into
            # a 429. A release racing the 502 may show a 429 for a moment.
            seen = []
            for _ in range(4):
                deadline = time.monotonic() + 5.0
                while True:
                    r = gw.request("POST", "/v1/chat/completions",
                                   {"Content-Type": "application/json"}, h.stream_body())
                    seen.append(r.status)
                    if r.status != 429:
                        break
                    assert time.monotonic() < deadline, \
                        "slot not released after a 502: %r" % seen
                    time.sleep(0.05)
                assert_error(r, 502, "upstream_unreachable", read=False)
            assert seen.count(502) == 4, seen
            assert stub.stats()["requests"] == 0


def test_upstream_abort_mid_stream_is_visibly_cut_and_frees_slot():
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"max_streams": 1}}) as gw:
        c, r = gw.open_stream(events=10, size=300, interval=20, abort_after=3, tag="abort")
        assert r.status == 200
        body = r.read_all(timeout=10)
        assert r.cut and not r.complete, "upstream abort not visible: terminating chunk sent"
        assert c.eof, "connection still open after an upstream cut"
        # What arrived, then the failure told as vLLM tells its own.
        assert body == b"".join(h.stub_event(i, 300) for i in range(3)) + \
            h.failure_event("chat", h.CUT_CLOSED), "relayed %r" % body[-200:]
        _admitted_within(gw, 1.0)


def test_upstream_first_byte_timeout_is_504_and_frees_slot():
    with Stub() as stub, Gateway(stub=stub, timeouts={"upstream_first_byte": "1s"},
                                 tenants={"acme": {"max_streams": 1}}) as gw:
        t0 = time.monotonic()
        c, r = gw.open_stream(hang=True, tag="hang", timeout=10)
        dt = time.monotonic() - t0
        assert_error(r, 504, "upstream_timeout")
        assert 0.8 <= dt, "504 after %.2fs with upstream_first_byte 1s" % dt
        h.wait_until(lambda: stub.tag("hang")["inflight"] == 0, 2,
                     msg="the gateway to drop the upstream request")
        c.close()
        _admitted_within(gw, 1.0)


def test_upstream_idle_timeout_cuts_stream():
    with Stub() as stub, Gateway(stub=stub, timeouts={"upstream_idle": "1s"},
                                 tenants={"acme": {"max_streams": 1}}) as gw:
        c, r = gw.open_stream(events=3, interval=5000, tag="idle", timeout=15)
        assert r.status == 200
        t0 = time.monotonic()
        body = r.read_all(timeout=15)
        dt = time.monotonic() - t0
        assert r.cut and not r.complete, "idle stream not visibly cut"
        # Cut before its second event (5 s later): the idle timeout, not
        # the end of the stream (the length check below).
        assert dt >= 0.8, "cut after %.1fs with upstream_idle 1s" % dt
        assert body == h.stub_event(0) + h.failure_event("chat", h.CUT_IDLE_1S), body
        h.wait_until(lambda: stub.tag("idle")["aborted_by_client"] == 1, 2,
                     msg="the stub to see its connection closed")
        _admitted_within(gw, 1.0)


def test_healthy_slow_stream_not_cut_by_idle_timeout():
    # Gaps shorter than upstream_idle never cut a stream, however long it is.
    with Stub() as stub, Gateway(stub=stub, timeouts={"upstream_idle": "1s"}) as gw:
        c, r = gw.open_stream(events=6, interval=500, timeout=15)
        body = r.read_all(timeout=15)
        assert r.complete and body == expected_events(6)


def test_oversized_headers_are_431():
    with Stub() as stub, Gateway(stub=stub, limits={"max_header_bytes": "4KiB"}) as gw:
        with h.Client(gw.port) as c:
            hd = dict(h.bearer(ACME_KEY), **{"X-Big": "a" * 8000})
            c.send("GET", "/v1/echo", hd)
            r = c.read_response()
            assert_error(r, 431, "headers_too_large")
        with h.Client(gw.port) as c:
            hd = [("X-F%d" % i, "v" * 100) for i in range(60)] + list(h.bearer(ACME_KEY).items())
            c.send("GET", "/v1/echo", hd)
            r = c.read_response()
            assert_error(r, 431, "headers_too_large")
        # Just under the limit is fine.
        r = gw.request("GET", "/v1/echo", {"X-Big": "b" * 3000})
        assert r.status == 200, r.status
        assert stub.stats()["requests"] == 1, stub.stats()


def test_garbage_is_400():
    with Stub() as stub, Gateway(stub=stub) as gw:
        for junk in (b"\x00\x01\x02garbage\xff\xfe\r\n\r\n",
                     b"GET /v1/models HTTP/9.9 nonsense\r\n\r\n",
                     b"this is not http at all\r\n\r\n",
                     b"POST /v1/echo HTTP/1.1\r\nContent-Length: abc\r\n\r\n"):
            with h.Client(gw.port) as c:
                c.send_raw(junk)
                r = c.read_response()
                assert_error(r, 400, "bad_request")
                assert c.wait_closed(3), "connection kept open after a 400 for %r" % junk
        assert stub.stats()["requests"] == 0


def test_incomplete_head_is_408_after_client_header():
    with Stub() as stub, Gateway(stub=stub, timeouts={"client_header": "1s"}) as gw:
        with h.Client(gw.port) as c:
            t0 = time.monotonic()
            c.send_raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bea")
            r = c.read_response(timeout=6)
            dt = time.monotonic() - t0
            assert_error(r, 408, "request_timeout")
            assert 0.8 <= dt, "408 after %.2fs with client_header 1s" % dt
            assert c.wait_closed(3), "connection kept open after a 408"
        assert stub.stats()["requests"] == 0


def test_client_header_counts_from_the_first_byte_on_a_kept_alive_connection():
    # Idle for longer than client_header between two requests is keepalive's
    # business; the next head then has client_header from its first byte,
    # not whatever is left of keepalive (it used to wait for that: 8 s here).
    with Stub() as stub, Gateway(stub=stub, timeouts={"client_header": "1s",
                                                      "keepalive": "10s"}) as gw:
        with h.Client(gw.port) as c:
            r = c.request("POST", "/v1/echo", h.bearer(ACME_KEY), b"one")
            assert r.status == 200 and r.json()["body"] == "one", r.status
            time.sleep(2.0)
            c.send_raw(b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nAuthor")
            time.sleep(0.3)
            c.send_raw(b"ization: Bearer %s\r\nContent-Length: 3\r\n\r\ntwo" %
                       ACME_KEY.encode())
            r = c.read_response(timeout=6)
            r.read_all(timeout=6)
            assert r.status == 200 and r.json()["body"] == "two", r.status
            time.sleep(2.0)
            t0 = time.monotonic()
            c.send_raw(b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nAuthor")
            r = c.read_response(timeout=9)
            dt = time.monotonic() - t0
            assert_error(r, 408, "request_timeout")
            assert 0.8 <= dt <= 4.0, "408 %.2fs after the head's first byte" % dt
            assert c.wait_closed(3), "connection kept open after a 408"
        assert stub.stats()["requests"] == 2


@h.timeout(60)
def test_trickled_body_is_408_after_client_body_and_frees_the_slot():
    # One byte of body every 0.3 s keeps client_header (the pause bound)
    # from firing; client_body bounds the whole body, so the slot comes back.
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"max_streams": 1}},
                                 timeouts={"client_header": "2s",
                                           "client_body": "1500ms"}) as gw:
        with h.Client(gw.port) as c:
            c.send_raw(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                        "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                        "Expect: 100-continue\r\n"
                        "Content-Length: 1000\r\n\r\n" % ACME_KEY).encode())
            t0 = time.monotonic()
            # 100 Continue says it was admitted: the one slot is held, so a
            # second request gets 429.
            deadline = time.monotonic() + 10
            assert c._readline(deadline).startswith(b"HTTP/1.1 100 ")
            assert c._readline(deadline) == b""
            r2 = gw.request("POST", "/v1/chat/completions",
                            dict(h.bearer(ACME_KEY), **{"Content-Type": "application/json"}),
                            h.stream_body())
            assert_error(r2, 429, "concurrency_limit_exceeded")
            sent = 0
            while time.monotonic() - t0 < 1.3:
                c.send_raw(b"{")
                sent += 1
                time.sleep(0.3)
            r = c.read_response(timeout=6)
            dt = time.monotonic() - t0
            assert_error(r, 408, "request_timeout")
            assert 1.3 <= dt, "408 after %.2fs with client_body 1.5s" % dt
            assert c.wait_closed(3), "connection kept open after a 408"
        r3 = gw.request("POST", "/v1/chat/completions",
                        dict(h.stub_headers(events=2, interval=0),
                             **{"Content-Type": "application/json"}), h.stream_body())
        assert r3.status == 200 and r3.complete, "slot not freed after the 408: %d" % r3.status
        assert stub.stats()["requests"] == 1


def test_silent_connection_closed_after_client_header():
    # A connection that never sends a byte is an incomplete head too.
    with Stub() as stub, Gateway(stub=stub, timeouts={"client_header": "1s"}) as gw:
        with h.Client(gw.port) as c:
            t0 = time.monotonic()
            assert c.wait_closed(6), "silent connection never closed"
            dt = time.monotonic() - t0
            assert 0.7 <= dt, "closed after %.2fs with client_header 1s" % dt


def test_body_over_max_body_bytes_is_413():
    with Stub() as stub, Gateway(stub=stub, limits={"max_body_bytes": "1KiB"}) as gw:
        with h.Client(gw.port) as c:
            r = h.send_head_then_body(c, "POST", "/v1/echo", h.bearer(ACME_KEY), b"y" * 5000)
            assert_error(r, 413, "request_too_large")
        r = gw.request("POST", "/v1/echo", body=b"z" * 1000)
        assert r.status == 200 and r.json()["body"] == "z" * 1000, r.status
        assert stub.stats()["requests"] == 1


def test_idle_keepalive_connection_is_closed():
    with Stub() as stub, Gateway(stub=stub, timeouts={"keepalive": "1s"}) as gw:
        with h.Client(gw.port) as c:
            r = c.request("GET", "/v1/echo", h.bearer(ACME_KEY))
            assert r.status == 200 and r.complete
            t0 = time.monotonic()
            assert c.wait_closed(6), "idle keep-alive connection not closed"
            dt = time.monotonic() - t0
            assert 0.7 <= dt, "closed after %.2fs with keepalive 1s" % dt


@h.timeout(90)
def test_kill_9_of_every_worker_replaces_them_and_reclaims_slots():
    N = 4
    with Stub() as stub, Gateway(stub=stub, workers=2, allow_worker_changes=True,
                                 tenants={"acme": {"max_streams": N}}) as gw:
        held = []
        for _ in range(N):
            c, r = gw.open_stream(events=100000, interval=100, tag="held")
            assert r.status == 200
            held.append((c, r))
        c, r = gw.open_stream(events=1, interval=0)
        assert_error(r, 429, "concurrency_limit_exceeded")
        c.close()
        old = gw.worker_pids()
        assert len(old) == 2, old
        for w in old:
            os.kill(w, signal.SIGKILL)
        new = gw.wait_workers(2, timeout=10, exclude=old)
        assert not set(new) & set(old), (old, new)
        for c, r in held:
            r.read_all(timeout=5)
            assert r.cut and not r.complete, "held stream not cut by the worker's death"
            assert c.eof
        # The master reclaims the dead workers' slots (a moment of
        # under-admission is allowed by the design, over-admission never).
        fresh = [gw.admit(within=2.0, events=100000, interval=100, tag="fresh")[0]
                 for _ in range(N)]
        c, r = gw.open_stream(events=1, interval=0)
        assert_error(r, 429, "concurrency_limit_exceeded")
        assert stub.tag("fresh")["inflight"] == N
        for c in fresh:
            c.close()
        h.wait_until(lambda: stub.tag("fresh")["aborted_by_client"] == N, 3,
                     msg="fresh streams aborted at the stub")


def test_upstream_short_json_body_is_visibly_cut():
    # The runner sends a head with the full Content-Length, then closes.
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"max_streams": 1}}) as gw:
        with h.Client(gw.port) as c:
            c.send("POST", "/v1/chat/completions",
                   dict(h.bearer(ACME_KEY), **h.stub_headers(events=50, abort_after=0)),
                   h.stream_body(stream=False))
            try:
                r = c.read_response()
            except h.StreamCut:
                r = None            # closed before any head: also visibly cut
            if r is not None:
                r.read_all(timeout=10)
                assert r.cut and not r.complete, \
                    "truncated upstream body relayed as complete (status %d)" % r.status
            assert c.eof
        _admitted_within(gw, 1.0)


def test_slow_head_within_first_byte_timeout_is_served():
    with Stub() as stub, Gateway(stub=stub, timeouts={"upstream_first_byte": "1s"}) as gw:
        c, r = gw.open_stream(events=3, interval=0, delay=400, timeout=10)
        assert r.status == 200, r.status
        assert r.read_all() == expected_events(3) and r.complete


def _served_connection(gw, timeout=2.0):
    """A keep-alive connection that was served a request (so the worker has
    counted it). Connections closed just before (e.g. the harness's
    readiness probe) may still count for a moment: retry on 503."""
    deadline = time.monotonic() + timeout
    while True:
        c = h.Client(gw.port)
        c.send("GET", "/v1/echo", h.bearer(ACME_KEY))
        try:
            r = c.read_response(timeout=5)
            r.read_all()
            status = r.status
        except h.StreamCut:
            status = None
        if status == 200:
            gw.clients.append(c)
            return c
        c.close()
        assert status in (503, None), status
        assert time.monotonic() < deadline, "no connection served within %.1fs" % timeout
        time.sleep(0.05)


def test_connections_past_max_connections_get_503():
    # Both places taken by connections in the middle of a request head: no
    # connection is idle, so a newcomer is refused at once.
    with Stub() as stub, Gateway(stub=stub, workers=1, limits={"max_connections": 2}) as gw:
        busy = []
        deadline = time.monotonic() + 3
        while len(busy) < 2:
            # A connection closed just before (the readiness probe) may
            # still count for a moment: one refused then is opened again.
            c = h.Client(gw.port)
            gw.clients.append(c)
            c.send_raw(b"GET /v1/echo HTTP/1.1\r\nHost: x\r\n")
            if select.select([c.sock], [], [], 0.2)[0]:
                assert_error(c.read_response(timeout=5), 503, "overloaded")
                c.close()
                assert time.monotonic() < deadline, "no place for a busy connection"
                continue
            busy.append(c)
        for _ in range(3):
            with h.Client(gw.port) as c:
                r = c.read_response(timeout=5)     # refused before any request
                assert_error(r, 503, "overloaded")
                assert c.wait_closed(3), "refused connection left open"
        # The busy ones were not cut for the newcomers.
        for c in busy:
            c.send_raw(b"Authorization: Bearer %s\r\n\r\n" % ACME_KEY.encode())
            r = c.read_response(timeout=5)
            r.read_all()
            assert r.status == 200, r.status
        assert stub.stats()["requests"] == 2, stub.stats()


def test_idle_keepalive_connection_makes_room_past_max_connections():
    # As nginx reuses its keep-alive connections: at max_connections the
    # connection idle the longest between two requests is closed, and the
    # newcomer is served instead of refused for up to `keepalive`.
    with Stub() as stub, Gateway(stub=stub, workers=1, limits={"max_connections": 2}) as gw:
        old = _served_connection(gw)
        time.sleep(0.05)
        new = _served_connection(gw)
        c = h.Client(gw.port)
        gw.clients.append(c)
        r = c.request("GET", "/v1/echo", h.bearer(ACME_KEY))
        assert r.status == 200, r.status
        assert old.wait_closed(3), "the oldest idle connection was not closed"
        r = new.request("GET", "/v1/echo", h.bearer(ACME_KEY))
        assert r.status == 200, "the newer idle connection was closed instead"
        # Now c is the one idle the longest.
        d = h.Client(gw.port)
        gw.clients.append(d)
        r = d.request("GET", "/v1/echo", h.bearer(ACME_KEY))
        assert r.status == 200, r.status
        assert c.wait_closed(3), "the longest idle connection was not closed"
        r = new.request("GET", "/v1/echo", h.bearer(ACME_KEY))
        assert r.status == 200
        assert stub.stats()["requests"] == 6, stub.stats()

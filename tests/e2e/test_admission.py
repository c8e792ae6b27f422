# SPDX-License-Identifier: BSD-2-Clause
"""Per-tenant admission: exact max_streams across workers, 429 + Retry-After."""

import threading
import time

import harness as h
from harness import ACME_KEY, BETA_KEY, Gateway, Stub, assert_error, expected_events


def _ask(gw, key, **kw):
    """Open a stream; return (client, response with head read, seconds to head)."""
    t0 = time.monotonic()
    c, r = gw.open_stream(key=key, **kw)
    return c, r, time.monotonic() - t0


def test_tenant_at_max_streams_gets_429_with_retry_after():
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"max_streams": 2, "retry_after": 7},
                                                     "beta": {"max_streams": 2}}) as gw:
        held = []
        for _ in range(2):
            c, r, _ = _ask(gw, ACME_KEY, events=8, interval=1000, tag="acme")
            assert r.status == 200, r.status
            held.append((c, r))
        h.wait_until(lambda: stub.tag("acme")["inflight"] == 2, 5, msg="2 acme streams at the stub")
        for _ in range(3):
            c, r, dt = _ask(gw, ACME_KEY, events=2, interval=0, tag="acme")
            assert_error(r, 429, "concurrency_limit_exceeded")
            assert r.header("retry-after") == "7", r.headers
            # Refused at once, not queued for a slot: both held streams
            # (8 s long, so that valgrind's slow gateway cannot see one
            # end first) are still at the upstream when the 429 is read.
            assert stub.tag("acme")["inflight"] == 2, stub.tag("acme")
            c.close()
        assert stub.tag("acme")["requests"] == 2, stub.tag("acme")
        # Another tenant is unaffected.
        c, r, _ = _ask(gw, BETA_KEY, events=3, interval=0, tag="beta")
        assert r.status == 200
        assert r.read_all() == expected_events(3) and r.complete
        c.close()
        # When the streams end, their slots are free again.
        for c, r in held:
            assert r.read_all(timeout=20) == expected_events(8) and r.complete
        for _ in range(2):
            c, r = gw.admit(within=1.0, events=2, interval=0, tag="acme")
            assert r.read_all() == expected_events(2) and r.complete
            c.close()
        # and both at once again
        pair = [gw.admit(within=1.0, events=4, interval=50, tag="acme") for _ in range(2)]
        c, r, _ = _ask(gw, ACME_KEY, events=1, interval=0, tag="acme")
        assert_error(r, 429, "concurrency_limit_exceeded")
        for c, r in pair:
            assert r.read_all() == expected_events(4)


def test_429_is_sent_without_waiting_for_the_body():
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"max_streams": 1, "retry_after": 3}}) as gw:
        c, _, _ = _ask(gw, ACME_KEY, hang=True, tag="hang", read_head=False)
        h.wait_until(lambda: stub.tag("hang")["inflight"] == 1, 5, msg="hung request at the stub")
        with h.Client(gw.port) as c2:
            c2.send("POST", "/v1/chat/completions",
                    dict(h.bearer(ACME_KEY), **{"Content-Length": "100000",
                                                "Content-Type": "application/json"}))
            # Waiting for the body would end in client_body's 408 after 60 s.
            r2 = c2.read_response(timeout=10)
            assert_error(r2, 429, "concurrency_limit_exceeded")
            assert r2.header("retry-after") == "3", r2.headers
            # (No byte of the 100000-byte body was sent: the 429 did not
            # wait for it.)
        assert stub.tag("hang")["requests"] == 1


def test_hung_upstream_holds_a_slot_until_client_leaves():
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"max_streams": 1}}) as gw:
        c, _, _ = _ask(gw, ACME_KEY, hang=True, tag="hang", read_head=False)
        h.wait_until(lambda: stub.tag("hang")["inflight"] == 1, 5, msg="hung request at the stub")
        c2, r2, _ = _ask(gw, ACME_KEY, events=1, interval=0)
        assert_error(r2, 429, "concurrency_limit_exceeded")
        c.close()
        h.wait_until(lambda: stub.tag("hang")["inflight"] == 0, 2,
                     msg="the gateway to drop the hung upstream request")
        ok = h.wait_until(lambda: _status(gw, ACME_KEY) == 200, 1, interval=0.05,
                          msg="the slot to be free")
        assert ok


def _status(gw, key):
    r = gw.request("POST", "/v1/chat/completions",
                   dict(h.stub_headers(events=1, interval=0), **{"Content-Type": "application/json"}),
                   h.stream_body(), key=key)
    return r.status


@h.timeout(120)
def test_exact_limit_under_4x_oversubscription():
    N = 8
    with Stub() as stub, Gateway(stub=stub, workers=2,
                                 tenants={"acme": {"max_streams": N, "retry_after": 1}}) as gw:
        assert len(gw.worker_pids()) == 2
        counts = {"ok": 0, "429": 0, "other": []}
        lock = threading.Lock()
        stop_at = time.monotonic() + 4.0
        want = expected_events(5, 64)

        def client():
            while time.monotonic() < stop_at:
                try:
                    with h.Client(gw.port, timeout=15) as c:
                        hd = dict(h.bearer(ACME_KEY), **{"Content-Type": "application/json"})
                        hd.update(h.stub_headers(events=5, size=64, interval=10, tag="over"))
                        c.send("POST", "/v1/chat/completions", hd, h.stream_body())
                        r = c.read_response(timeout=15)
                        body = r.read_all(timeout=15)
                        if r.status == 200 and r.complete and body == want:
                            with lock:
                                counts["ok"] += 1
                        elif r.status == 429:
                            assert_error(r, 429, "concurrency_limit_exceeded", read=False)
                            assert r.header("retry-after") == "1"
                            with lock:
                                counts["429"] += 1
                            time.sleep(0.02)
                        else:
                            with lock:
                                counts["other"].append((r.status, r.complete, body[:100]))
                except Exception as e:  # noqa: BLE001 - counted, reported below
                    with lock:
                        counts["other"].append(repr(e))

        threads = [threading.Thread(target=client, daemon=True) for _ in range(4 * N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "client threads stuck"
        tag = stub.tag("over")
        print("200s %d, 429s %d, stub tag %r" % (counts["ok"], counts["429"], tag))
        assert not counts["other"], "unexpected outcomes: %r" % counts["other"][:5]
        assert counts["ok"] > 0 and counts["429"] > 0, counts
        assert tag["max_inflight"] <= N, "upstream saw %d concurrent streams, limit %d" % (
            tag["max_inflight"], N)
        assert tag["max_inflight"] == N, "limit under-admits: max %d concurrent of %d" % (
            tag["max_inflight"], N)
        assert tag["requests"] == counts["ok"], \
            "stub saw %d requests, clients got %d 200s" % (tag["requests"], counts["ok"])
        assert tag["completed"] == counts["ok"], tag
        # No slot leaked: N fresh hung requests are all admitted, N+1th is not.
        h.wait_until(lambda: stub.tag("over")["inflight"] == 0, 5, msg="stub idle")
        held = gw.hold_hung(stub, "fresh", N, within=1.0)
        assert stub.tag("fresh")["inflight"] == N
        c, r, dt = _ask(gw, ACME_KEY, hang=True, tag="fresh")
        assert_error(r, 429, "concurrency_limit_exceeded")
        assert stub.tag("fresh")["requests"] == N
        for c in held:
            c.close()

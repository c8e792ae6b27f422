# SPDX-License-Identifier: BSD-2-Clause
"""SIGTERM: stop accepting, drain in-flight streams up to drain_timeout, exit 0."""

import os
import signal
import time

import harness as h
from harness import Gateway, Stub, expected_events


def test_sigterm_without_traffic_exits_zero_promptly():
    with Stub() as stub, Gateway(stub=stub, drain_timeout="10s") as gw:
        workers = gw.worker_pids()
        t0 = time.monotonic()
        code = gw.stop(timeout=8)
        dt = time.monotonic() - t0
        assert code == 0, "exit status %s after SIGTERM" % code
        # Generous, and still short of the 10 s drain_timeout an idle
        # gateway must not wait for.
        assert dt < 5.0, "idle gateway took %.1fs to exit (drain_timeout 10s)" % dt
        h.wait_until(lambda: not any(h.pid_alive(w) for w in workers), 2,
                     msg="workers to exit with the master")


def test_sigterm_drains_inflight_stream_then_exits_zero():
    with Stub() as stub, Gateway(stub=stub, drain_timeout="10s") as gw:
        c, r = gw.open_stream(events=20, size=100, interval=100, timeout=15)
        assert r.status == 200
        r.read_events(2, timeout=5)
        os.kill(gw.pid, signal.SIGTERM)
        body = r.read_all(timeout=15)
        assert r.complete, "in-flight stream cut by SIGTERM after %d bytes" % len(body)
        assert body == expected_events(20, 100), "drained stream differs"
        code = gw.wait_exit(8)
        assert code == 0, "exit status %s after drain" % code


def test_sigterm_stops_accepting_new_streams():
    with Stub() as stub, Gateway(stub=stub, drain_timeout="10s") as gw:
        c, r = gw.open_stream(events=20, interval=100, timeout=15)
        assert r.status == 200
        os.kill(gw.pid, signal.SIGTERM)
        time.sleep(0.3)
        served = False
        try:
            with h.Client(gw.port, timeout=3) as c2:
                c2.send("POST", "/v1/chat/completions",
                        dict(h.bearer(h.ACME_KEY), **h.stub_headers(events=1, interval=0)),
                        h.stream_body())
                r2 = c2.read_response(timeout=3)
                r2.read_all(timeout=3)
                served = r2.status == 200
        except (OSError, h.StreamCut, TimeoutError):
            pass
        assert not served, "a new stream was served after SIGTERM"
        assert r.read_all(timeout=15) == expected_events(20) and r.complete
        assert gw.wait_exit(8) == 0
        assert stub.stats()["requests"] == 1, stub.stats()


def test_sigterm_cuts_streams_left_after_drain_timeout():
    with Stub() as stub, Gateway(stub=stub, drain_timeout="1s") as gw:
        c, r = gw.open_stream(events=200, interval=100, timeout=15, tag="long")
        assert r.status == 200
        r.read_events(1, timeout=5)
        t0 = time.monotonic()
        os.kill(gw.pid, signal.SIGTERM)
        r.read_all(timeout=10)
        dt = time.monotonic() - t0
        assert r.cut and not r.complete, "stream past drain_timeout not visibly cut"
        # Cut, not finished (the stream has 20 s to go): by drain_timeout.
        assert 0.7 <= dt, "cut %.2fs after SIGTERM with drain_timeout 1s" % dt
        code = gw.wait_exit(5)
        assert code == 0, "exit status %s" % code
        h.wait_until(lambda: stub.tag("long")["aborted_by_client"] == 1, 2,
                     msg="the stub to see the upstream closed")

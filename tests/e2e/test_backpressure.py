# SPDX-License-Identifier: BSD-2-Clause
"""A client that stops reading: the gateway buffers at most stream_buffer,
pauses the upstream (TCP pushes back on the runner), and loses nothing."""

import time

import harness as h
from harness import ACME_KEY, Gateway, Stub

EVENTS = 40000
SIZE = 1000
RSS_BOUND_KB = 20 * 1024
UPSTREAM_RCVBUF = 128 * 1024
CLIENT_SNDBUF = 64 * 1024
CLIENT_RCVBUF = 4096


def _sysctl_max(name):
    with open("/proc/sys/net/ipv4/" + name) as f:
        return int(f.read().split()[2])


def _in_flight_bound():
    """Bytes that may legitimately sit between the stub and a client that
    reads nothing: the stub's send buffer (autotuned, up to tcp_wmem's max),
    the gateway's upstream receive buffer (upstream_rcvbuf, doubled by the
    kernel), stream_buffer, the gateway's client send buffer (client_sndbuf,
    doubled) and the client's receive buffer (doubled), plus 256 KiB for
    framing and segments in flight. Without upstream_rcvbuf the kernel may
    grow the upstream receive buffer to tcp_rmem's max (32 MiB here), and
    without client_sndbuf the client send buffer to tcp_wmem's max."""
    return (_sysctl_max("tcp_wmem") + 2 * UPSTREAM_RCVBUF + 64 * 1024 +
            2 * CLIENT_SNDBUF + 2 * CLIENT_RCVBUF + 256 * 1024)


def _wait_stub_stalled(stub, timeout=20.0):
    """Poll the stub's bytes_sent until it stays the same for 1 s; returns
    the stats at that point."""
    deadline = time.monotonic() + timeout
    hist = []
    while time.monotonic() < deadline:
        st = stub.stats()
        hist.append((time.monotonic(), st["bytes_sent"]))
        cur = hist[-1][1]
        since = hist[-1][0]
        for t, b in reversed(hist):
            if b != cur:
                break
            since = t
        if cur > 0 and hist[-1][0] - since >= 1.0:
            return st
        time.sleep(0.25)
    raise AssertionError("stub never stopped sending: bytes_sent history %r"
                         % [b for _, b in hist[-8:]])


def _slow_client_bounded(kind):
    """A client that reads nothing of a fast 40 MB stream on the relay path
    `kind` (harness.RELAY_PATHS): the runner is pushed back, the worker's
    memory stays bounded, and the client then gets every byte."""
    body, extra = h.relay_path_request(kind)
    with Stub() as stub, Gateway(stub=stub, stream_buffer="64KiB",
                                 timeouts={"client_stall": "60s"},
                                 limits={"upstream_rcvbuf": "128KiB",
                                         "client_sndbuf": "64KiB"},
                                 **h.relay_path_config(kind)) as gw:
        # Warm both workers up so the baseline includes one-time allocations.
        for _ in range(6):
            hd = dict(h.stub_headers(events=50, size=1000, interval=0),
                      **{"Content-Type": "application/json"})
            hd.update(extra)
            r = gw.request("POST", "/v1/chat/completions", hd, body)
            assert r.status == 200 and r.complete
            assert bytes(r.data) == h.relay_path_expected(kind, 50, 1000), kind
        stub.reset()
        workers = gw.worker_pids()
        base = {w: gw.rss_kb(w) for w in workers}

        c, r = gw.open_stream(key=ACME_KEY, rcvbuf=CLIENT_RCVBUF, timeout=30, body=body,
                              headers=extra, events=EVENTS, size=SIZE, interval=0, tag="big")
        assert r.status == 200, r.status
        want = h.relay_path_expected(kind, EVENTS, SIZE)
        # The client reads nothing more; the runner must be pushed back.
        st = _wait_stub_stalled(stub)
        bound = _in_flight_bound()
        print("%s: stub stalled at %d of %d bytes (bound %d), blocked_writes %d" % (
            kind, st["bytes_sent"], len(want), bound, st["blocked_writes"]))
        assert st["bytes_sent"] < bound, \
            "%s: stub sent %d of %d bytes to a client that reads nothing (bound %d)" % (
                kind, st["bytes_sent"], len(want), bound)
        assert st["blocked_writes"] > 0, "the stub never saw TCP push back: %r" % st
        assert st["streams_completed"] == 0, st
        growth = {w: gw.rss_kb(w) - base[w] for w in workers}
        print("worker RSS growth KiB %r (base %r)" % (growth, base))
        assert max(growth.values()) < RSS_BOUND_KB, \
            "%s: worker RSS grew by %r KiB while the stream was paused (bound %d)" % (
                kind, growth, RSS_BOUND_KB)
        # Paused, not lost: the client now reads every byte, in order.
        body = r.read_all(timeout=90)
        assert r.complete, "stream cut after %d of %d bytes" % (len(body), len(want))
        assert len(body) == len(want), (len(body), len(want))
        if body != want:
            i = next(i for i in range(len(want)) if body[i] != want[i])
            raise AssertionError("byte %d differs: got %r want %r" % (
                i, body[i:i + 80], want[i:i + 80]))
        h.wait_until(lambda: stub.tag("big")["completed"] == 1, 5, msg="stub completion")
        assert max(gw.rss_kb(w) - base[w] for w in workers) < RSS_BOUND_KB


@h.skip_under("sanitizers", "valgrind")
@h.timeout(150)
def test_slow_client_pauses_upstream_with_bounded_memory_then_gets_every_byte():
    _slow_client_bounded("injected")


# The same on the plain path, where the relay pauses without the scanner
# (issue 22: only one indirect token test caught a pause lost there).

@h.skip_under("sanitizers", "valgrind")
@h.timeout(150)
def test_slow_client_bounded_memory_with_usage_off():
    _slow_client_bounded("usage_off")


@h.skip_under("sanitizers", "valgrind")
@h.timeout(150)
def test_slow_client_bounded_memory_with_inject_false():
    _slow_client_bounded("inject_false")


@h.skip_under("sanitizers", "valgrind")
@h.timeout(150)
def test_slow_client_bounded_memory_for_a_client_that_asked_for_usage():
    _slow_client_bounded("client_asked")


@h.skip_under("sanitizers", "valgrind")
@h.timeout(150)
def test_slow_client_bounded_memory_for_an_uncounted_request():
    _slow_client_bounded("uncounted")


def _stalled_client_cut(kind):
    body, extra = h.relay_path_request(kind)
    with Stub() as stub, Gateway(stub=stub, stream_buffer="64KiB",
                                 timeouts={"client_stall": "1s"},
                                 tenants={"acme": {"max_streams": 1}},
                                 **h.relay_path_config(kind)) as gw:
        c, r = gw.open_stream(key=ACME_KEY, rcvbuf=4096, timeout=30, body=body, headers=extra,
                              events=EVENTS, size=SIZE, interval=0, tag="stall")
        assert r.status == 200
        h.wait_until(lambda: stub.tag("stall")["aborted_by_client"] == 1, 20,
                     msg="the gateway to cut the stalled stream and close the upstream")
        body = r.read_all(timeout=30)
        assert r.cut and not r.complete, "stalled stream not visibly cut"
        assert h.relay_path_expected(kind, EVENTS, SIZE).startswith(body), "relayed bytes differ"
        r2 = gw.request("POST", "/v1/chat/completions",
                        dict(h.stub_headers(events=2, interval=0),
                             **{"Content-Type": "application/json"}), h.stream_body())
        assert r2.status == 200 and r2.complete, "slot not released after the stall cut: %d" % r2.status


@h.timeout(90)
def test_stalled_client_is_cut_after_client_stall_and_slot_freed():
    _stalled_client_cut("injected")


@h.timeout(90)
def test_stalled_client_is_cut_on_every_plain_relay_path():
    for kind in h.RELAY_PATHS[1:]:
        _stalled_client_cut(kind)
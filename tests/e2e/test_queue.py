# SPDX-License-Identifier: BSD-2-Clause
"""Fair queueing per pool (issue 24): a request whose pool's replicas are all
at their max_streams waits for a slot instead of 503 upstream_unavailable.

Real processes on 127.0.0.1: two workers, stub replicas with max_streams. A
slot freed by a stream in either worker goes to the next waiter, whichever
worker holds it; the queue answers queue_full and queue_timeout with
Retry-After; a waiter that disconnects leaves; a tenant with priority below
0 is shed; a higher band goes first. sluice_queue_waiting is the exact
point to synchronise on (the queue's own count, all workers).
"""

import time

import harness as h
from harness import ACME_KEY, BETA_KEY, UPSTREAM_KEY, Gateway, Stub, assert_error, \
    expected_events

CT = {"Content-Type": "application/json"}


def queue_config(replicas, queue, workers=2, **tenants):
    cfg = h.gateway_config(None, workers=workers, log_level="info",
                           admin_listen="%s:%d" % (h.HOST, h.free_port()))
    cfg["upstreams"] = {"main": {
        "replicas": [{"url": u, "max_streams": n} for u, n in replicas],
        "api_key": UPSTREAM_KEY, "queue": queue}}
    for name, over in tenants.items():
        cfg["tenants"][name].update(over)
    return cfg


def waiting(gw, tenant="acme"):
    return h.scrape(gw).value("sluice_queue_waiting", upstream="main", tenant=tenant)


def wait_waiting(gw, n, tenant="acme"):
    h.wait_metric(gw, "sluice_queue_waiting", n, timeout=10, upstream="main",
                  tenant=tenant)


def outcome(gw, name):
    return h.scrape(gw).value("sluice_queue_total", upstream="main", outcome=name)


def hold(gw, n, key=ACME_KEY):
    """n long streams, each admitted and started on a replica."""
    held = []
    for _ in range(n):
        c, r = gw.open_stream(key=key, events=200, interval=200, timeout=20)
        assert r.status == 200, r.status
        held.append(c)
    return held


def close_all(clients):
    for c in clients:
        c.close()


@h.timeout(120)
def test_queue_waiters_get_slots_freed_in_either_worker_and_nothing_leaks():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = queue_config([(s1.url, 1), (s2.url, 1)], {"max": 50, "timeout": "20s"})
        with Gateway(cfg) as gw:
            held = hold(gw, 2)
            waiters = []
            for i in range(8):
                c, _ = gw.open_stream(events=3, interval=0, read_head=False, timeout=30,
                                      tag="w")
                waiters.append(c)
            wait_waiting(gw, 8)
            assert s1.stats()["requests"] + s2.stats()["requests"] == 2
            # One stream ends: its slot serves the 8 waiters one after the other.
            held[0].close()
            for c in waiters:
                r = c.read_response(timeout=20)
                assert r.status == 200, (r.status, bytes(r.read_all(timeout=5))[:200])
                r.read_all(timeout=20)
                assert bytes(r.data) == expected_events(3)
            assert s1.tag("w")["max_inflight"] + s2.tag("w")["max_inflight"] <= 1 + 1
            assert s1.stats()["max_inflight"] <= 1 and s2.stats()["max_inflight"] <= 1
            assert outcome(gw, "dispatched") == 8
            assert h.scrape(gw).value("sluice_queue_wait_seconds_count",
                                      upstream="main") == 8
            wait_waiting(gw, 0)
            close_all(held[1:])
            close_all(waiters)
            h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")
            m = h.wait_until(lambda: (lambda m: m if sum(
                m.value("sluice_replica_streams", upstream="main", replica=u)
                for u in (s1.url, s2.url)) == 0 else None)(h.scrape(gw)), 5,
                interval=0.1, msg="no replica slot held")
            assert m is not None
            # Both replicas take streams again: no slot was lost.
            again = hold(gw, 2)
            close_all(again)


@h.skip_under("valgrind")
@h.timeout(60)
def test_queue_full_and_timeout_answer_503_with_retry_after_and_reach_no_upstream():
    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 1)], {"max": 1, "timeout": "500ms"})
        cfg["access_log"] = alog = h.tmpfile("access", ".log")
        with Gateway(cfg) as gw:
            held = hold(gw, 1)
            a, _ = gw.open_stream(events=1, interval=0, read_head=False, timeout=10)
            wait_waiting(gw, 1)
            r = gw.request("POST", "/v1/chat/completions", dict(CT), h.stream_body())
            assert_error(r, 503, "queue_full", read=False)
            assert int(r.header("retry-after")) >= 1, r.headers
            ra = a.read_response(timeout=10)
            assert_error(ra, 503, "queue_timeout")
            assert int(ra.header("retry-after")) >= 1, ra.headers
            assert s1.stats()["requests"] == 1
            assert outcome(gw, "full") == 1
            assert outcome(gw, "timeout") == 1
            wait_waiting(gw, 0)
            close_all(held)
            h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")
            # queued_ms: the waiter waited its whole timeout, the refused
            # one (queue full) and the held stream not at all.
            lines = h.wait_access_lines(alog, 3)
            assert len(lines) == 3, lines
            by = sorted((ln["status"], ln["end"], ln["queued_ms"]) for ln in lines)
            assert by[0][:2] == (200, "client_gone") and by[0][2] == 0, by
            full = [ln for ln in lines if ln["status"] == 503 and ln["queued_ms"] == 0]
            assert len(full) == 1 and full[0]["end"] == "rejected", lines
            timed = [ln for ln in lines if ln["status"] == 503 and ln is not full[0]]
            assert len(timed) == 1 and timed[0]["end"] == "rejected", lines
            assert timed[0]["queued_ms"] >= 500, timed[0]
            assert timed[0]["queued_ms"] <= timed[0]["duration_ms"] + 0.1, timed[0]
            assert timed[0]["ttfb_ms"] == 0 and timed[0]["tries"] == 0, timed[0]


@h.timeout(60)
def test_queue_access_log_queued_ms_is_the_wait_of_a_dispatched_waiter():
    hold_s = 1.0
    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 1)], {"max": 10, "timeout": "30s"})
        cfg["access_log"] = alog = h.tmpfile("access", ".log")
        with Gateway(cfg) as gw:
            held = hold(gw, 1)
            a, _ = gw.open_stream(events=2, interval=0, read_head=False, timeout=20)
            wait_waiting(gw, 1)
            # The waiter is queued by now: the slot frees hold_s later.
            time.sleep(hold_s)
            close_all(held)
            r = a.read_response(timeout=20)
            assert r.status == 200, r.status
            r.read_all(timeout=20)
            assert bytes(r.data) == expected_events(2)
            lines = h.wait_access_lines(alog, 2)
            assert len(lines) == 2, lines
            first = [ln for ln in lines if ln["end"] == "client_gone"]
            served = [ln for ln in lines if ln["end"] == "done"]
            assert len(first) == 1 and len(served) == 1, lines
            assert first[0]["queued_ms"] == 0, first[0]
            assert served[0]["status"] == 200 and served[0]["tries"] == 1, served[0]
            assert served[0]["queued_ms"] >= hold_s * 1000, served[0]
            assert served[0]["queued_ms"] <= served[0]["duration_ms"] + 0.1, served[0]
            # ttfb_ms counts from the complete request head too: the wait is in it.
            assert served[0]["ttfb_ms"] >= served[0]["queued_ms"], served[0]


@h.timeout(60)
def test_queue_disconnected_waiter_leaves_and_frees_its_place_and_tenant_slot():
    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 1)], {"max": 1, "timeout": "30s"})
        with Gateway(cfg) as gw:
            held = hold(gw, 1)
            a, _ = gw.open_stream(events=1, interval=0, read_head=False, timeout=10)
            wait_waiting(gw, 1)
            h.wait_metric(gw, "sluice_tenant_streams", 2, tenant="acme")
            a.close()
            wait_waiting(gw, 0)
            h.wait_metric(gw, "sluice_tenant_streams", 1, tenant="acme")
            assert outcome(gw, "gone") == 1
            # Its place is free: the next one waits, then gets the slot.
            b, _ = gw.open_stream(events=2, interval=0, read_head=False, timeout=20)
            wait_waiting(gw, 1)
            close_all(held)
            r = b.read_response(timeout=20)
            assert r.status == 200, r.status
            r.read_all(timeout=20)
            assert bytes(r.data) == expected_events(2)
            assert s1.stats()["requests"] == 2
            b.close()
            h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")


@h.timeout(60)
def test_queue_priority_below_zero_is_shed_and_higher_band_goes_first():
    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 1)], {"max": 10, "timeout": "30s"},
                           beta={"priority": 1})
        with Gateway(cfg) as gw:
            held = hold(gw, 1)
            a, _ = gw.open_stream(events=50, interval=100, read_head=False, timeout=20,
                                  tag="acme")
            wait_waiting(gw, 1)
            b, _ = gw.open_stream(key=BETA_KEY, events=50, interval=100, read_head=False,
                                  timeout=20, tag="beta")
            wait_waiting(gw, 1, tenant="beta")
            # beta (band 1) came last and goes first.
            close_all(held)
            rb = b.read_response(timeout=20)
            assert rb.status == 200, rb.status
            h.wait_until(lambda: s1.tag("beta")["inflight"] == 1, 5, msg="beta runs")
            assert s1.tag("acme")["requests"] == 0
            assert waiting(gw) == 1
            b.close()
            ra = a.read_response(timeout=20)
            assert ra.status == 200, ra.status
            a.close()

    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 1)], {"max": 10, "timeout": "30s"},
                           beta={"priority": -1})
        with Gateway(cfg) as gw:
            held = hold(gw, 1)
            r = gw.request("POST", "/v1/chat/completions", dict(CT), h.stream_body(),
                           key=BETA_KEY)
            assert_error(r, 503, "upstream_unavailable", read=False)
            assert outcome(gw, "shed") == 1
            assert s1.stats()["requests"] == 1
            close_all(held)


def test_queue_absent_keeps_503_upstream_unavailable_at_once():
    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 1)], {"max": 1})
        del cfg["upstreams"]["main"]["queue"]
        with Gateway(cfg) as gw:
            held = hold(gw, 1)
            r = gw.request("POST", "/v1/chat/completions", dict(CT), h.stream_body())
            assert_error(r, 503, "upstream_unavailable", read=False)
            assert h.scrape(gw).get("sluice_queue_waiting", upstream="main",
                                    tenant="acme") is None
            close_all(held)


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


@h.timeout(120)
def test_queue_kill_9_of_a_worker_with_waiters_and_streams_leaks_no_slot():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = queue_config([(s1.url, 1), (s2.url, 1)], {"max": 50, "timeout": "30s"})
        with Gateway(cfg, allow_worker_changes=True) as gw:
            held = hold(gw, 2)
            waiters = []
            for _ in range(10):
                c, _ = gw.open_stream(events=2, interval=0, read_head=False, timeout=30)
                waiters.append(c)
            wait_waiting(gw, 10)
            owners = {c: owner_of(gw, c) for c in held + waiters}
            victim = owners[held[0]]
            assert victim is not None
            h.kill_pid(victim)
            lost = [c for c in waiters if owners[c] == victim]
            live = [c for c in waiters if owners[c] != victim]
            # The victim's waiters are gone from the queue, its stream's
            # replica slot went to a waiter of the live worker.
            for c in live:
                r = c.read_response(timeout=20)
                assert r.status == 200, r.status
                r.read_all(timeout=20)
                assert bytes(r.data) == expected_events(2)
            wait_waiting(gw, 0)
            close_all(held + waiters)
            gw.wait_workers(2, exclude=(victim,))
            h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme", timeout=10)
            h.wait_until(lambda: sum(h.scrape(gw).value(
                "sluice_replica_streams", upstream="main", replica=u)
                for u in (s1.url, s2.url)) == 0, 10, msg="no replica slot held")
            assert outcome(gw, "gone") >= len(lost)
            again = hold(gw, 2)
            close_all(again)


def last_body(stub):
    st, _, body = stub._http("GET", "/stub/last")
    assert st == 200, (st, body[:200])
    return body


@h.timeout(60)
def test_queue_waiters_body_reaches_the_replica_byte_exact():
    body = b'{"model": "stub", "stream": false, "messages": [{"role": "user", ' \
           b'"content": "caf\\u00e9 \xe2\x82\xac  x"}], "n": 1}'
    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 1)], {"max": 10, "timeout": "30s"})
        with Gateway(cfg) as gw:
            held = hold(gw, 1)
            a, _ = gw.open_stream(body=body, read_head=False, timeout=20)
            wait_waiting(gw, 1)
            close_all(held)
            r = a.read_response(timeout=20)
            assert r.status == 200, r.status
            r.read_all(timeout=20)
            assert last_body(s1) == body
            a.close()


@h.timeout(60)
def test_inject_priority_adds_the_tenants_negated_priority_as_last_member():
    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 4)], {"max": 10}, beta={"priority": 7})
        cfg["upstreams"]["main"]["inject_priority"] = True
        with Gateway(cfg) as gw:
            body = b'{"model": "stub", "stream": false, "priority": 100, ' \
                   b'"messages": [{"role": "user", "content": "hi"}]}'
            r = gw.request("POST", "/v1/chat/completions", dict(CT), body, key=BETA_KEY)
            assert r.status == 200, r.status
            assert last_body(s1) == body[:-1] + b',"priority":-7}'
            r = gw.request("POST", "/v1/chat/completions", dict(CT), b'{}')
            assert last_body(s1) == b'{"priority":0}'
            # Not a JSON object: untouched.
            r = gw.request("POST", "/v1/completions", dict(CT), b'[1]')
            assert last_body(s1) == b'[1]'
    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 4)], {"max": 10}, beta={"priority": 7})
        with Gateway(cfg) as gw:
            body = b'{"model": "stub", "stream": false, "messages": []}'
            r = gw.request("POST", "/v1/chat/completions", dict(CT), body, key=BETA_KEY)
            assert last_body(s1) == body


@h.timeout(90)
def test_queue_reload_applies_timeout_at_once_and_a_removed_pool_answers_its_waiters():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = queue_config([(s1.url, 1)], {"max": 10, "timeout": "60s"})
        cfg["upstreams"]["other"] = {"url": s2.url, "api_key": UPSTREAM_KEY}
        with Gateway(cfg, allow_worker_changes=True) as gw:
            held = hold(gw, 1)
            a, _ = gw.open_stream(events=1, interval=0, read_head=False, timeout=20)
            wait_waiting(gw, 1)
            # A shorter timeout applies to the waiter already there.
            cfg["upstreams"]["main"]["queue"]["timeout"] = "100ms"
            h.reload(gw, cfg)
            r = a.read_response(timeout=10)
            assert_error(r, 503, "queue_timeout")
            a.close()
            assert outcome(gw, "timeout") == 1
            cfg["upstreams"]["main"]["queue"]["timeout"] = "60s"
            h.reload(gw, cfg)
            c, _ = gw.open_stream(events=1, interval=0, read_head=False, timeout=20)
            wait_waiting(gw, 1)
            # The pool is removed: its waiter gets 503 upstream_unavailable.
            cfg2 = dict(cfg)
            cfg2["upstreams"] = {"other": cfg["upstreams"]["other"]}
            for t in cfg2["tenants"].values():
                t["upstream"] = "other"
            h.reload(gw, cfg2)
            r = c.read_response(timeout=10)
            assert_error(r, 503, "upstream_unavailable")
            close_all(held + [c])
            assert s1.stats()["requests"] == 1


@h.timeout(120)
def test_queue_latecomer_tenant_goes_next_not_behind_40_waiters():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = queue_config([(s1.url, 2), (s2.url, 2)], {"max": 100, "timeout": "60s"})
        with Gateway(cfg) as gw:
            held = []
            for i in range(4):
                # They end one after the other, normally (charged, then free).
                c, r = gw.open_stream(events=5 * (i + 1), interval=200, timeout=20)
                assert r.status == 200, r.status
                held.append(c)
            waiters = []
            for _ in range(40):
                c, _ = gw.open_stream(events=100, interval=100, read_head=False,
                                      timeout=30, tag="acmew")
                waiters.append(c)
            wait_waiting(gw, 40)
            b, _ = gw.open_stream(key=BETA_KEY, events=100, interval=100,
                                  read_head=False, timeout=30, tag="beta")
            wait_waiting(gw, 1, tenant="beta")
            rb = b.read_response(timeout=20)
            assert rb.status == 200, rb.status
            # beta's was the first dispatched: no acme waiter ran before it.
            assert s1.tag("acmew")["requests"] + s2.tag("acmew")["requests"] == 0, \
                (s1.tag("acmew"), s2.tag("acmew"))
            assert waiting(gw) == 40
            close_all(waiters + [b] + held)
            h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme", timeout=10)


@h.skip_under("valgrind")
@h.timeout(180)
def test_queue_weights_3_to_1_share_a_flooded_pool_within_5_percent():
    import threading
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = queue_config([(s1.url, 2), (s2.url, 2)], {"max": 200, "timeout": "60s"},
                           acme={"weight": 3}, beta={"weight": 1})
        with Gateway(cfg) as gw:
            lock = threading.Lock()
            done = {"acme": 0, "beta": 0}
            stop = threading.Event()
            errors = []

            def loop(tenant, key):
                while not stop.is_set():
                    try:
                        r = gw.request("POST", "/v1/chat/completions",
                                       dict(CT, **h.stub_headers(events=4, interval=5)),
                                       h.stream_body(), key=key, timeout=60)
                    except Exception as e:  # noqa: BLE001 - reported below
                        errors.append(repr(e))
                        return
                    if r.status != 200:
                        errors.append(r.status)
                        return
                    with lock:
                        if sum(done.values()) < 400 and not stop.is_set():
                            done[tenant] += 1
                        if sum(done.values()) >= 400:
                            stop.set()
            threads = [threading.Thread(target=loop, args=("acme", ACME_KEY))
                       for _ in range(12)]
            threads += [threading.Thread(target=loop, args=("beta", BETA_KEY))
                        for _ in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not errors, errors[:5]
            assert sum(done.values()) == 400, done
            assert 285 <= done["acme"] <= 315, done
            assert s1.stats()["max_inflight"] <= 2 and s2.stats()["max_inflight"] <= 2


@h.skip_under("valgrind")
@h.timeout(180)
def test_queue_reload_changing_weights_mid_flood_applies_to_waiters():
    import threading
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = queue_config([(s1.url, 2), (s2.url, 2)], {"max": 200, "timeout": "60s"},
                           acme={"weight": 1}, beta={"weight": 1})
        with Gateway(cfg, allow_worker_changes=True) as gw:
            lock = threading.Lock()
            done = {"acme": 0, "beta": 0}
            phase = {"counting": False}
            stop = threading.Event()
            errors = []

            def loop(tenant, key):
                while not stop.is_set():
                    try:
                        r = gw.request("POST", "/v1/chat/completions",
                                       dict(CT, **h.stub_headers(events=4, interval=5)),
                                       h.stream_body(), key=key, timeout=60)
                    except Exception as e:  # noqa: BLE001 - reported below
                        errors.append(repr(e))
                        return
                    if r.status != 200:
                        errors.append(r.status)
                        return
                    with lock:
                        if phase["counting"] and sum(done.values()) < 400:
                            done[tenant] += 1
                        if sum(done.values()) >= 400:
                            stop.set()
            threads = [threading.Thread(target=loop, args=("acme", ACME_KEY))
                       for _ in range(12)]
            threads += [threading.Thread(target=loop, args=("beta", BETA_KEY))
                        for _ in range(12)]
            for t in threads:
                t.start()
            try:
                h.wait_until(lambda: outcome(gw, "dispatched") >= 100, 60,
                             msg="the flood is queued")
                cfg["tenants"]["acme"]["weight"] = 3
                h.reload(gw, cfg, timeout=20)
                with lock:
                    phase["counting"] = True
            except BaseException:
                stop.set()
                raise
            finally:
                for t in threads:
                    t.join(120)
            assert not errors, errors[:5]
            assert sum(done.values()) == 400, done
            assert 280 <= done["acme"] <= 320, done


def test_queue_a_running_stream_is_charged_as_it_is_relayed():
    # VTC charges output as it is produced: a tenant's service counter must
    # grow while its stream runs, not only when it ends (otherwise a
    # flooder's running streams do not count and it looks less served).
    with Stub("r1") as s1:
        cfg = queue_config([(s1.url, 1)], {"max": 10, "timeout": "20s"}, workers=1)
        with Gateway(cfg) as gw:
            def service():
                return h.scrape(gw).value("sluice_tenant_service", upstream="main",
                                          tenant="acme")

            c, r = gw.open_stream(events=60, interval=50, timeout=20, tag="run")
            assert r.status == 200
            r.read_events(5, timeout=10)
            first = service()
            r.read_events(25, timeout=10)
            second = service()
            assert s1.tag("run")["completed"] == 0, "the stream ended too soon"
            assert 0 < first < second, (first, second)
            r.read_all(timeout=20)
            h.wait_until(lambda: s1.tag("run")["completed"] == 1, 5, msg="stream end")
            # At the end the usage's exact count is charged beyond the
            # estimate: 2 x 60 completion tokens in all, and the prompt.
            h.wait_until(lambda: service() >= 120 + 1, 5,
                         msg="the end charge (now %r)" % service())
            c.close()

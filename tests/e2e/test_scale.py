# SPDX-License-Identifier: BSD-2-Clause
"""A node at SaaS scale (issue 32): a tenant per customer onboarded and
offboarded by reload without a restart, the places of removed tenants
reused once their streams end, and every capacity that start and reload
check refused by `sluice -t` at its line and column too."""

import json
import re

import harness as h
from harness import ACME_KEY, Gateway, Stub, expected_events


def _tenants(prefix, n, max_streams=2):
    return {"%s%d" % (prefix, i): {"keys": ["sk-%s-%05d" % (prefix, i)],
                                   "max_streams": max_streams, "upstream": "main"}
            for i in range(n)}


def _key(prefix, i):
    return "sk-%s-%05d" % (prefix, i)


def _with_tenants(gw, tenants, **over):
    cfg = dict(gw.config)
    cfg["tenants"] = tenants
    return h.deep_merge(cfg, over) if over else cfg


def _status(gw, key):
    """Status of a short completion with key (2 events)."""
    with h.Client(gw.port, timeout=20) as c:
        hd = dict(h.bearer(key), **{"Content-Type": "application/json"})
        hd.update(h.stub_headers(events=2, interval=0))
        c.send("POST", "/v1/chat/completions", hd, h.stream_body())
        r = c.read_response(timeout=20)
        body = r.read_all(timeout=20)
    if r.status == 200:
        assert r.complete and body == expected_events(2), body[-200:]
    return r.status


def _finish_whole(c, r, events, what):
    body = r.read_all(timeout=60)
    assert r.complete and body == expected_events(events), \
        "%s cut after %d bytes" % (what, len(body))


@h.timeout(240)
def test_reload_from_2_to_5000_tenants_then_to_5000_others_three_times_without_restart():
    """limits.max_tenants: 5000. Each reload swaps every tenant while a
    stream of the last set runs; that stream finishes whole, the newest
    key is admitted at once, the removed keys get 401. Four sets of
    tenants (2 + 3 x 5000) fit only because removed tenants' places are
    taken by new ones once their streams end: the same master throughout."""
    with Stub() as stub, Gateway(stub=stub, allow_worker_changes=True,
                                 admin_listen="%s:%d" % (h.HOST, h.free_port()),
                                 limits={"max_tenants": 5000}) as gw:
        master = gw.pid
        c, r = gw.admit(key=ACME_KEY, events=25, interval=100, timeout=30)
        running = (c, r, "acme's stream")
        for prefix in ("b", "c", "d"):
            h.reload(gw, _with_tenants(gw, _tenants(prefix, 5000)), timeout=60)
            assert _status(gw, _key(prefix, 4999)) == 200, \
                "the newest key of set %s is not admitted after the reload" % prefix
            assert _status(gw, _key(prefix, 0)) == 200
            assert _status(gw, ACME_KEY) == 401
            if prefix != "b":
                old = chr(ord(prefix) - 1)
                assert _status(gw, _key(old, 4999)) == 401
            _finish_whole(*running[:2], events=25, what=running[2])
            h.wait_metric(gw, "sluice_tenant_streams", 0, timeout=10,
                          tenant="acme" if prefix == "b" else "%s0" % old)
            c, r = gw.admit(key=_key(prefix, 0), events=25, interval=100,
                            timeout=30)
            running = (c, r, "%s0's stream" % prefix)
        _finish_whole(*running[:2], events=25, what=running[2])
        assert gw.pid == master and h.pid_alive(master)
        m = h.scrape(gw)
        assert m.get("sluice_tenant_max_streams", tenant="d4999") == 2
        assert m.get("sluice_tenant_max_streams", tenant="c4999") == 0, \
            "the set removed last is retired, not yet given away"
        assert m.get("sluice_tenant_max_streams", tenant="b4999") is None, \
            "a set removed two reloads ago still has its places"
        ok, failed = h.reload_results(gw)
        assert (ok, failed) == (3, 0)


@h.timeout(120)
def test_a_reload_that_needs_more_room_than_streams_leave_fails_and_keeps_running():
    """max_tenants 2: running tenants x0, x1 and removed ones whose streams
    still run count until those end. A reload to two others fits (2 x 2);
    one more swap while every stream runs does not: it fails with why, the
    running set keeps serving, and the same reload succeeds once the
    streams ended."""
    first = dict(_tenants("x", 2), acme=None, beta=None)
    with Stub() as stub, Gateway(stub=stub, allow_worker_changes=True,
                                 admin_listen="%s:%d" % (h.HOST, h.free_port()),
                                 limits={"max_tenants": 2},
                                 tenants=first) as gw:
        held = [gw.admit(key=_key("x", i), events=30, interval=100, timeout=30)
                for i in range(2)]
        h.reload(gw, _with_tenants(gw, _tenants("y", 2)), timeout=30)
        held += [gw.admit(key=_key("y", i), events=30, interval=100, timeout=30)
                 for i in range(2)]
        h.reload(gw, _with_tenants(gw, _tenants("z", 2)), expect="failed",
                 timeout=30)
        err = h.stderr_text(gw)
        assert re.search(r"master: error: no room for tenant 'z\d': 4 tenants are "
                         r"mapped, removed ones among them until their streams "
                         r"end \(limits.max_tenants 2 at start\)", err), err[-2000:]
        assert _status(gw, _key("y", 1)) == 200, "the running set stopped serving"
        assert _status(gw, _key("z", 1)) == 401
        for i, (c, r) in enumerate(held):
            _finish_whole(c, r, 30, "stream %d" % i)
        for t in ("x0", "x1", "y0", "y1"):
            h.wait_metric(gw, "sluice_tenant_streams", 0, timeout=10, tenant=t)
        h.reload(gw, _with_tenants(gw, _tenants("z", 2)), timeout=30)
        assert _status(gw, _key("z", 1)) == 200
        assert _status(gw, _key("y", 1)) == 401


def _check(text):
    path = h.write_config(text)
    rc, out, err = h.run_sluice(["-t", "-c", path])
    return path, rc, out + err


def _yaml_with(tenants_n, upstreams_n=1, max_tenants=None, max_upstreams=None,
               replicas=1, queue=False):
    lines = ['listen: "127.0.0.1:%d"' % h.free_port()]
    if max_tenants is not None:
        lines += ["limits:", "  max_tenants: %d" % max_tenants]
    if max_upstreams is not None:
        lines += ["limits:", "  max_upstreams: %d" % max_upstreams]
    lines.append("upstreams:")
    for u in range(upstreams_n):
        lines += ["  u%d:" % u]
        if replicas == 1:
            lines += ['    url: "http://127.0.0.1:9"']
        else:
            lines += ["    replicas:"] + ['      - url: "http://127.0.0.%d:9"' % (r + 1)
                                         for r in range(replicas)]
        if queue:
            lines += ["    queue: {max: 10}"]
    lines.append("tenants:")
    for t in range(tenants_n):
        lines += ["  t%d:" % t, '    keys: ["sk-t-%05d"]' % t, "    upstream: u0"]
    return "\n".join(lines) + "\n"


def test_every_capacity_start_and_reload_refuse_sluice_t_refuses_too():
    """Tenants over limits.max_tenants, upstreams over 64, models over
    limits.max_models, either limit out of range: `sluice -t` names each
    at its line and column, start refuses the same file, and a reload of
    it fails and keeps the running configuration."""
    models = ['listen: "127.0.0.1:%d"' % h.free_port(), "limits:",
              "  max_models: 127", "upstreams:",
              "  main:", '    url: "http://127.0.0.1:9"', "models:"]
    for i in range(128):
        models += ["  m%d:" % i, "    upstream: main"]
    models += ["tenants:", "  a:", '    keys: ["sk-a-00001"]', "    upstream: main"]
    cases = [
        (_yaml_with(4, max_tenants=3), 8, 3, "tenants: 4 tenants, limits.max_tenants is 3"),
        (_yaml_with(1, upstreams_n=65, max_upstreams=64), 5, 3,
         "upstreams: 65 upstreams, limits.max_upstreams is 64"),
        (_yaml_with(1, upstreams_n=65, max_upstreams=65, replicas=64), 5, 3,
         "upstreams: 4160 replicas in all, at most 4096 (4 per "
         "limits.max_upstreams, at least 4096)"),
        (_yaml_with(1, upstreams_n=65, queue=True), 3, 3,
         "upstreams: 65 upstreams with a queue, at most 64"),
        (_yaml_with(1, max_upstreams=10001), 3, 18,
         "limits.max_upstreams: 10001 is out of range 1-10000"),
        ("\n".join(models) + "\n", 8, 3, "models: 128 models, limits.max_models is 127"),
        (_yaml_with(1, max_tenants=1000001), 3, 16,
         "limits.max_tenants: 1000001 is out of range 1-1000000"),
        (_yaml_with(1).replace("upstreams:", "limits:\n  max_models: 100001\nupstreams:"),
         3, 15, "limits.max_models: 100001 is out of range 1-100000"),
    ]
    for text, line, col, msg in cases:
        path, rc, out = _check(text)
        want = "%s:%d:%d: %s" % (path, line, col, msg)
        assert rc == 1 and want in out, "want %r from sluice -t, got rc %d:\n%s" % (
            want, rc, out[-1500:])
        rc, out, err = h.run_sluice(["-c", path], timeout=10)
        assert rc == 1 and want in out + err, \
            "start did not refuse %r: rc %d\n%s" % (msg, rc, (out + err)[-1500:])
    # The limit itself is fixed at start: a reload that changes it warns,
    # keeps it, and is judged by it.
    with Stub() as stub, Gateway(stub=stub, allow_worker_changes=True,
                                 limits={"max_tenants": 3}) as gw:
        h.reload(gw, _with_tenants(gw, _tenants("p", 3), limits={"max_tenants": 10}))
        err = h.stderr_text(gw)
        assert "reload: 'limits.max_tenants' changes need a restart; keeping 3" in err
        assert _status(gw, _key("p", 2)) == 200
        h.reload(gw, _with_tenants(gw, _tenants("q", 5), limits={"max_tenants": 10}),
                 expect="failed")
        err = h.stderr_text(gw)
        assert "reload failed: 5 tenants, limits.max_tenants is 3 until a restart" in err, \
            err[-1500:]
        assert _status(gw, _key("p", 2)) == 200
        assert _status(gw, _key("q", 4)) == 401
        # Over the file's own limit: refused at its place, like sluice -t.
        h.reload(gw, _with_tenants(gw, _tenants("q", 4), limits={"max_tenants": 3}),
                 expect="failed")
        assert re.search(r":\d+:\d+: tenants: 4 tenants, limits.max_tenants is 3",
                         h.stderr_text(gw)), h.stderr_text(gw)[-1500:]
        assert _status(gw, _key("p", 2)) == 200
        # The other room limits too: warned, kept, and judged by.
        h.reload(gw, _with_tenants(gw, _tenants("p", 3), limits={
            "max_tenants": 3, "max_models": 5, "max_upstreams": 7}))
        err = h.stderr_text(gw)
        assert "reload: 'limits.max_models' changes need a restart; keeping 10000" in err
        assert "reload: 'limits.max_upstreams' changes need a restart; keeping 1000" in err
        cfg = _with_tenants(gw, _tenants("p", 3), limits={"max_upstreams": 1001})
        cfg["upstreams"] = dict(("x%d" % i, {"url": gw.config["upstreams"]["main"]["url"]})
                                for i in range(1000))
        cfg["upstreams"]["main"] = gw.config["upstreams"]["main"]
        for t in cfg["tenants"].values():
            t["upstream"] = "main"
        h.reload(gw, cfg, expect="failed")
        assert "reload failed: 1001 upstreams, limits.max_upstreams is 1000 until a " \
            "restart" in h.stderr_text(gw), h.stderr_text(gw)[-1500:]
        assert _status(gw, _key("p", 2)) == 200


def _models(prefix, n):
    return {"%s%05d" % (prefix, i): {"targets": [{"upstream": "main"}]}
            for i in range(n)}


def _model_status(gw, model, key=ACME_KEY):
    with h.Client(gw.port, timeout=20) as c:
        hd = dict(h.bearer(key), **{"Content-Type": "application/json"})
        hd.update(h.stub_headers(events=2, interval=0))
        c.send("POST", "/v1/chat/completions", hd, h.stream_body(model=model))
        r = c.read_response(timeout=20)
        body = r.read_all(timeout=20)
    if r.status == 200:
        assert r.complete and body == expected_events(2), body[-200:]
    return r.status


def _list_models(gw, key):
    with h.Client(gw.port, timeout=20) as c:
        c.send("GET", "/v1/models", h.bearer(key))
        r = c.read_response(timeout=20)
        body = r.read_all(timeout=20)
    assert r.status == 200, (r.status, body[:300])
    return [e["id"] for e in json.loads(bytes(body))["data"]]


@h.timeout(240)
def test_ten_thousand_models_listed_routed_counted_and_swapped_by_reload():
    """limits.max_models 10000 and 10,000 models (a LoRA adapter per
    customer): /v1/models lists them all (a tenant with an allow-list, its
    two), the last one routes and counts under its own name. A reload to
    10,000 others, while a stream of the first set runs, serves the new
    names at once and lets the stream finish whole; a third set takes the
    places of the first once its workers have drained (2 x max_models
    places), and a reused place counts from 0. Per-model histograms name
    the first 100 models, the rest are summed under model="_other"."""
    tenants = {"acme": {"keys": [ACME_KEY], "max_streams": 10, "upstream": "main"},
               "few": {"keys": ["sk-few-0001"], "max_streams": 10,
                       "models": ["m09999", "m00001"]}}
    with Stub() as stub, Gateway(stub=stub, allow_worker_changes=True,
                                 admin_listen="%s:%d" % (h.HOST, h.free_port()),
                                 limits={"max_models": 10000},
                                 models=_models("m", 10000), tenants=tenants) as gw:
        master = gw.pid
        ids = _list_models(gw, ACME_KEY)
        assert ids == ["m%05d" % i for i in range(10000)]
        assert _list_models(gw, "sk-few-0001") == ["m00001", "m09999"]
        assert _model_status(gw, "m09999") == 200
        assert _model_status(gw, "m00000") == 200
        assert _model_status(gw, "m09999", key="sk-few-0001") == 200
        assert _model_status(gw, "m09998", key="sk-few-0001") == 404
        m = h.wait_metric(gw, "sluice_model_requests_total", 2, timeout=10,
                          model="m09999", code="200")
        assert m.get("sluice_model_requests_total", model="m00000", code="200") == 1
        hist = "sluice_time_to_first_token_seconds_count"
        assert m.get(hist, model="m00000") == 1
        assert m.get(hist, model="m00099") == 0
        assert m.get(hist, model="m00100") is None
        assert m.get(hist, model="_other") == 2
        models = {lb for lb in m.series(hist)}
        assert len(models) == 1 + 100 + 1, "\"-\", 100 models, _other"
        st = h.admin_request(h.admin_port(gw), "GET", "/status.json", 10)
        assert st.status == 200
        assert len(json.loads(st.text)["models"]) == 10000

        first = gw.worker_pids()
        c, r = gw.admit(events=25, interval=100, timeout=30,
                        body=h.stream_body(model="m09999"))
        cfg = dict(gw.config)
        cfg["models"] = _models("n", 10000)
        cfg["tenants"] = {"acme": tenants["acme"]}
        h.reload(gw, cfg, timeout=60)
        assert _model_status(gw, "n09999") == 200
        assert _model_status(gw, "m09999") == 404
        _finish_whole(c, r, 25, "the stream of model m09999")
        m = h.scrape(gw)
        assert m.get("sluice_model_requests_total", model="n09999", code="200") == 1
        # The first set's workers drain; its places then go to the third.
        h.wait_until(lambda: not any(h.pid_alive(p) for p in first), 30,
                     msg="the first generation's workers to exit")
        cfg["models"] = _models("o", 10000)
        h.reload(gw, cfg, timeout=60)
        assert _model_status(gw, "o09999") == 200
        m = h.wait_metric(gw, "sluice_model_requests_total", 1, timeout=10,
                          model="o09999", code="200")
        assert m.get("sluice_model_requests_total", model="m09999", code="200") is None, \
            "the first set's place was reused without its counters zeroed"
        assert m.get("sluice_model_requests_total", model="n09999", code="200") == 1
        # m09999's 3 first tokens, n09999's and o09999's: "_other" keeps
        # what a reused place had counted, so it never goes back.
        assert m.get(hist, model="_other") == 5
        assert gw.pid == master and h.pid_alive(master)
        assert h.reload_results(gw) == (2, 0)


def _pool_per_model(prefix, n, stub_url, closed_url):
    """n upstreams PREFIXiiii, the even ones the stub, the odd ones a
    closed port, and a model PREFIX-miiii routed to each, renamed
    as-PREFIXiiii upstream."""
    ups = {"%s%04d" % (prefix, i): {"url": stub_url if i % 2 == 0 else closed_url}
           for i in range(n)}
    models = {"%s-m%04d" % (prefix, i): {"targets": [
        {"upstream": "%s%04d" % (prefix, i), "model": "as-%s%04d" % (prefix, i)}]}
        for i in range(n)}
    return ups, models


def _route_all(gw, prefix, n):
    """POST /v1/echo for each model: the even ones answer with the body
    their own target renamed, the odd ones 502 (a closed port)."""
    c = gw.client(timeout=20)
    try:
        for i in range(n):
            body = json.dumps({"model": "%s-m%04d" % (prefix, i)}).encode()
            hd = dict(h.bearer(ACME_KEY), **{"Content-Type": "application/json"})
            r = c.request("POST", "/v1/echo", hd, body, timeout=20)
            data = bytes(r.read_all(timeout=20))
            if i % 2 == 0:
                assert r.status == 200, (i, r.status, data[:200])
                got = json.loads(json.loads(data.decode())["body"])
                assert got == {"model": "as-%s%04d" % (prefix, i)}, (i, got)
            else:
                assert r.status == 502, (i, r.status, data[:200])
            if r.header("connection") == "close" or r.status == 502:
                c.close()
                c = gw.client(timeout=20)
    finally:
        c.close()


@h.timeout(300)
def test_a_thousand_upstreams_a_pool_per_model_each_routed_and_reused_by_reload():
    """limits.max_upstreams 1000 and 1,000 upstreams, a pool per model:
    each model's request reaches its own upstream (the stub echoes the
    name its target renamed it to; the odd upstreams are a closed port and
    count their own connect error). A reload to 1,000 other upstreams
    routes the new ones at once; a third set takes the places of the first
    once its workers have drained (2 x max_upstreams places), counting
    from 0, without a restart."""
    closed = "http://127.0.0.1:%d" % h.closed_port()
    with Stub() as stub:
        ups, models = _pool_per_model("u", 1000, stub.url, closed)
        # Started with them: 1,000 and the harness's own upstream "main".
        gw = Gateway(stub=stub, allow_worker_changes=True,
                     admin_listen="%s:%d" % (h.HOST, h.free_port()),
                     limits={"max_upstreams": 1001}, upstreams=ups, models=models,
                     tenants={"acme": {"keys": [ACME_KEY], "max_streams": 10}})
        with gw:
            _thousand_upstreams(gw, stub, closed)


def _thousand_upstreams(gw, stub, closed):
    if True:
        master = gw.pid
        assert len(gw.config["upstreams"]) == 1001
        _route_all(gw, "u", 1000)
        cfg = dict(gw.config)
        m = h.scrape(gw)
        assert m.get("sluice_upstream_errors_total", upstream="u0999", kind="connect") == 1
        assert m.get("sluice_upstream_errors_total", upstream="u0998", kind="connect") == 0
        first = gw.worker_pids()
        cfg["upstreams"], cfg["models"] = _pool_per_model("v", 1000, stub.url, closed)
        cfg["tenants"] = {"acme": {"keys": [ACME_KEY], "max_streams": 10}}
        h.reload(gw, cfg, timeout=60)
        _route_all(gw, "v", 1000)
        m = h.scrape(gw)
        assert m.get("sluice_upstream_errors_total", upstream="v0999", kind="connect") == 1
        assert m.get("sluice_upstream_errors_total", upstream="u0999", kind="connect") == 1, \
            "a removed upstream's counters went before its workers drained"
        h.wait_until(lambda: not any(h.pid_alive(p) for p in first), 30,
                     msg="the first set's workers to exit")
        cfg["upstreams"], cfg["models"] = _pool_per_model("w", 1000, stub.url, closed)
        h.reload(gw, cfg, timeout=60)
        _route_all(gw, "w", 4)
        m = h.scrape(gw)
        assert m.get("sluice_upstream_errors_total", upstream="w0003", kind="connect") == 1
        assert m.get("sluice_upstream_errors_total", upstream="w0999", kind="connect") == 0
        left = {dict(lb)["upstream"] for lb in m.series("sluice_upstream_errors_total")
                if dict(lb)["upstream"].startswith("u")}
        # 2 x 1001 places: main and u* (1,001), v* (1,000), then w* take
        # the one never used and 999 of main's and u*'s, lowest first.
        assert left == {"u0998", "u0999"}, \
            "the first set's places were not reused: %d left" % len(left)
        assert m.get("sluice_upstream_errors_total", upstream="v0999", kind="connect") == 1
        assert gw.pid == master and h.pid_alive(master)


@h.timeout(120)
def test_queues_of_removed_upstreams_count_until_their_workers_drain():
    """64 upstreams with a queue fill the queue room: a reload that swaps
    one for another fails, says why and keeps serving; removing it first,
    then adding the new one once the workers that knew the old one are
    gone, works without a restart, and the new upstream's queue holds a
    request while its one slot is taken, then dispatches it."""
    with Stub() as stub, Gateway(stub=stub, allow_worker_changes=True,
                                 admin_listen="%s:%d" % (h.HOST, h.free_port())) as gw:
        def cfg(names):
            c = dict(gw.config)
            c["upstreams"] = {n: {"replicas": [{"url": stub.url, "max_streams": 1}],
                                  "queue": {"max": 10, "timeout": "30s"}}
                              for n in names}
            c["tenants"] = {"acme": {"keys": [ACME_KEY], "max_streams": 10,
                                     "upstream": names[-1]}}
            return c
        qs = ["q%02d" % i for i in range(64)]
        h.reload(gw, cfg(qs), timeout=30)
        assert _status(gw, ACME_KEY) == 200
        h.reload(gw, cfg(qs[:63] + ["r63"]), expect="failed", timeout=30)
        assert "no room for the queue of upstream 'r63': all 64 queues are held " \
            "by upstreams that workers still draining may use" in h.stderr_text(gw), \
            h.stderr_text(gw)[-1500:]
        assert _status(gw, ACME_KEY) == 200, "the running configuration stopped"
        before = gw.worker_pids()
        h.reload(gw, cfg(qs[:63]), timeout=30)
        h.wait_until(lambda: not any(h.pid_alive(p) for p in before), 30,
                     msg="the workers that knew q63 to exit")
        h.reload(gw, cfg(qs[:63] + ["r63"]), timeout=30)
        c1, r1 = gw.admit(events=10, interval=100, timeout=30)
        c2, r2 = gw.open_stream(events=2, interval=0, timeout=30, read_head=False)
        h.wait_metric(gw, "sluice_queue_waiting", 1, timeout=10, upstream="r63",
                      tenant="acme")
        _finish_whole(c1, r1, 10, "the stream holding r63's slot")
        r2 = c2.read_response(timeout=30)
        _finish_whole(c2, r2, 2, "the queued stream")
        m = h.wait_metric(gw, "sluice_queue_total", 1, timeout=10, upstream="r63",
                          outcome="dispatched")
        assert m.get("sluice_queue_total", upstream="q63", outcome="dispatched") is None

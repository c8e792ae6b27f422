# SPDX-License-Identifier: BSD-2-Clause
"""Stored responses stay on their replica (issue 34): a runner such as
vLLM keeps the Responses API's stored responses in its own memory, so a
follow-up naming one (previous_response_id, GET/DELETE /v1/responses/{id},
.../cancel, .../input_items) must reach the replica that made it.

Real processes on 127.0.0.1: two stub replicas (each stores its own
responses, ids resp_PORT_PID_N, and answers vLLM's 404 for others') in a
pool balanced round robin, which on its own would send every other turn
to the replica that does not hold the response. The stubs' counters
(previous_found / previous_missing, retrieve_found / retrieve_missing) say
where each request went; sluice_response_affinity_total{upstream,result}
says what sluice knew."""

import json
import os
import shutil
import subprocess

import harness as h
from harness import ACME_KEY, UPSTREAM_KEY, Gateway, Stub

CT = {"Content-Type": "application/json"}
FAST = {"X-Stub-Interval-Ms": "0", "X-Stub-Events": "3"}
JS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "js")


def pool_cfg(stubs, workers=1, **upstream):
    cfg = h.gateway_config(None, workers=workers, log_level="info",
                           admin_listen="%s:%d" % (h.HOST, h.free_port()))
    up = {"replicas": [s if isinstance(s, dict) else {"url": s.url} for s in stubs],
          "api_key": UPSTREAM_KEY, "balance": "round_robin"}
    up.update(upstream)
    cfg["upstreams"] = {"main": up}
    return cfg


def create(gw, prev=None, stream=True, store=None, headers=None, key=ACME_KEY):
    """POST /v1/responses; returns (status, id of the answer or None, body)."""
    body = {"model": "stub", "input": "hello", "stream": stream}
    if prev is not None:
        body["previous_response_id"] = prev
    if store is not None:
        body["store"] = store
    hd = dict(CT)
    hd.update(FAST)
    hd.update(headers or {})
    r = gw.request("POST", "/v1/responses", hd, json.dumps(body).encode(), key=key)
    data = bytes(r.data)
    if r.status != 200:
        return r.status, None, data
    if not stream:
        return r.status, json.loads(data)["id"], data
    for line in data.split(b"\n"):
        if line.startswith(b"data: "):
            ev = json.loads(line[6:])
            if ev["type"] == "response.created":
                return r.status, ev["response"]["id"], data
    raise AssertionError("no response.created in %r" % data[:300])


def port_of(rid):
    """resp_PORT_PID_N: the port of the stub that made it."""
    return int(rid.split("_")[1])


def result(gw, res):
    return h.scrape(gw).value("sluice_response_affinity_total", upstream="main",
                              result=res)


def counts(stub):
    st = stub.stats()
    return {k: st[k] for k in ("previous_found", "previous_missing",
                               "retrieve_found", "retrieve_missing")}


def chain(gw, turns, stream=True):
    """A conversation of `turns` chained by previous_response_id: the ids."""
    ids = []
    prev = None
    for i in range(turns):
        st, rid, data = create(gw, prev, stream=stream)
        assert st == 200, "turn %d: %d %r" % (i, st, data[:300])
        ids.append(rid)
        prev = rid
    return ids


def assert_one_holder(stubs, ids, follow_ups):
    """Every turn made by the replica of the first; it found each previous."""
    assert len({port_of(i) for i in ids}) == 1, ids
    owner = [s for s in stubs if s.port == port_of(ids[0])][0]
    other = [s for s in stubs if s is not owner][0]
    assert counts(owner)["previous_found"] == follow_ups
    assert counts(owner)["previous_missing"] == 0
    assert counts(other) == {"previous_found": 0, "previous_missing": 0,
                             "retrieve_found": 0, "retrieve_missing": 0}
    return owner, other


@h.timeout(60)
def test_stored_chain_of_streamed_turns_stays_on_the_replica_holding_it():
    with Stub("r1") as s1, Stub("r2") as s2, Gateway(pool_cfg([s1, s2])) as gw:
        ids = chain(gw, 8)
        assert_one_holder((s1, s2), ids, 7)
        h.wait_metric(gw, "sluice_response_affinity_total", 7, upstream="main",
                      result="owner")
        assert result(gw, "unknown") == 0 and result(gw, "owner_down") == 0
        # Other traffic still alternates: round robin is untouched.
        r1, r2 = s1.stats()["requests"], s2.stats()["requests"]
        for _ in range(4):
            assert create(gw)[0] == 200
        assert s1.stats()["requests"] - r1 == 2 and s2.stats()["requests"] - r2 == 2


@h.timeout(60)
def test_stored_json_responses_are_learnt_too():
    with Stub("r1") as s1, Stub("r2") as s2, Gateway(pool_cfg([s1, s2])) as gw:
        ids = chain(gw, 6, stream=False)
        assert_one_holder((s1, s2), ids, 5)
        h.wait_metric(gw, "sluice_response_affinity_total", 5, upstream="main",
                      result="owner")


@h.timeout(60)
def test_stored_get_delete_cancel_input_items_go_to_the_owner():
    with Stub("r1") as s1, Stub("r2") as s2, Gateway(pool_cfg([s1, s2])) as gw:
        _, rid, _ = create(gw)
        owner = s1 if port_of(rid) == s1.port else s2
        other = s2 if owner is s1 else s1
        for _ in range(3):
            r = gw.request("GET", "/v1/responses/" + rid)
            assert r.status == 200 and json.loads(bytes(r.data))["id"] == rid
        r = gw.request("GET", "/v1/responses/%s/input_items" % rid)
        assert r.status == 200 and json.loads(bytes(r.data))["object"] == "list"
        r = gw.request("POST", "/v1/responses/%s/cancel" % rid, CT, b"")
        assert r.status == 200 and json.loads(bytes(r.data))["id"] == rid
        r = gw.request("DELETE", "/v1/responses/" + rid)
        assert r.status == 200 and json.loads(bytes(r.data))["deleted"] is True
        # Deleted by its owner: the owner's own 404 now.
        r = gw.request("GET", "/v1/responses/" + rid)
        assert r.status == 404
        assert counts(owner) == {"previous_found": 0, "previous_missing": 0,
                                 "retrieve_found": 6, "retrieve_missing": 1}
        assert counts(other)["retrieve_found"] + counts(other)["retrieve_missing"] == 0
        h.wait_metric(gw, "sluice_response_affinity_total", 7, upstream="main",
                      result="owner")


@h.timeout(60)
def test_stored_unknown_id_balances_as_usual():
    with Stub("r1") as s1, Stub("r2") as s2, Gateway(pool_cfg([s1, s2])) as gw:
        for i in range(4):
            r = gw.request("GET", "/v1/responses/resp_nowhere_%d" % i)
            assert r.status == 404
            assert b"Response with id 'resp_nowhere_%d' not found." % i in bytes(r.data)
        st, _, data = create(gw, prev="resp_nowhere_x")
        assert st == 404, data[:200]
        assert counts(s1)["retrieve_missing"] + counts(s2)["retrieve_missing"] == 4
        assert abs(counts(s1)["retrieve_missing"] - counts(s2)["retrieve_missing"]) <= 1
        h.wait_metric(gw, "sluice_response_affinity_total", 5, upstream="main",
                      result="unknown")
        assert result(gw, "owner") == 0


@h.timeout(60)
def test_stored_owner_down_balances_and_the_answer_is_the_runners_404():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = pool_cfg([s1, s2], health={"path": "/health", "interval": "100ms",
                                         "timeout": "50ms", "fall": 1, "rise": 1})
        with Gateway(cfg) as gw:
            _, rid, _ = create(gw)
            owner = s1 if port_of(rid) == s1.port else s2
            other = s2 if owner is s1 else s1
            owner_url = owner.url
            owner.kill()
            h.wait_metric(gw, "sluice_replica_up", 0, timeout=5, upstream="main",
                          replica=owner_url)
            r = gw.request("GET", "/v1/responses/" + rid)
            assert r.status == 404, (r.status, bytes(r.data)[:200])
            assert b"Response with id '%s' not found." % rid.encode() in bytes(r.data)
            st, _, data = create(gw, prev=rid)
            assert st == 404 and b"not found" in data
            assert counts(other) == {"previous_found": 0, "previous_missing": 1,
                                     "retrieve_found": 0, "retrieve_missing": 1}
            h.wait_metric(gw, "sluice_response_affinity_total", 2, upstream="main",
                          result="owner_down")
            assert result(gw, "owner") == 0


@h.timeout(120)
def test_stored_learnt_on_one_worker_is_found_on_another():
    log = h.tmpfile("access", ".log")
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = pool_cfg([s1, s2], workers=2)
        cfg["access_log"] = log
        with Gateway(cfg) as gw:
            for _ in range(15):
                chain(gw, 3)   # each request on a new connection
            assert counts(s1)["previous_missing"] + counts(s2)["previous_missing"] == 0
            assert counts(s1)["previous_found"] + counts(s2)["previous_found"] == 30
            h.wait_metric(gw, "sluice_response_affinity_total", 30, upstream="main",
                          result="owner")
            lines = h.wait_until(lambda: (lambda ls: ls if len(ls) >= 45 else None)(
                [l for l in h.access_lines(log) if l["path"] == "/v1/responses"]),
                5, msg="45 access log lines")
    # Both workers served, and a turn's next one was served by the other
    # worker at least once: the table is shared, not per worker.
    workers = [l["worker"] for l in lines]
    assert len(set(workers)) == 2, workers
    pairs = [(workers[i], workers[i + 1]) for i in range(0, 45, 3)] + \
        [(workers[i + 1], workers[i + 2]) for i in range(0, 45, 3)]
    assert any(a != b for a, b in pairs), workers
    assert all(l["status"] == 200 for l in lines)


@h.timeout(120)
def test_stored_follow_up_waits_for_its_full_replica_not_another():
    with Stub("r1") as s1, Stub("r2") as s2:
        cfg = pool_cfg([{"url": s1.url, "max_streams": 1},
                        {"url": s2.url, "max_streams": 1}], workers=2,
                       queue={"max": 10, "timeout": "20s"})
        with Gateway(cfg) as gw:
            _, rid, _ = create(gw)
            owner = s1 if port_of(rid) == s1.port else s2
            other = s2 if owner is s1 else s1
            # Both replicas full, a long stream on each.
            held = {}
            for tag in ("ha", "hb"):
                c, r = gw.open_stream(events=500, interval=100, timeout=20, tag=tag)
                assert r.status == 200
                held[tag] = c
            on_owner = "ha" if owner.tag("ha")["inflight"] == 1 else "hb"
            on_other = "hb" if on_owner == "ha" else "ha"
            assert other.tag(on_other)["inflight"] == 1
            body = json.dumps({"model": "stub", "input": "next", "stream": False,
                               "previous_response_id": rid}).encode()
            hd = dict(CT)
            hd.update(FAST)
            hd.update(h.bearer(ACME_KEY))
            w = gw.client(timeout=30)
            w.send("POST", "/v1/responses", hd, body)
            h.wait_metric(gw, "sluice_queue_waiting", 1, timeout=10, upstream="main",
                          tenant="acme")
            # The other replica frees: not for this waiter, which waits on.
            held[on_other].close()
            h.wait_metric(gw, "sluice_replica_streams", 0, timeout=10,
                          upstream="main", replica=other.url)
            h.wait_metric(gw, "sluice_queue_waiting", 1, timeout=2, upstream="main",
                          tenant="acme")
            assert counts(other)["previous_missing"] == 0
            # Its own replica frees: it goes there.
            held[on_owner].close()
            r = w.read_response(timeout=20)
            r.read_all(timeout=20)
            assert r.status == 200, (r.status, bytes(r.data)[:300])
            assert port_of(json.loads(bytes(r.data))["id"]) == owner.port
            assert counts(owner)["previous_found"] == 1
            assert counts(other)["previous_found"] + counts(other)["previous_missing"] == 0
            w.close()
            h.wait_metric(gw, "sluice_queue_total", 1, upstream="main",
                          outcome="dispatched")
            assert result(gw, "owner") == 1


@h.timeout(60)
def test_stored_reload_keeps_the_table_and_a_removed_replica_balances():
    with Stub("r1") as s1, Stub("r2") as s2, Stub("r3") as s3:
        cfg = pool_cfg([s1, s2])
        with Gateway(cfg, allow_worker_changes=True) as gw:
            ids = [create(gw)[1] for _ in range(2)]
            assert {port_of(i) for i in ids} == {s1.port, s2.port}
            # A reload that keeps both replicas (a new ttl) keeps every id.
            cfg["upstreams"]["main"]["response_affinity"] = {"ttl": "2h"}
            h.reload(gw, cfg)
            for rid in ids:
                r = gw.request("GET", "/v1/responses/" + rid)
                assert r.status == 200, (rid, r.status)
            h.wait_metric(gw, "sluice_response_affinity_total", 2, upstream="main",
                          result="owner")
            # A reload that removes s1: its id names no replica of the pool.
            on1 = [i for i in ids if port_of(i) == s1.port][0]
            cfg["upstreams"]["main"]["replicas"] = [{"url": s2.url}, {"url": s3.url}]
            h.reload(gw, cfg)
            r = gw.request("GET", "/v1/responses/" + on1)
            assert r.status == 404
            assert counts(s1)["retrieve_missing"] == 0
            assert counts(s2)["retrieve_missing"] + counts(s3)["retrieve_missing"] == 1
            h.wait_metric(gw, "sluice_response_affinity_total", 1, upstream="main",
                          result="owner_down")
            on2 = [i for i in ids if port_of(i) == s2.port][0]
            assert gw.request("GET", "/v1/responses/" + on2).status == 200
            h.wait_metric(gw, "sluice_response_affinity_total", 3, upstream="main",
                          result="owner")


@h.timeout(60)
def test_stored_store_false_is_not_learnt_and_max_0_turns_it_off():
    with Stub("r1") as s1, Stub("r2") as s2:
        with Gateway(pool_cfg([s1, s2])) as gw:
            _, rid, _ = create(gw, store=False)
            # The runner kept nothing: sluice learns nothing (no entry to
            # push stored ids out of the table), and the follow-ups are
            # balanced as an unknown id is; each runner answers its 404.
            for _ in range(2):
                assert gw.request("GET", "/v1/responses/" + rid).status == 404
            assert counts(s1)["retrieve_missing"] == 1
            assert counts(s2)["retrieve_missing"] == 1
            assert result(gw, "unknown") == 2
            assert result(gw, "owner") == 0
            # "store": true (and no "store") is learnt as before.
            _, rid, _ = create(gw, store=True)
            owner = s1 if port_of(rid) == s1.port else s2
            for _ in range(2):
                assert gw.request("GET", "/v1/responses/" + rid).status == 200
            assert counts(owner)["retrieve_found"] == 2
            assert result(gw, "owner") == 2
        s1.reset()
        s2.reset()
        with Gateway(pool_cfg([s1, s2], response_affinity={"max": 0})) as gw:
            _, rid, _ = create(gw)
            for _ in range(2):
                gw.request("GET", "/v1/responses/" + rid)
            # Off: balanced as before, nothing counted.
            assert counts(s1)["retrieve_found"] + counts(s2)["retrieve_found"] == 1
            assert counts(s1)["retrieve_missing"] + counts(s2)["retrieve_missing"] == 1
            assert h.scrape(gw).series("sluice_response_affinity_total") == {}


def _sdk(scenario, gw, key=ACME_KEY):
    node = shutil.which("node")
    assert node, "node is not installed (./quickstart installs the test tools)"
    assert os.path.isdir(os.path.join(JS, "node_modules", "openai")), \
        "tests/js/node_modules/openai is missing: run ./quickstart build"
    p = subprocess.run([node, os.path.join(JS, "api_sdks.mjs"), scenario,
                        "http://127.0.0.1:%d" % gw.port, key],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, "node exited %d: %s" % (p.returncode, p.stderr[-2000:])
    return json.loads(p.stdout)


@h.skip_under("valgrind")
@h.timeout(90)
def test_stored_openai_sdk_chain_through_a_round_robin_pool_never_404s():
    with Stub("r1") as s1, Stub("r2") as s2, Gateway(pool_cfg([s1, s2])) as gw:
        out = _sdk("responses-chain", gw)
        assert len(out["turns"]) == 6, out
        assert all("error" not in t for t in out["turns"]), out["turns"]
        assert out["retrieved"] is None, out["retrieved"]
        assert len({port_of(t["id"]) for t in out["turns"]}) == 1, out["turns"]
        assert counts(s1)["previous_missing"] + counts(s2)["previous_missing"] == 0
        assert counts(s1)["previous_found"] + counts(s2)["previous_found"] == 5
        h.wait_metric(gw, "sluice_response_affinity_total", 6, upstream="main",
                      result="owner")

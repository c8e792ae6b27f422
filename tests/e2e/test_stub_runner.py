# SPDX-License-Identifier: BSD-2-Clause
"""The stub as a model runner (issue 14): --batch, --prefix-cache, --block,
--ttft-base-ms, --ttft-ms-per-kib, --prefill-mode, GET /metrics and
GET /stub/prefills.

Straight to the stub, no gateway: bench/routing and the routing tests rely on
these numbers, so the arithmetic of the model is pinned exactly (cached blocks,
the modelled prefill, queue and slot gauges). Wall-clock is only ever used as
a lower bound (a TTFT is at least the modelled delay), never as an upper one.
"""

import json
import subprocess
import time

import harness as h
from harness import Client, Stub, expected_events

CT = {"Content-Type": "application/json"}


def chat_body(*contents, stream=True):
    """A chat body whose messages carry these contents (system, user, ...)."""
    msgs = [{"role": "system" if i == 0 else "user" if i % 2 else "assistant",
             "content": c} for i, c in enumerate(contents)]
    return json.dumps({"model": "stub", "stream": stream, "messages": msgs}).encode()


def post(stub, body, path="/v1/chat/completions", events=2, interval=0):
    hd = dict(CT)
    hd.update(h.stub_headers(events=events, interval=interval))
    r = stub.direct("POST", path, hd, body)
    assert r.status == 200 and r.complete, (r.status, bytes(r.data[:200]))
    return r


def open_stream(stub, body, events, interval):
    """A stream on its own connection; the head is not read yet."""
    c = Client(stub.port, timeout=30)
    hd = dict(CT)
    hd.update(h.stub_headers(events=events, interval=interval))
    c.send("POST", "/v1/chat/completions", hd, body)
    return c


def metrics(stub):
    st, hd, body = stub._http("GET", "/metrics")
    assert st == 200, (st, body[:200])
    assert hd.get("Content-Type") == "text/plain; version=0.0.4; charset=utf-8", hd
    return h.Metrics(body.decode())


def gauges(stub):
    m = metrics(stub)
    return (m.get("vllm:num_requests_running", model_name="stub"),
            m.get("vllm:num_requests_waiting", model_name="stub"),
            m.get("vllm:kv_cache_usage_perc", model_name="stub"))


# ------------------------------------------------------------------ off by default

def test_runner_options_off_by_default_change_nothing_but_gauges():
    with Stub() as stub:
        r = post(stub, chat_body("a" * 1000, "hello"), events=3)
        assert bytes(r.data) == expected_events(3)
        st = stub.stats()
        assert st["runner"] == {"batch": 0, "prefix_cache": 0, "block": 64,
                                "ttft_base_ms": 0.0, "ttft_ms_per_kib": 0.0,
                                "prefill_mode": "independent"}, st["runner"]
        assert (st["running"], st["waiting"], st["max_running"], st["max_waiting"]) == \
            (0, 0, 1, 0), st
        assert st["prefills"] == 1 and st["prompt_bytes"] == 1005, st
        assert st["prompt_bytes_hit"] == 0 and st["prompt_blocks"] == 0, st
        assert st["cache_blocks"] == 0 and st["cache_evictions"] == 0, st
        lp = st["last_prefill"]
        assert lp["prefill_ms"] == 0.0 and lp["queue_ms"] == 0.0 and lp["hit_blocks"] == 0, lp
        assert gauges(stub) == (0.0, 0.0, 0.0)


def test_bad_runner_options_exit_2():
    for args in (["--batch", "-1"], ["--batch", "100001"], ["--prefix-cache", "x"],
                 ["--block", "15"], ["--block", "65537"], ["--ttft-base-ms", "1e3"],
                 ["--ttft-ms-per-kib", "86401"], ["--ttft-base-ms", ""],
                 ["--prefill-mode", "fifo"], ["--prefill-mode", ""]):
        p = subprocess.run([h.stub_bin(), "-l", "127.0.0.1:0"] + args,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        assert p.returncode == 2, (args, p.returncode, p.stderr[-300:])
        assert b"usage: sluice-stub" in p.stderr, (args, p.stderr[-300:])


# ------------------------------------------------------------------ lax bools (issue 22)

def test_stream_and_include_usage_are_read_as_vllm_reads_a_bool():
    # vLLM's pydantic (lax mode) streams for "stream": 1, "yes", 1.0 and takes
    # include_usage 0 or "false" for false; the stub does the same, so the
    # gateway's reading of them can be tested against it.
    hd = dict(CT)
    hd.update(h.stub_headers(events=2, interval=0))
    hd["X-Stub-Usage"] = "5,2"
    usage = (b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":0,'
             b'"model":"stub","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,'
             b'"total_tokens":7}}\n\n')
    with Stub() as stub:
        for stream, iu, streamed, asked in ((1, None, True, False), ("YES", None, True, False),
                                            (1.0, None, True, False), (0, None, False, False),
                                            ("off", None, False, False), (2, None, False, False),
                                            (True, 0, True, False), (True, "false", True, False),
                                            (True, "n", True, False), (True, 1, True, True),
                                            (True, "Yes", True, True)):
            d = {"model": "stub", "stream": stream, "messages": []}
            if iu is not None:
                d["stream_options"] = {"include_usage": iu}
            r = stub.direct("POST", "/v1/chat/completions", hd, json.dumps(d).encode())
            assert r.status == 200 and r.complete, (d, r.status)
            ct = r.header("content-type")
            assert ct.startswith("text/event-stream" if streamed else "application/json"), (d, ct)
            if streamed:
                want = (h.stub_event(0) + h.stub_event(1) + (usage if asked else b"") +
                        h.DONE_EVENT)
                assert bytes(r.data) == want, (d, bytes(r.data))


# ------------------------------------------------------------------ prefix cache

def test_second_identical_prompt_hits_every_whole_block():
    with Stub(args=("--prefix-cache", 64)) as stub:
        body = chat_body("s" * 1000, "hello")      # 1005 prompt bytes: 15 whole blocks
        post(stub, body)
        st = stub.stats()
        assert st["last_prefill"]["blocks"] == 15 and st["last_prefill"]["hit_blocks"] == 0, st
        assert st["cache_blocks"] == 15 and st["prefix_hit_requests"] == 0, st
        post(stub, body)
        st = stub.stats()
        lp = st["last_prefill"]
        assert (lp["prompt_bytes"], lp["blocks"], lp["hit_blocks"], lp["hit_bytes"]) == \
            (1005, 15, 15, 960), lp
        assert (st["prompt_bytes"], st["prompt_bytes_hit"]) == (2010, 960), st
        assert (st["prompt_blocks"], st["prefix_hit_blocks"], st["prefix_hit_requests"]) == \
            (30, 15, 1), st
        assert st["cache_blocks"] == 15 and st["prefills"] == 2, st
        assert gauges(stub) == (0.0, 0.0, 0.0)     # cached, not in use


def test_next_turn_hits_the_whole_blocks_of_the_previous_turn_only():
    with Stub(args=("--prefix-cache", 1000, "--block", 100)) as stub:
        turn1 = ["S" * 750, "first question"]                  # 764 bytes: 7 blocks
        post(stub, chat_body(*turn1))
        turn2 = turn1 + ["an answer", "second question"]       # 788 bytes: 7 blocks
        post(stub, chat_body(*turn2))
        lp = stub.stats()["last_prefill"]
        assert (lp["prompt_bytes"], lp["blocks"], lp["hit_blocks"]) == (788, 7, 7), lp
        turn3 = turn2 + ["b" * 300, "third"]                   # 1093 bytes: 10 blocks
        post(stub, chat_body(*turn3))
        lp = stub.stats()["last_prefill"]
        assert (lp["prompt_bytes"], lp["blocks"], lp["hit_blocks"]) == (1093, 10, 7), lp
        # Same bytes after a different first byte: the chain shares nothing.
        post(stub, chat_body("T" + "S" * 749, "first question"))
        lp = stub.stats()["last_prefill"]
        assert (lp["blocks"], lp["hit_blocks"]) == (7, 0), lp


def test_prompt_of_completions_and_content_parts_are_hashed_alike():
    with Stub(args=("--prefix-cache", 100)) as stub:
        text = "p" * 640                                       # 10 blocks
        post(stub, json.dumps({"stream": True, "prompt": text}).encode(),
             path="/v1/completions")
        parts = json.dumps({"stream": True, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "p" * 300}, {"type": "image_url", "image_url": {}},
            {"type": "text", "text": "p" * 340}]}]}).encode()
        post(stub, parts)
        lp = stub.stats()["last_prefill"]
        assert (lp["prompt_bytes"], lp["blocks"], lp["hit_blocks"]) == (640, 10, 10), lp


def test_lru_evicts_the_least_recent_blocks_and_keeps_a_prompts_head_longest():
    with Stub(args=("--prefix-cache", 20)) as stub:
        a, b = chat_body("a" * 960), chat_body("b" * 960)      # 15 blocks each
        post(stub, a)
        post(stub, b)
        st = stub.stats()
        assert (st["cache_blocks"], st["cache_evictions"]) == (20, 10), st
        # b's 15 new blocks pushed out a's tail (inserted tail first): its head stays.
        post(stub, a)
        st = stub.stats()
        assert st["last_prefill"]["hit_blocks"] == 5, st["last_prefill"]
        assert (st["cache_blocks"], st["cache_evictions"]) == (20, 20), st
        assert gauges(stub)[2] == 0.0              # full of cached blocks, none in use
        post(stub, b)
        assert stub.stats()["last_prefill"]["hit_blocks"] == 5


def test_reset_empties_the_prefix_cache_and_zeroes_the_runner_counters():
    with Stub(args=("--prefix-cache", 64)) as stub:
        body = chat_body("r" * 640)
        post(stub, body)
        post(stub, body)
        stub.reset()
        st = stub.stats()
        for k in ("prefills", "prompt_bytes", "prompt_bytes_hit", "prompt_blocks",
                  "prefix_hit_blocks", "prefix_hit_requests", "cache_blocks",
                  "cache_evictions", "max_running", "max_waiting"):
            assert st[k] == 0, (k, st)
        assert st["last_prefill"] is None and st["queue_ms_total"] == 0.0, st
        assert gauges(stub) == (0.0, 0.0, 0.0)
        post(stub, body)
        assert stub.stats()["last_prefill"]["hit_blocks"] == 0


# ------------------------------------------------------------------ TTFT model

def test_ttft_is_base_plus_cost_of_uncached_kib():
    with Stub(args=("--prefix-cache", 1000, "--ttft-base-ms", 50,
                    "--ttft-ms-per-kib", "100.5")) as stub:
        body = chat_body("k" * 2048)
        for want_prefill, want_hit, b in ((50 + 2 * 100.5, 0, body),
                                          (50.0, 32, body),
                                          (50 + 100.5, 32, chat_body("k" * 2048, "n" * 1024))):
            c = Client(stub.port, timeout=30)
            hd = dict(CT)
            hd.update(h.stub_headers(events=1, interval=0))
            t0 = time.monotonic()
            c.send("POST", "/v1/chat/completions", hd, b)
            r = c.read_response()
            ttft = (time.monotonic() - t0) * 1000.0
            r.read_all()
            c.close()
            assert r.status == 200 and r.complete
            lp = stub.stats()["last_prefill"]
            assert lp["hit_blocks"] == want_hit, lp
            assert abs(lp["prefill_ms"] - want_prefill) < 0.001, (lp, want_prefill)
            assert lp["queue_ms"] == 0.0, lp
            assert lp["ttft_ms"] >= want_prefill, lp
            assert ttft >= want_prefill, "head after %.1f ms, model says %.1f" % (
                ttft, want_prefill)


# ------------------------------------------------------------------ batch and queue

@h.timeout(60)
def test_batch_of_one_queues_the_second_request_until_the_first_ends():
    with Stub(args=("--batch", 1, "--ttft-base-ms", 5)) as stub:
        c1 = open_stream(stub, chat_body("first"), events=3, interval=400)
        r1 = c1.read_response()
        assert r1.status == 200
        r1.read_events(1)
        c2 = open_stream(stub, chat_body("second"), events=1, interval=0)
        h.wait_until(lambda: stub.stats()["waiting"] == 1, msg="second request queued")
        assert gauges(stub) == (1.0, 1.0, 0.0)
        st = stub.stats()
        assert (st["running"], st["waiting"], st["max_running"], st["max_waiting"]) == \
            (1, 1, 1, 1), st
        assert st["prefills"] == 1 and st["inflight"] == 2, st
        assert r1.read_all() == expected_events(3) and r1.complete
        r2 = c2.read_response()
        assert r2.status == 200 and r2.read_all() == expected_events(1)
        st = stub.stats()
        assert (st["running"], st["waiting"], st["max_running"], st["prefills"]) == \
            (0, 0, 1, 2), st
        # It waited for the first stream's last events (400 ms apart).
        assert st["last_prefill"]["queue_ms"] > 0, st["last_prefill"]
        assert st["last_prefill"]["ttft_ms"] >= st["last_prefill"]["queue_ms"] + 5.0, st
        c1.close()
        c2.close()


@h.timeout(60)
def test_a_client_that_leaves_the_queue_frees_its_place():
    with Stub(args=("--batch", 1)) as stub:
        c1 = open_stream(stub, chat_body("first"), events=2, interval=600)
        r1 = c1.read_response()
        r1.read_events(1)
        c2 = open_stream(stub, chat_body("gone"), events=1, interval=0)
        h.wait_until(lambda: stub.stats()["waiting"] == 1, msg="second request queued")
        c2.close()
        h.wait_until(lambda: stub.stats()["waiting"] == 0, msg="the queue emptied")
        st = stub.stats()
        assert st["aborted_by_client"] == 1 and st["running"] == 1, st
        assert r1.read_all() == expected_events(2)
        c1.close()
        # The slot is free: the next request is served with no wait.
        post(stub, chat_body("third"))
        st = stub.stats()
        assert st["prefills"] == 2 and st["last_prefill"]["queue_ms"] == 0.0, st
        assert (st["running"], st["waiting"]) == (0, 0), st


@h.timeout(60)
def test_a_freed_slot_goes_to_the_longest_waiting_request():
    with Stub(args=("--batch", 1)) as stub:
        hold = open_stream(stub, chat_body("hold"), events=2, interval=300)
        hold.read_response().read_events(1)
        waiting = []
        for i in range(3):
            # prompts of 10, 20, 30 bytes: last_prefill tells which one got the slot
            waiting.append(open_stream(stub, chat_body("w" * 10 * (i + 1)), events=2,
                                       interval=500))
            h.wait_until(lambda: stub.stats()["waiting"] == i + 1, msg="queued %d" % i)
        assert gauges(stub)[:2] == (1.0, 3.0)
        for i, c in enumerate(waiting):
            r = c.read_response()          # its head: its prefill just ended
            st = stub.stats()
            assert st["prefills"] == 2 + i, st
            assert st["last_prefill"]["prompt_bytes"] == 10 * (i + 1), st["last_prefill"]
            assert (st["running"], st["waiting"]) == (1, 2 - i), st
            assert r.read_all() == expected_events(2)
        st = stub.stats()
        assert (st["max_running"], st["max_waiting"], st["running"], st["waiting"]) == \
            (1, 3, 0, 0), st
        hold.close()
        for c in waiting:
            c.close()


def test_metrics_parse_as_prometheus_text_in_vllm_names():
    with Stub(args=("--prefix-cache", 10)) as stub:
        post(stub, chat_body("m" * 256))                      # 4 blocks
        m = metrics(stub)
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:kv_cache_usage_perc"):
            assert m.types[name] == "gauge", (name, m.types)
            assert m.helps[name], name
            assert list(m.series(name)) == [(("model_name", "stub"),)], m.series(name)
        # KV in use is what running requests hold, as vLLM counts it: the
        # 4 blocks cached by the finished request are free to evict.
        assert m.get("vllm:kv_cache_usage_perc", model_name="stub") == 0.0
        assert m.get("vllm:num_requests_running", model_name="stub") == 0.0
        c = open_stream(stub, chat_body("n" * 192), events=100, interval=100)   # 3 blocks
        h.wait_until(lambda: gauges(stub)[0] == 1.0, 5, msg="the stream to run")
        assert gauges(stub) == (1.0, 0.0, 0.3)
        c.close()
        h.wait_until(lambda: gauges(stub) == (0.0, 0.0, 0.0), 5, msg="the slot to free")
        st = stub.stats()
        assert st["requests"] == 2, "GET /metrics counted as a /v1/ request: %r" % st


# ------------------------------------------------------------------ shared prefill compute

def prefills(stub):
    st, _, body = stub._http("GET", "/stub/prefills")
    assert st == 200, (st, body[:200])
    return json.loads(body)["prefills"]


def two_concurrent_prefills(mode):
    """A (2 KiB, 400 ms of compute) then B (1 KiB, 200 ms) on two connections,
    B sent once A has its slot: the records of both, in the order they ended, and
    the gauges seen while both were prefilling."""
    with Stub(args=("--prefill-mode", mode, "--ttft-base-ms", 10,
                    "--ttft-ms-per-kib", 200)) as stub:
        ca = open_stream(stub, chat_body("a" * 2048), events=1, interval=0)
        # Two connections ready in one loop iteration are served in either
        # order: B goes out once A holds its slot.
        h.wait_until(lambda: stub.stats()["prefilling"] == 1, 5, msg="A prefilling")
        cb = open_stream(stub, chat_body("b" * 1024), events=1, interval=0)
        h.wait_until(lambda: stub.stats()["prefilling"] == 2, 5, msg="both prefilling")
        st = stub.stats()
        during = (st["running"], st["waiting"], st["prefilling"], st["lane_backlog_ms"],
                  gauges(stub)[:2])
        for c in (ca, cb):
            r = c.read_response()
            assert r.status == 200 and r.read_all() == expected_events(1)
            c.close()
        recs = prefills(stub)
        st = stub.stats()
        assert st["prefilling"] == 0 and st["lane_backlog_ms"] == 0.0, st
        assert st["runner"]["prefill_mode"] == mode, st["runner"]
        assert abs(st["lane_ms_total"] - sum(x["lane_ms"] for x in recs)) < 0.01, st
        return recs, during


@h.timeout(60)
def test_shared_lane_second_concurrent_prefill_waits_for_the_first_ones_compute():
    recs, during = two_concurrent_prefills("shared")
    a, b = recs
    assert (a["prompt_bytes"], b["prompt_bytes"]) == (2048, 1024), recs
    assert a["lane_ms"] == 0.0 and abs(a["prefill_ms"] - 410.0) < 0.001, a
    assert abs(b["prefill_ms"] - 210.0) < 0.001, b
    # Exact: B's compute starts when A's ends (base is not lane time).
    assert abs(b["slot_ms"] + b["lane_ms"] - (a["slot_ms"] + 400.0)) < 0.01, recs
    gap = b["slot_ms"] - a["slot_ms"]
    assert 0 < gap < 300, "B was given its slot %.1f ms after A" % gap
    # So B's modelled TTFT from its slot is the sum of both computes + base - gap.
    assert abs(b["lane_ms"] + b["prefill_ms"] - (400 + 200 + 10 - gap)) < 0.01, recs
    for x in recs:
        assert x["ttft_ms"] >= x["queue_ms"] + x["lane_ms"] + x["prefill_ms"] - 0.01, x
    running, waiting, prefilling, backlog, g = during
    # Both hold a slot (vLLM counts a request in chunked prefill as running).
    assert (running, waiting, prefilling) == (2, 0, 2) and g == (2.0, 0.0), during
    assert 0 < backlog <= 600.0, during


@h.timeout(60)
def test_independent_prefills_overlap_and_never_wait_for_a_lane():
    recs, during = two_concurrent_prefills("independent")
    b, a = sorted(recs, key=lambda x: x["prompt_bytes"])
    assert (a["prompt_bytes"], b["prompt_bytes"]) == (2048, 1024), recs
    assert a["lane_ms"] == 0.0 and b["lane_ms"] == 0.0, recs
    assert abs(a["prefill_ms"] - 410.0) < 0.001 and abs(b["prefill_ms"] - 210.0) < 0.001
    assert during[:3] == (2, 0, 2) and during[3] == 0.0, during


@h.timeout(60)
def test_shared_lane_a_client_that_leaves_mid_prefill_gives_its_compute_back():
    with Stub(args=("--prefill-mode", "shared", "--ttft-ms-per-kib", 200)) as stub:
        # A: 15 KiB = 3,000 ms of compute; B queued behind it in the lane.
        ca = open_stream(stub, chat_body("a" * 15 * 1024), events=1, interval=0)
        h.wait_until(lambda: stub.stats()["prefilling"] == 1, 5, msg="A prefilling")
        cb = open_stream(stub, chat_body("b" * 512), events=1, interval=0)
        h.wait_until(lambda: stub.stats()["prefilling"] == 2, 5, msg="B in the lane")
        assert stub.stats()["lane_backlog_ms"] > 2000, stub.stats()
        ca.close()
        r = cb.read_response()
        assert r.status == 200 and r.read_all() == expected_events(1)
        cb.close()
        recs = prefills(stub)
        assert len(recs) == 1 and recs[0]["prompt_bytes"] == 512, recs
        b = recs[0]
        # Without the give-back B would wait for all of A's 3,000 ms.
        assert 0 < b["lane_ms"] < 2000, b
        assert abs(b["prefill_ms"] - 100.0) < 0.001, b
        st = stub.stats()
        assert (st["aborted_by_client"], st["prefilling"], st["running"]) == (1, 0, 0), st
        assert st["lane_backlog_ms"] == 0.0, st


def test_prefills_ring_keeps_the_last_records_and_is_emptied_by_reset():
    with Stub(args=("--prefix-cache", 64)) as stub:
        assert prefills(stub) == []
        body = chat_body("r" * 640)
        post(stub, body)
        post(stub, body)
        recs = prefills(stub)
        assert [(x["prompt_bytes"], x["hit_bytes"]) for x in recs] == [(640, 0), (640, 640)]
        assert all(x["lane_ms"] == 0.0 and x["prefill_ms"] == 0.0 for x in recs), recs
        stub.reset()
        assert prefills(stub) == []


def test_model_knob_names_the_model_in_each_event_at_the_same_size():
    with Stub() as stub:
        hd = dict(CT, **h.stub_headers(events=2, interval=0, size=200))
        hd["X-Stub-Model"] = "1"
        r = stub.direct("POST", "/v1/chat/completions", hd, chat_body("hi"))
        assert r.status == 200 and r.complete
        plain = expected_events(2, 200)
        want = plain.replace(b'"object":"chat.completion.chunk",',
                             b'"object":"chat.completion.chunk","model":"stub",')
        # The padding makes up for the member: each event is still 200 bytes.
        want = want.replace(b'"pad":"' + b"x" * 15, b'"pad":"')
        assert bytes(r.data) == want, bytes(r.data)
        for ev in bytes(r.data).split(b"\n\n")[:2]:
            assert len(ev) + 2 == 200, len(ev)

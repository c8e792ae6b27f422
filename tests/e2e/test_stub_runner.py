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


# ------------------------------------------------------------------ Responses, Messages, embeddings

def sse(data):
    """An SSE body as [(event, parsed data)], checking each is exactly
    "event: TYPE\\ndata: ONE-LINE-JSON\\n\\n" with the data's "type" == TYPE."""
    data = bytes(data)
    assert data.endswith(b"\n\n") or data == b"", data[-80:]
    out = []
    for raw in data.split(b"\n\n")[:-1]:
        lines = raw.split(b"\n")
        assert len(lines) == 2 and lines[0].startswith(b"event: ") and \
            lines[1].startswith(b"data: "), raw[:200]
        typ = lines[0][7:].decode()
        doc = json.loads(lines[1][6:])
        assert doc["type"] == typ, (typ, doc)
        out.append((typ, doc))
    return out


def api_post(stub, path, body, events=3, interval=0, extra=None, client=None):
    hd = dict(CT)
    hd.update(h.stub_headers(events=events, interval=interval))
    hd.update(extra or {})
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    if client is not None:
        return client.request("POST", path, hd, body)
    return stub.direct("POST", path, hd, body)


def ids(stub, n):
    """resp_/msg_ ids of the stub's n-th Responses or Messages answer."""
    tail = "_%d_%d_%d" % (stub.port, stub.proc.pid, n)
    return "resp" + tail, "msg" + tail


RESP_TYPES_HEAD = ["response.created", "response.in_progress",
                   "response.output_item.added", "response.content_part.added"]
RESP_TYPES_TAIL = ["response.output_text.done", "response.content_part.done",
                   "response.output_item.done", "response.completed"]


def response_object(rid, mid, model, status, text=None, usage=None, prev=None,
                    store=True, instructions=None):
    """A Responses API object as the stub documents it (dict, member order kept)."""
    output = []
    if status == "completed":
        output = [{"id": mid, "type": "message", "status": "completed",
                   "content": [{"type": "output_text", "annotations": [], "logprobs": [],
                                "text": text}], "role": "assistant"}]
    return {"id": rid, "object": "response", "created_at": 0, "status": status,
            "background": False, "error": None, "incomplete_details": None,
            "instructions": instructions, "max_output_tokens": None, "model": model,
            "output": output, "parallel_tool_calls": True,
            "previous_response_id": prev, "reasoning": None, "store": store,
            "temperature": 1.0, "text": {"format": {"type": "text"}},
            "tool_choice": "auto", "tools": [], "top_p": 1.0, "truncation": "disabled",
            "usage": usage, "user": None, "metadata": {}}


def resp_usage(p, c):
    return {"input_tokens": p, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": c, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + c}


def not_stored(rid):
    return {"error": {"message": "Response with id '%s' not found." % rid,
                      "type": "invalid_request_error", "param": "response_id",
                      "code": 404}}


def test_responses_stream_is_openais_event_sequence_one_chunk_each():
    with Stub() as stub:
        r = api_post(stub, "/v1/responses",
                     {"model": "my-model", "stream": True, "input": "hello",
                      "instructions": "be brief"},
                     events=3, extra={"X-Stub-Usage": "11,3"})
        assert r.status == 200 and r.complete, (r.status, bytes(r.data[:200]))
        assert r.header("content-type") == "text/event-stream"
        assert r.header("transfer-encoding") == "chunked"
        evs = sse(r.data)
        assert [t for t, _ in evs] == RESP_TYPES_HEAD + \
            ["response.output_text.delta"] * 3 + RESP_TYPES_TAIL, evs
        assert [d["sequence_number"] for _, d in evs] == list(range(11))
        # One chunk per event, and no [DONE] on /v1/responses.
        assert len(r.chunk_times) == 11, r.chunk_times
        assert b"[DONE]" not in bytes(r.data)
        rid, mid = ids(stub, 1)
        text = "tok0 tok1 tok2 "
        d = dict(evs)
        inprog = response_object(rid, mid, "my-model", "in_progress",
                                 instructions="be brief")
        assert evs[0][1] == {"type": "response.created", "sequence_number": 0,
                             "response": inprog}
        assert evs[1][1] == {"type": "response.in_progress", "sequence_number": 1,
                             "response": inprog}
        assert d["response.output_item.added"]["item"] == \
            {"id": mid, "type": "message", "status": "in_progress", "content": [],
             "role": "assistant"}
        assert d["response.content_part.added"]["part"] == \
            {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        # Deltas byte for byte, members in OpenAI's order.
        raw = bytes(r.data).split(b"\n\n")
        for i in range(3):
            assert raw[4 + i] == (
                'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
                '"sequence_number":%d,"item_id":"%s","output_index":0,"content_index":0,'
                '"delta":"tok%d ","logprobs":[]}' % (4 + i, mid, i)).encode(), raw[4 + i]
        assert d["response.output_text.done"]["text"] == text
        assert d["response.content_part.done"]["part"]["text"] == text
        assert d["response.output_item.done"]["item"]["status"] == "completed"
        done = d["response.completed"]["response"]
        assert done == response_object(rid, mid, "my-model", "completed", text,
                                       resp_usage(11, 3), instructions="be brief"), done
        st = stub.stats()
        assert (st["streams_started"], st["streams_completed"]) == (1, 1), st
        assert (st["responses_stored"], st["responses_held"]) == (1, 1), st
        assert st["usage_chunks"] == 0 and st["include_usage_requests"] == 0, st


def test_responses_json_usage_defaults_ignore_usage_and_model_default():
    with Stub() as stub:
        body = json.dumps({"input": "x" * 37}).encode()       # no model, no stream
        r = api_post(stub, "/v1/responses", body, events=2)
        assert r.status == 200 and r.header("content-type") == "application/json"
        assert int(r.header("content-length")) == len(r.data)
        rid, mid = ids(stub, 1)
        p = (len(body) + 3) // 4
        assert r.json() == response_object(rid, mid, "stub", "completed", "tok0 tok1 ",
                                           resp_usage(p, 2)), r.json()
        r = api_post(stub, "/v1/responses", {"model": "m", "stream": True, "input": "y"},
                     events=1, extra={"X-Stub-Ignore-Usage": "1"})
        assert dict(sse(r.data))["response.completed"]["response"]["usage"] is None
        r = api_post(stub, "/v1/responses", {"model": "m", "input": "y"}, events=1,
                     extra={"X-Stub-Ignore-Usage": "1"})
        assert r.json()["usage"] is None


def test_responses_stream_paces_the_deltas_only():
    with Stub() as stub:
        t0 = time.monotonic()
        r = api_post(stub, "/v1/responses", {"stream": True, "input": "a"}, events=3,
                     interval=100)
        assert r.complete and len(sse(r.data)) == 11
        assert time.monotonic() - t0 >= 0.2       # two pauses between three deltas


def test_responses_abort_after_counts_deltas_only():
    with Stub() as stub:
        for k, want in ((0, []),
                        (2, RESP_TYPES_HEAD + ["response.output_text.delta"] * 2),
                        (3, RESP_TYPES_HEAD + ["response.output_text.delta"] * 3)):
            r = api_post(stub, "/v1/responses", {"stream": True, "input": "a"}, events=3,
                         extra={"X-Stub-Abort-After": str(k)})
            assert r.status == 200 and r.cut and not r.complete, (k, r.complete)
            assert [t for t, _ in sse(r.data)] == want, (k, bytes(r.data)[-300:])
        # K > events never fires; cut streams were not stored (no completed event).
        r = api_post(stub, "/v1/responses", {"stream": True, "input": "a"}, events=3,
                     extra={"X-Stub-Abort-After": "4"})
        assert r.complete and len(sse(r.data)) == 11
        st = stub.stats()
        assert st["responses_stored"] == 1 and st["streams_completed"] == 1, st
        # Non-stream: the head with the full Content-Length, then the close.
        r = api_post(stub, "/v1/responses", {"input": "a"}, events=3,
                     extra={"X-Stub-Abort-After": "0"})
        assert r.status == 200 and r.cut and len(r.data) == 0
        assert int(r.header("content-length")) > 0


def test_stored_responses_get_cancel_input_items_delete():
    with Stub() as stub:
        items = [{"id": "in_1", "type": "message", "role": "user", "content": "hi"},
                 {"type": "message", "role": "user", "content": "there", "id": "in_2"}]
        r = api_post(stub, "/v1/responses", {"model": "m", "input": items}, events=2)
        obj = r.json()
        rid = obj["id"]
        assert rid == ids(stub, 1)[0]
        with Client(stub.port) as c:
            g = c.request("GET", "/v1/responses/" + rid)
            assert g.status == 200 and bytes(g.data) == bytes(r.data)
            g = c.request("POST", "/v1/responses/%s/cancel" % rid)
            assert g.status == 200 and bytes(g.data) == bytes(r.data)
            g = c.request("GET", "/v1/responses/%s/input_items" % rid)
            assert g.status == 200 and g.json() == {"object": "list", "data": items,
                                                    "first_id": "in_1", "last_id": "in_2",
                                                    "has_more": False}, g.json()
            g = c.request("DELETE", "/v1/responses/" + rid)
            assert g.status == 200 and g.json() == \
                {"id": rid, "object": "response.deleted", "deleted": True}
            for m, p in (("GET", ""), ("DELETE", ""), ("POST", "/cancel"),
                         ("GET", "/input_items")):
                g = c.request(m, "/v1/responses/%s%s" % (rid, p))
                assert g.status == 404 and g.json() == not_stored(rid), (m, p, g.json())
            # Other methods on those paths are plain 404s.
            g = c.request("PUT", "/v1/responses/" + rid)
            assert g.status == 404 and g.json()["error"]["message"] == "not found"
        st = stub.stats()
        assert (st["responses_stored"], st["responses_held"], st["responses_deleted"]) == \
            (1, 0, 1), st
        assert (st["retrieve_found"], st["retrieve_missing"]) == (4, 4), st


def test_string_input_items_and_store_false():
    with Stub() as stub:
        rid = api_post(stub, "/v1/responses", {"input": "say \"hi\""}, events=1).json()["id"]
        g = stub.direct("GET", "/v1/responses/%s/input_items" % rid)
        assert g.json() == {"object": "list", "data": [
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": 'say "hi"'}]}],
            "first_id": None, "last_id": None, "has_more": False}, g.json()
        r = api_post(stub, "/v1/responses", {"input": "x", "store": False}, events=1)
        assert r.json()["store"] is False
        g = stub.direct("GET", "/v1/responses/" + r.json()["id"])
        assert g.status == 404
        assert stub.stats()["responses_held"] == 1


def test_previous_response_id_found_chains_missing_is_vllms_404():
    with Stub() as stub:
        first = api_post(stub, "/v1/responses", {"input": "one"}, events=1).json()
        r = api_post(stub, "/v1/responses", {"input": "two", "stream": True,
                                             "previous_response_id": first["id"]}, events=1)
        done = dict(sse(r.data))["response.completed"]["response"]
        assert done["previous_response_id"] == first["id"] and done["id"] == ids(stub, 2)[0]
        hd = dict(CT)
        body = json.dumps({"input": "x", "previous_response_id": 'resp_no"pe'}).encode()
        r = stub.direct("POST", "/v1/responses", hd, body)
        assert r.status == 404 and r.header("content-type") == "application/json"
        assert bytes(r.data) == (b'{"error":{"message":"Response with id \'resp_no\\"pe\' not '
                                 b'found.","type":"invalid_request_error","param":"response_id",'
                                 b'"code":404}}'), bytes(r.data)
        st = stub.stats()
        assert (st["previous_found"], st["previous_missing"]) == (1, 1), st
        assert st["prefills"] == 2, st        # the 404 took no slot
        # X-Stub-Status wins over the lookup.
        hd["X-Stub-Status"] = "500"
        r = stub.direct("POST", "/v1/responses", hd, body)
        assert r.status == 500 and r.json()["error"]["message"] == "stub status 500"
        # Reset forgets every stored response.
        stub.reset()
        g = stub.direct("GET", "/v1/responses/" + first["id"])
        assert g.status == 404 and stub.stats()["responses_held"] == 0


def test_two_stubs_make_distinct_ids_that_name_their_replica():
    with Stub() as a, Stub() as b:
        ra = api_post(a, "/v1/responses", {"input": "x"}, events=1).json()["id"]
        rb = api_post(b, "/v1/responses", {"input": "x"}, events=1).json()["id"]
        assert ra != rb and ra == ids(a, 1)[0] and rb == ids(b, 1)[0]
        # Each holds only its own.
        assert a.direct("GET", "/v1/responses/" + rb).status == 404
        assert b.direct("GET", "/v1/responses/" + rb).status == 200
        r = api_post(a, "/v1/responses", {"input": "y", "previous_response_id": rb}, events=1)
        assert r.status == 404 and r.json() == not_stored(rb)


def test_a_chain_starts_its_prompt_with_the_stored_conversation():
    with Stub(args=("--prefix-cache", 64)) as stub:
        first = api_post(stub, "/v1/responses", {"input": "A" * 200}, events=2).json()
        assert stub.stats()["last_prefill"]["prompt_bytes"] == 200
        api_post(stub, "/v1/responses", {"input": "next", "instructions": "sys",
                                         "previous_response_id": first["id"]}, events=1)
        lp = stub.stats()["last_prefill"]
        # The stored conversation (prompt + "tok0 tok1 "), then instructions and input.
        assert lp["prompt_bytes"] == 200 + 10 + 3 + 4, lp
        assert (lp["blocks"], lp["hit_blocks"]) == (3, 3), lp


def anth_events(mid, model, n, usage_in=None, out=None, ignore=False):
    """The documented Messages stream, as [(type, dict)]."""
    msg = {"id": mid, "type": "message", "role": "assistant", "model": model,
           "content": [], "stop_reason": None, "stop_sequence": None}
    if not ignore:
        msg["usage"] = dict(usage_in, output_tokens=1)
    evs = [("message_start", {"type": "message_start", "message": msg}),
           ("content_block_start", {"type": "content_block_start", "index": 0,
                                    "content_block": {"type": "text", "text": ""}}),
           ("ping", {"type": "ping"})]
    evs += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": "tok%d " % i}})
            for i in range(n)]
    md = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
    if not ignore:
        md["usage"] = {"output_tokens": out}
    evs += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", md), ("message_stop", {"type": "message_stop"})]
    return evs


MSG_BODY = {"model": "claude-x", "max_tokens": 10, "stream": True, "system": "sys",
            "messages": [{"role": "user", "content": "hi"}]}


def test_messages_stream_is_anthropics_event_sequence():
    with Stub() as stub:
        r = api_post(stub, "/v1/messages", MSG_BODY, events=2,
                     extra={"X-Stub-Usage": "9,2", "X-Stub-Cache-Tokens": "5,7"})
        assert r.status == 200 and r.complete
        assert r.header("content-type") == "text/event-stream"
        mid = ids(stub, 1)[1]
        usage = {"input_tokens": 9, "cache_creation_input_tokens": 5,
                 "cache_read_input_tokens": 7}
        assert sse(r.data) == anth_events(mid, "claude-x", 2, usage, 2)
        assert len(r.chunk_times) == 8 and b"[DONE]" not in bytes(r.data)
        raw = bytes(r.data).split(b"\n\n")
        assert raw[0].endswith(b'"usage":{"input_tokens":9,"cache_creation_input_tokens":5,'
                               b'"cache_read_input_tokens":7,"output_tokens":1}}}'), raw[0]
        assert raw[2] == b'event: ping\ndata: {"type": "ping"}'
        assert raw[3] == (b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                          b'"index":0,"delta":{"type":"text_delta","text":"tok0 "}}')
        assert raw[6] == (b'event: message_delta\ndata: {"type":"message_delta","delta":'
                          b'{"stop_reason":"end_turn","stop_sequence":null},"usage":'
                          b'{"output_tokens":2}}')
        # Defaults: P = ceil(body / 4), C = events, no cache members; ignore-usage.
        body = json.dumps(MSG_BODY).encode()
        r = api_post(stub, "/v1/messages", body, events=1)
        assert sse(r.data) == anth_events(ids(stub, 2)[1], "claude-x", 1,
                                          {"input_tokens": (len(body) + 3) // 4}, 1)
        r = api_post(stub, "/v1/messages", body, events=1,
                     extra={"X-Stub-Ignore-Usage": "1"})
        assert sse(r.data) == anth_events(ids(stub, 3)[1], "claude-x", 1, ignore=True)


def test_messages_abort_after_counts_deltas_only():
    with Stub() as stub:
        for k, n in ((0, 0), (1, 4), (2, 5)):
            r = api_post(stub, "/v1/messages", MSG_BODY, events=2,
                         extra={"X-Stub-Abort-After": str(k)})
            assert r.cut and not r.complete, k
            evs = sse(r.data)
            assert len(evs) == n and (n == 0 or evs[-1][0] == "content_block_delta"), (k, evs)


def test_messages_json_count_tokens_and_anthropic_shaped_stub_errors():
    with Stub() as stub:
        body = dict(MSG_BODY, stream=False)
        r = api_post(stub, "/v1/messages", body, events=2,
                     extra={"X-Stub-Usage": "4,2", "X-Stub-Cache-Tokens": "0,3"})
        assert r.status == 200 and r.json() == {
            "id": ids(stub, 1)[1], "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": "tok0 tok1 "}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 4, "cache_creation_input_tokens": 0,
                                             "cache_read_input_tokens": 3, "output_tokens": 2}}
        r = api_post(stub, "/v1/messages", body, events=1, extra={"X-Stub-Ignore-Usage": "1"})
        assert "usage" not in r.json()
        ct = json.dumps({"model": "c", "messages": [{"role": "user", "content": "x"}]}).encode()
        r = api_post(stub, "/v1/messages/count_tokens", ct)
        assert r.status == 200 and r.json() == {"input_tokens": (len(ct) + 3) // 4}
        r = api_post(stub, "/v1/messages/count_tokens", ct, extra={"X-Stub-Usage": "42,1"})
        assert bytes(r.data) == b'{"input_tokens":42}'
        r = api_post(stub, "/v1/messages", body, extra={"X-Stub-Status": "529"})
        assert r.status == 529 and bytes(r.data) == \
            b'{"type":"error","error":{"type":"stub","message":"stub status 529"}}'
        st, _, _ = stub._http("POST", "/stub/busy?on=1&status=429&retry_after=3", body=b"")
        assert st == 200
        r = api_post(stub, "/v1/messages", body)
        assert r.status == 429 and r.header("retry-after") == "3"
        assert bytes(r.data) == b'{"type":"error","error":{"type":"stub","message":"stub busy"}}'
        # The other APIs keep the stub's own shape; count_tokens is no completion.
        for path in ("/v1/responses", "/v1/embeddings"):
            r = api_post(stub, path, {"input": "x"})
            assert r.status == 429 and r.json()["error"] == \
                {"message": "stub busy", "type": "stub", "code": 429}, (path, r.json())
        assert api_post(stub, "/v1/messages/count_tokens", ct).status == 200
        assert stub.stats()["busy_rejected"] == 3


def test_embeddings_string_array_tokens_base64_and_bad_input():
    with Stub() as stub:
        body = json.dumps({"model": "emb", "input": "abcd"}).encode()
        r = api_post(stub, "/v1/embeddings", body)
        assert r.status == 200 and r.header("content-type") == "application/json"
        assert bytes(r.data) == (
            b'{"object":"list","data":[{"object":"embedding","embedding":[4.0,0.0,0.5,-0.25],'
            b'"index":0}],"model":"emb","usage":{"prompt_tokens":%d,"total_tokens":%d}}'
            % ((len(body) + 3) // 4, (len(body) + 3) // 4)), bytes(r.data)
        r = api_post(stub, "/v1/embeddings", {"input": ["a", "bcd", [1, 2]]},
                     extra={"X-Stub-Usage": "7,0"})
        assert r.json() == {"object": "list", "data": [
            {"object": "embedding", "embedding": [1.0, 0.0, 0.5, -0.25], "index": 0},
            {"object": "embedding", "embedding": [3.0, 1.0, 0.5, -0.25], "index": 1},
            {"object": "embedding", "embedding": [2.0, 2.0, 0.5, -0.25], "index": 2}],
            "model": "stub", "usage": {"prompt_tokens": 7, "total_tokens": 7}}, r.json()
        r = api_post(stub, "/v1/embeddings", {"input": [5, 6, 7], "encoding_format": "base64"},
                     extra={"X-Stub-Ignore-Usage": "1"})
        doc = r.json()
        assert "usage" not in doc and len(doc["data"]) == 1
        import base64
        import struct
        assert struct.unpack("<4f", base64.b64decode(doc["data"][0]["embedding"])) == \
            (3.0, 0.0, 0.5, -0.25)
        assert api_post(stub, "/v1/embeddings", {"input": []}).json()["data"] == []
        for bad in ({"input": {"x": 1}}, {"model": "m"}, {"input": ["a", 3]}, b"not json"):
            r = api_post(stub, "/v1/embeddings", bad)
            assert r.status == 400 and r.json()["error"]["message"].startswith("bad input"), bad
        assert stub.stats()["prefills"] == 4         # the 400s took no slot


def test_new_apis_are_completions_for_last_loading_and_the_runner():
    with Stub(args=("--batch", 1)) as stub:
        body = json.dumps({"model": "m", "stream": True, "input": "queued?"}).encode()
        for path in ("/v1/responses", "/v1/messages", "/v1/embeddings",
                     "/v1/messages/count_tokens"):
            api_post(stub, path, body, events=1)
            st, hd, got = stub._http("GET", "/stub/last")
            assert st == 200 and got == body and hd["X-Stub-Path"] == path, (path, hd)
        st = stub.stats()
        assert st["prefills"] == 3 and st["requests"] == 4, st    # count_tokens: no slot
        assert st["prompt_bytes"] == 7 * 2, st       # responses "input" + embeddings "input"
        # With the one slot held by a slow stream, a Messages request waits its turn.
        c = Client(stub.port, timeout=30)
        hd = dict(CT, **h.stub_headers(events=3, interval=150))
        c.send("POST", "/v1/responses", hd, body)
        c.read_response()
        h.wait_until(lambda: stub.stats()["running"] == 1)
        t0 = time.monotonic()
        r = api_post(stub, "/v1/messages", MSG_BODY, events=1)
        assert r.complete and time.monotonic() - t0 >= 0.2
        assert stub.stats()["max_waiting"] == 1
        c.close()
        st, _, _ = stub._http("POST", "/stub/slow-start?seconds=30", body=b"")
        r = api_post(stub, "/v1/messages", MSG_BODY)
        assert r.status == 503 and r.json()["error"]["message"] == "Loading model"


def test_the_openai_node_sdk_parses_responses_chains_and_embeddings():
    import os
    import shutil
    js = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "js")
    node = shutil.which("node")
    assert node, "node is not installed (./quickstart installs the test tools)"
    assert os.path.isdir(os.path.join(js, "node_modules", "openai")), \
        "tests/js/node_modules/openai is missing: run ./quickstart build"
    with Stub() as stub:
        p = subprocess.run([node, os.path.join(js, "openai_sdk_stub.mjs"), stub.url + "/v1"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, "node exited %d: %s" % (p.returncode, p.stderr[-2000:])
        out = json.loads(p.stdout)
        types = RESP_TYPES_HEAD + ["response.output_text.delta"] * 3 + RESP_TYPES_TAIL
        assert out["events"] == [[t, i] for i, t in enumerate(types)], out["events"]
        assert out["first"]["id"] == ids(stub, 1)[0] and out["first"]["text"] == "tok0 tok1 tok2 "
        assert out["first"]["usage"]["output_tokens"] == 3, out["first"]
        assert out["second"] == {"id": ids(stub, 2)[0], "previous": ids(stub, 1)[0],
                                 "outputText": "tok0 tok1 tok2 "}, out["second"]
        assert out["retrieved"] is True
        assert out["items"] == [{"type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": "next"}]}]
        assert out["missing"] == {"name": "NotFoundError", "status": 404,
                                  "message": "404 Response with id 'resp_nope' not found."}, \
            out["missing"]
        assert out["afterDelete"]["status"] == 404
        assert out["embeddings"] == [[2, 0, 0.5, -0.25], [3, 1, 0.5, -0.25]]

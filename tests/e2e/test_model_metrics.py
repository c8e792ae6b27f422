# SPDX-License-Identifier: BSD-2-Clause
"""Models, metrics (issue 23): requests by the model that answered, fallbacks
between models, tokens by tenant and model, and the time to first token,
time per output token and request duration histograms per model, in the
OpenTelemetry GenAI semantic conventions' buckets (sluice.8, ADMIN
ENDPOINTS). Exact counts after a known set of requests; counters that
survive a reload and a kill -9 of a worker."""

import json
import signal
import time

import harness as h

JSON_CT = {"Content-Type": "application/json"}
CHAT = "/v1/chat/completions"
REQ = "sluice_model_requests_total"
FB = "sluice_model_fallbacks_total"
TOK = "sluice_tenant_tokens_total"
TTFT = "sluice_time_to_first_token_seconds"
TPOT = "sluice_time_per_output_token_seconds"
DUR = "sluice_request_duration_seconds"
BOUNDS = {
    TTFT: ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25",
           "0.5", "0.75", "1", "2.5", "5", "7.5", "10"],
    TPOT: ["0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5",
           "0.75", "1", "2.5"],
    DUR: ["0.01", "0.02", "0.04", "0.08", "0.16", "0.32", "0.64", "1.28", "2.56", "5.12",
          "10.24", "20.48", "40.96", "81.92"],
}

ROUTED = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:{admin}"
workers: {workers}
upstreams:
  big:
    url: "{big}"
  small:
    url: "{small}"
models:
  llama-70b:
    aliases: ["gpt-4o", "default"]
    targets:
      - upstream: big
        model: "meta-llama/Llama-3.1-70B-Instruct"
  llama-8b:
    aliases: ["tiny"]
    targets: [{{upstream: small}}]
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 100
    models: [llama-8b]
  beta:
    keys: ["sk-beta"]
    max_streams: 100
    upstream: big
"""


def _routed(big, small, workers=2, **kw):
    return h.Gateway(ROUTED.format(port=h.free_port(), admin=h.free_port(),
                                   workers=workers, big=big.url, small=small.url), **kw)


def _post(gw, key, body, path="/v1/echo", headers=None):
    hd = dict(h.bearer(key), **JSON_CT)
    hd.update(headers or {})
    with gw.client() as c:
        r = c.request("POST", path, hd, body)
        r.read_all(timeout=10)
    return r


def _chat(gw, key, model=None, events=3, usage=None, delay=None, stream=True):
    """A chat completion (streamed by default) through the stub; usage:
    (prompt, completion) the stub reports."""
    d = {"stream": stream, "messages": [{"role": "user", "content": "hello"}]}
    if model is not None:
        d["model"] = model
    hd = h.stub_headers(events=events, interval=0, delay=delay)
    if usage is not None:
        hd["X-Stub-Usage"] = "%d,%d" % usage
    return _post(gw, key, json.dumps(d).encode(), path=CHAT, headers=hd)


def _samples(m, name):
    """{(labels minus le...) : value} of a family, labels as a dict."""
    return {lb: v for lb, v in m.series(name).items()}


def _by(m, name, *labels):
    """{tuple of the labels' values: value} for every sample of name."""
    out = {}
    for lb, v in m.series(name).items():
        d = dict(lb)
        out[tuple(d[k] for k in labels)] = v
    return out


def _check_hist(m, name, model, count):
    """The histogram of model: its buckets are the GenAI bounds, cumulative,
    +Inf == count == want."""
    buckets = {dict(lb)["le"]: v for lb, v in m.series(name + "_bucket").items()
               if dict(lb)["model"] == model}
    assert sorted(buckets, key=lambda x: float(x)) == BOUNDS[name] + ["+Inf"], \
        (name, sorted(buckets))
    vals = [buckets[b] for b in BOUNDS[name] + ["+Inf"]]
    assert vals == sorted(vals), (name, model, vals)
    assert buckets["+Inf"] == m.get(name + "_count", model=model) == count, \
        (name, model, buckets["+Inf"], m.get(name + "_count", model=model), count)
    return buckets


def test_requests_tokens_and_latencies_are_counted_per_model_exactly():
    with h.Stub("big") as big, h.Stub("small") as small, _routed(big, small) as gw:
        # acme: an alias of its model, twice (one a stream with usage), an
        # alias of a model it may not use and a name nobody has (404, "-").
        assert _post(gw, "sk-acme", b'{"model":"tiny"}').status == 200
        assert _chat(gw, "sk-acme", "tiny", events=3, usage=(5, 3)).status == 200
        assert _post(gw, "sk-acme", b'{"model":"gpt-4o"}').status == 404
        assert _post(gw, "sk-acme", b'{"model":"nope"}').status == 404
        # beta: no model (its upstream, "-"), as a body and as a stream, and
        # a model by its name.
        assert _post(gw, "sk-beta", b'{"n":1}').status == 200
        assert _chat(gw, "sk-beta", None, events=2, usage=(7, 2)).status == 200
        assert _post(gw, "sk-beta", b'{"model":"llama-70b"}').status == 200
        # Not relayed and no tenant at all: "-".
        assert _post(gw, "sk-wrong", b'{"model":"tiny"}').status == 401
        # A relayed error status: its model, its code.
        r = _chat(gw, "sk-beta", "default", stream=False, events=1)
        assert r.status == 200
        r = _post(gw, "sk-beta", b'{"model":"default","stream":false}', path=CHAT,
                  headers=h.stub_headers(status=503))
        assert r.status == 503
        m = h.wait_metric(gw, REQ, 2, model="llama-70b", code="200")
        want = {("llama-8b", "200"): 2, ("-", "404"): 2, ("-", "200"): 2,
                ("llama-70b", "200"): 2, ("llama-70b", "503"): 1, ("-", "401"): 1}
        m = h.wait_metric(gw, REQ, 1, model="llama-70b", code="503")
        assert _by(m, REQ, "model", "code") == want, _by(m, REQ, "model", "code")
        assert m.types[REQ] == "counter" and m.types[FB] == "counter"
        # Every request, once: the same total as sluice_requests_total.
        assert sum(want.values()) == sum(m.series("sluice_requests_total").values())
        assert m.series(FB) == {}
        # Tokens: acme's stream under llama-8b, beta's under "-"; every
        # tenant has its "-" series.
        toks = _by(m, TOK, "tenant", "model", "kind")
        assert toks == {
            ("acme", "-", "prompt"): 0, ("acme", "-", "completion"): 0,
            ("acme", "-", "estimated"): 0,
            ("acme", "llama-8b", "prompt"): 5, ("acme", "llama-8b", "completion"): 3,
            ("acme", "llama-8b", "estimated"): 0,
            ("beta", "-", "prompt"): 7, ("beta", "-", "completion"): 2,
            ("beta", "-", "estimated"): 0,
            ("beta", "llama-70b", "prompt"): toks[("beta", "llama-70b", "prompt")],
            ("beta", "llama-70b", "completion"): 1, ("beta", "llama-70b", "estimated"): 0,
        }, toks
        # Histograms: every relayed response under its model (the 503 too);
        # the time to first token of successful ones; the time per output
        # token of streams with 2 tokens or more.
        for model, dur, ttft, tpot in (("llama-8b", 2, 2, 1), ("-", 2, 2, 1),
                                       ("llama-70b", 3, 2, 0)):
            _check_hist(m, DUR, model, dur)
            _check_hist(m, TTFT, model, ttft)
            _check_hist(m, TPOT, model, tpot)
        for name in (TTFT, TPOT, DUR):
            assert m.types[name] == "histogram", name
            assert {dict(lb)["model"] for lb in m.series(name + "_count")} == \
                {"-", "llama-8b", "llama-70b"}
        # Relayed responses: as many as sluice_stream_duration_seconds has.
        assert sum(m.series(DUR + "_count").values()) == \
            m.get("sluice_stream_duration_seconds_count") == 7


FALLBACK = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:{admin}"
workers: 1
upstreams:
  primary:
    url: "{primary}"
    retries: 0
  second:
    url: "{second}"
    retries: 0
  backup:
    url: "{backup}"
models:
  big:
    aliases: [gpt-4o]
    targets: [{{upstream: primary, model: big-internal}}]
    fallback: [mid, small]
  mid:
    targets: [{{upstream: second}}]
  small:
    targets:
      - {{upstream: second, weight: 10}}
      - {{upstream: backup, model: small-internal, weight: 1}}
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 100
  lim:
    keys: ["sk-lim"]
    max_streams: 100
    models: [big]
"""


def test_fallbacks_are_counted_from_the_model_they_leave_to_the_one_they_reach():
    dead1 = "http://127.0.0.1:%d" % h.closed_port()
    dead2 = "http://127.0.0.1:%d" % h.closed_port()
    with h.Stub("backup") as backup, h.Gateway(FALLBACK.format(
            port=h.free_port(), admin=h.free_port(), primary=dead1, second=dead2,
            backup=backup.url)) as gw:
        # big (dead) -> mid (dead) -> small's first target (dead, weight 10)
        # -> small's other target: three moves, one of them within small.
        r = _post(gw, "sk-acme", b'{"model":"gpt-4o"}')
        assert r.status == 200 and r.header("x-sluice-model") == "small"
        # small itself: its first target, then its second.
        r = _post(gw, "sk-acme", b'{"model":"small"}')
        assert r.status == 200 and r.header("x-sluice-model") == "small"
        # lim may not use mid or small: no move, a 502 under big.
        r = _post(gw, "sk-lim", b'{"model":"big"}')
        assert r.status == 502 and r.header("x-sluice-model") == "big"
        m = h.wait_metric(gw, REQ, 1, model="big", code="502")
        assert _by(m, FB, "model", "to") == {
            ("big", "mid"): 1, ("mid", "small"): 1, ("small", "small"): 2}, \
            _by(m, FB, "model", "to")
        assert _by(m, REQ, "model", "code") == {
            ("small", "200"): 2, ("big", "502"): 1}, _by(m, REQ, "model", "code")
        # Only small's answers were relayed from an upstream.
        _check_hist(m, DUR, "small", 2)
        _check_hist(m, DUR, "big", 0)
        _check_hist(m, DUR, "mid", 0)
        assert backup.stats()["requests"] == 2


def _sse_answer(events, gaps, usage):
    """A RawUpstream handler: an SSE head, then each event after its gap
    (seconds), then the usage chunk and [DONE]."""
    def answer(sock, req):
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Connection: close\r\n\r\n")
        for ev, gap in zip(events, gaps):
            time.sleep(gap)
            sock.sendall(b"data: " + json.dumps(ev).encode() + b"\n\n")
        sock.sendall(b'data: {"choices":[],"usage":{"prompt_tokens":1,'
                     b'"completion_tokens":%d,"total_tokens":%d}}\n\n'
                     % (usage, usage + 1))
        sock.sendall(b"data: [DONE]\n\n")
    return answer


def _delta(**d):
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]}


RAW = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:{admin}"
workers: 1
upstreams:
  raw:
    url: "{raw}"
models:
  m:
    targets: [{{upstream: raw}}]
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 10
"""


def test_time_to_first_token_waits_for_content_and_tpot_needs_two_tokens():
    # A role-only event and one with an empty content come at once, the
    # content 300 ms later; then two more tokens 200 ms apart.
    events = [_delta(role="assistant"), _delta(content=""), _delta(content="a"),
              _delta(content="b"), _delta(content="c")]
    gaps = [0, 0, 0.3, 0.2, 0.2]
    with h.RawUpstream(_sse_answer(events, gaps, 3)) as up, h.Gateway(RAW.format(
            port=h.free_port(), admin=h.free_port(), raw=up.url)) as gw:
        r = _post(gw, "sk-acme", h.stream_body(model="m"), path=CHAT)
        assert r.status == 200 and r.complete
        m = h.wait_metric(gw, TTFT + "_count", 1, model="m")
        b = _check_hist(m, TTFT, "m", 1)
        assert b["0.25"] == 0, b            # not the first event: its content
        t = _check_hist(m, TPOT, "m", 1)
        assert t["0.15"] == 0, t            # (duration - ttft) / 2 >= 0.2
        assert m.get(TPOT + "_sum", model="m") >= 0.2
        assert m.get(DUR + "_sum", model="m") >= m.get(TTFT + "_sum", model="m") + 0.4
        assert m.get(TOK, tenant="acme", model="m", kind="completion") == 3


def test_one_completion_token_has_no_time_per_output_token():
    with h.RawUpstream(_sse_answer([_delta(content="a")], [0], 1)) as up, \
            h.Gateway(RAW.format(port=h.free_port(), admin=h.free_port(),
                                 raw=up.url)) as gw:
        for _ in range(2):
            r = _post(gw, "sk-acme", h.stream_body(model="m"), path=CHAT)
            assert r.status == 200 and r.complete
        m = h.wait_metric(gw, DUR + "_count", 2, model="m")
        _check_hist(m, TTFT, "m", 2)
        _check_hist(m, TPOT, "m", 0)


def test_a_json_answer_times_its_first_body_byte():
    with h.Stub("big") as big, h.Stub("small") as small, _routed(big, small) as gw:
        r = _chat(gw, "sk-acme", "tiny", stream=False, events=2, delay=300)
        assert r.status == 200
        m = h.wait_metric(gw, TTFT + "_count", 1, model="llama-8b")
        b = _check_hist(m, TTFT, "llama-8b", 1)
        assert b["0.25"] == 0, b
        _check_hist(m, TPOT, "llama-8b", 0)     # not a stream


def test_model_counters_survive_a_reload_and_a_kill_9_of_a_worker():
    with h.Stub("big") as big, h.Stub("small") as small, \
            _routed(big, small, allow_worker_changes=True) as gw:
        for _ in range(3):
            assert _chat(gw, "sk-acme", "tiny", usage=(4, 2)).status == 200
        assert _post(gw, "sk-beta", b'{"model":"llama-70b"}').status == 200
        m = h.wait_metric(gw, REQ, 3, model="llama-8b", code="200")
        base = {k: v for k, v in m.counters().items()
                if k[0].startswith(("sluice_model", "sluice_time", "sluice_request_dur",
                                    TOK))}
        assert m.get(TOK, tenant="acme", model="llama-8b", kind="prompt") == 12
        # A reload that keeps llama-8b, drops llama-70b and adds llama-3b:
        # llama-8b goes on from its counts; llama-70b's stay while kept.
        text = gw.config.replace("  llama-8b:\n", "  llama-3b:\n    targets: "
                                 "[{upstream: small}]\n  llama-8b:\n")
        text = text.replace('    aliases: ["gpt-4o", "default"]\n', "")
        text = text.replace("  llama-70b:\n    targets:\n      - upstream: big\n"
                            '        model: "meta-llama/Llama-3.1-70B-Instruct"\n', "")
        assert "llama-70b" not in text and "llama-3b" in text
        h.reload(gw, text)
        assert _chat(gw, "sk-acme", "tiny", usage=(4, 2)).status == 200
        m = h.wait_metric(gw, REQ, 4, model="llama-8b", code="200")
        assert m.get(TOK, tenant="acme", model="llama-8b", kind="prompt") == 16
        assert m.get(REQ, model="llama-70b", code="200") == 1
        assert m.get(DUR + "_count", model="llama-8b") == 4
        assert m.get(DUR + "_count", model="llama-3b") == 0
        for k, v in base.items():
            assert m.counters()[k] >= v, (k, v, m.counters()[k])
        # kill -9 every worker: nothing counted is lost.
        before = m.counters()
        workers = gw.worker_pids()
        for w in workers:
            h.kill_pid(w, signal.SIGKILL)
        deadline = time.monotonic() + 8
        while True:
            m = h.scrape(gw)
            cur = m.counters()
            for k, v in before.items():
                assert k in cur, "%r disappeared after kill -9" % (k,)
                assert cur[k] >= v, "%r went backwards: %r -> %r" % (k, v, cur[k])
            now = gw.worker_pids()
            if len(now) == 2 and not set(now) & set(workers) and m.get("sluice_workers") == 2:
                break
            assert time.monotonic() < deadline, "workers not replaced: %r" % now
            time.sleep(0.05)
        assert m.get(REQ, model="llama-8b", code="200") == 4
        assert m.get(TPOT + "_count", model="llama-8b") == 4
        assert m.get(TOK, tenant="acme", model="llama-8b", kind="completion") == 8
        assert _chat(gw, "sk-acme", "tiny", usage=(4, 2)).status == 200
        m = h.wait_metric(gw, REQ, 5, model="llama-8b", code="200")
        assert m.get(TTFT + "_count", model="llama-8b") == 5
        assert m.get(TOK, tenant="acme", model="llama-8b", kind="prompt") == 20


def test_without_models_every_request_is_model_dash():
    with h.Stub() as stub:
        text = ('listen: "127.0.0.1:%d"\nadmin_listen: "127.0.0.1:%d"\nworkers: 1\n'
                'upstreams:\n  main:\n    url: "%s"\ntenants:\n  acme:\n'
                '    keys: ["sk-acme"]\n    max_streams: 10\n    upstream: main\n'
                % (h.free_port(), h.free_port(), stub.url))
        with h.Gateway(text) as gw:
            assert _chat(gw, "sk-acme", "whatever", usage=(3, 2)).status == 200
            assert _post(gw, "sk-nope", b"{}").status == 401
            m = h.wait_metric(gw, REQ, 1, model="-", code="401")
            assert _by(m, REQ, "model", "code") == {("-", "200"): 1, ("-", "401"): 1}
            assert _by(m, TOK, "tenant", "model", "kind") == {
                ("acme", "-", "prompt"): 3, ("acme", "-", "completion"): 2,
                ("acme", "-", "estimated"): 0}
            for name, n in ((DUR, 1), (TTFT, 1), (TPOT, 1)):
                _check_hist(m, name, "-", n)
                assert {dict(lb)["model"] for lb in m.series(name + "_count")} == {"-"}


def _many_models(n, max_models=127):
    return ('listen: "127.0.0.1:%d"\nlimits:\n  max_models: %d\nupstreams:\n  u:\n'
            '    url: "http://127.0.0.1:9"\nmodels:\n%stenants:\n  acme:\n'
            '    keys: ["sk-acme"]\n    max_streams: 1\n'
            % (h.free_port(), max_models, "".join("  m%d:\n    targets: [{upstream: u}]\n" % i
                                                  for i in range(n))))


def test_check_refuses_more_models_than_limits_max_models():
    path = h.write_config(_many_models(127))
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 0 and err == "", (rc, out, err)
    path = h.write_config(_many_models(128))
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 1 and out == "", (rc, out, err)
    # At the section's first model (line 8: listen, limits, max_models,
    # upstreams, u, url, models).
    assert err.splitlines() == [
        "%s:8:3: models: 128 models, limits.max_models is 127" % path], err


def test_a_full_model_table_is_reused_once_no_worker_knows_the_old_models():
    # limits.max_models 2: 2 x 2 slots. Models a*, then b* (the two free
    # slots), then c* while a stream of the first generation still runs:
    # every slot may still be counted under, so c* count under "-" (and a
    # warning says so). Once the first two generations are gone, the next
    # reload gives c* the slots of a*, zeroed, and a*'s series go.
    with h.Stub() as stub:
        def cfg(prefix):
            return ('listen: "127.0.0.1:%d"\nadmin_listen: "127.0.0.1:%d"\nworkers: 1\n'
                    'limits:\n  max_models: 2\n'
                    'upstreams:\n  u:\n    url: "%s"\nmodels:\n%stenants:\n  acme:\n'
                    '    keys: ["sk-acme"]\n    max_streams: 10\n'
                    % (port, admin, stub.url,
                       "".join("  %s%d:\n    targets: [{upstream: u}]\n" % (prefix, i)
                               for i in range(2))))
        port, admin = h.free_port(), h.free_port()
        with h.Gateway(cfg("a"), allow_worker_changes=True) as gw:
            assert _post(gw, "sk-acme", b'{"model":"a1"}').status == 200
            h.wait_metric(gw, REQ, 1, model="a1", code="200")
            c, r = gw.admit(key="sk-acme", events=30, interval=100, timeout=30,
                            body=h.stream_body(model="a0"))
            h.reload(gw, cfg("b"))
            assert _post(gw, "sk-acme", b'{"model":"b1"}').status == 200
            h.wait_metric(gw, REQ, 1, model="b1", code="200")
            h.reload(gw, cfg("c"))
            assert "model 'c0': all 4 model metric slots are held" in h.stderr_text(gw)
            assert _post(gw, "sk-acme", b'{"model":"c1"}').status == 200
            m = h.wait_metric(gw, REQ, 1, model="-", code="200")
            assert m.get(REQ, model="a1", code="200") == 1
            assert m.get(REQ, model="b1", code="200") == 1
            assert m.get(REQ, model="c1", code="200") is None
            body = r.read_all(timeout=30)
            assert r.complete and body == h.expected_events(30)
            c.close()
            # The first two generations are gone: a*'s and b*'s slots are free.
            h.wait_until(lambda: len(gw.worker_pids()) == 1, 10,
                         msg="the older generations to exit")
            h.reload(gw, cfg("c"))
            assert _post(gw, "sk-acme", b'{"model":"c1"}').status == 200
            m = h.wait_metric(gw, REQ, 1, model="c1", code="200")
            assert m.get(REQ, model="-", code="200") == 1
            assert not any(dict(lb)["model"].startswith("a")
                           for lb in m.series(DUR + "_count")), m.series(DUR + "_count")
            assert m.get(DUR + "_count", model="c1") == 1
            assert m.get(DUR + "_count", model="c0") == 0, \
                "c0 took a0's slot without a0's counts zeroed"

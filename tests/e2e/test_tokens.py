# SPDX-License-Identifier: BSD-2-Clause
"""Issue 13, tokens: usage read from the response (exact when the runner
reports it, estimated as ceil(content bytes / 4) when it does not), the
usage option injected upstream and its chunk kept from clients that did not
ask, per-tenant tokens_per_minute budgets over a 60 s window shared by the
workers, metrics and access log fields.

The stub reports usage as X-Stub-Usage: P,C says (bench/README.md, Usage).
With X-Stub-Usage-Null: 1 a stream that asked for usage also carries
"usage":null in its ordinary chunks (as vLLM and OpenAI do); for a client
that did not ask the gateway removes that member too, so it sees the bytes
of a runner never asked; a client that asked gets it unchanged."""

import json
import re
import time

import harness as h
from harness import ACME_KEY, ACME_KEY2, BETA_KEY, Gateway, Stub, assert_error

JSON_CT = {"Content-Type": "application/json"}
CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
TOKENS = "sluice_tenant_tokens_total"
WINDOW = "sluice_tenant_tokens_window"
INJECTED = b',"stream_options":{"include_usage":true}'


# ---------------------------------------------------------------- stub bytes

def _body(path=CHAT, stream=True, asked=None):
    """A compact JSON request body; asked: stream_options.include_usage."""
    d = {"model": "stub"}
    if path == CHAT:
        d["messages"] = [{"role": "user", "content": "hello"}]
    else:
        d["prompt"] = "hello"
    d["stream"] = stream
    if asked is not None:
        d["stream_options"] = {"include_usage": asked}
    return json.dumps(d, separators=(",", ":")).encode()


def _event(path, i, usage_null=False, size=0):
    """Event i of a stub stream on path, byte-exact (bench/README.md)."""
    if path == CHAT:
        fmt = ('data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","seq":%d,'
               '"choices":[{"index":0,"delta":{"content":"tok%d "}}],"pad":"%s"')
    else:
        fmt = ('data: {"id":"cmpl-stub","object":"text_completion","seq":%d,'
               '"choices":[{"index":0,"text":"tok%d "}],"pad":"%s"')
    tail = ',"usage":null}\n\n' if usage_null else '}\n\n'
    base = len(fmt % (i, i, "") + tail)
    return (fmt % (i, i, "x" * max(0, size - base)) + tail).encode()


def _usage_chunk(path, p, c):
    ident, obj = (("chatcmpl-stub", "chat.completion.chunk") if path == CHAT
                  else ("cmpl-stub", "text_completion"))
    return ('data: {"id":"%s","object":"%s","created":0,"model":"stub","choices":[],'
            '"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n'
            % (ident, obj, p, c, p + c)).encode()


def _stream(path, n, usage_null=False, usage=None, size=0, done=True):
    """The SSE body: n events, then the usage chunk (if given), then [DONE]."""
    b = b"".join(_event(path, i, usage_null, size) for i in range(n))
    if usage is not None:
        b += _usage_chunk(path, *usage)
    return b + (h.DONE_EVENT if done else b"")


def _nonstream(n, p, c):
    """The stub's non-stream answer with n tokens (both paths)."""
    content = "".join("tok%d " % i for i in range(n))
    return ('{"id":"chatcmpl-stub","object":"chat.completion","choices":[{"index":0,'
            '"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],'
            '"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}'
            % (content, p, c, p + c)).encode()


def _estimate(nbytes):
    return (nbytes + 3) // 4


def _content_bytes(n):
    return sum(len("tok%d " % i) for i in range(n))


# ---------------------------------------------------------------- gateway side

def _config(stub, tpm=None, inject=None, **kw):
    over = {"admin_listen": "%s:%d" % (h.HOST, h.free_port()),
            "access_log": h.tmpfile("access", ".log")}
    if tpm is not None:
        over["tenants"] = {"acme": {"tokens_per_minute": tpm}}
    if inject is not None:
        over["usage"] = {"inject": inject}
    over.update(kw)
    return h.gateway_config(stub, **over)


def _gw(stub, tpm=None, inject=None, **kw):
    cfg = _config(stub, tpm, inject, **kw)
    gw = Gateway(cfg)
    gw.access_path = cfg["access_log"]
    return gw


def _hdrs(key=ACME_KEY, usage=None, ignore=False, null=False, **stub_kw):
    d = dict(h.bearer(key))
    d.update(JSON_CT)
    d.update(h.stub_headers(**stub_kw))
    if usage is not None:
        d["X-Stub-Usage"] = "%d,%d" % usage
    if ignore:
        d["X-Stub-Ignore-Usage"] = "1"
    if null:
        d["X-Stub-Usage-Null"] = "1"
    return d


def _post(gw, body, path=CHAT, client=None, **kw):
    """POST body on client (or a new connection); the whole response."""
    kw.setdefault("interval", 0)
    if client is not None:
        return client.request("POST", path, _hdrs(**kw), body, timeout=30)
    with h.Client(gw.port) as c:
        return c.request("POST", path, _hdrs(**kw), body, timeout=30)


def _last(stub):
    """(path, body bytes) of the last completion request the stub received."""
    st, hd, body = stub._http("GET", "/stub/last")
    assert st == 200, "GET /stub/last: %d %r" % (st, body[:200])
    return hd.get("X-Stub-Path"), body


def _tag(stub, name):
    t = stub.tag(name)
    t.setdefault("include_usage_requests", 0)
    return t


def _log_line(gw, n):
    """The n-th access log line (1-based), waiting for it."""
    return h.wait_access_lines(gw.access_path, n)[n - 1]


def _check_log(line, usage, prompt=0, completion=0):
    """Access log usage fields: the runner's counts (exact), or the prompt
    estimated from the request and the completion from what was relayed
    (estimated). The contract does not say what they are for usage "none":
    0 or null are both accepted there."""
    assert line.get("usage") == usage, "access log usage %r, expected %r: %r" % (
        line.get("usage"), usage, line)
    if usage == "exact":
        assert (line.get("prompt_tokens"), line.get("completion_tokens")) == (prompt, completion), \
            "access log tokens %r/%r, expected %d/%d: %r" % (
                line.get("prompt_tokens"), line.get("completion_tokens"), prompt, completion, line)
    elif usage == "estimated":
        assert (line.get("prompt_tokens"), line.get("completion_tokens")) == (prompt, completion), \
            "estimated tokens %r/%r, expected %d/%d: %r" % (
                line.get("prompt_tokens"), line.get("completion_tokens"), prompt, completion, line)
    else:
        assert line.get("prompt_tokens") in (0, None), line
        assert line.get("completion_tokens") in (0, None), line


def _expect_tokens(gw, prompt=0, completion=0, estimated=0, window=None, tenant="acme"):
    """Wait for the counters that should have moved, then check all three
    kinds (and the window gauge) exactly."""
    want = {"prompt": prompt, "completion": completion, "estimated": estimated}
    for kind, v in want.items():
        if v:
            h.wait_metric(gw, TOKENS, v, tenant=tenant, model="-", kind=kind)
    if window is not None:
        h.wait_metric(gw, WINDOW, window, timeout=4.0, tenant=tenant)
    m = h.scrape(gw)
    got = {k: m.value(TOKENS, tenant=tenant, model="-", kind=k) for k in want}
    assert got == want, "%s{tenant=%s}: %r, expected %r" % (TOKENS, tenant, got, want)
    assert m.types.get(TOKENS) == "counter", m.types.get(TOKENS)
    assert m.types.get(WINDOW) == "gauge", m.types.get(WINDOW)
    return m


def _conn_per_worker(gw, nworkers=2, tries=64):
    """Keep-alive connections, one served by each worker (the access log's
    worker field says which); GET /v1/models counts no tokens."""
    got = {}
    for _ in range(tries):
        c = gw.client()
        before = len(h.access_lines(gw.access_path))
        r = c.request("GET", "/v1/models", h.bearer(ACME_KEY))
        assert r.status == 200, r.status
        w = h.wait_access_lines(gw.access_path, before + 1)[before]["worker"]
        if w in got:
            c.close()
        else:
            got[w] = c
        if len(got) == nworkers:
            return [got[k] for k in sorted(got)]
    raise AssertionError("no connection reached every worker in %d tries: %r"
                         % (tries, sorted(got)))


def _retry_after(r):
    ra = r.header("retry-after")
    assert ra is not None and ra.isdigit() and int(ra) >= 1, \
        "Retry-After %r, want an integer >= 1" % ra
    return int(ra)


# ---------------------------------------------------------------- counting

def test_streamed_usage_is_counted_exactly_and_the_injected_chunk_never_reaches_the_client():
    with Stub() as stub, _gw(stub) as gw:
        n_log = 0
        for path, usage, tag, null in ((CHAT, (11, 5), "chat", False),
                                       (COMPL, (23, 7), "compl", False),
                                       (CHAT, (2, 5), "null", True)):
            body = _body(path)
            r = _post(gw, body, path, events=5, usage=usage, tag=tag, null=null)
            n_log += 1
            assert r.status == 200 and r.complete, (r.status, bytes(r.data[-200:]))
            # The runner's events as sent, without the usage chunk, then
            # [DONE]: the bytes of a stream never asked for usage (the
            # "usage":null member a runner adds to each event, once asked,
            # removed as well).
            assert bytes(r.data) == _stream(path, 5), \
                "%s: client got %r" % (path, bytes(r.data))
            assert b'"choices":[]' not in r.data and b"prompt_tokens" not in r.data
            assert b'"usage"' not in r.data, bytes(r.data)
            # The runner was asked: one member added to the body, nothing else.
            assert _tag(stub, tag)["include_usage_requests"] == 1, stub.tag(tag)
            assert _last(stub) == (path, body[:-1] + INJECTED + b"}"), _last(stub)
            _check_log(_log_line(gw, n_log), "exact", *usage)
        assert stub.stats()["usage_chunks"] == 3, "the stub sent no usage chunk"
        _expect_tokens(gw, prompt=36, completion=17, estimated=0, window=53)
        # The runner did send the member in each event (the stub's own bytes).
        direct = stub.direct("POST", CHAT, _hdrs(events=5, interval=0, usage=(2, 5), null=True),
                             _body(CHAT, asked=True))
        assert bytes(direct.data) == _stream(CHAT, 5, usage_null=True, usage=(2, 5)), \
            bytes(direct.data)
        # beta has used nothing
        m = h.scrape(gw)
        assert m.value(TOKENS, tenant="beta", model="-", kind="prompt") == 0


def test_non_streamed_usage_is_counted_exactly_and_the_body_is_untouched():
    with Stub() as stub, _gw(stub) as gw:
        cases = ((CHAT, (13, 4), 3), (COMPL, (17, 6), 2), (CHAT, None, 3))
        prompt = completion = 0
        for i, (path, usage, n) in enumerate(cases, 1):
            body = _body(path, stream=False)
            r = _post(gw, body, path, events=n, usage=usage, tag="ns")
            # Without X-Stub-Usage the stub reports ceil(body bytes / 4), n.
            p, c = usage if usage is not None else (_estimate(len(body)), n)
            assert r.status == 200 and r.complete, r.status
            assert bytes(r.data) == _nonstream(n, p, c), bytes(r.data)
            assert _last(stub) == (path, body), "a non-streamed body was edited: %r" % (
                _last(stub),)
            _check_log(_log_line(gw, i), "exact", p, c)
            prompt += p
            completion += c
        assert _tag(stub, "ns")["include_usage_requests"] == 0
        _expect_tokens(gw, prompt=prompt, completion=completion, estimated=0,
                       window=prompt + completion)


def test_client_that_asked_for_usage_gets_the_chunk_byte_identical():
    with Stub() as stub, _gw(stub) as gw:
        for i, (path, usage) in enumerate(((CHAT, (9, 3)), (COMPL, (4, 12))), 1):
            body = _body(path, asked=True)
            r = _post(gw, body, path, events=3, usage=usage, tag="asked", null=True)
            want = _stream(path, 3, usage_null=True, usage=usage)
            assert r.status == 200 and r.complete, r.status
            assert bytes(r.data) == want, "%s: client got %r" % (path, bytes(r.data))
            direct = stub.direct("POST", path, _hdrs(events=3, interval=0, usage=usage,
                                                     null=True), body)
            assert bytes(direct.data) == bytes(r.data), "gateway and stub bytes differ"
            # the stub saw the body as the client sent it
            assert _last(stub) == (path, body), _last(stub)
            _check_log(_log_line(gw, i), "exact", *usage)
        assert _tag(stub, "asked")["include_usage_requests"] == 2
        _expect_tokens(gw, prompt=13, completion=15, estimated=0, window=28)


def test_stream_options_without_include_usage_gets_only_the_member_added():
    # (client body, body the runner must see)
    cases = (
        (b'{"model":"stub","stream":true,"stream_options":{},"n":1}',
         b'{"model":"stub","stream":true,"stream_options":{"include_usage":true},"n":1}'),
        (b'{"stream":true,"stream_options":{"continuous_usage_stats":false}}',
         b'{"stream":true,"stream_options":{"continuous_usage_stats":false,'
         b'"include_usage":true}}'),
        (b'{"stream":true,"stream_options":{"include_usage":false}}',
         b'{"stream":true,"stream_options":{"include_usage":true}}'),
        (b'{"stream":true,"stream_options":null}',
         b'{"stream":true,"stream_options":{"include_usage":true}}'),
        (b'{ "stream": true , "model" : "stub" }',
         b'{ "stream": true , "model" : "stub" ' + INJECTED + b'}'),
    )
    with Stub() as stub, _gw(stub) as gw:
        for i, (body, upstream) in enumerate(cases, 1):
            r = _post(gw, body, events=2, usage=(i, 1), tag="opt")
            assert r.status == 200 and r.complete, r.status
            assert bytes(r.data) == _stream(CHAT, 2), \
                "case %d: client got %r" % (i, bytes(r.data))
            assert _last(stub) == (CHAT, upstream), "case %d: upstream body %r" % (
                i, _last(stub)[1])
            _check_log(_log_line(gw, i), "exact", i, 1)
        assert _tag(stub, "opt")["include_usage_requests"] == len(cases)
        _expect_tokens(gw, prompt=15, completion=5, estimated=0, window=20)


def test_inject_false_forwards_the_body_untouched_and_estimates_streams():
    with Stub() as stub, _gw(stub, inject=False) as gw:
        body = _body(CHAT)
        r = _post(gw, body, events=10, size=200, usage=(50, 50), tag="noinj")
        assert r.status == 200 and r.complete
        assert bytes(r.data) == h.expected_events(10, 200), bytes(r.data[:300])
        assert _last(stub) == (CHAT, body)
        # 50 bytes of content ("tok0 ".."tok9 "); the padding is not content.
        # The prompt: "hello", 2.
        _check_log(_log_line(gw, 1), "estimated", prompt=2, completion=13)

        body = _body(COMPL)
        r = _post(gw, body, COMPL, events=3, usage=(50, 50), tag="noinj")
        assert bytes(r.data) == _stream(COMPL, 3), bytes(r.data)
        assert _last(stub) == (COMPL, body)
        _check_log(_log_line(gw, 2), "estimated", prompt=2, completion=4)

        # A non-streamed answer carries usage whatever inject says.
        r = _post(gw, _body(CHAT, stream=False), events=2, usage=(5, 2), tag="noinj")
        assert bytes(r.data) == _nonstream(2, 5, 2)
        _check_log(_log_line(gw, 3), "exact", 5, 2)

        assert _tag(stub, "noinj")["include_usage_requests"] == 0, stub.tag("noinj")
        _expect_tokens(gw, prompt=5, completion=2, estimated=21, window=28)


def test_stream_without_usage_is_estimated_when_cut_or_ignored():
    with Stub() as stub, _gw(stub) as gw:
        # Cut by the upstream after 3 of 5 events: no usage arrived. The
        # prompt is estimated from the request ("hello": 2 tokens).
        r = _post(gw, _body(CHAT), events=5, abort_after=3, usage=(40, 5), tag="est")
        assert r.status == 200 and r.cut and not r.complete, (r.status, r.cut, r.complete)
        assert bytes(r.data) == _stream(CHAT, 3, done=False) + \
            h.failure_event("chat", h.CUT_CLOSED), bytes(r.data)
        _check_log(_log_line(gw, 1), "estimated", prompt=2,
                   completion=_estimate(_content_bytes(3)))

        # A runner that ignores the option: the client's bytes are exactly
        # those of a runner never asked.
        r = _post(gw, _body(CHAT), events=10, ignore=True, usage=(40, 10), tag="est")
        assert r.status == 200 and r.complete
        assert bytes(r.data) == h.expected_events(10), bytes(r.data[:300])
        _check_log(_log_line(gw, 2), "estimated", prompt=2, completion=13)

        # A client that asked, a runner that ignores it (completions: "text").
        r = _post(gw, _body(COMPL, asked=True), COMPL, events=4, ignore=True,
                  usage=(40, 4), tag="est")
        assert bytes(r.data) == _stream(COMPL, 4), bytes(r.data)
        _check_log(_log_line(gw, 3), "estimated", prompt=2, completion=5)

        # Cut after the usage chunk, before [DONE]: usage did arrive (exact),
        # and the client that did not ask still never sees it.
        r = _post(gw, _body(CHAT), events=3, abort_after=4, usage=(8, 2), tag="est")
        assert r.status == 200 and r.cut, (r.status, r.cut)
        assert bytes(r.data) == _stream(CHAT, 3, done=False) + \
            h.failure_event("chat", h.CUT_CLOSED), bytes(r.data)
        _check_log(_log_line(gw, 4), "exact", 8, 2)

        # Not streamed, no usage in the answer: estimated from its content
        # ("tok0 ... tok6 " is 35 bytes: 9 tokens).
        r = _post(gw, _body(CHAT, stream=False), events=7, ignore=True, tag="est")
        assert r.status == 200 and b'"usage"' not in bytes(r.data), bytes(r.data)
        _check_log(_log_line(gw, 5), "estimated", prompt=2, completion=9)

        assert _tag(stub, "est")["include_usage_requests"] == 4
        est = _estimate(_content_bytes(3)) + 13 + 5 + 9 + 4 * 2
        _expect_tokens(gw, prompt=8, completion=2, estimated=est, window=10 + est)


def test_malformed_or_non_object_bodies_are_relayed_untouched_and_not_counted():
    bodies = (
        b'{"model":"stub","stream":true,',             # truncated
        b'[{"stream":true}]',                          # an array
        b'"stream":true',                              # not JSON
        b'{"stream":true,"x":"\xff\xfe"}',              # invalid UTF-8
        b'{"stream":true} {"n":1}',                    # trailing garbage
        b'{"stream":true,"stream_options":{"include_usage":false}',   # unclosed
    )
    with Stub() as stub, _gw(stub) as gw:
        for i, body in enumerate(bodies, 1):
            r = _post(gw, body, events=3, usage=(100, 100), tag="bad")
            assert r.status == 200 and r.complete, (i, r.status, bytes(r.data[:200]))
            assert bytes(r.data) == h.expected_events(3), (i, bytes(r.data[:300]))
            assert _last(stub) == (CHAT, body), "body %d edited: %r" % (i, _last(stub)[1])
            _check_log(_log_line(gw, i), "none")
        # not JSON, not streamed: the runner's usage is not counted either
        body = b"not json at all"
        r = _post(gw, body, COMPL, events=2, usage=(100, 100), tag="bad")
        assert bytes(r.data) == _nonstream(2, 100, 100)
        assert _last(stub) == (COMPL, body)
        _check_log(_log_line(gw, len(bodies) + 1), "none")
        assert _tag(stub, "bad")["include_usage_requests"] == 0
        # One counted request last: once it shows, nothing else was counted.
        _post(gw, _body(CHAT, stream=False), events=1, usage=(3, 1), tag="bad")
        _check_log(_log_line(gw, len(bodies) + 2), "exact", 3, 1)
        _expect_tokens(gw, prompt=3, completion=1, estimated=0, window=4)


# ---------------------------------------------------------------- budgets

def test_budget_refuses_at_the_limit_across_workers_with_retry_after():
    with Stub() as stub, _gw(stub, tpm=100) as gw:
        a, b = _conn_per_worker(gw)
        t0 = time.monotonic()
        # 99 tokens on worker 0: under the budget, so the next is admitted.
        r = _post(gw, _body(CHAT, stream=False), client=a, events=2, usage=(90, 9), tag="acme")
        assert r.status == 200, r.status
        # 1 token on worker 1 (a stream): now exactly at the budget.
        r = _post(gw, _body(CHAT), client=b, events=1, usage=(1, 0), tag="acme")
        assert r.status == 200 and bytes(r.data) == _stream(CHAT, 1)
        # At the budget: refused on both workers, for both keys of acme.
        ras = []
        for c in (a, b):
            r = _post(gw, _body(CHAT), client=c, events=1, usage=(1, 1), tag="acme")
            assert_error(r, 429, "token_budget_exceeded", read=False)
            ras.append(_retry_after(r))
        r = _post(gw, _body(CHAT, stream=False), key=ACME_KEY2, events=1, tag="acme")
        assert_error(r, 429, "token_budget_exceeded", read=False)
        ras.append(_retry_after(r))
        el = time.monotonic() - t0
        # Room comes when the second of the first request leaves the window.
        for ra in ras:
            assert max(1, 58 - el) <= ra <= 61, \
                "Retry-After %d, %.1fs after the first tokens of a 60 s window" % (ra, el)
        assert stub.tag("acme")["requests"] == 2, "a refused request reached the runner"
        # Another tenant is unaffected.
        r = _post(gw, _body(CHAT), key=BETA_KEY, events=2, usage=(500, 500), tag="beta")
        assert r.status == 200 and r.complete
        _expect_tokens(gw, prompt=91, completion=9, window=100)
        _expect_tokens(gw, prompt=500, completion=500, window=1000, tenant="beta")
        # Counted under their own reason, not as concurrency refusals.
        m = h.scrape(gw)
        assert m.value("sluice_rejected_total", tenant="acme", reason="token_budget") == 3
        assert m.value("sluice_rejected_total", tenant="acme", reason="max_streams") == 0
        assert m.value("sluice_rejected_total", tenant="beta", reason="token_budget") == 0
        # The refusals are in the access log, counted as nothing.
        lines = h.access_lines(gw.access_path)
        refused = [ln for ln in lines if ln["status"] == 429]
        assert len(refused) == 3, refused
        for ln in refused:
            _check_log(ln, "none")


def test_admitted_stream_is_never_cut_and_is_charged_when_it_ends():
    with Stub() as stub, _gw(stub, tpm=100) as gw:
        a, b = _conn_per_worker(gw)
        a.send("POST", CHAT, _hdrs(events=6, interval=150, usage=(150, 50), tag="long"),
               _body(CHAT))
        r = a.read_response(timeout=10)
        assert r.status == 200, r.status
        r.read_events(1, timeout=10)
        # In flight, its 200 tokens are not charged yet: another is admitted.
        r2 = _post(gw, _body(CHAT, stream=False), client=b, events=1, usage=(1, 1), tag="acme")
        assert r2.status == 200, r2.status
        h.wait_metric(gw, WINDOW, 2, timeout=4.0, tenant="acme")
        # The stream is over budget once it ends, and still ends whole.
        assert r.read_all(timeout=10) == _stream(CHAT, 6) and r.complete
        for c in (b, a):
            r3 = _post(gw, _body(CHAT), client=c, events=1, tag="acme")
            assert_error(r3, 429, "token_budget_exceeded", read=False)
            _retry_after(r3)
        _expect_tokens(gw, prompt=151, completion=51, window=202)


@h.timeout(120)
@h.skip_under("valgrind")
def test_budget_recovers_when_the_window_slides_past_retry_after():
    with Stub() as stub, _gw(stub, tpm=20) as gw:
        r = _post(gw, _body(CHAT, stream=False), events=1, usage=(15, 5), tag="acme")
        assert r.status == 200
        r = _post(gw, _body(CHAT), events=1, tag="acme")
        assert_error(r, 429, "token_budget_exceeded", read=False)
        ra = _retry_after(r)
        assert 58 <= ra <= 61, ra
        time.sleep(ra - 2.5)
        r = _post(gw, _body(CHAT), events=1, tag="acme")
        assert_error(r, 429, "token_budget_exceeded", read=False)
        ra2 = _retry_after(r)
        assert 1 <= ra2 <= 4, "Retry-After %d, %.1fs before the window frees" % (ra2, 2.5)
        time.sleep(ra2 + 0.3)
        h.wait_metric(gw, WINDOW, 0, timeout=2.0, tenant="acme")
        r = _post(gw, _body(CHAT), events=2, usage=(3, 3), tag="acme")
        assert r.status == 200 and r.complete, r.status
        assert bytes(r.data) == _stream(CHAT, 2)
        _expect_tokens(gw, prompt=18, completion=8, window=6)


def test_reload_changes_tokens_per_minute_at_once():
    with Stub() as stub:
        cfg = _config(stub, tpm=100, log_level="info")
        # A reload replaces the workers: that is no crash here.
        with Gateway(cfg, allow_worker_changes=True) as gw:
            gw.access_path = cfg["access_log"]

            def ask(want, usage=(30, 10)):
                r = _post(gw, _body(CHAT, stream=False), events=1, usage=usage, tag="acme")
                if want == 200:
                    assert r.status == 200, (r.status, bytes(r.data[:200]))
                else:
                    assert_error(r, 429, "token_budget_exceeded", read=False)
                    _retry_after(r)

            def budget(tpm):
                t = {"tokens_per_minute": tpm}
                h.reload(gw, h.deep_merge(cfg, {"tenants": {"acme": t}}))

            ask(200)
            ask(200)                 # 80 of 100
            h.wait_metric(gw, WINDOW, 80, timeout=4.0, tenant="acme")
            budget(50)               # the window survives the reload: 80 >= 50
            ask(429)
            budget(0)                # 0 = no budget
            ask(200)                 # 120
            budget(200)
            ask(200)                 # 160
            ask(200)                 # 200
            ask(429)
            budget(None)             # key removed = no budget
            ask(200)                 # 240
            _expect_tokens(gw, prompt=180, completion=60, window=240)



def test_reload_budget_applies_to_a_request_whose_head_spans_the_reload():
    # The retired worker that finishes reading this head admits it: with the
    # budget the master published, as it does with max_streams, not with
    # the one of its own configuration.
    with Stub() as stub:
        cfg = _config(stub, tpm=1000, workers=1)
        with Gateway(cfg, allow_worker_changes=True) as gw:
            gw.access_path = cfg["access_log"]
            r = _post(gw, _body(CHAT, stream=False), events=1, usage=(5, 5), tag="acme")
            assert r.status == 200
            h.wait_metric(gw, WINDOW, 10, timeout=4.0, tenant="acme")
            c = gw.client()
            body = _body(CHAT, stream=False)
            c.send_raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Authorization: Bearer %s\r\nContent-Length: %d\r\n"
                       % (ACME_KEY.encode(), len(body)))
            time.sleep(0.2)
            h.reload(gw, h.deep_merge(cfg, {"tenants": {"acme": {"tokens_per_minute": 5}}}))
            c.send_raw(b"\r\n" + body)
            r = c.read_response(timeout=10)
            assert_error(r, 429, "token_budget_exceeded")
            _retry_after(r)
            c.close()
            r = _post(gw, _body(CHAT, stream=False), events=1, tag="acme")
            assert_error(r, 429, "token_budget_exceeded", read=False)

# ---------------------------------------------------------------- prompt tokens in the budget (issue 22)
#
# A runner that reports 1,000 prompt tokens for each request; a tenant with a
# budget of 3,000 tokens a minute. Whatever the client wrote, each admitted
# request is charged its prompt (the runner's 1,000 when its usage arrives,
# the estimate from the request's 4,000 bytes of message text when it does
# not), so the fourth request and every one after it are refused: ten never
# pass. Before issue 22 each was charged only its completion (1 to 100).

PROMPT_TEXT = "x" * 4000       # ceil(4000 / 4) = 1,000 tokens estimated


def _prompt_body(**members):
    d = {"model": "stub", "messages": [{"role": "user", "content": PROMPT_TEXT}]}
    d.update(members)
    return json.dumps(d, separators=(",", ":")).encode()


def _ten_against_a_budget(gw, stub, body, expect, disconnect=False):
    """Ten requests, one at a time, each reported by the stub as 1,000
    prompt and 5 completion tokens; expect(line) checks the access log line
    of an admitted one. The first three are admitted (0, 1,005 and 2,010
    tokens used before them), the other seven refused for the budget."""
    statuses = []
    for i in range(10):
        hd = _hdrs(events=5, interval=400 if disconnect else 0, usage=(1000, 5), tag="tpm")
        c = gw.client()
        try:
            c.send("POST", CHAT, hd, body)
            r = c.read_response(timeout=10)
            if r.status == 200 and disconnect:
                r.read_events(1, timeout=10)     # the first token, then gone
            else:
                r.read_all(timeout=30)
        finally:
            c.close()
        statuses.append(r.status)
        line = _log_line(gw, i + 1)
        if r.status == 200:
            assert r.header("content-type").startswith("text/event-stream"), r.headers
            if not disconnect:
                # the usage chunk sluice asked for is the client's only if it asked
                assert bytes(r.data) == _stream(CHAT, 5), bytes(r.data)
            expect(line)
        else:
            assert_error(r, 429, "token_budget_exceeded", read=False)
            _check_log(line, "none")
    assert statuses == [200] * 3 + [429] * 7, statuses
    assert stub.tag("tpm")["requests"] == 3, stub.tag("tpm")


def _exact_1000(line):
    _check_log(line, "exact", 1000, 5)


def test_tokens_stream_1_is_streamed_so_the_runner_is_asked_for_its_usage():
    # vLLM (pydantic) streams for "stream": 1; so does the stub.
    body = _prompt_body(stream=1)
    with Stub() as stub, _gw(stub, tpm=3000) as gw:
        _ten_against_a_budget(gw, stub, body, _exact_1000)
        assert _last(stub) == (CHAT, body[:-1] + INJECTED + b"}"), _last(stub)
        assert _tag(stub, "tpm")["include_usage_requests"] == 3
        _expect_tokens(gw, prompt=3000, completion=15, estimated=0, window=3015)


def test_tokens_include_usage_0_is_read_as_false_and_rewritten():
    body = _prompt_body(stream=True, stream_options={"include_usage": 0})
    with Stub() as stub, _gw(stub, tpm=3000) as gw:
        _ten_against_a_budget(gw, stub, body, _exact_1000)
        assert _last(stub) == (CHAT, body.replace(b'"include_usage":0', b'"include_usage":true'))
        assert _tag(stub, "tpm")["include_usage_requests"] == 3
        _expect_tokens(gw, prompt=3000, completion=15, estimated=0, window=3015)


def test_tokens_include_usage_string_false_is_read_as_false_and_rewritten():
    body = _prompt_body(stream=True, stream_options={"include_usage": "false"})
    with Stub() as stub, _gw(stub, tpm=3000) as gw:
        _ten_against_a_budget(gw, stub, body, _exact_1000)
        assert _last(stub) == (CHAT, body.replace(b'"include_usage":"false"',
                                                  b'"include_usage":true'))
        assert _tag(stub, "tpm")["include_usage_requests"] == 3
        _expect_tokens(gw, prompt=3000, completion=15, estimated=0, window=3015)


def test_tokens_a_client_gone_after_the_first_token_is_charged_its_prompt():
    # The usage would come after the last event: the client leaves after
    # the first ("tok0 ": 2 tokens), so the prompt is the estimate from
    # the 4,000 bytes of the message, 1,000, and 1,002 are charged.
    body = _prompt_body(stream=True)

    def estimated(line):
        _check_log(line, "estimated", prompt=1000, completion=2)

    with Stub() as stub, _gw(stub, tpm=3000) as gw:
        _ten_against_a_budget(gw, stub, body, estimated, disconnect=True)
        _expect_tokens(gw, estimated=3006, window=3006)


# ---------------------------------------------------------------- hostile runners and clients
#
# A runner that is not the stub: a raw upstream answering each request with
# the bytes a test gives it, so what a real runner (vLLM, TGI, llama.cpp)
# may do and the stub never does can be pinned.

def _sse(*events):
    return b"".join(events)


def _delta(text):
    return ('data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text).encode()


def _usage_ev(p, c):
    return ('data: {"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,'
            '"total_tokens":%d}}\n\n' % (p, c, p + c)).encode()


def _json_answer(content, usage=None):
    d = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
    if usage is not None:
        d["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                      "total_tokens": usage[0] + usage[1]}
    return json.dumps(d, separators=(",", ":")).encode()


def _answer(body, ctype="application/json", pace=None):
    """A RawUpstream handler sending one 200 with body (in pieces of `pace`
    bytes when given, so the gateway sees many reads)."""
    def handler(sock, req):
        sock.sendall(("HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                      "Connection: close\r\n\r\n" % (ctype, len(body))).encode())
        step = pace or len(body) or 1
        for i in range(0, len(body), step):
            sock.sendall(body[i:i + step])
    return handler


def _raw_post(gw, body, path=CHAT, headers=None, key=ACME_KEY):
    hd = dict(h.bearer(key))
    hd.update(JSON_CT)
    hd.update(headers or {})
    with h.Client(gw.port) as c:
        r = c.request("POST", path, hd, body, timeout=30)
        r.read_all(timeout=30)
        return r


def test_tokens_a_stream_is_read_as_the_runner_sends_it_not_as_the_request_asks():
    # Python runners (vLLM: pydantic) take "stream": "true", 1, "yes", 1.0
    # for true and stream: such a request is asked for its usage like one
    # with true (issue 22), and the chunk is kept from the client. A runner
    # may answer "stream": true with one JSON body. Each is counted from
    # what came back, never charged 0.
    sse = _sse(_delta("hello world "), _delta("bye"), _usage_ev(30, 4), h.DONE_EVENT)
    bodies = (b'{"model":"x","stream":"true","messages":[]}',
              b'{"model":"x","stream":1,"messages":[]}',
              b'{"model":"x","stream":"YES","messages":[]}',
              b'{"model":"x","stream":1e0,"messages":[]}',
              b'{"model":"x","stream":"\\u0074","messages":[]}')
    with h.RawUpstream(_answer(sse, "text/event-stream")) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        for i, body in enumerate(bodies, 1):
            r = _raw_post(gw, body)
            assert r.status == 200 and bytes(r.data) == _sse(_delta("hello world "),
                                                              _delta("bye"), h.DONE_EVENT), \
                bytes(r.data)
            assert up.requests[-1].endswith(b"\r\n\r\n" + body[:-1] + INJECTED + b"}"), \
                up.requests[-1][-200:]
            _check_log(_log_line(gw, i), "exact", 30, 4)
        # Values a runner reads as false, or refuses: not streamed, not
        # edited; what came back (the same stream here) is still counted.
        for j, body in enumerate((b'{"model":"x","stream":0,"messages":[]}',
                                  b'{"model":"x","stream":"off","messages":[]}',
                                  b'{"model":"x","stream":2,"messages":[]}',
                                  b'{"model":"x","stream":"true ","messages":[]}'),
                                 len(bodies) + 1):
            r = _raw_post(gw, body)
            assert r.status == 200 and bytes(r.data) == sse, bytes(r.data)
            assert up.requests[-1].endswith(b"\r\n\r\n" + body), up.requests[-1][-200:]
            _check_log(_log_line(gw, j), "exact", 30, 4)
        _expect_tokens(gw, prompt=270, completion=36, window=306)
    answer = _json_answer("abcdefghij", (12, 3))
    with h.RawUpstream(_answer(answer)) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        r = _raw_post(gw, _body(CHAT))
        assert r.status == 200 and bytes(r.data) == answer, bytes(r.data)
        _check_log(_log_line(gw, 1), "exact", 12, 3)
        _expect_tokens(gw, prompt=12, completion=3, window=15)


def test_tokens_a_stream_without_an_event_stream_type_is_read_as_the_request_asked():
    # A runner that streams under another type (or none, or a JSON one) is
    # still scanned, and the usage chunk asked for by sluice still never
    # reaches the client.
    sse = _sse(_delta("abcd"), _usage_ev(5, 1), h.DONE_EVENT)
    for ctype in ("text/plain", None, "application/json"):
        def handler(sock, req, ctype=ctype):
            sock.sendall(b"HTTP/1.1 200 OK\r\n" +
                         (b"Content-Type: %s\r\n" % ctype.encode() if ctype else b"") +
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(sse) + sse)
        with h.RawUpstream(handler) as up, \
                _gw(None, upstreams={"main": {"url": up.url}}) as gw:
            r = _raw_post(gw, _body(CHAT))
            assert r.status == 200 and bytes(r.data) == _sse(_delta("abcd"), h.DONE_EVENT), \
                (ctype, bytes(r.data))
            _check_log(_log_line(gw, 1), "exact", 5, 1)


def test_tokens_a_streamed_request_answered_in_json_without_usage_is_estimated():
    answer = _json_answer("abcdefghij")        # 10 bytes: 3 tokens
    with h.RawUpstream(_answer(answer)) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        r = _raw_post(gw, _body(CHAT))
        assert r.status == 200 and bytes(r.data) == answer
        _check_log(_log_line(gw, 1), "estimated", prompt=2, completion=3)
        _expect_tokens(gw, estimated=5, window=5)


def test_tokens_a_slow_client_does_not_lose_the_usage_of_a_non_streamed_answer():
    # The answer is larger than the stream buffer and the client reads
    # late: the upstream transfer pauses, and libcurl hands the paused piece
    # over again; the copy kept for the usage must hold each byte once.
    answer = _json_answer("q" * (100 << 10), (100, 50))
    with h.RawUpstream(_answer(answer, pace=3000)) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}, workers=1, stream_buffer="16KiB",
                limits={"client_sndbuf": "4KiB", "upstream_rcvbuf": "4KiB"}) as gw:
        c = h.Client(gw.port, rcvbuf=4096)
        try:
            c.send("POST", CHAT, _hdrs(), _body(CHAT, stream=False))
            time.sleep(0.5)
            r = c.read_response(timeout=10)
            r.read_all(timeout=30)
        finally:
            c.close()
        assert r.status == 200 and bytes(r.data) == answer
        line = _log_line(gw, 1)
        assert line["paused_ms"] > 0, "the transfer never paused: %r" % line
        _check_log(line, "exact", 100, 50)
        _expect_tokens(gw, prompt=100, completion=50, window=150)


def test_tokens_a_counted_request_asks_the_runner_for_an_uncompressed_answer():
    # A compressed answer cannot be read: a client asking for gzip would be
    # charged nothing. Uncounted requests keep the client's header.
    answer = _json_answer("abcd", (7, 1))
    with h.RawUpstream(_answer(answer)) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        r = _raw_post(gw, _body(CHAT, stream=False), headers={"Accept-Encoding": "gzip, br"})
        assert r.status == 200 and bytes(r.data) == answer
        head = up.requests[-1].split(b"\r\n\r\n", 1)[0].lower()
        assert head.count(b"accept-encoding") == 1 and b"accept-encoding: identity" in head, head
        _check_log(_log_line(gw, 1), "exact", 7, 1)
        with h.Client(gw.port) as c:
            r = c.request("GET", "/v1/models", dict(h.bearer(ACME_KEY),
                                                    **{"Accept-Encoding": "gzip"}))
            r.read_all()
        head = up.requests[-1].split(b"\r\n\r\n", 1)[0].lower()
        assert b"accept-encoding: gzip" in head, head
        _expect_tokens(gw, prompt=7, completion=1, window=8)


def test_tokens_a_non_streamed_answer_over_the_bound_is_estimated_from_its_bytes():
    # Bodies over 1 MiB are not parsed (sluice(8)); such an answer is not free.
    answer = _json_answer("x" * (2 << 20), (100, 50))
    with h.RawUpstream(_answer(answer)) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        r = _raw_post(gw, _body(CHAT, stream=False))
        assert r.status == 200 and bytes(r.data) == answer
        est = _estimate(len(answer))
        _check_log(_log_line(gw, 1), "estimated", prompt=2, completion=est)
        _expect_tokens(gw, estimated=2 + est, window=2 + est)


def test_tokens_a_percent_encoded_path_is_counted_as_the_runner_routes_it():
    # uvicorn and cpp-httplib decode the path before routing.
    sse = _sse(_delta("abcd"), _usage_ev(9, 1), h.DONE_EVENT)
    with h.RawUpstream(_answer(sse, "text/event-stream")) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        paths = ("/v1/chat/%63ompletions", "/v1/%63hat/completions?x=1",
                 "/v1/completion%73")
        for i, path in enumerate(paths, 1):
            r = _raw_post(gw, _body(CHAT), path=path)
            assert r.status == 200 and bytes(r.data) == _sse(_delta("abcd"), h.DONE_EVENT), \
                (path, bytes(r.data))
            assert up.requests[-1].startswith(b"POST " + path.encode() + b" "), up.requests[-1][:80]
            _check_log(_log_line(gw, i), "exact", 9, 1)
        # decoded, this is not a completions path: relayed, not counted
        r = _raw_post(gw, _body(CHAT), path="/v1/chat/completions%3Fx")
        _check_log(_log_line(gw, len(paths) + 1), "none")
        _expect_tokens(gw, prompt=27, completion=3, window=30)


def test_tokens_no_usage_chunk_reaches_a_client_that_did_not_ask_even_if_sent_twice():
    sse = _sse(_delta("abcd"), _usage_ev(10, 2), _usage_ev(20, 4), h.DONE_EVENT)
    with h.RawUpstream(_answer(sse, "text/event-stream")) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        r = _raw_post(gw, _body(CHAT))
        assert r.status == 200 and r.complete
        assert bytes(r.data) == _sse(_delta("abcd"), h.DONE_EVENT), bytes(r.data)


def test_tokens_bodies_python_runners_accept_are_counted():
    sse = _sse(_delta("abcd"), _usage_ev(9, 1), h.DONE_EVENT)
    bodies = (b'\xef\xbb\xbf{"model":"x","stream":true,"messages":[]}',
              b'{"model":"x","stream":true,"messages":[{"role":"user","content":"\\ud800"}]}',
              b'{"model":"x","stream":true,"temperature":NaN,"messages":[]}',
              b'{"model":"x","stream":true,"unknown_member":1e999,"messages":[]}')
    with h.RawUpstream(_answer(sse, "text/event-stream")) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        for i, body in enumerate(bodies, 1):
            r = _raw_post(gw, body)
            assert r.status == 200 and r.complete, (body, r.status)
            # counted as the runner reported it, the chunk asked for kept
            # from the client, the body given the option
            assert bytes(r.data) == _sse(_delta("abcd"), h.DONE_EVENT), (body, bytes(r.data))
            assert up.requests[-1].endswith(b"\r\n\r\n" + body[:-1] + INJECTED + b"}"), \
                (body, up.requests[-1][-200:])
            _check_log(_log_line(gw, i), "exact", 9, 1)
        _expect_tokens(gw, prompt=9 * len(bodies), completion=len(bodies),
                       window=10 * len(bodies))


def _told_usage(sock, req):
    """A runner that reports the usage the request's X-Usage: P,C,T header
    tells it (streamed or not, as asked), after "abcd"."""
    p, c, t = re.search(rb"(?im)^x-usage: *(\d+),(\d+),(\d+)\r$", req).groups()
    usage = b'{"prompt_tokens":%s,"completion_tokens":%s,"total_tokens":%s}' % (p, c, t)
    if b'"stream":true' in req:
        body = _sse(_delta("abcd"), b'data: {"choices":[],"usage":' + usage + b"}\n\n",
                    h.DONE_EVENT)
        ctype = b"text/event-stream"
    else:
        body = (b'{"choices":[{"index":0,"message":{"role":"assistant","content":"abcd"}}],'
                b'"usage":' + usage + b"}")
        ctype = b"application/json"
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n" % (ctype, len(body)) + body)


def test_tokens_an_absurd_usage_is_refused_for_the_estimate_and_no_counter_wraps():
    # A runner reporting 2^63-1 tokens, three times: the counters wrapped and
    # went backwards. A count over 100,000,000 is refused (sluice.yaml(5)):
    # the request is charged its estimate, prompt ("hello": 2) plus
    # completion ("abcd": 1).
    big = 2 ** 63 - 1
    kinds = ("prompt", "completion", "estimated")
    with h.RawUpstream(_told_usage) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        seen = []
        for i in range(3):
            r = _raw_post(gw, _body(CHAT), headers={"X-Usage": "%d,%d,%d" % (big, big, big)})
            assert r.status == 200 and r.complete
            assert bytes(r.data) == _sse(_delta("abcd"), h.DONE_EVENT), bytes(r.data)
            _check_log(_log_line(gw, i + 1), "estimated", prompt=2, completion=1)
            h.wait_metric(gw, TOKENS, 3 * (i + 1), tenant="acme", model="-",
                          kind="estimated")
            m = h.scrape(gw)
            seen.append(tuple(m.value(TOKENS, tenant="acme", model="-", kind=k)
                              for k in kinds))
        assert seen == [(0, 0, 3), (0, 0, 6), (0, 0, 9)], seen
        # One count over the bound is enough (total_tokens is not charged,
        # so not judged); the bound itself is a count.
        cases = (((big, 1, big), False, "estimated"),
                 ((1, 100000001, 100000002), True, "estimated"),
                 ((100000000, 100000000, 200000000), True, "exact"))
        for j, (usage, stream, kind) in enumerate(cases, 4):
            r = _raw_post(gw, _body(CHAT, stream=stream),
                          headers={"X-Usage": "%d,%d,%d" % usage})
            assert r.status == 200 and r.complete
            if kind == "exact":
                _check_log(_log_line(gw, j), "exact", usage[0], usage[1])
            else:
                _check_log(_log_line(gw, j), "estimated", prompt=2, completion=1)
        _expect_tokens(gw, prompt=100000000, completion=100000000, estimated=15,
                       window=200000015)


@h.timeout(90)
@h.skip_under("valgrind")
def test_tokens_a_huge_request_body_does_not_stall_the_other_streams_of_its_worker():
    answer = _json_answer("ok", (1, 1))
    with h.RawUpstream(_answer(answer), read_timeout=30) as up, Stub() as stub, \
            _gw(None, workers=1, limits={"max_body_bytes": "16MiB"},
                upstreams={"main": {"url": up.url}, "other": {"url": stub.url}},
                tenants={"beta": {"upstream": "other"}, "acme": {"upstream": "main"}}) as gw:
        w = gw.worker_pids()[0]
        beta = gw.client()
        beta.send("POST", CHAT, _hdrs(key=BETA_KEY, events=60, interval=50), _body(CHAT))
        r = beta.read_response(timeout=10)
        assert r.status == 200
        r.read_events(2, timeout=10)
        n = (16 << 20) // 2 - 64
        big = b'{"model":"x","x":[' + b"1," * (n - 1) + b'1]}'
        with h.Client(gw.port) as c:
            c.send("POST", CHAT, _hdrs(), big)
            rb = c.read_response(timeout=60)
            rb.read_all(timeout=60)
        assert rb.status == 200, rb.status
        r.read_all(timeout=30)
        assert r.complete
        gaps = [b[0] - a[0] for a, b in zip(r.events, r.events[1:])]
        # jansson's tree stalled it 4.1 s; the walker is ~70 ms of CPU on an idle
        # machine: 2 s leaves room for a loaded one and still catches a tree.
        assert max(gaps) < 2.0, "the worker stalled a stream for %.2fs" % max(gaps)
        assert h.rss_kb(w) < 200 * 1024, "worker RSS %d KiB after one request" % h.rss_kb(w)


def test_tokens_the_estimate_counts_tool_call_arguments_and_reasoning():
    tool = (b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
            b'{"name":"f","arguments":"' + b"a" * 400 + b'"}}]}}]}\n\n')
    think = b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"' + b"r" * 400 + b'"}}]}\n\n'
    for i, ev in enumerate((tool, think), 1):
        with h.RawUpstream(_answer(_sse(ev, h.DONE_EVENT), "text/event-stream")) as up, \
                _gw(None, upstreams={"main": {"url": up.url}}) as gw:
            r = _raw_post(gw, _body(CHAT))
            assert r.status == 200 and r.complete
            _check_log(_log_line(gw, 1), "estimated", prompt=2, completion=100)


def test_tokens_a_usage_event_with_other_fields_first_is_still_removed():
    usage = (b'id: 2\nevent: message\ndata: {"choices":[],"usage":{"prompt_tokens":6,'
             b'"completion_tokens":2,"total_tokens":8}}\n\n')
    with h.RawUpstream(_answer(_sse(b"id: 1\n" + _delta("abcd"), usage, h.DONE_EVENT),
                               "text/event-stream")) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        r = _raw_post(gw, _body(CHAT))
        assert r.status == 200 and r.complete
        _check_log(_log_line(gw, 1), "exact", 6, 2)
        assert bytes(r.data) == _sse(b"id: 1\n" + _delta("abcd"), h.DONE_EVENT), bytes(r.data)


def test_tokens_injection_does_not_turn_on_continuous_usage_stats():
    def vllm(sock, req):
        so = json.loads(req.split(b"\r\n\r\n", 1)[1]).get("stream_options") or {}
        inc = so.get("include_usage") is True
        cont = inc and so.get("continuous_usage_stats") is True
        evs = []
        for i in range(3):
            u = (',"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}'
                 % (i + 1, 6 + i)) if cont else (',"usage":null' if inc else "")
            evs.append(('data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]%s}\n\n'
                        % (i, u)).encode())
        if inc:
            evs.append(_usage_ev(5, 3))
        b = _sse(*evs) + h.DONE_EVENT
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(b) + b)
    with h.RawUpstream(vllm) as up, _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        r = _raw_post(gw, b'{"model":"x","stream":true,'
                          b'"stream_options":{"continuous_usage_stats":true}}')
        assert r.status == 200 and r.complete
        assert b'"usage"' not in bytes(r.data), bytes(r.data)
        _check_log(_log_line(gw, 1), "exact", 5, 3)


def _python_json_encoding(b):
    """json.detect_encoding as json.loads(bytes) applies it (RFC 4627 s3,
    a BOM first): what a Python runner would decode the body as."""
    return json.detect_encoding(b)


def test_tokens_a_utf16_or_utf32_body_is_refused_400_not_relayed_uncounted():
    # json.loads(bytes) (FastAPI, pydantic) decodes these; sluice reads
    # UTF-8 only, so relaying them would let their tokens past the budget.
    doc = json.dumps({"model": "x", "stream": True,
                      "messages": [{"role": "user", "content": "hello " * 50}]})
    compl = json.dumps({"model": "x", "stream": False, "prompt": "hello " * 50})
    bodies = []
    for enc in ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"):
        bodies.append((CHAT, doc.encode(enc)))                  # no BOM
        bodies.append((COMPL, compl.encode(enc)))
    for enc in ("utf-16", "utf-32"):                             # a BOM first
        bodies.append((CHAT, doc.encode(enc)))
    for path, body in bodies:
        assert _python_json_encoding(body) not in ("utf-8", "utf-8-sig"), body[:8]
        assert json.loads(body)["model"] == "x"                 # a runner takes it
    sse = _sse(_delta("abcd"), _usage_ev(9, 1), h.DONE_EVENT)
    with h.RawUpstream(_answer(sse, "text/event-stream")) as up, \
            _gw(None, tpm=3000, upstreams={"main": {"url": up.url}},
                tenants={"acme": {"max_streams": 1}}) as gw:
        for i, (path, body) in enumerate(bodies, 1):
            r = _raw_post(gw, body, path)
            doc_ = assert_error(r, 400, "bad_request", read=False)
            assert doc_["error"]["message"] == "request body must be UTF-8 JSON", doc_
            line = _log_line(gw, i)
            assert line["status"] == 400 and line.get("usage") in ("none", None), line
        assert up.requests == [], "a UTF-16/32 body reached the runner: %r" % (
            up.requests[0][-80:],)
        # max_streams 1: the slot of every refusal was released; a UTF-8
        # body (with a BOM too) is relayed and counted as before.
        for i, body in enumerate((doc.encode(), b"\xef\xbb\xbf" + doc.encode()), 1):
            r = _raw_post(gw, body)
            assert r.status == 200 and r.complete, (r.status, bytes(r.data[:200]))
            _check_log(_log_line(gw, len(bodies) + i), "exact", 9, 1)
        assert len(up.requests) == 2
        _expect_tokens(gw, prompt=18, completion=2, window=20)
        # the refusal keeps the connection: the next request on it is served
        hd = dict(h.bearer(ACME_KEY))
        hd.update(JSON_CT)
        with h.Client(gw.port) as c:
            r = c.request("POST", CHAT, hd, bodies[0][1], timeout=30)
            assert_error(r, 400, "bad_request")
            r = c.request("POST", CHAT, hd, doc.encode(), timeout=30)
            r.read_all(timeout=30)
            assert r.status == 200 and r.complete, (r.status, bytes(r.data[:200]))
        assert len(up.requests) == 3
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")


def test_tokens_a_utf16_body_is_refused_where_prefix_affinity_reads_it_and_relayed_elsewhere():
    doc = json.dumps({"model": "x", "stream": False, "prompt": "hello " * 50})
    wide = doc.encode("utf-16-le")
    with h.RawUpstream(_answer(_json_answer("abcd"))) as up:
        # usage off: only prefix_affinity reads the body
        cfg = _config(None, usage={"enabled": False})
        cfg["upstreams"] = {"main": {"replicas": [{"url": up.url}],
                                     "balance": "prefix_affinity"}}
        with Gateway(cfg) as gw:
            r = _raw_post(gw, wide, COMPL)
            doc_ = assert_error(r, 400, "bad_request", read=False)
            assert doc_["error"]["message"] == "request body must be UTF-8 JSON", doc_
            assert up.requests == []
        # usage off and no body reader: relayed untouched, as any body
        cfg = _config(None, upstreams={"main": {"url": up.url}}, usage={"enabled": False})
        with Gateway(cfg) as gw:
            r = _raw_post(gw, wide, COMPL)
            assert r.status == 200 and r.complete, (r.status, bytes(r.data[:200]))
            assert len(up.requests) == 1 and up.requests[0].endswith(b"\r\n\r\n" + wide)
        # a path sluice does not count is relayed untouched too (count_tokens
        # is relayed, not charged); every metered API's path refuses it
        cfg = _config(None, upstreams={"main": {"url": up.url}})
        with Gateway(cfg) as gw:
            r = _raw_post(gw, wide, "/v1/messages/count_tokens")
            assert r.status == 200 and r.complete, (r.status, bytes(r.data[:200]))
            assert len(up.requests) == 2 and up.requests[1].endswith(b"\r\n\r\n" + wide)
            for path in ("/v1/embeddings", "/v1/responses", "/v1/messages"):
                r = _raw_post(gw, wide, path)
                doc_ = assert_error(r, 400, "bad_request", read=False)
                assert doc_["error"]["message"] == "request body must be UTF-8 JSON", doc_
            assert len(up.requests) == 2


# ---------------------------------------------------------------- other APIs
# The Responses API, the Anthropic Messages API and embeddings report their
# usage unasked: counted from it (or estimated), never edited.

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
EMBEDDINGS = "/v1/embeddings"


def _resp_ev(type_, **members):
    d = {"type": type_}
    d.update(members)
    return ("event: %s\ndata: %s\n\n" % (type_, json.dumps(d, separators=(",", ":")))).encode()


def _resp_stream(deltas, usage=None, final="response.completed"):
    """A Responses API stream: the deltas, the done events with the whole
    text again, then final carrying usage (input, output) when given."""
    text = "".join(deltas)
    b = _resp_ev("response.created", sequence_number=0,
                 response={"id": "resp_1", "status": "in_progress", "output": [],
                           "usage": None})
    for i, d in enumerate(deltas):
        b += _resp_ev("response.output_text.delta", sequence_number=i + 1, item_id="msg_1",
                      output_index=0, content_index=0, delta=d, logprobs=[])
    b += _resp_ev("response.output_text.done", sequence_number=90, item_id="msg_1",
                  output_index=0, content_index=0, text=text, logprobs=[])
    if usage is not None:
        b += _resp_ev(final, sequence_number=91, response={
            "id": "resp_1", "status": "completed",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": usage[0], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": usage[1], "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": usage[0] + usage[1]}})
    return b


def _msg_stream(deltas, usage=None):
    """A Messages API stream; usage (input, cache_creation, cache_read, output)."""
    b = _resp_ev("message_start", message={
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "usage": {"input_tokens": usage[0] if usage else 9,
                  "cache_creation_input_tokens": usage[1] if usage else 0,
                  "cache_read_input_tokens": usage[2] if usage else 0, "output_tokens": 1}})
    b += _resp_ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
    for d in deltas:
        b += _resp_ev("content_block_delta", index=0, delta={"type": "text_delta", "text": d})
    b += _resp_ev("content_block_stop", index=0)
    if usage is not None:
        b += _resp_ev("message_delta", delta={"stop_reason": "end_turn"},
                      usage={"output_tokens": usage[3]})
        b += _resp_ev("message_stop")
    return b


def test_tokens_responses_messages_and_embeddings_are_counted_and_relayed_unchanged():
    deltas = ["Hello", " there", ", friend"]
    cases = (
        (RESPONSES, b'{"model":"x","stream":true,"input":"abcdefgh"}',
         _resp_stream(deltas, (37, 11)), "text/event-stream", (37, 11)),
        (RESPONSES, b'{"model":"x","stream":true,"input":"abcdefgh"}',
         _resp_stream(deltas, (5, 6), "response.incomplete"), "text/event-stream", (5, 6)),
        (MESSAGES, b'{"model":"x","stream":true,"max_tokens":5,"messages":[]}',
         _msg_stream(deltas, (25, 100, 7, 15)), "text/event-stream", (132, 15)),
        (RESPONSES, b'{"model":"x","input":"abcd"}',
         b'{"id":"resp_1","output":[],"usage":{"input_tokens":12,"output_tokens":34,'
         b'"total_tokens":46}}', "application/json", (12, 34)),
        (MESSAGES, b'{"model":"x","max_tokens":5,"messages":[]}',
         b'{"content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":10,'
         b'"cache_read_input_tokens":5,"output_tokens":7}}', "application/json", (15, 7)),
        (EMBEDDINGS, b'{"model":"e","input":["abcd","efgh"]}',
         b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],'
         b'"usage":{"prompt_tokens":8,"total_tokens":8}}', "application/json", (8, 0)),
    )
    tp = tc = 0
    for i, (path, body, answer, ctype, (p, c)) in enumerate(cases, 1):
        with h.RawUpstream(_answer(answer, ctype, pace=7)) as up, \
                _gw(None, upstreams={"main": {"url": up.url}}) as gw:
            r = _raw_post(gw, body, path)
            assert r.status == 200 and bytes(r.data) == answer, (path, bytes(r.data)[:300])
            assert up.requests[-1].endswith(b"\r\n\r\n" + body), up.requests[-1][-200:]
            _check_log(_log_line(gw, 1), "exact", p, c)
            _expect_tokens(gw, prompt=p, completion=c, window=p + c)
            tp += p
            tc += c
    assert (tp, tc) == (37 + 5 + 132 + 12 + 15 + 8, 11 + 6 + 15 + 34 + 7)


def test_tokens_responses_and_messages_streams_without_usage_are_estimated():
    deltas = ["Hello", " there", ", friend"]          # 19 bytes: 5 tokens
    # prompts: "abcdefgh" + "xyz" (responses), "abcd" + "hello" (messages): 3 each
    cases = (
        (RESPONSES, b'{"model":"x","stream":true,"input":"abcdefgh","instructions":"xyz"}',
         _resp_stream(deltas)),
        (MESSAGES, b'{"model":"x","stream":true,"system":"abcd","messages":'
         b'[{"role":"user","content":"hello"}]}', _msg_stream(deltas)),
    )
    for path, body, answer in cases:
        with h.RawUpstream(_answer(answer, "text/event-stream", pace=5)) as up, \
                _gw(None, upstreams={"main": {"url": up.url}}) as gw:
            r = _raw_post(gw, body, path)
            assert r.status == 200 and bytes(r.data) == answer, bytes(r.data)[:300]
            _check_log(_log_line(gw, 1), "estimated", 3, 5)
            _expect_tokens(gw, estimated=8, window=8)


def test_tokens_stored_responses_and_count_tokens_are_relayed_not_charged():
    answer = b'{"id":"resp_1","usage":{"input_tokens":12,"output_tokens":34}}'
    with h.RawUpstream(_answer(answer)) as up, \
            _gw(None, upstreams={"main": {"url": up.url}}) as gw:
        r = _raw_post(gw, b'{"model":"x","messages":[]}', MESSAGES + "/count_tokens")
        assert r.status == 200 and bytes(r.data) == answer
        r = _raw_post(gw, b'{}', RESPONSES + "/resp_1/cancel")
        assert r.status == 200 and bytes(r.data) == answer
        _check_log(_log_line(gw, 2), "none")
        m = h.scrape(gw)
        for kind in ("prompt", "completion", "estimated"):
            assert m.value(TOKENS, tenant="acme", model="-", kind=kind) in (0, None), kind

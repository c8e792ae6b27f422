# SPDX-License-Identifier: BSD-2-Clause
"""Every API the runners serve is governed, not only chat (issue 34): the
Responses API, the Anthropic Messages API and embeddings. This file holds
what sluice says itself on them: its errors in the client's protocol."""

import datetime
import json
import re
import time

import harness as h
from harness import ACME_KEY, Gateway, Stub, assert_error


def assert_anthropic_error(resp, status, etype, code, read=True):
    """The response is an error in the Anthropic Messages API's shape:
    {"type":"error","error":{"type":T,"message":M,"code":C}}."""
    if read:
        resp.read_all(timeout=10)
    assert resp.status == status, "expected status %d, got %d (body %r)" % (
        status, resp.status, bytes(resp.data[:300]))
    assert "application/json" in (resp.header("content-type") or "")
    doc = json.loads(bytes(resp.data).decode())
    assert doc.get("type") == "error", doc
    err = doc.get("error")
    assert isinstance(err, dict), doc
    assert err.get("type") == etype, (etype, doc)
    assert err.get("code") == code, (code, doc)
    assert isinstance(err.get("message"), str) and err["message"], doc
    assert set(doc) == {"type", "error"} and set(err) == {"type", "message", "code"}, doc
    return doc


def _req(gw, method, path, headers=None, body=None, key=ACME_KEY):
    hd = {"Content-Type": "application/json"}
    if key is not None:
        hd["X-Api-Key"] = key
    hd.update(headers or {})
    with h.Client(gw.port) as c:
        c.send(method, path, hd, body if body is not None else b"")
        r = c.read_response()
        r.read_all(timeout=10)
        return r


MSG = json.dumps({"model": "stub", "max_tokens": 16, "stream": True,
                  "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_sluice_errors_on_messages_are_anthropic_shaped_and_openai_elsewhere():
    with Stub() as stub, Gateway(stub=stub, limits={"max_body_bytes": 4096}) as gw:
        # 401, the same refusal OpenAI-shaped on chat.
        r = _req(gw, "POST", "/v1/messages", body=MSG, key=None)
        assert_anthropic_error(r, 401, "authentication_error", "invalid_api_key", read=False)
        r = _req(gw, "POST", "/v1/messages", body=MSG, key="sk-nobody")
        assert_anthropic_error(r, 401, "authentication_error", "invalid_api_key", read=False)
        r = _req(gw, "POST", "/v1/chat/completions", body=MSG, key=None)
        assert_error(r, 401, "invalid_api_key", read=False)
        # Paths under /v1/messages speak it too; a query does not change it.
        r = _req(gw, "POST", "/v1/messages/count_tokens?beta=true", body=MSG, key=None)
        assert_anthropic_error(r, 401, "authentication_error", "invalid_api_key", read=False)
        # 400 (a dot segment), 413 (a body over max_body_bytes), 405 (TRACE).
        r = _req(gw, "POST", "/v1/messages/./x", body=MSG)
        assert_anthropic_error(r, 400, "invalid_request_error", "bad_request", read=False)
        r = _req(gw, "POST", "/v1/messages", body=b"x" * 5000)
        assert_anthropic_error(r, 413, "invalid_request_error", "request_too_large",
                               read=False)
        r = _req(gw, "TRACE", "/v1/messages")
        assert_anthropic_error(r, 405, "invalid_request_error", "method_not_allowed",
                               read=False)
        # Not /v1/messages: OpenAI-shaped as before.
        for path in ("/v1/messagesx", "/v1/responses", "/v1/embeddings"):
            r = _req(gw, "POST", path, body=MSG, key=None)
            assert_error(r, 401, "invalid_api_key", read=False)
        assert stub.stats()["requests"] == 0, stub.stats()


def test_messages_429_and_5xx_keep_their_status_and_retry_after():
    cfg = h.gateway_config(None, upstream_url="http://127.0.0.1:%d" % h.closed_port(),
                           tenants={"acme": {"max_streams": 1, "retry_after": 7}})
    with Stub() as stub:
        cfg["upstreams"]["live"] = {"url": stub.url}
        cfg["tenants"]["beta"]["upstream"] = "live"
        cfg["tenants"]["beta"]["max_streams"] = 1
        with Gateway(cfg) as gw:
            # 502: acme's upstream refuses connections.
            r = _req(gw, "POST", "/v1/messages", body=MSG)
            assert_anthropic_error(r, 502, "api_error", "upstream_unreachable", read=False)
            # 429: beta holds its one stream on a chat request.
            hold = h.Client(gw.port)
            hd = {"Content-Type": "application/json"}
            hd.update(h.bearer(h.BETA_KEY))
            hd.update(h.stub_headers(events=50, interval=100))
            hold.send("POST", "/v1/chat/completions", hd, h.stream_body())
            first = hold.read_response()
            assert first.status == 200
            r = _req(gw, "POST", "/v1/messages", body=MSG, key=h.BETA_KEY)
            doc = assert_anthropic_error(r, 429, "rate_limit_error",
                                         "concurrency_limit_exceeded", read=False)
            assert r.header("retry-after") == "2", r.header("retry-after")
            hold.close()


def test_messages_504_is_an_api_error():
    with Stub() as stub, Gateway(stub=stub, timeouts={"upstream_first_byte": "1s"}) as gw:
        r = _req(gw, "POST", "/v1/messages", h.stub_headers(delay=3000),
                 body=MSG)
        assert_anthropic_error(r, 504, "api_error", "upstream_timeout", read=False)


def test_access_log_names_each_request_s_api():
    path = h.tmpfile("access", ".log")
    with Stub() as stub, Gateway(stub=stub, access_log=path) as gw:
        want = []
        for method, target, api in (
                ("POST", "/v1/chat/completions", "chat"),
                ("POST", "/v1/completions", "completions"),
                ("POST", "/v1/responses", "responses"),
                ("GET", "/v1/responses/resp_1/input_items?limit=2", "responses"),
                ("POST", "/v1/messages", "messages"),
                ("POST", "/v1/messages/count_tokens", "messages"),
                ("POST", "/v1/embeddings", "embeddings"),
                ("POST", "/v1/chat/%63ompletions", "chat"),
                ("GET", "/v1/models", "other"),
                ("GET", "/v1/echo", "other"),
                ("POST", "/v1/embeddings/x", "other")):
            body = h.stream_body() if method == "POST" else None
            r = _req(gw, method, target, h.stub_headers(events=1, interval=0), body=body)
            assert r.status in (200, 400, 404), (target, r.status)   # relayed
            want.append((target.split("?")[0] if "%" not in target else target, api))
        # Refused before admission, the API is still the path's.
        r = _req(gw, "POST", "/v1/messages", body=MSG, key=None)
        assert r.status == 401
        want.append(("/v1/messages", "messages"))
        lines = h.wait_access_lines(path, len(want))
        # Two workers: a line may follow the next request's (written once
        # the response is out, which the client may see first).
        assert sorted((ln["path"], ln["api"]) for ln in lines) == sorted(want), lines


RL = ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")
ARL = ("anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining",
       "anthropic-ratelimit-tokens-reset")
DURATION = re.compile(r"^(?:([1-9][0-9]*)m)?([0-9]|[1-5][0-9])s$")


def _seconds(v):
    m = DURATION.match(v)
    assert m, "not OpenAI's duration form: %r" % v
    return int(m.group(1) or 0) * 60 + int(m.group(2))


def _chat(gw, key=ACME_KEY, usage=(1000, 200), path="/v1/chat/completions", more=None):
    hd = {"Content-Type": "application/json", "X-Stub-Usage": "%d,%d" % usage}
    hd.update(h.bearer(key))
    hd.update(h.stub_headers(events=2, interval=0))
    hd.update(more or {})
    with h.Client(gw.port) as c:
        return c.request("POST", path, hd, h.stream_body(), timeout=30)


def test_ratelimit_headers_state_the_tenant_s_token_budget():
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"tokens_per_minute": 3000}}) as gw:
        r = _chat(gw)
        assert r.status == 200
        # Before the first charge: the whole budget, nothing to reset.
        assert [r.header(n) for n in RL] == ["3000", "3000", "0s"], r.headers
        assert r.header(ARL[0]) is None, "anthropic-* only on /v1/messages"
        r = _chat(gw)
        assert [r.header(n) for n in RL[:2]] == ["3000", "1800"], r.headers
        assert 55 <= _seconds(r.header(RL[2])) <= 62, r.header(RL[2])
        # Another tenant without a budget gets none of them.
        r = _chat(gw, key=h.BETA_KEY)
        assert r.status == 200 and all(r.header(n) is None for n in RL + ARL), r.headers
        # On /v1/messages the Anthropic names too, reset as an RFC 3339 time.
        r = _chat(gw, path="/v1/messages")
        assert [r.header(n) for n in RL[:2]] == ["3000", "600"], r.headers
        assert [r.header(n) for n in ARL[:2]] == ["3000", "600"], r.headers
        at = datetime.datetime.strptime(r.header(ARL[2]), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc)
        ahead = (at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        assert 50 <= ahead <= 63, (r.header(ARL[2]), ahead)


def test_token_budget_429_carries_the_ratelimit_headers():
    with Stub() as stub, Gateway(stub=stub, tenants={"acme": {"tokens_per_minute": 1000}}) as gw:
        r = _chat(gw, usage=(900, 300))
        assert r.status == 200
        r = _chat(gw)
        assert_error(r, 429, "token_budget_exceeded", read=False)
        assert [r.header(n) for n in RL[:2]] == ["1000", "0"], r.headers
        assert 55 <= _seconds(r.header(RL[2])) <= 62, r.header(RL[2])
        r = _chat(gw, path="/v1/messages")
        assert_anthropic_error(r, 429, "rate_limit_error", "token_budget_exceeded", read=False)
        assert [r.header(n) for n in ARL[:2]] == ["1000", "0"], r.headers
        assert int(r.header("retry-after")) >= 1


PROVIDER_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"x-ratelimit-limit-tokens: 999999\r\nX-RateLimit-Remaining-Tokens: 999998\r\n"
                 b"x-ratelimit-reset-tokens: 1ms\r\nanthropic-ratelimit-tokens-remaining: 5\r\n"
                 b"x-ratelimit-remaining-requests: 77\r\nConnection: close\r\n"
                 b"Content-Length: 2\r\n\r\n{}")


def test_an_upstream_s_own_token_ratelimit_headers_give_way_to_the_tenant_s():
    # An upstream that states rate limits of its own, as a hosted provider does.
    with h.RawUpstream(lambda sock, req: sock.sendall(PROVIDER_HEAD)) as p:
        cfg = h.gateway_config(None, upstream_url=p.url,
                               tenants={"acme": {"tokens_per_minute": 3000}})
        with Gateway(cfg) as gw:
            for key, want in ((ACME_KEY, ["3000", "3000", "0s"]),
                              (h.BETA_KEY, ["999999", "999998", "1ms"])):
                hd = {"Connection": "close"}
                hd.update(h.bearer(key))
                with h.Client(gw.port) as c:
                    r = c.request("GET", "/v1/messages/x", hd, b"", timeout=10)
                assert r.status == 200, r.status
                got = [(k.lower(), v) for k, v in r.headers if "ratelimit" in k.lower()]
                names = [k for k, _ in got]
                for n in RL:
                    assert names.count(n) == 1, (key, got)
                assert [r.header(n) for n in RL] == want, (key, got)
                # Other rate-limit headers of the provider pass.
                assert r.header("x-ratelimit-remaining-requests") == "77", got
                if key == ACME_KEY:
                    assert r.header(ARL[1]) == "3000" and names.count(ARL[1]) == 1, got
                else:
                    assert r.header(ARL[1]) == "5", got


# ---------------------------------------------------------------- cut mid-stream

EV = [b'data: {"id":"c1","choices":[{"delta":{"content":"a"}}]}\n\n',
      b'data: {"id":"c1","choices":[{"delta":{"content":"b"}}]}\n\n']


def _cutting_runner(sock, req):
    """Two events, then the way the request's path names: "half" sends
    half an event before closing, "json" is not an event stream."""
    path = req.split(b" ")[1]
    if path == b"/v1/chat/completions?json":
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"id\":")
        return
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    for ev in EV:
        sock.sendall(b"%x\r\n%s\r\n" % (len(ev), ev))
    if path.endswith(b"?half"):
        sock.sendall(b"5\r\ndata:\r\n")
    time.sleep(0.1)
    h.close_rst(sock)


def test_a_runner_cut_between_events_is_told_in_the_stream_then_cut():
    with h.RawUpstream(_cutting_runner) as up, \
            Gateway(upstream_url=up.url, workers=1) as gw:
        for path, tail in (("/v1/chat/completions", h.failure_event("chat", "connection reset")),
                           ("/v1/completions", h.failure_event("chat", "connection reset")),
                           # Half an event: a terminal one after it would spoil both.
                           ("/v1/chat/completions?half", b"data:"),
                           # An event stream of an API sluice does not know: as it was.
                           ("/v1/other", b"")):
            c = gw.client()
            c.send("POST", path, h.bearer(ACME_KEY), b"{}")
            r = c.read_response(timeout=5)
            assert r.status == 200, (path, r.status)
            body = r.read_all(timeout=5)
            assert r.cut and not r.complete, (path, "relayed as complete")
            assert c.eof, path
            assert body == b"".join(EV) + tail, (path, body)
            c.close()
        # Not an event stream: cut as it was, nothing appended.
        c = gw.client()
        c.send("POST", "/v1/chat/completions?json", h.bearer(ACME_KEY), b"{}")
        r = c.read_response(timeout=5)
        body = r.read_all(timeout=5)
        assert r.status == 200 and bytes(body) == b'{"id":' and not r.complete, body
        c.close()


def test_a_runner_cut_over_http2_is_a_reset_stream_never_a_clean_end():
    from test_h2 import _gw as h2_gw, _curl
    files = h.TLSFiles()
    log = h.tmpfile("access", ".log")
    with Stub() as stub, h2_gw(files, stub, access_log=log) as gw:
        base = ["--http2", "--cacert", files.ca, "--resolve",
                "localhost:%d:127.0.0.1" % gw.port, "-H", "Authorization: Bearer " + ACME_KEY,
                "-H", "Content-Type: application/json", "-H", "X-Stub-Events: 5",
                "-H", "X-Stub-Interval-Ms: 0", "--data-binary", h.stream_body().decode(),
                "https://localhost:%d/v1/chat/completions" % gw.port]
        rc, out, err = _curl(base[:-1] + ["-H", "X-Stub-Abort-After: 2", base[-1]])
        # curl: 92, the stream was reset with INTERNAL_ERROR (a failure,
        # not a short answer); what arrived, then the failure told.
        assert rc == 92 and "INTERNAL_ERROR" in err, (rc, err)
        assert out == h.stub_event(0) + h.stub_event(1) + h.failure_event("chat", h.CUT_CLOSED), out
        rc, out, err = _curl(base)
        assert rc == 0 and out == h.expected_events(5), (rc, err, out[-200:])
        lines = h.wait_access_lines(log, 2)
        assert [(ln["end"], ln["status"], ln["proto"]) for ln in lines] == \
            [("upstream_error", 200, "h2"), ("done", 200, "h2")], lines


# ---------------------------------------------------------------- budgets on every API

TOKENS = "sluice_tenant_tokens_total"
PROMPT_4000 = "p" * 4000        # estimated: ceil(4000 / 4) = 1,000 tokens

API_BODIES = {
    "responses": ("/v1/responses", {"model": "m", "stream": True, "input": PROMPT_4000}),
    "messages": ("/v1/messages", {"model": "m", "stream": True, "max_tokens": 64,
                                  "messages": [{"role": "user", "content": PROMPT_4000}]}),
    "embeddings": ("/v1/embeddings", {"model": "m", "input": PROMPT_4000}),
}


def _budget_gw(stub):
    return Gateway(stub=stub, admin_listen="%s:%d" % (h.HOST, h.free_port()),
                   tenants={"acme": {"tokens_per_minute": 3000}})


def test_a_token_budget_holds_on_the_responses_messages_and_embeddings_apis():
    """Eight 1,000-token prompts against a 3,000 budget: 3 served, then
    429 token_budget_exceeded (in the API's own error shape), tokens exact."""
    for api, (path, body) in API_BODIES.items():
        with Stub() as stub, _budget_gw(stub) as gw:
            got = []
            for _ in range(8):
                hd = dict(h.bearer(ACME_KEY), **{"Content-Type": "application/json",
                                                 "X-Stub-Usage": "1000,16",
                                                 "X-Stub-Events": "16",
                                                 "X-Stub-Interval-Ms": "0"})
                with h.Client(gw.port) as c:
                    r = c.request("POST", path, hd, json.dumps(body).encode(), timeout=30)
                got.append(r.status)
                if r.status == 429:
                    if api == "messages":
                        assert_anthropic_error(r, 429, "rate_limit_error",
                                               "token_budget_exceeded", read=False)
                    else:
                        assert_error(r, 429, "token_budget_exceeded", read=False)
            assert got == [200] * 3 + [429] * 5, (api, got)
            completion = 0 if api == "embeddings" else 16
            m = h.wait_metric(gw, TOKENS, 3000, tenant="acme", model="-", kind="prompt")
            assert m.value(TOKENS, tenant="acme", model="-", kind="completion") == \
                3 * completion, api
            assert m.value(TOKENS, tenant="acme", model="-", kind="estimated") in (0, None), api
            assert stub.stats()["requests"] == 3, (api, stub.stats())


def test_a_client_gone_after_the_first_event_is_charged_its_estimate_on_every_api():
    """The same budget, each client leaving after the first event: nothing
    reported, the prompt estimated from the request's text (1,000 tokens),
    the completion from what was relayed before it left."""
    for api in ("responses", "messages"):
        path, body = API_BODIES[api]
        log = h.tmpfile("access", ".log")
        with Stub() as stub, Gateway(stub=stub, access_log=log,
                                     admin_listen="%s:%d" % (h.HOST, h.free_port()),
                                     tenants={"acme": {"tokens_per_minute": 3000}}) as gw:
            got = []
            for i in range(8):
                hd = dict(h.bearer(ACME_KEY), **{"Content-Type": "application/json",
                                                 "X-Stub-Events": "50",
                                                 "X-Stub-Interval-Ms": "200"})
                c = h.Client(gw.port)
                c.send("POST", path, hd, json.dumps(body).encode())
                r = c.read_response(timeout=10)
                got.append(r.status)
                if r.status == 200:
                    assert len(r.read_events(1, timeout=10)) == 1
                    c.close()
                    # Charged when the exchange ends, before the next admission.
                    h.wait_access_lines(log, i + 1)
                else:
                    r.read_all(timeout=10)
                    c.close()
            assert got == [200] * 3 + [429] * 5, (api, got)
            lines = h.wait_access_lines(log, 8)
            served = [ln for ln in lines if ln["status"] == 200]
            assert [(ln["end"], ln["usage"], ln["prompt_tokens"], ln["api"]) for ln in served] \
                == [("client_gone", "estimated", 1000, api)] * 3, served
            total = sum(ln["prompt_tokens"] + ln["completion_tokens"] for ln in served)
            m = h.wait_metric(gw, TOKENS, total, tenant="acme", model="-", kind="estimated")
            assert m.value(TOKENS, tenant="acme", model="-", kind="prompt") in (0, None), api
            assert total < 3000 + 3 * 10, (api, total)   # a token or two relayed each


# ---------------------------------------------------------------- time to first token

TTFT = "sluice_time_to_first_token_seconds"
TPOT = "sluice_time_per_output_token_seconds"


def _resp_ev(t, **kw):
    d = {"type": t}
    d.update(kw)
    return ("event: %s\ndata: %s\n\n" % (t, json.dumps(d))).encode()


TIMED = {
    "/v1/responses": [
        (0, _resp_ev("response.created", sequence_number=0,
                     response={"id": "resp_1", "model": "m", "status": "in_progress"})),
        (0, _resp_ev("response.in_progress", sequence_number=1, response={"id": "resp_1"})),
        (0.3, _resp_ev("response.output_text.delta", sequence_number=2, delta="a")),
        (0.2, _resp_ev("response.output_text.delta", sequence_number=3, delta="b")),
        (0.2, _resp_ev("response.output_text.delta", sequence_number=4, delta="c")),
        (0, _resp_ev("response.completed", sequence_number=5, response={
            "id": "resp_1", "model": "m", "usage": {"input_tokens": 4, "output_tokens": 3,
                                                    "total_tokens": 7}}))],
    "/v1/messages": [
        (0, _resp_ev("message_start", message={"id": "msg_1", "model": "m",
                                               "usage": {"input_tokens": 4,
                                                         "output_tokens": 1}})),
        (0, _resp_ev("content_block_start", index=0,
                     content_block={"type": "text", "text": ""})),
        (0.3, _resp_ev("content_block_delta", index=0, delta={"type": "text_delta",
                                                                "text": "a"})),
        (0.2, _resp_ev("content_block_delta", index=0, delta={"type": "text_delta",
                                                                "text": "b"})),
        (0.2, _resp_ev("content_block_delta", index=0, delta={"type": "text_delta",
                                                                "text": "c"})),
        (0, _resp_ev("content_block_stop", index=0)),
        (0, _resp_ev("message_delta", delta={"stop_reason": "end_turn"},
                     usage={"output_tokens": 3})),
        (0, _resp_ev("message_stop"))],
}

TIMED_CONFIG = """\
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


def _timed_runner(sock, req):
    path = req.split(b" ")[1].decode()
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Connection: close\r\n\r\n")
    for gap, ev in TIMED[path]:
        time.sleep(gap)
        sock.sendall(ev)


def test_time_to_first_token_of_responses_and_messages_is_their_first_text_delta():
    # The stream's first events come at once, its first text 300 ms later,
    # then two more 200 ms apart: TTFT >= 0.3 s, TPOT >= 0.2 s, per API.
    for path in TIMED:
        with h.RawUpstream(_timed_runner) as up, Gateway(TIMED_CONFIG.format(
                port=h.free_port(), admin=h.free_port(), raw=up.url)) as gw:
            with gw.client() as c:
                r = c.request("POST", path, dict(h.bearer("sk-acme"), **{
                    "Content-Type": "application/json"}), b'{"model":"m","stream":true}')
            assert r.status == 200 and bytes(r.data) == b"".join(e for _, e in TIMED[path])
            m = h.wait_metric(gw, TTFT + "_count", 1, model="m")
            assert m.value(TTFT + "_bucket", model="m", le="0.25") == 0, path
            assert m.value(TTFT + "_bucket", model="m", le="1") == 1, path
            assert m.value(TPOT + "_count", model="m") == 1, path
            assert m.value(TPOT + "_bucket", model="m", le="0.15") == 0, path
            assert m.value(TPOT + "_sum", model="m") >= 0.19, path
            assert m.value(TOKENS, tenant="acme", model="m", kind="completion") == 3, path


# ---------------------------------------------------------------- the alias set back

ALIAS_CONFIG = """\
listen: "127.0.0.1:{port}"
workers: 1
upstreams:
  main:
    url: "{stub}"
models:
  llama:
    aliases: ["gpt-5"]
    targets: [{{upstream: main, model: "meta-llama/Llama-3.1-8B-Instruct"}}]
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 10
    models: [llama]
"""


def _events(data):
    """(event name, data JSON) of each event of an SSE body."""
    out = []
    for block in bytes(data).decode().split("\n\n"):
        if not block.strip():
            continue
        name, payload = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                payload = json.loads(line[6:])
        out.append((name, payload))
    return out


def test_the_alias_is_set_back_in_every_responses_and_messages_event_and_body():
    internal = b"meta-llama/Llama-3.1-8B-Instruct"
    with Stub() as stub, Gateway(ALIAS_CONFIG.format(port=h.free_port(),
                                                     stub=stub.url)) as gw:
        hd = {"Content-Type": "application/json", "X-Api-Key": "sk-acme",
              "X-Stub-Events": "4", "X-Stub-Interval-Ms": "0"}
        for path, body in (("/v1/responses", {"model": "gpt-5", "input": "hi"}),
                           ("/v1/messages", {"model": "gpt-5", "max_tokens": 8,
                                             "messages": [{"role": "user", "content": "hi"}]})):
            for stream in (True, False):
                body["stream"] = stream
                with h.Client(gw.port) as c:
                    r = c.request("POST", path, hd, json.dumps(body).encode(), timeout=30)
                assert r.status == 200, (path, r.status, bytes(r.data)[:200])
                assert internal not in bytes(r.data), (path, stream, bytes(r.data)[:400])
                if not stream:
                    assert r.json()["model"] == "gpt-5", (path, r.json())
                    continue
                evs = _events(r.data)
                named = [(n, d.get("response", d.get("message", {})).get("model"))
                         for n, d in evs if isinstance(d.get("response", d.get("message")),
                                                       dict)]
                if path == "/v1/responses":
                    assert named == [("response.created", "gpt-5"),
                                     ("response.in_progress", "gpt-5"),
                                     ("response.completed", "gpt-5")], named
                else:
                    assert named == [("message_start", "gpt-5")], named
        # The runner was sent its own name every time.
        last = stub.direct("GET", "/stub/last")
        last.read_all(timeout=10)
        assert json.loads(bytes(last.data))["model"] == internal.decode()

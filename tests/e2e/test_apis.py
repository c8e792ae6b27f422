# SPDX-License-Identifier: BSD-2-Clause
"""Every API the runners serve is governed, not only chat (issue 34): the
Responses API, the Anthropic Messages API and embeddings. This file holds
what sluice says itself on them: its errors in the client's protocol."""

import json
import threading

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
            assert r.status in (200, 404), (target, r.status)
            want.append((target.split("?")[0] if "%" not in target else target, api))
        # Refused before admission, the API is still the path's.
        r = _req(gw, "POST", "/v1/messages", body=MSG, key=None)
        assert r.status == 401
        want.append(("/v1/messages", "messages"))
        lines = h.wait_access_lines(path, len(want))
        assert [(ln["path"], ln["api"]) for ln in lines] == want, lines

# SPDX-License-Identifier: BSD-2-Clause
"""Relaying requests and SSE streams through the gateway, byte for byte."""

import json

import harness as h
from harness import ACME_KEY, UPSTREAM_KEY, Gateway, Stub, bearer, expected_events


def _stream(c, key=ACME_KEY, **kw):
    hd = dict(bearer(key))
    hd["Content-Type"] = "application/json"
    hd.update(h.stub_headers(**kw))
    c.send("POST", "/v1/chat/completions", hd, h.stream_body())
    return c.read_response()


def _echo(gw, method="POST", path="/v1/echo", headers=None, body=b"", key=ACME_KEY):
    r = gw.request(method, path, headers=headers, body=body, key=key)
    assert r.status == 200, "echo status %d: %r" % (r.status, bytes(r.data[:300]))
    assert r.complete, "echo response cut"
    return r.json()


def _hdrs(echo):
    return [(k.lower(), v) for k, v in echo["headers"]]


@h.timeout(90)
def test_long_stream_relayed_byte_exact():
    with Stub() as stub, Gateway(stub=stub) as gw:
        c = gw.client(timeout=30)
        r = _stream(c, events=2000, size=512, interval=0)
        assert r.status == 200, r.status
        body = r.read_all(timeout=60)
        assert r.complete, "stream cut after %d bytes" % len(body)
        want = expected_events(2000, 512)
        assert len(body) == len(want), "got %d bytes, want %d" % (len(body), len(want))
        assert body == want, "stream differs from the stub's at byte %d" % next(
            i for i in range(len(want)) if body[i] != want[i])
        st = stub.stats()
        assert st["streams_completed"] == 1, st


def test_paced_stream_is_not_buffered():
    # 5 events, 300 ms apart: each must reach the client as it is produced.
    with Stub() as stub, Gateway(stub=stub) as gw:
        c = gw.client()
        r = _stream(c, events=5, interval=300)
        assert r.status == 200, r.status
        body = r.read_all(timeout=20)
        assert r.complete and body == expected_events(5), body[:200]
        times = [t for t, _ in r.events]
        assert len(times) == 6, "%d events" % len(times)
        first = times[0] - r.t_head
        assert first < 0.25, "first event %.3fs after the head (buffered?)" % first
        for i in range(1, 5):
            gap = times[i] - times[i - 1]
            assert gap > 0.15, "event %d arrived %.3fs after event %d: held back" % (
                i, gap, i - 1)
        spread = times[4] - times[0]
        assert spread > 0.9, "events 0..4 arrived within %.3fs: batched" % spread


def test_stream_response_headers():
    with Stub() as stub, Gateway(stub=stub) as gw:
        c = gw.client()
        r = _stream(c, events=3, interval=0)
        r.read_all()
        assert r.status == 200
        assert r.version == "1.1", r.version
        assert r.header("x-accel-buffering") == "no", r.headers
        assert (r.header("content-type") or "").startswith("text/event-stream"), r.headers
        assert "no-cache" in (r.header("cache-control") or ""), r.headers
        assert r.chunked, "stream not sent chunked: %r" % r.headers
        assert r.header("content-length") is None, r.headers
        assert r.complete and bytes(r.data) == expected_events(3)


def test_json_response_relayed():
    with Stub() as stub, Gateway(stub=stub) as gw:
        hd = {"Content-Type": "application/json", "X-Stub-Events": "4"}
        body = h.stream_body(stream=False)
        direct = stub.direct("POST", "/v1/chat/completions", hd, body)
        r = gw.request("POST", "/v1/chat/completions", hd, body)
        assert r.status == 200 and r.complete, (r.status, r.complete)
        assert (r.header("content-type") or "").startswith("application/json"), r.headers
        assert r.header("x-accel-buffering") == "no", r.headers
        assert r.chunked, "relayed response not chunked: %r" % r.headers
        doc = r.json()
        assert doc["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 ", doc
        assert json.loads(bytes(direct.data)) == doc, (bytes(direct.data), doc)


def test_method_path_query_and_body_relayed():
    with Stub() as stub, Gateway(stub=stub) as gw:
        payload = b'{"prompt": "caf\xc3\xa9 \\" & <>", "n": 1}'
        e = _echo(gw, "POST", "/v1/echo?a=1&b=two%20words&c=", body=payload,
                  headers={"Content-Type": "application/json"})
        assert e["method"] == "POST", e
        assert e["path"] == "/v1/echo", e
        assert e["query"] == "a=1&b=two%20words&c=", e
        assert e["body"] == payload.decode(), e
        e = _echo(gw, "GET", "/v1/echo?model=x")
        assert e["method"] == "GET" and e["path"] == "/v1/echo", e
        assert e["query"] == "model=x", e
        assert e["body"] == "", e
        e = _echo(gw, "GET", "/v1/echo")
        assert e["query"] == "", e


def test_large_request_body_relayed():
    with Stub() as stub, Gateway(stub=stub) as gw:
        payload = bytes((ord("a") + i % 26) for i in range(1 << 20))
        e = _echo(gw, "POST", "/v1/echo", body=payload)
        assert len(e["body"]) == len(payload), len(e["body"])
        assert e["body"] == payload.decode()


def test_chunked_request_body_relayed():
    with Stub() as stub, Gateway(stub=stub) as gw:
        c = gw.client()
        head = ("POST /v1/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                "Transfer-Encoding: chunked\r\n\r\n" % ACME_KEY).encode()
        c.send_raw(head + b"5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\n\r\n")
        r = c.read_response()
        r.read_all()
        assert r.status == 200 and r.complete, (r.status, bytes(r.data[:200]))
        e = r.json()
        assert e["body"] == "hello world", e


def test_authorization_replaced_by_upstream_api_key():
    with Stub() as stub, Gateway(stub=stub) as gw:
        e = _echo(gw, "POST", "/v1/echo", body=b"{}")
        auth = [v for k, v in _hdrs(e) if k == "authorization"]
        assert auth == ["Bearer %s" % UPSTREAM_KEY], auth
        assert ACME_KEY not in json.dumps(e), "client key reached the upstream: %r" % e


def test_authorization_removed_without_api_key():
    with Stub() as stub, Gateway(stub=stub, upstreams={"main": {"api_key": None}}) as gw:
        assert "api_key" not in gw.config["upstreams"]["main"]
        e = _echo(gw, "POST", "/v1/echo", body=b"{}")
        assert [v for k, v in _hdrs(e) if k == "authorization"] == [], e["headers"]
        assert ACME_KEY not in json.dumps(e), "client key reached the upstream: %r" % e


def test_hop_by_hop_headers_not_forwarded_custom_headers_are():
    with Stub() as stub, Gateway(stub=stub) as gw:
        hd = [("Connection", "keep-alive, TE"), ("Keep-Alive", "timeout=5"),
              ("TE", "trailers"), ("Proxy-Connection", "keep-alive"),
              ("Proxy-Authorization", "Basic dXNlcjpwYXNz"),
              ("X-Custom-One", "hello world"), ("X-Request-Id", "req-42"),
              ("OpenAI-Organization", "org-1")]
        e = _echo(gw, "POST", "/v1/echo", headers=hd, body=b"{}")
        got = _hdrs(e)
        names = [k for k, _ in got]
        for hop in ("keep-alive", "te", "proxy-connection", "proxy-authorization"):
            assert hop not in names, "hop-by-hop %s forwarded: %r" % (hop, got)
        for k, v in got:
            if k == "connection":
                assert "te" not in [t.strip().lower() for t in v.split(",")], got
        assert ("x-custom-one", "hello world") in got, got
        assert ("x-request-id", "req-42") in got, got
        assert ("openai-organization", "org-1") in got, got


def test_headers_named_in_connection_not_forwarded():
    with Stub() as stub, Gateway(stub=stub) as gw:
        hd = [("Connection", "keep-alive, X-Hop-Only"), ("X-Hop-Only", "secret"),
              ("X-End-To-End", "kept")]
        e = _echo(gw, "POST", "/v1/echo", headers=hd, body=b"{}")
        got = _hdrs(e)
        assert "x-hop-only" not in [k for k, _ in got], got
        assert ("x-end-to-end", "kept") in got, got


def test_one_workers_reused_easy_handle_sends_each_request_as_its_own():
    # One worker, requests one after another: every one runs on the same
    # reused (not reset) libcurl handle. Each must reach the upstream with
    # its own method, body and headers, nothing of the one before: the
    # fixed header tail in its four forms (with and without the client's
    # Content-Type and Accept), empty headers, X-Forwarded-For lists.
    with Stub() as stub, Gateway(stub=stub, workers=1) as gw:
        seq = [
            ("POST", {"Content-Type": "application/json", "Accept": "text/event-stream"},
             b'{"a":1}'),
            ("POST", {}, b'{"b":2}'),
            ("GET", {"Accept": "application/json"}, b""),
            ("PUT", {"Content-Type": "text/plain", "X-Empty": ""}, b"put"),
            ("GET", {"X-Forwarded-For": "10.0.0.1"}, b""),
            ("DELETE", {}, b""),
            ("POST", {"Content-Type": "application/json"}, b'{"c":3}'),
        ]
        for rnd in range(2):
            for i, (method, hd, body) in enumerate(seq):
                e = _echo(gw, method, "/v1/echo?i=%d" % i, headers=hd, body=body)
                where = (rnd, i, method)
                assert e["method"] == method, (where, e)
                assert e["query"] == "i=%d" % i, (where, e)
                assert e["body"] == body.decode(), (where, e)
                got = _hdrs(e)
                names = [k for k, _ in got]
                assert [v for k, v in got if k == "authorization"] == \
                    ["Bearer %s" % UPSTREAM_KEY], (where, got)
                for name in ("content-type", "accept"):
                    want = [v for k, v in hd.items() if k.lower() == name]
                    assert [v for k, v in got if k == name] == want, (where, name, got)
                assert "expect" not in names, (where, got)
                if "X-Empty" in hd:
                    assert ("x-empty", "") in got, (where, got)
                else:
                    assert "x-empty" not in names, (where, got)
                xff = [v for k, v in got if k == "x-forwarded-for"]
                assert len(xff) == 1, (where, got)
                if "X-Forwarded-For" in hd:
                    assert xff[0].startswith("10.0.0.1, "), (where, got)
                else:
                    assert "," not in xff[0], (where, got)


def test_keepalive_serves_several_requests_on_one_connection():
    with Stub() as stub, Gateway(stub=stub) as gw:
        c = gw.client()
        for i in range(3):
            r = _stream(c, events=5 + i, size=100 * i, interval=0)
            body = r.read_all()
            assert r.status == 200 and r.complete, (i, r.status, r.complete)
            assert body == expected_events(5 + i, 100 * i), "stream %d differs" % i
            assert (r.header("connection") or "").lower() != "close", r.headers
            c.send("POST", "/v1/chat/completions",
                   dict(bearer(ACME_KEY), **{"X-Stub-Events": "3"}),
                   h.stream_body(stream=False))
            r = c.read_response()
            r.read_all()
            assert r.status == 200 and r.complete, (i, r.status)
            assert r.json()["choices"][0]["message"]["content"] == "tok0 tok1 tok2 "
            c.send("GET", "/v1/echo?i=%d" % i, bearer(ACME_KEY))
            r = c.read_response()
            r.read_all()
            assert r.status == 200 and r.complete, (i, r.status)
            assert r.json()["query"] == "i=%d" % i
        assert not c.eof, "gateway closed the keep-alive connection"
        assert stub.stats()["requests"] == 9, stub.stats()


def _sequential_streams(c, n):
    """n short streams one after another on client connection c."""
    for i in range(n):
        r = _stream(c, events=3, interval=0)
        r.read_all()
        assert r.status == 200 and r.complete


def test_upstream_connections_are_reused():
    with Stub() as stub, Gateway(stub=stub, workers=1) as gw:
        before = stub.stats()["connections_total"]
        c = gw.client()
        _sequential_streams(c, 6)
        st = stub.stats()
        assert st["requests"] == 6, st
        opened = st["connections_total"] - before - 1   # minus this stats call
        assert opened == 1, "6 sequential requests opened %d upstream connections" % opened


@h.timeout(90)
def test_burst_spills_over_then_idle_upstream_connections_are_closed():
    # 100 streams at once on one worker, then 2 sequential ones: the burst
    # opens ~100 upstream connections; once it is over, they are reused, and
    # after the idle period those beyond the first shard's cache (64) close.
    with Stub() as stub, Gateway(stub=stub, workers=1) as gw:
        streams = [gw.open_stream(events=20, size=10, interval=50, timeout=30)
                   for _ in range(100)]
        for c, r in streams:
            assert r.status == 200
        for c, r in streams:
            r.read_all(timeout=30)
            assert r.complete
            c.close()
        st = stub.stats()
        assert st["requests"] == 100, st
        peak = st["connections_open"] - 1          # minus this stats call
        assert peak >= 90, "100 concurrent streams used %d upstream connections" % peak
        total = st["connections_total"]
        c = gw.client()
        _sequential_streams(c, 2)
        st = stub.stats()
        opened = st["connections_total"] - total - 1
        assert opened == 0, "after the burst, 2 requests opened %d connections" % opened

        def settled():
            return stub.stats()["connections_open"] - 1 <= 64
        h.wait_until(settled, 25, msg="idle upstream connections beyond 64 closed")
        _sequential_streams(c, 1)


def test_upstream_error_status_relayed():
    with Stub() as stub, Gateway(stub=stub) as gw:
        for code in (503, 422, 400):
            hd = {"Content-Type": "application/json", "X-Stub-Status": str(code)}
            direct = stub.direct("POST", "/v1/chat/completions", hd, h.stream_body())
            assert direct.status == code, direct.status
            r = gw.request("POST", "/v1/chat/completions", hd, h.stream_body())
            assert r.status == code, "want %d, got %d" % (code, r.status)
            assert r.complete
            assert bytes(r.data) == bytes(direct.data), (bytes(r.data), bytes(direct.data))
            assert r.header("content-type") == direct.header("content-type")

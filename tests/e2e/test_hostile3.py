# SPDX-License-Identifier: BSD-2-Clause
"""Third black-box pass: request trailers, upstream heads that lie about
their framing, hop-by-hop headers named by the upstream, and upstream URLs
that no connection can use. Each test failed on 8a007f1 and pins the exact
outcome: the status and JSON error, what reaches the other side, and that
no slot is left behind."""

import json
import os
import socket
import time

import harness as h
from harness import ACME_KEY, Gateway, RawUpstream, assert_error

AUTH = b"Authorization: Bearer " + ACME_KEY.encode() + b"\r\n"


def _head_lines(raw):
    return raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]


def _answer(data):
    """A RawUpstream handler that sends `data` and closes."""
    def handler(sock, req):
        sock.sendall(data)
        time.sleep(0.2)
    return handler


def _slots_back(gw):
    h.wait_until(lambda: gw.running() and h.scrape(gw).value(
        "sluice_tenant_streams", tenant="acme") == 0, timeout=5,
        msg="acme's slots back to 0")


# ---------------------------------------------------------------- trailers

@h.timeout(30)
def test_chunked_request_trailers_are_dropped_never_forwarded_as_headers():
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    with RawUpstream(_answer(ok)) as up, \
            Gateway(upstream_url=up.url, workers=1) as gw:
        with h.Client(gw.port) as c:
            c.send_raw(b"POST /v1/trailers HTTP/1.1\r\nHost: x\r\n" + AUTH +
                       b"Transfer-Encoding: chunked\r\n\r\n"
                       b"5;ext=1\r\nhello\r\n3\r\nabc\r\n0\r\n"
                       b"X-Trailer: t\r\nAccept-Encoding: gzip\r\n"
                       b"X-Forwarded-For: 6.6.6.6\r\n\r\n")
            r = c.read_response(timeout=10)
            r.read_all(timeout=10)
        assert r.status == 200, (r.status, bytes(r.data[:200]))
        assert len(up.requests) == 1, len(up.requests)
        raw = up.requests[0]
        lines = _head_lines(raw)
        assert raw.split(b"\r\n\r\n", 1)[1] == b"helloabc", raw
        names = [ln.split(":", 1)[0].lower() for ln in lines]
        assert "x-trailer" not in names, lines
        assert "accept-encoding" not in names, lines
        xff = [ln for ln in lines if ln.lower().startswith("x-forwarded-for:")]
        assert xff == ["X-Forwarded-For: 127.0.0.1"], lines


def _chunked_body_refused(body, status, code, message, te=b"Transfer-Encoding: chunked\r\n"):
    """A chunked POST (`te`: its Transfer-Encoding lines) with `body` is
    refused with status, code and message, the connection closed, no
    upstream contacted, no slot left."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    with RawUpstream(_answer(ok)) as up, \
            Gateway(upstream_url=up.url, workers=1,
                    admin_listen="%s:%d" % (h.HOST, h.free_port())) as gw:
        with h.Client(gw.port) as c:
            c.send_raw(b"POST /v1/chunked HTTP/1.1\r\nHost: x\r\n" + AUTH +
                       te + b"\r\n" + body)
            r = c.read_response(timeout=10)
            doc = assert_error(r, status, code)
            assert doc["error"]["message"] == message, doc
            assert r.header("connection") == "close", r.headers
        assert up.requests == [], up.requests
        _slots_back(gw)


@h.timeout(30)
def test_endless_chunk_extension_is_400_about_the_chunk_not_431():
    # http-parser counts a chunk-size line against its header limit and
    # reported "header overflow": a malformed body got 431 headers_too_large.
    _chunked_body_refused(b"1;" + b"a" * 200000 + b"\r\nx\r\n0\r\n\r\n",
                          400, "bad_request", "chunk extension too long")


@h.timeout(30)
def test_endless_request_trailer_is_431():
    _chunked_body_refused(b"1\r\nx\r\n0\r\nX-T: " + b"b" * 200000 + b"\r\n\r\n",
                          431, "headers_too_large", "request trailer too large")


# ---------------------------------------------------------------- upstream framing

def _bad_head_is_502(head):
    with RawUpstream(_answer(head)) as up, \
            Gateway(upstream_url=up.url, workers=1,
                    admin_listen="%s:%d" % (h.HOST, h.free_port())) as gw:
        r = gw.request("POST", "/v1/chat/completions",
                       {"Content-Type": "application/json"}, h.stream_body())
        assert_error(r, 502, "upstream_unreachable")
        m = h.scrape(gw)
        assert m.value("sluice_upstream_errors_total", upstream="main",
                       kind="bad_response") == 1, m.series("sluice_upstream_errors_total")
        _slots_back(gw)


@h.timeout(30)
def test_upstream_with_conflicting_content_lengths_is_502_bad_response():
    # RFC 9112 6.3: a proxy must not guess which length frames the body.
    _bad_head_is_502(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 3\r\nContent-Length: 5\r\n\r\nabcde")


@h.timeout(30)
def test_upstream_with_overflowing_content_length_is_502_not_a_finished_body():
    # libcurl reads an overflowing length as "until close": a body cut short
    # would reach the client as a whole one, terminating chunk included.
    _bad_head_is_502(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 99999999999999999999999\r\n\r\nabc")


@h.timeout(30)
def test_upstream_with_non_numeric_content_length_is_502():
    _bad_head_is_502(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 3x\r\n\r\nabc")


@h.timeout(30)
def test_upstream_with_a_transfer_coding_other_than_chunked_is_502():
    # Nothing but chunked can be re-framed for the client: a 200 followed
    # by a cut is worse than a clear 502.
    _bad_head_is_502(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")


@h.timeout(30)
def test_upstream_naming_chunked_twice_is_502():
    # RFC 9112 6.1: chunked is applied once at most. A body chunked twice
    # loses one layer in libcurl; the inner framing must not reach the
    # client as content.
    _bad_head_is_502(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"8\r\n3\r\nabc\r\n\r\n0\r\n\r\n")


@h.timeout(30)
def test_request_naming_chunked_twice_is_400_and_reaches_no_upstream():
    # Two Transfer-Encoding lines: a body chunked twice (de-chunked once,
    # framing forwarded as content) or a smuggling probe. Refused before
    # admission; the connection is closed, the slot never taken.
    _chunked_body_refused(b"8\r\n3\r\nabc\r\n\r\n0\r\n\r\n", 400, "bad_request",
                          "chunked transfer coding named twice",
                          te=b"Transfer-Encoding: chunked\r\n" * 2)


@h.timeout(30)
def test_upstream_with_equal_repeated_content_lengths_is_relayed():
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}")
    with RawUpstream(_answer(head)) as up, \
            Gateway(upstream_url=up.url, workers=1) as gw:
        r = gw.request("GET", "/v1/same")
        r.read_all(timeout=10)
        assert r.status == 200, (r.status, bytes(r.data[:200]))
        assert bytes(r.data) == b"{}", bytes(r.data)


@h.timeout(30)
def test_upstream_headers_named_in_connection_are_not_relayed():
    head = (b"HTTP/1.1 200 OK\r\nX-Secret: s\r\nConnection: close, X-Secret\r\n"
            b"X-Kept: k\r\nConnection: x-other\r\nX-Other: o\r\n"
            b"Content-Length: 2\r\n\r\nok")
    with RawUpstream(_answer(head)) as up, \
            Gateway(upstream_url=up.url, workers=1) as gw:
        r = gw.request("GET", "/v1/hop")
        r.read_all(timeout=10)
        assert r.status == 200, (r.status, bytes(r.data[:200]))
        assert bytes(r.data) == b"ok", bytes(r.data)
        names = [n.lower() for n, _ in r.headers]
        assert "x-secret" not in names, r.headers
        assert "x-other" not in names, r.headers
        assert r.header("x-kept") == "k", r.headers


# ---------------------------------------------------------------- config

_URL_CONFIG = """\
listen: "127.0.0.1:{port}"
upstreams:
  main:
    url: "{url}"
tenants:
  a:
    keys: ["k"]
    max_streams: 1
    upstream: main
"""


@h.timeout(30)
def test_check_refuses_an_upstream_url_with_a_bad_port_at_its_line_and_column():
    for url in ("http://127.0.0.1:99999", "http://127.0.0.1:0", "http://127.0.0.1:80x",
                "http://127.0.0.1:", "http://[::1", "http://[::1]x", "https://h:-1"):
        path = h.write_config(_URL_CONFIG.format(port=h.free_port(), url=url))
        rc, out, err = h.run_sluice(["-t", "-c", path])
        assert rc == 1, (url, rc, out, err)
        want = "%s:4:10: upstreams.main.url: '%s' " % (path, url)
        assert err.startswith(want), (url, err)
    for url in ("http://127.0.0.1:65535", "http://[::1]:8000", "http://[::1]",
                "http://runner.local", "http://127.0.0.1:1/base/"):
        path = h.write_config(_URL_CONFIG.format(port=h.free_port(), url=url))
        rc, out, err = h.run_sluice(["-t", "-c", path])
        assert rc == 0, (url, rc, out, err)


# ---------------------------------------------------------------- timeouts

@h.timeout(30)
def test_upstream_trickling_its_head_is_504_after_upstream_first_byte():
    # sluice.yaml(5): upstream_first_byte runs "from starting the upstream
    # request to the upstream's response head"; a head line must not restart it.
    def trickle(sock, req):
        sock.sendall(b"HTTP/1.1 200 OK\r\n")
        for i in range(10):
            time.sleep(0.3)
            sock.sendall(b"X-Line-%d: v\r\n" % i)
        sock.sendall(b"Content-Length: 2\r\n\r\nok")
        time.sleep(0.2)
    with RawUpstream(trickle) as up, \
            Gateway(upstream_url=up.url, workers=1,
                    admin_listen="%s:%d" % (h.HOST, h.free_port()),
                    timeouts={"upstream_first_byte": "1s"}) as gw:
        t0 = time.monotonic()
        r = gw.request("POST", "/v1/chat/completions",
                       {"Content-Type": "application/json"}, h.stream_body())
        took = time.monotonic() - t0
        # The whole head comes at 3 s: a 504 means it was not waited for.
        assert_error(r, 504, "upstream_timeout")
        assert took > 0.9, took
        m = h.scrape(gw)
        assert m.value("sluice_upstream_errors_total", upstream="main",
                       kind="timeout") == 1, m.series("sluice_upstream_errors_total")
        _slots_back(gw)


_LISTEN_CONFIG = """\
listen: "{listen}"
upstreams:
  main:
    url: "http://127.0.0.1:9"
tenants:
  a:
    keys: ["k"]
    max_streams: 1
"""


@h.timeout(30)
def test_check_refuses_a_listen_address_that_is_not_an_ip_at_its_line_and_column():
    # Each passed -t, then start failed ("Name or service not known") with
    # no FILE:LINE:COL.
    for listen in ("999.1.1.1:8080", "127.0.0.1.1:8080", "[::g]:8080", "[1.2.3.4]:8080"):
        path = h.write_config(_LISTEN_CONFIG.format(listen=listen))
        rc, out, err = h.run_sluice(["-t", "-c", path])
        assert rc == 1, (listen, rc, out, err)
        assert err.startswith("%s:1:9: listen: '%s' is not host:port or [v6]:port"
                              % (path, listen)), (listen, err)
    for listen in ("127.0.0.1:8080", "0.0.0.0:1", "[::1]:8080", "[::]:80", "localhost:8080",
                   "127.1:8080", "0:8080"):
        path = h.write_config(_LISTEN_CONFIG.format(listen=listen))
        rc, out, err = h.run_sluice(["-t", "-c", path])
        assert rc == 0, (listen, rc, out, err)


# ---------------------------------------------------------------- HEAD

@h.timeout(30)
def test_head_refused_by_sluice_gets_no_body_and_the_next_response_is_intact():
    # RFC 9110 9.3.2: no content in a HEAD response. sluice's own error
    # bodies (404, 401, 429, ...) went out after a HEAD too, and a client
    # reusing the connection read them as the start of its next response.
    with h.Stub() as stub, Gateway(stub=stub, workers=1,
                                   tenants={"acme": {"max_streams": 1}}) as gw:
        held = gw.hold_hung(stub, "head", 1)
        for head, status in ((b"HEAD /nope HTTP/1.1\r\nHost: x\r\n" + AUTH, 404),
                             (b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n"
                              b"Authorization: Bearer wrong\r\n", 401),
                             (b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH, 429)):
            with h.Client(gw.port) as c:
                c.send_raw(head + b"\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n"
                           b"Authorization: Bearer " + h.BETA_KEY.encode() + b"\r\n\r\n")
                r = c.read_response(timeout=5)
                assert r.status == status, (status, r.status)
                assert r.header("content-type") == "application/json", r.headers
                r2 = c.read_response(timeout=5)
                r2.read_all(timeout=5)
                assert r2.status == 200, (status, r2.status, bytes(r2.data[:200]))
                assert json.loads(bytes(r2.data))["object"] == "list", bytes(r2.data[:200])
        for c in held:
            c.close()


# ---------------------------------------------------------------- admin

@h.timeout(30)
def test_admin_405_names_the_allowed_methods():
    with Gateway(workers=1, admin_listen="%s:%d" % (h.HOST, h.free_port())) as gw:
        port = h.admin_port(gw)
        for path in ("/metrics", "/healthz"):
            r = h.admin_request(port, method="POST", path=path)
            assert r.status == 405, (path, r.status)
            assert r.headers.get("allow") == "GET, HEAD", (path, r.headers)
            # The body says what the header says (it said "only GET").
            assert r.body == b"only GET and HEAD\n", (path, r.body)
        r = h.admin_request(port, method="GET", path="/healthz")
        assert r.status == 200 and "allow" not in r.headers, r.headers


@h.timeout(60)
def test_check_takes_a_file_of_exactly_16_mib_and_refuses_one_byte_more():
    # sluice.yaml(5): "a file larger than 16 MiB" is an error; a file of
    # exactly 16 MiB was refused too (the read buffer doubled past the cap).
    base = _LISTEN_CONFIG.format(listen="127.0.0.1:%d" % h.free_port())
    pad = 16 * 1024 * 1024 - len(base)
    for size, rc_want in ((16 * 1024 * 1024, 0), (16 * 1024 * 1024 + 1, 1)):
        text = base + "#" + "c" * (pad - 2 + size - 16 * 1024 * 1024) + "\n"
        assert len(text) == size
        path = h.write_config(text)
        rc, out, err = h.run_sluice(["-t", "-c", path], timeout=30)
        assert rc == rc_want, (size, rc, out, err[:300])
        if rc_want == 1:
            assert err.startswith("%s:1:1: file too large" % path), err[:300]
        os.unlink(path)


# ---------------------------------------------------------------- TRACE

@h.timeout(30)
def test_trace_is_refused_405_and_never_reaches_the_upstream():
    # A runner that echoes TRACE (RFC 9110 9.3.8) would hand the client the
    # head sluice sends upstream, with the upstream's api_key substituted
    # for the tenant's key. nginx answers TRACE 405 itself; so does sluice,
    # and the connection stays usable.
    def echo(sock, req):
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: message/http\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(req), req))
        time.sleep(0.2)
    with RawUpstream(echo) as up, Gateway(upstream_url=up.url, workers=1) as gw:
        with h.Client(gw.port) as c:
            c.send_raw(b"TRACE /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
            r = c.read_response(timeout=5)
            assert_error(r, 405, "method_not_allowed")
            assert r.header("allow") == "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS", \
                r.headers
            assert h.UPSTREAM_KEY.encode() not in bytes(r.data)
            r = c.request("GET", "/v1/models", h.bearer(ACME_KEY))
            assert r.status == 200, r.status
        assert len(up.requests) == 1 and up.requests[0].startswith(b"GET "), up.requests
        assert h.UPSTREAM_KEY.encode() in up.requests[0]


@h.timeout(30)
def test_relayed_head_keeps_the_upstreams_content_length_and_the_connection():
    # RFC 9110 8.6: a HEAD response's Content-Length is the size a GET would
    # get. sluice dropped it (its bodies are re-framed). No body follows, and
    # the next request on the connection is answered intact.
    def handler(sock, req):
        if req.startswith(b"HEAD "):
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1234\r\n\r\n")
        else:
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 2\r\n\r\nok")
        time.sleep(0.2)
    with RawUpstream(handler) as up, \
            Gateway(upstream_url=up.url, workers=1,
                    admin_listen="%s:%d" % (h.HOST, h.free_port())) as gw:
        with h.Client(gw.port) as c:
            c.send_raw(b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n"
                       b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
            r = c.read_response(timeout=5)
            assert r.status == 200, r.status
            assert r.header("content-length") == "1234", r.headers
            assert r.header("transfer-encoding") is None, r.headers
            r2 = c.read_response(timeout=5)
            r2.read_all(timeout=5)
            assert r2.status == 200, (r2.status, bytes(r2.data[:200]))
            assert bytes(r2.data) == b"ok", bytes(r2.data)
        _slots_back(gw)

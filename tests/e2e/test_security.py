# SPDX-License-Identifier: BSD-2-Clause
"""Secrets stay secret: a client's API key never reaches an upstream, a log
or the admin listener; a tenant's key only ever reaches its own upstream;
keys match exactly; the operator is warned about a world-readable config."""

import os
import signal

import harness as h
from harness import (ACME_KEY, ACME_KEY2, BETA_KEY, UPSTREAM_KEY, Gateway, RawUpstream, Stub,
                     assert_error, expected_events)

CLIENT_KEYS = (ACME_KEY, ACME_KEY2, BETA_KEY)


def _echo(gw, key=ACME_KEY, method="GET", headers=None, path="/v1/echo", body=b""):
    hd = dict(h.bearer(key)) if key else {}
    hd.update(headers or {})
    with h.Client(gw.port) as c:
        r = c.request(method, path, hd, body)
    assert r.status == 200, (r.status, bytes(r.data[:200]))
    return r.json()


def _auth_values(echo):
    return [v for k, v in echo["headers"] if k.lower() == "authorization"]


def test_client_key_never_reaches_the_upstream_in_any_header():
    with Stub() as stub, Gateway(stub=stub) as gw:
        variants = [
            [("Authorization", "Bearer " + ACME_KEY)],
            [("authorization", "Bearer " + ACME_KEY)],
            [("AUTHORIZATION", "bearer   " + ACME_KEY + "  ")],
            [("Authorization", "Bearer " + ACME_KEY), ("Proxy-Authorization", "Bearer " + BETA_KEY)],
            [("Authorization", "Bearer " + ACME_KEY), ("Connection", "X-Key"),
             ("X-Key", ACME_KEY2)],
        ]
        for hd in variants:
            for method in ("GET", "POST", "PUT", "DELETE"):
                with h.Client(gw.port) as c:
                    r = c.request(method, "/v1/echo", hd, b"{}" if method != "GET" else b"")
                assert r.status == 200, (hd, r.status)
                echo = r.json()
                flat = repr(echo["headers"])
                for k in CLIENT_KEYS:
                    assert k not in flat, "client key %r forwarded upstream: %s" % (k, flat)
                assert _auth_values(echo) == ["Bearer " + UPSTREAM_KEY], echo["headers"]
        # Two Authorization lines: refused (400), nothing reaches the upstream.
        served = stub.stats()["requests"]
        for method in ("GET", "POST"):
            with h.Client(gw.port) as c:
                r = c.request(method, "/v1/echo", [("Authorization", "Bearer " + ACME_KEY),
                                                   ("Authorization", "Bearer " + ACME_KEY2)],
                              b"{}" if method != "GET" else b"")
            assert_error(r, 400, "bad_request", read=False)
        assert stub.stats()["requests"] == served
    # Without an upstream api_key the client's Authorization is removed, and
    # the raw bytes the upstream receives hold no key at all.
    def answer(sock, req):
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
    with RawUpstream(answer) as up, Gateway(upstream_url=up.url,
                                            upstreams={"main": {"api_key": None}}) as gw:
        for key in CLIENT_KEYS:
            with h.Client(gw.port) as c:
                r = c.request("POST", "/v1/chat/completions",
                              dict(h.bearer(key), **{"Content-Type": "application/json"}),
                              h.stream_body())
            assert r.status == 200, r.status
        assert len(up.requests) == len(CLIENT_KEYS)
        for req in up.requests:
            assert b"authorization" not in req.lower(), req
            for k in CLIENT_KEYS + (UPSTREAM_KEY,):
                assert k.encode() not in req, "key %r reached the upstream: %r" % (k, req)


def _all_secrets():
    return CLIENT_KEYS + (UPSTREAM_KEY, "sk-dead-secret", "dead-upstream-secret",
                          "sk-acme-1x", "sk-unknown-secret")


@h.timeout(60)
def test_keys_never_logged_at_debug_nor_in_the_access_log():
    access = h.tmpfile("access", ".log")
    with Stub() as stub:
        dead = "http://127.0.0.1:%d" % h.closed_port()
        cfg = h.gateway_config(
            stub, log_level="debug", access_log=access,
            upstreams={"gone": {"url": dead, "api_key": "dead-upstream-secret"}},
            tenants={"acme": {"max_streams": 1},
                     "dead": {"keys": ["sk-dead-secret"], "max_streams": 5,
                              "upstream": "gone"}})
        with Gateway(cfg) as gw:
            # Served, streamed, echoed.
            c, r = gw.open_stream(events=3, interval=0)
            assert r.read_all() == expected_events(3)
            c.close()
            _echo(gw, key=BETA_KEY, method="POST", body=b'{"k":1}')
            # 401s: near miss, unknown, wrong scheme, key without scheme.
            for value in ("Bearer sk-acme-1x", "Bearer sk-unknown-secret",
                          "Basic " + ACME_KEY, ACME_KEY2):
                with h.Client(gw.port) as cl:
                    rr = cl.request("GET", "/v1/echo", {"Authorization": value})
                    assert_error(rr, 401, "invalid_api_key", read=False)
            # 429 while the only slot is held, then the holder leaves.
            held, hr = gw.open_stream(events=1000, interval=50)
            assert hr.status == 200
            c, r = gw.open_stream(key=ACME_KEY2, events=1)
            assert_error(r, 429, "concurrency_limit_exceeded")
            c.close()
            held.close()
            # 502 from a dead upstream, with its own api_key.
            r = gw.request("POST", "/v1/chat/completions", {}, h.stream_body(),
                           key="sk-dead-secret")
            assert_error(r, 502, "upstream_unreachable", read=False)
            # 400 and 431 whose heads carry keys.
            out, _ = h.exchange_raw(gw.port, b"GET /v1/echo HTTP/1.1\r\nAuthorization: Bearer " +
                                    ACME_KEY.encode() + b"\x00\r\n\r\n", timeout=3)
            assert out.startswith(b"HTTP/1.1 400 "), out[:100]
            out, _ = h.exchange_raw(gw.port, b"GET /v1/echo HTTP/1.1\r\nAuthorization: Bearer " +
                                    ACME_KEY.encode() + b"\r\nX-Big: " + b"k" * 40000 +
                                    b"\r\n\r\n", timeout=3)
            assert out.startswith(b"HTTP/1.1 431 "), out[:100]
            # A reload and a log reopen log too.
            h.reload(gw)
            os.kill(gw.pid, signal.SIGUSR1)
            h.wait_access_lines(access, 10, timeout=5)
            gw.stop()
        err = h.stderr_text(gw)
        with open(access, "rb") as f:
            log = f.read().decode("utf-8", "replace")
        assert " debug: " in err, "log_level debug logged no debug line"
        assert len(log.splitlines()) >= 10, log
        for secret in _all_secrets():
            assert secret not in err, "%r appears in stderr:\n%s" % (
                secret, [ln for ln in err.splitlines() if secret in ln][:3])
            assert secret not in log, "%r appears in the access log:\n%s" % (
                secret, [ln for ln in log.splitlines() if secret in ln][:3])


def test_query_string_never_logged_on_upstream_errors():
    # The access log drops the query ("it may carry secrets"); so must the
    # error log's line about a failed upstream request.
    access = h.tmpfile("access", ".log")
    dead = "http://127.0.0.1:%d" % h.closed_port()
    with Gateway(upstream_url=dead, access_log=access, log_level="debug") as gw:
        r = gw.request("GET", "/v1/models?api-key=query-secret-123&x=1")
        assert_error(r, 502, "upstream_unreachable", read=False)
        h.wait_access_lines(access, 1)
        gw.stop()
    err = h.stderr_text(gw)
    assert "query-secret-123" not in err, "query string logged: %s" % [
        ln for ln in err.splitlines() if "query-secret-123" in ln]
    with open(access) as f:
        assert "query-secret-123" not in f.read()


def test_config_readable_by_others_warns_at_start():
    with Stub() as stub:
        for mode, warns in ((0o644, True), (0o604, True), (0o600, False), (0o640, False)):
            gw = Gateway(stub=stub, workers=1)
            gw.config_mode = mode
            with gw:
                assert gw.request("GET", "/v1/echo").status == 200
                err = h.stderr_text(gw)
                lines = [ln for ln in err.splitlines() if "readable by others" in ln]
                if warns:
                    assert len(lines) == 1, "mode %o: expected one warning, stderr:\n%s" % (mode, err)
                    assert " warn: " in lines[0] and gw.path in lines[0], lines[0]
                else:
                    assert not lines, "mode %o warned: %r" % (mode, lines)


def test_tenant_key_reaches_only_its_own_upstream():
    with Stub(name="stub-a") as a, Stub(name="stub-b") as b:
        cfg = h.gateway_config(
            a, upstreams={"main": None,
                          "ua": {"url": a.url, "api_key": "ua-secret"},
                          "ub": {"url": b.url, "api_key": "ub-secret"}},
            tenants={"acme": {"upstream": "ua"}, "beta": {"upstream": "ub"}})
        with Gateway(cfg, workers=2) as gw:
            sent = {"a": 0, "b": 0}
            # Tenants alternate on one keep-alive connection and on fresh ones;
            # the workers' upstream connection caches must never mix them.
            with h.Client(gw.port) as c:
                for i in range(20):
                    key = ACME_KEY if i % 2 == 0 else BETA_KEY
                    r = c.request("GET", "/v1/echo?i=%d" % i, h.bearer(key))
                    assert r.status == 200
                    want = "Bearer ua-secret" if key == ACME_KEY else "Bearer ub-secret"
                    assert _auth_values(r.json()) == [want], (key, r.json()["headers"])
                    sent["a" if key == ACME_KEY else "b"] += 1
            for i in range(10):
                for key, tag in ((ACME_KEY2, "acme"), (BETA_KEY, "beta")):
                    c, r = gw.open_stream(key=key, events=3, interval=0, tag=tag)
                    assert r.status == 200 and r.read_all() == expected_events(3)
                    c.close()
                    sent["a" if tag == "acme" else "b"] += 1
            sa, sb = a.stats(), b.stats()
            assert sa["requests"] == sent["a"] and sb["requests"] == sent["b"], (sa, sb, sent)
            assert set(sa["tags"]) <= {"acme", "-"} and set(sb["tags"]) <= {"beta", "-"}, \
                (sa["tags"], sb["tags"])


def test_keys_are_compared_exactly():
    with Stub() as stub:
        cfg = h.gateway_config(
            stub, upstreams={"main": None,
                             "ua": {"url": stub.url, "api_key": "ua-secret"},
                             "ub": {"url": stub.url, "api_key": "ub-secret"}},
            tenants={"acme": None, "beta": None,
                     "short": {"keys": ["sk-same"], "max_streams": 10, "upstream": "ua"},
                     "long": {"keys": ["sk-same-longer"], "max_streams": 10, "upstream": "ub"}})
        with Gateway(cfg) as gw:
            assert _auth_values(_echo(gw, "sk-same")) == ["Bearer ua-secret"]
            assert _auth_values(_echo(gw, "sk-same-longer")) == ["Bearer ub-secret"]
            served = stub.stats()["requests"]
            for bad in ("sk-sam", "sk-same-", "sk-same-longe", "sk-same-longerr", "SK-SAME",
                        "sk-Same", "sk-samE", "xsk-same", "sk-same\u00e9", "sk-samesk-same",
                        "sk-same-longer-", "k-same", "same", "sk-same,sk-same"):
                with h.Client(gw.port) as c:
                    c.send_raw(("GET /v1/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"
                                "\r\n\r\n" % bad).encode("utf-8"))
                    r = c.read_response()
                    assert_error(r, 401, "invalid_api_key")
            assert stub.stats()["requests"] == served, "a near-miss key reached the upstream"


def test_admin_listener_is_only_where_the_config_says_and_exposes_no_keys():
    with Stub() as stub:
        with Gateway(stub=stub) as gw:
            pids = [gw.pid] + h.wait_workers_ready(gw, timeout=30)
            assert h.listening_addrs(pids) == {(h.HOST, gw.port)}, h.listening_addrs(pids)
            # /metrics and /healthz are not served on the client listener.
            for path in ("/metrics", "/healthz"):
                r = gw.request("GET", path)
                assert_error(r, 404, "not_found", read=False)
            assert stub.stats()["requests"] == 0
        aport = h.free_port()
        with Gateway(stub=stub, admin_listen="%s:%d" % (h.HOST, aport)) as gw:
            # A worker closes the admin socket before it is ready; look then
            # (under valgrind a worker may take a while to get there).
            master, workers = gw.pid, h.wait_workers_ready(gw, timeout=30)
            assert h.listening_addrs([master]) == {(h.HOST, gw.port), (h.HOST, aport)}, \
                h.listening_addrs([master])
            assert h.listening_addrs(workers) == {(h.HOST, gw.port)}, \
                "a worker holds the admin socket: %r" % h.listening_addrs(workers)
            assert gw.request("GET", "/v1/echo").status == 200
            for path in ("/metrics", "/healthz", "/config", "/debug/vars", "/metrics/../config",
                         "/v1/echo"):
                r = h.admin_request(aport, "GET", path)
                assert r.status in (200, 404), (path, r.status)
                assert (r.status == 200) == (path in ("/metrics", "/healthz")), (path, r.status)
                for secret in CLIENT_KEYS + (UPSTREAM_KEY,):
                    assert secret.encode() not in r.raw, "%s exposes %r" % (path, secret)
            assert stub.stats()["requests"] == 1

# SPDX-License-Identifier: BSD-2-Clause
"""Tenants are found by `Authorization: Bearer KEY` or `X-Api-Key: KEY`; everything
else is 401 (or 404 off /v1/) and the upstream is never contacted."""

import harness as h
from harness import ACME_KEY, ACME_KEY2, BETA_KEY, Gateway, Stub, assert_error


def _post(gw, headers, path="/v1/chat/completions"):
    hd = {"Content-Type": "application/json"}
    hd.update(h.stub_headers(events=2, interval=0))
    hd.update(headers)
    with h.Client(gw.port) as c:
        c.send("POST", path, hd, h.stream_body())
        r = c.read_response()
        r.read_all(timeout=10)
        return r


def test_missing_authorization_is_401():
    with Stub() as stub, Gateway(stub=stub) as gw:
        r = _post(gw, {})
        assert_error(r, 401, "invalid_api_key", read=False)
        r = gw.request("GET", "/v1/models", key=None)
        assert_error(r, 401, "invalid_api_key", read=False)
        assert stub.stats()["requests"] == 0, stub.stats()


def test_unknown_key_is_401():
    with Stub() as stub, Gateway(stub=stub) as gw:
        for key in ("sk-nobody", ACME_KEY + "x", ACME_KEY[:-1], "SK-ACME-1",
                    "sk-acme-1 sk-acme-2"):
            r = _post(gw, {"Authorization": "Bearer " + key})
            assert_error(r, 401, "invalid_api_key", read=False)
        assert stub.stats()["requests"] == 0, stub.stats()


def test_malformed_authorization_is_401():
    with Stub() as stub, Gateway(stub=stub) as gw:
        for value in ("Basic c2stYWNtZS0xOg==", "Bearer", "Bearer ", "Bearer" + ACME_KEY,
                      ACME_KEY, "Token " + ACME_KEY, ""):
            r = _post(gw, {"Authorization": value})
            assert_error(r, 401, "invalid_api_key", read=False)
        assert stub.stats()["requests"] == 0, stub.stats()


def test_401_body_is_never_sent_upstream():
    # A big body with a bad key: refused on the head, upstream untouched.
    with Stub() as stub, Gateway(stub=stub) as gw:
        with h.Client(gw.port) as c:
            r = h.send_head_then_body(c, "POST", "/v1/echo",
                                      {"Authorization": "Bearer sk-nobody"}, b"x" * 200000)
            assert_error(r, 401, "invalid_api_key")
        assert stub.stats()["requests"] == 0, stub.stats()


def test_every_key_of_a_tenant_is_accepted():
    with Stub() as stub, Gateway(stub=stub) as gw:
        for key in (ACME_KEY, ACME_KEY2, BETA_KEY):
            r = _post(gw, h.bearer(key))
            assert r.status == 200 and r.complete, (key, r.status)
            assert bytes(r.data) == h.expected_events(2)
        assert stub.stats()["requests"] == 3


def test_tenant_routed_to_its_upstream():
    with Stub("stub-a") as a, Stub("stub-b") as b:
        cfg = h.gateway_config(a, upstreams={"other": {"url": b.url, "api_key": "key-b"}},
                               tenants={"beta": {"upstream": "other"}})
        with Gateway(cfg) as gw:
            r = gw.request("GET", "/v1/echo", key=ACME_KEY)
            assert r.status == 200
            assert ["authorization", "Bearer " + h.UPSTREAM_KEY] in \
                [[k.lower(), v] for k, v in r.json()["headers"]]
            r = gw.request("GET", "/v1/echo", key=BETA_KEY)
            assert r.status == 200
            assert ["authorization", "Bearer key-b"] in \
                [[k.lower(), v] for k, v in r.json()["headers"]]
            assert a.stats()["requests"] == 1, a.stats()
            assert b.stats()["requests"] == 1, b.stats()


def test_path_outside_v1_is_404():
    with Stub() as stub, Gateway(stub=stub) as gw:
        for path in ("/", "/v2/chat/completions", "/v1x/models", "/stub/stats",
                     "/chat/completions"):
            r = gw.request("GET", path, key=ACME_KEY)
            assert_error(r, 404, "not_found", read=False)
        r = gw.request("POST", "/v2/chat/completions", key=ACME_KEY, body=h.stream_body())
        assert_error(r, 404, "not_found", read=False)
        assert stub.stats()["requests"] == 0, stub.stats()


def _echo_headers(gw, headers):
    with h.Client(gw.port) as c:
        c.send("GET", "/v1/echo", headers)
        r = c.read_response()
        r.read_all(timeout=10)
    return r


def test_x_api_key_authenticates_as_a_bearer_token_does():
    with Stub() as stub, Gateway(stub=stub) as gw:
        for key in (ACME_KEY, BETA_KEY):
            r = _post(gw, {"X-Api-Key": key})
            assert r.status == 200 and r.complete, (key, r.status)
            assert bytes(r.data) == h.expected_events(2)
        # Any case of the name, on every path, and beside an equal bearer token.
        r = _post(gw, {"x-api-key": ACME_KEY, "Authorization": "Bearer " + ACME_KEY})
        assert r.status == 200, r.status
        r = _echo_headers(gw, {"X-API-KEY": ACME_KEY})
        assert r.status == 200, r.status
        sent = [[k.lower(), v] for k, v in r.json()["headers"]]
        # Neither credential reaches the runner: it gets the pool's api_key.
        assert ["authorization", "Bearer " + h.UPSTREAM_KEY] in sent, sent
        assert not [k for k, _ in sent if k == "x-api-key"], sent
        r = _echo_headers(gw, {"X-Api-Key": ACME_KEY, "Authorization": "Bearer " + ACME_KEY})
        sent = [[k.lower(), v] for k, v in r.json()["headers"]]
        assert [k for k, _ in sent].count("authorization") == 1, sent
        assert not [k for k, _ in sent if k == "x-api-key"], sent
        assert stub.stats()["requests"] == 5, stub.stats()


def test_x_api_key_and_bearer_naming_different_keys_is_401():
    with Stub() as stub, Gateway(stub=stub) as gw:
        for hd in ({"X-Api-Key": ACME_KEY, "Authorization": "Bearer " + BETA_KEY},
                   {"X-Api-Key": ACME_KEY, "Authorization": "Bearer " + ACME_KEY2},
                   {"X-Api-Key": "sk-nobody", "Authorization": "Bearer " + ACME_KEY},
                   {"X-Api-Key": ACME_KEY, "Authorization": "Basic c2stYWNtZS0xOg=="},
                   {"X-Api-Key": ""}, {"X-Api-Key": "sk-nobody"},
                   {"X-Api-Key": ACME_KEY + "x"}):
            r = _post(gw, hd)
            assert_error(r, 401, "invalid_api_key", read=False)
        assert stub.stats()["requests"] == 0, stub.stats()


def test_two_x_api_key_headers_are_400():
    with Stub() as stub, Gateway(stub=stub) as gw:
        with h.Client(gw.port) as c:
            c.sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: " +
                           ACME_KEY.encode() + b"\r\nX-Api-Key: " + ACME_KEY.encode() +
                           b"\r\n\r\n")
            r = c.read_response()
            assert_error(r, 400, "bad_request")
        assert stub.stats()["requests"] == 0, stub.stats()

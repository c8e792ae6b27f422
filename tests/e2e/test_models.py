# SPDX-License-Identifier: BSD-2-Clause
"""Models: route by the request body's "model" (issue 23).

`sluice -t` on models: sections, then routing end to end against stub
runners that echo the model they were sent.
"""

import harness as h

MODELS = """\
listen: "127.0.0.1:{port}"
workers: 1
upstreams:
  big:
    url: "http://127.0.0.1:{big}"
  small:
    url: "http://127.0.0.1:{small}"
models:
  llama-70b:
    aliases: ["gpt-4o", "default"]
    targets:
      - upstream: big
        model: "meta-llama/Llama-3.1-70B-Instruct"
        weight: 90
      - upstream: small
        weight: 10
  llama-8b:
    targets: [{{upstream: small}}]
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 100
    upstream: small
    models: [llama-70b]
  beta:
    keys: ["sk-beta"]
    max_streams: 100
"""


def _line_col(text, needle, at=None):
    """1-based (line, column) of `at` (default: needle) in the line of
    `text` that holds needle."""
    for n, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return n, line.index(at if at is not None else needle) + 1
    raise AssertionError("%r not in the config" % needle)


def _check(text):
    path = h.write_config(text)
    rc, out, err = h.run_sluice(["-t", "-c", path])
    return path, rc, out, err


def test_check_accepts_a_models_section_and_a_tenant_without_upstream():
    text = MODELS.format(port=h.free_port(), big=9000, small=9001)
    path, rc, out, err = _check(text)
    assert rc == 0, "exit %d, output %r" % (rc, out + err)
    assert out.splitlines() == ["%s: ok" % path], out
    assert err == "", err


def test_check_reports_each_models_error_at_its_position():
    base = MODELS.format(port=h.free_port(), big=9000, small=9001)
    cases = [
        # (old, new, needle of the reported line, at, message)
        ("- upstream: big\n", "- upstream: huge\n", "upstream: huge", "huge",
         "models.llama-70b.targets[0].upstream: no upstream named 'huge'"),
        ("targets: [{upstream: small}]", "targets: []", "targets: []", "[",
         "models.llama-8b.targets: must hold at least one target"),
        ("weight: 90", "weight: 1001", "weight: 1001", "1001",
         "models.llama-70b.targets[0].weight: 1001 is out of range 1-1000"),
        ("weight: 10\n", "weight: 0\n", "weight: 0", "0",
         "models.llama-70b.targets[1].weight: 0 is out of range 1-1000"),
        ("  llama-8b:\n", "  llama-8b:\n    aliases: [gpt-4o]\n",
         "aliases: [gpt-4o]", "gpt-4o",
         "models.llama-8b.aliases: 'gpt-4o' is already the name or an alias "
         "of model 'llama-70b'"),
        ("  llama-8b:\n", "  default:\n", "  default:", "default",
         "models: 'default' is already the name or an alias of model "
         "'llama-70b'"),
        ("models: [llama-70b]", "models: [llama-70b, mistral]", "mistral",
         "mistral", "tenants.acme.models: no model named 'mistral'"),
        ("models: [llama-70b]", "models: [gpt-4o]", "models: [gpt-4o]",
         "gpt-4o", "tenants.acme.models: 'gpt-4o' is an alias of model "
         "'llama-70b': list models by their name"),
    ]
    for old, new, needle, at, msg in cases:
        assert old in base, old
        text = base.replace(old, new, 1)
        line, col = _line_col(text, needle, at)
        path, rc, out, err = _check(text)
        assert rc == 1, "exit %d (want 1) for %r, output %r" % (rc, new, out + err)
        assert out == "", out
        assert err.splitlines() == ["%s:%d:%d: %s" % (path, line, col, msg)], \
            (new, err)


def test_check_without_models_still_wants_a_tenant_upstream():
    text = MODELS.format(port=h.free_port(), big=9000, small=9001)
    start = text.index("models:\n")
    end = text.index("tenants:\n")
    text = text[:start] + text[end:]
    text = text.replace("    models: [llama-70b]\n", "")
    line, _ = _line_col(text, 'keys: ["sk-beta"]')
    path, rc, out, err = _check(text)
    assert rc == 1, "exit %d (want 1), output %r" % (rc, out + err)
    assert err.splitlines() == [
        "%s:%d:5: tenant 'beta': missing key 'upstream' (there are 2 "
        "upstreams)" % (path, line)], err


# ------------------------------------------------------------------ relay

import json  # noqa: E402

ROUTED = """\
listen: "127.0.0.1:{port}"
workers: {workers}
log_level: info
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
        weight: 90
      - upstream: small
        weight: 10
  llama-8b:
    aliases: ["tiny"]
    targets: [{{upstream: small}}]
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 1
    models: [llama-8b]
  beta:
    keys: ["sk-beta"]
    max_streams: 100
    upstream: big
"""

JSON_CT = {"Content-Type": "application/json"}

NOT_FOUND = ('{"error":{"message":"The model \'%s\' does not exist or you do not '
             'have access to it.","type":"invalid_request_error",'
             '"code":"model_not_found"}}\n')


def _routed(big, small, workers=1):
    return h.Gateway(ROUTED.format(port=h.free_port(), workers=workers,
                                   big=big.url, small=small.url))


def _echo(c, key, body, path="/v1/echo", headers=None):
    hd = dict(h.bearer(key), **JSON_CT)
    hd.update(headers or {})
    r = c.request("POST", path, hd, body)
    r.read_all(timeout=10)
    return r


def _echoed(r):
    """(upstream port, body bytes the upstream received) of a /v1/echo answer."""
    doc = json.loads(bytes(r.data).decode())
    host = [v for n, v in doc["headers"] if n.lower() == "host"][0]
    return int(host.rsplit(":", 1)[1]), doc["body"].encode()


def test_weights_split_1000_requests_90_10_and_rewrite_the_model():
    with h.Stub("big") as big, h.Stub("small") as small, _routed(big, small) as gw:
        sent = b'{"model":"llama-70b","messages":[{"role":"user","content":"hi"}]}'
        to_big = sent.replace(b'"llama-70b"', b'"meta-llama/Llama-3.1-70B-Instruct"')
        n = {big.port: 0, small.port: 0}
        with gw.client() as c:
            for _ in range(1000):
                r = _echo(c, "sk-beta", sent)
                assert r.status == 200, (r.status, bytes(r.data[:300]))
                assert r.header("x-sluice-model") == "llama-70b"
                port, body = _echoed(r)
                n[port] += 1
                # big is sent its own name for the model; small the name
                # the client sent (its target has no model:), untouched.
                assert body == (to_big if port == big.port else sent), body
        assert abs(n[big.port] - 900) <= 30 and abs(n[small.port] - 100) <= 30, n
        assert n[big.port] + n[small.port] == 1000


def test_aliases_resolve_and_the_allow_list_holds_for_them():
    with h.Stub("big") as big, h.Stub("small") as small, _routed(big, small) as gw:
        with gw.client() as c:
            # An alias of a listed model: routed, rewritten to its name.
            r = _echo(c, "sk-acme", b'{"model":"tiny","n":1}')
            assert r.status == 200, bytes(r.data[:300])
            assert r.header("x-sluice-model") == "llama-8b"
            assert _echoed(r) == (small.port, b'{"model":"llama-8b","n":1}')
            # The escaped key and value count as the plain ones.
            r = _echo(c, "sk-acme", b'{"mo\\u0064el":"ti\\u006ey"}')
            assert r.status == 200, bytes(r.data[:300])
            assert _echoed(r) == (small.port, b'{"mo\\u0064el":"llama-8b"}')
            # An alias of a model acme may not use, its name, and a name
            # nobody has: the same 404, and no upstream is asked.
            before = big.stats()["requests"] + small.stats()["requests"]
            for name in ("gpt-4o", "llama-70b", "nope"):
                r = _echo(c, "sk-acme", json.dumps({"model": name}).encode())
                assert r.status == 404, (name, r.status)
                assert bytes(r.data) == (NOT_FOUND % name).encode(), bytes(r.data)
                assert r.header("x-sluice-model") is None
            assert big.stats()["requests"] + small.stats()["requests"] == before
        # acme has max_streams 1: each refusal gave its slot back at once.
        with gw.client() as c:
            r = _echo(c, "sk-acme", b'{"model":"llama-8b"}')
            assert r.status == 200, bytes(r.data[:300])


def test_requests_without_a_model_and_with_a_bad_one():
    with h.Stub("big") as big, h.Stub("small") as small, _routed(big, small) as gw:
        with gw.client() as c:
            # beta has an upstream: no model, or no JSON, goes there, as is.
            for body in (b'{"messages":[]}', b"not json", b""):
                r = _echo(c, "sk-beta", body)
                assert r.status == 200, (body, r.status, bytes(r.data[:300]))
                assert r.header("x-sluice-model") is None
                assert _echoed(r) == (big.port, body)
            # acme has none: 400.
            for body, msg in ((b'{"messages":[]}', "you must provide a model parameter"),
                              (b"", "you must provide a model parameter"),
                              (b'{"model":', "the request body is not valid JSON")):
                r = _echo(c, "sk-acme", body)
                doc = h.assert_error(r, 400, "bad_request", read=False)
                assert doc["error"]["message"] == msg, doc
            # A model that is not a string: 400 for everyone.
            for key in ("sk-acme", "sk-beta"):
                r = _echo(c, key, b'{"model":["llama-8b"]}')
                doc = h.assert_error(r, 400, "bad_request", read=False)
                assert doc["error"]["message"] == "'model' must be a string", doc
            # Only the first top-level member counts; every one is rewritten.
            r = _echo(c, "sk-acme", b'{"x":{"model":"nope"},"model":"tiny","model":"gpt-4o"}')
            assert r.status == 200, bytes(r.data[:300])
            assert _echoed(r) == (small.port,
                                  b'{"x":{"model":"nope"},"model":"llama-8b","model":"llama-8b"}')
            # multipart/form-data: the "model" field.
            form = (b'--b1\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                    b'Content-Type: audio/wav\r\n\r\nRIFF\r\n'
                    b'--b1\r\nContent-Disposition: form-data; name="model"\r\n\r\ntiny\r\n--b1--\r\n')
            r = _echo(c, "sk-acme", form, headers={
                "Content-Type": "multipart/form-data; boundary=b1"})
            assert r.status == 200, bytes(r.data[:300])
            assert _echoed(r) == (small.port, form.replace(b"\r\n\r\ntiny\r\n",
                                                           b"\r\n\r\nllama-8b\r\n"))


def test_a_streamed_chat_is_routed_rewritten_and_asked_for_usage():
    with h.Stub("big") as big, h.Stub("small") as small, _routed(big, small) as gw:
        with gw.client() as c:
            hd = dict(h.bearer("sk-acme"), **JSON_CT)
            hd.update(h.stub_headers(events=3, interval=0))
            r = c.request("POST", "/v1/chat/completions", hd,
                          h.stream_body(model="tiny"))
            body = r.read_all(timeout=10)
            assert r.status == 200
            assert r.header("x-sluice-model") == "llama-8b"
            assert bytes(body) == h.expected_events(3)
        r = small.direct("GET", "/stub/last")
        r.read_all(timeout=10)
        assert r.status == 200
        doc = json.loads(bytes(r.data).decode())
        assert doc["model"] == "llama-8b"
        assert doc["stream_options"] == {"include_usage": True}
        assert big.stats()["requests"] == 0


def test_reload_moves_a_model_and_keeps_the_stream_in_flight():
    with h.Stub("a") as a, h.Stub("b") as b:
        text = ROUTED.format(port=h.free_port(), workers=1, big=a.url, small=b.url)
        text = text.replace("  llama-8b:\n", "  stub:\n    targets: [{upstream: big}]\n"
                            "  llama-8b:\n")
        with h.Gateway(text, allow_worker_changes=True) as gw:
            c, r = gw.admit(key="sk-beta", events=20, interval=100, tag="long", timeout=20)
            r.read_events(2, timeout=5)
            assert r.header("x-sluice-model") == "stub"
            h.reload(gw, text.replace("  stub:\n    targets: [{upstream: big}]\n",
                                      "  stub:\n    targets: [{upstream: small}]\n"))
            with gw.client() as c2:
                for _ in range(3):
                    r2 = _echo(c2, "sk-beta", b'{"model":"stub"}')
                    assert r2.status == 200
                    assert _echoed(r2) == (b.port, b'{"model":"stub"}')
            body = r.read_all(timeout=20)
            assert r.complete and body == h.expected_events(20)
            assert a.tag("long")["completed"] == 1
            assert b.tag("long")["requests"] == 0


def _get(c, key, path, method="GET"):
    r = c.request(method, path, dict(h.bearer(key)) if key else {})
    r.read_all(timeout=10)
    return r


def test_v1_models_lists_each_tenants_models_and_aliases_sorted():
    with h.Stub("big") as big, h.Stub("small") as small, _routed(big, small) as gw:
        with gw.client() as c:
            r = _get(c, "sk-beta", "/v1/models")
            assert r.status == 200, bytes(r.data[:300])
            assert r.header("content-type") == "application/json"
            doc = json.loads(bytes(r.data).decode())
            assert doc["object"] == "list"
            ids = [m["id"] for m in doc["data"]]
            assert ids == ["default", "gpt-4o", "llama-70b", "llama-8b", "tiny"], ids
            created = doc["data"][0]["created"]
            assert isinstance(created, int) and created > 1700000000
            assert all(m == {"id": m["id"], "object": "model", "created": created,
                             "owned_by": "sluice"} for m in doc["data"]), doc
            # acme may use llama-8b only: its name and alias.
            r = _get(c, "sk-acme", "/v1/models?x=1")
            assert [m["id"] for m in json.loads(bytes(r.data).decode())["data"]] == \
                ["llama-8b", "tiny"]
            # One model, by a name the tenant may use.
            r = _get(c, "sk-acme", "/v1/models/tiny")
            assert r.status == 200
            assert json.loads(bytes(r.data).decode()) == {
                "id": "tiny", "object": "model", "created": created, "owned_by": "sluice"}
            for path, name in (("/v1/models/gpt-4o", "gpt-4o"), ("/v1/models/nope", "nope"),
                               ("/v1/models/ti%6Ey%22", 'tiny\\"')):
                r = _get(c, "sk-acme", path)
                assert r.status == 404, path
                assert bytes(r.data) == (NOT_FOUND % name).encode(), bytes(r.data)
            # HEAD: the head alone, with the length.
            r = c.request("HEAD", "/v1/models", dict(h.bearer("sk-beta")))
            assert r.status == 200 and r.header("content-length") is not None
            # Still one connection, kept alive throughout.
            r = _get(c, "sk-beta", "/v1/models")
            assert r.status == 200
            # A key is required.
            r = _get(c, None, "/v1/models")
            h.assert_error(r, 401, "invalid_api_key", read=False)
        assert big.stats()["requests"] == 0 and small.stats()["requests"] == 0


def test_v1_models_takes_no_slot():
    with h.Stub("big") as big, h.Stub("small") as small, _routed(big, small) as gw:
        # acme's one slot is held by a hung request: the list still comes.
        with gw.client() as held:
            hd = dict(h.bearer("sk-acme"), **JSON_CT)
            hd.update(h.stub_headers(hang=True))
            held.send("POST", "/v1/chat/completions", hd, h.stream_body(model="tiny"))
            h.wait_until(lambda: small.stats()["inflight"] == 1, 5,
                         msg="the hung request to reach the stub")
            with gw.client() as c:
                r = _get(c, "sk-acme", "/v1/models")
                assert r.status == 200, bytes(r.data[:300])
                r = _echo(c, "sk-acme", b'{"model":"tiny"}')
                h.assert_error(r, 429, "concurrency_limit_exceeded", read=False)


def test_access_log_says_the_model_as_sent_and_as_sent_upstream():
    with h.Stub("big") as big, h.Stub("small") as small:
        log = h.tmpfile("access", ".log")
        text = ROUTED.format(port=h.free_port(), workers=1, big=big.url,
                             small=small.url) + 'access_log: "%s"\n' % log
        with h.Gateway(text) as gw, gw.client() as c:
            assert _echo(c, "sk-acme", b'{"model":"tiny"}').status == 200
            assert _echo(c, "sk-acme", b'{"model":"gpt-4o"}').status == 404
            assert _echo(c, "sk-beta", b'{"n":1}').status == 200
            assert _echo(c, "sk-beta", b'{"model":"llama-70b"}').status == 200
            lines = h.wait_access_lines(log, 4)
        got = [(l["status"], l["model"], l["upstream_model"]) for l in lines]
        assert got == [(200, "tiny", "llama-8b"), (404, "gpt-4o", "-"), (200, "-", "-"),
                       (200, "llama-70b", "meta-llama/Llama-3.1-70B-Instruct")], got


def test_an_answer_made_after_routing_names_the_model_too():
    with h.Stub("big") as big:
        dead = "http://127.0.0.1:%d" % h.closed_port()
        with _routed(big, type("S", (), {"url": dead})()) as gw, gw.client() as c:
            # llama-8b's only target is the dead upstream: 502, named.
            r = _echo(c, "sk-acme", b'{"model":"tiny"}')
            h.assert_error(r, 502, "upstream_unreachable", read=False)
            assert r.header("x-sluice-model") == "llama-8b"
            # Refused before routing: no model named.
            r = _echo(c, "sk-acme", b'{"model":"nope"}')
            assert r.status == 404 and r.header("x-sluice-model") is None


# ------------------------------------------------------------------ fallback

FALLBACK = """\
listen: "127.0.0.1:{port}"
workers: 1
upstreams:
  primary:
    replicas: [{{url: "{primary}", max_streams: 1}}]
    retries: 0
  backup:
    url: "{backup}"
models:
  big:
    aliases: [gpt-4o]
    targets: [{{upstream: primary, model: big-internal}}]
    fallback: [small]
  small:
    targets: [{{upstream: backup, model: small-internal}}]
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 100
  lim:
    keys: ["sk-lim"]
    max_streams: 100
    models: [big]
"""


def _fallback_gw(primary_url, backup):
    return h.Gateway(FALLBACK.format(port=h.free_port(), primary=primary_url,
                                     backup=backup.url))


def test_fallback_when_the_primary_pool_is_down():
    dead = "http://127.0.0.1:%d" % h.closed_port()
    with h.Stub("backup") as backup, _fallback_gw(dead, backup) as gw, gw.client() as c:
        r = _echo(c, "sk-acme", b'{"model":"gpt-4o","n":1}')
        assert r.status == 200, bytes(r.data[:300])
        assert r.header("x-sluice-model") == "small"
        assert _echoed(r) == (backup.port, b'{"model":"small-internal","n":1}')
        # small is not in lim's list: no fallback, today's answer.
        r = _echo(c, "sk-lim", b'{"model":"gpt-4o"}')
        h.assert_error(r, 502, "upstream_unreachable", read=False)
        assert r.header("x-sluice-model") == "big"
        assert backup.stats()["requests"] == 1


def test_fallback_when_the_primary_pool_is_full():
    with h.Stub("primary") as primary, h.Stub("backup") as backup, \
            _fallback_gw(primary.url, backup) as gw:
        with gw.client() as held:
            hd = dict(h.bearer("sk-acme"), **JSON_CT)
            hd.update(h.stub_headers(hang=True))
            held.send("POST", "/v1/chat/completions", hd, h.stream_body(model="big"))
            h.wait_until(lambda: primary.stats()["inflight"] == 1, 5,
                         msg="the hung request to hold the primary's one slot")
            with gw.client() as c:
                r = _echo(c, "sk-acme", b'{"model":"big"}')
                assert r.status == 200, bytes(r.data[:300])
                assert r.header("x-sluice-model") == "small"
                assert _echoed(r) == (backup.port, b'{"model":"small-internal"}')
                r = _echo(c, "sk-lim", b'{"model":"big"}')
                h.assert_error(r, 503, "upstream_unavailable", read=False)
                assert r.header("x-sluice-model") == "big"


def test_fallback_when_the_primary_answers_busy():
    with h.Stub("primary", args=("--busy", "--busy-status", "503")) as primary, \
            h.Stub("backup") as backup, _fallback_gw(primary.url, backup) as gw, \
            gw.client() as c:
        hd = dict(h.bearer("sk-acme"), **JSON_CT)
        hd.update(h.stub_headers(events=2, interval=0))
        r = c.request("POST", "/v1/chat/completions", hd, h.stream_body(model="big"))
        body = r.read_all(timeout=10)
        assert r.status == 200, bytes(body[:300])
        assert r.header("x-sluice-model") == "small"
        assert bytes(body) == h.expected_events(2)
        assert primary.stats()["requests"] == 1
        last = backup.direct("GET", "/stub/last")
        last.read_all(timeout=10)
        assert json.loads(bytes(last.data).decode())["model"] == "small-internal"


def test_no_fallback_once_a_byte_was_relayed():
    with h.Stub("primary") as primary, h.Stub("backup") as backup, \
            _fallback_gw(primary.url, backup) as gw, gw.client() as c:
        hd = dict(h.bearer("sk-acme"), **JSON_CT)
        hd.update(h.stub_headers(events=10, interval=0, abort_after=2))
        c.send("POST", "/v1/chat/completions", hd, h.stream_body(model="big"))
        r = c.read_response(timeout=10)
        assert r.status == 200 and r.header("x-sluice-model") == "big"
        try:
            r.read_all(timeout=10)
        except h.StreamCut:
            pass
        assert not r.complete
        assert backup.stats()["requests"] == 0


def test_fallback_walks_the_whole_chain_once():
    # big's target is dead; its fallbacks are mid (dead too) and small.
    # Each failed try moves one step along the chain of the first choice,
    # not along mid's own (which has no fallback).
    dead1 = "http://127.0.0.1:%d" % h.closed_port()
    dead2 = "http://127.0.0.1:%d" % h.closed_port()
    with h.Stub("backup") as backup:
        log = h.tmpfile("access", ".log")
        text = FALLBACK.format(port=h.free_port(), primary=dead1, backup=backup.url)
        text = text.replace("  backup:\n", '  second:\n    url: "%s"\n    retries: 0\n'
                            "  backup:\n" % dead2)
        text = text.replace("    fallback: [small]\n",
                            "    fallback: [mid, small]\n"
                            "  mid:\n    targets: [{upstream: second}]\n")
        text = text.replace("models: [big]", "models: [big, mid, small]")
        text += 'access_log: "%s"\n' % log
        with h.Gateway(text) as gw, gw.client() as c:
            for key in ("sk-acme", "sk-lim"):
                r = _echo(c, key, b'{"model":"big"}')
                assert r.status == 200, bytes(r.data[:300])
                assert r.header("x-sluice-model") == "small"
                assert _echoed(r) == (backup.port, b'{"model":"small-internal"}')
            lines = h.wait_access_lines(log, 2)
        assert [(l["tries"], l["model"], l["upstream_model"]) for l in lines] == \
            [(3, "big", "small-internal")] * 2, lines
        assert backup.stats()["requests"] == 2


# ------------------------------------------- the answer's "model" set back

import re  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

RENAMED = """\
listen: "127.0.0.1:{port}"
workers: 1
upstreams:
  up:
    url: "{up}"
  dead:
    url: "{dead}"
    retries: 0
models:
  m1:
    aliases: ["gpt-4o"]
    targets: [{{upstream: up, model: "org/Internal-1"}}]
  m2:
    targets: [{{upstream: up}}]
  m3:
    targets: [{{upstream: dead, model: "gone"}}]
    fallback: [m1]
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 10
"""


def _answer_events(model, usage):
    m = json.dumps(model)
    ev = []
    for i in range(3):
        ev.append(('data: {"id":"c1","object":"chat.completion.chunk","model":%s,'
                   '"choices":[{"index":0,"model":"nested","delta":{"content":'
                   '"t%d \\"model\\": %s"}}]}\n\n' % (m, i, "x")).encode())
    if usage:
        ev.append(('data: {"id":"c1","object":"chat.completion.chunk","model":%s,'
                   '"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,'
                   '"total_tokens":8}}\n\n' % m).encode())
    return b"".join(ev) + b"data: [DONE]\n\n"


def _answer_json(model):
    return ('{"id":"c1","object":"chat.completion","model":%s,"choices":[{"index":0,'
            '"message":{"role":"assistant","content":"{\\"model\\":\\"no\\"}"},'
            '"finish_reason":"stop"}],"usage":{"prompt_tokens":5,'
            '"completion_tokens":3,"total_tokens":8}}' % json.dumps(model)).encode()


def _echo_runner(sock, req):
    """A runner that names in its answer the model it was sent, and writes
    its answer a byte at a time (each in its own chunk when streamed), so
    that every member is split across reads."""
    body = json.loads(req.split(b"\r\n\r\n", 1)[1].decode())
    model = body["model"]
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if body.get("stream"):
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        data = _answer_events(model, usage)
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        for i in range(len(data)):
            sock.sendall(b"1\r\n" + data[i:i + 1] + b"\r\n")
            time.sleep(0.0005)
        sock.sendall(b"0\r\n\r\n")
    else:
        data = _answer_json(model)
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(data))
        for i in range(len(data)):
            sock.sendall(data[i:i + 1])
            time.sleep(0.0005)


def _renamed_gw(up):
    dead = "http://127.0.0.1:%d" % h.closed_port()
    return h.Gateway(RENAMED.format(port=h.free_port(), up=up.url, dead=dead))


def _chat(c, model, stream, usage=False):
    body = {"model": model, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}
    if usage:
        body["stream_options"] = {"include_usage": True}
    hd = dict(h.bearer("sk-acme"), **JSON_CT)
    r = c.request("POST", "/v1/chat/completions", hd, json.dumps(body).encode())
    r.read_all(timeout=20)
    return r


def test_the_answers_model_is_the_name_the_client_sent():
    with h.RawUpstream(_echo_runner) as up, _renamed_gw(up) as gw, gw.client() as c:
        # An alias, sent upstream as the target's own name: the stream's
        # events and the JSON answer name the alias again; nothing else
        # changes (nested members, "model" inside strings). The usage
        # chunk sluice asked for is still taken out.
        r = _chat(c, "gpt-4o", True)
        assert r.status == 200 and r.header("x-sluice-model") == "m1"
        assert bytes(r.data) == _answer_events("gpt-4o", False), bytes(r.data)
        r = _chat(c, "gpt-4o", False)
        assert r.status == 200 and r.header("x-sluice-model") == "m1"
        assert bytes(r.data) == _answer_json("gpt-4o"), bytes(r.data)
        # The model's own name: the same, with the client's own usage chunk.
        r = _chat(c, "m1", True, usage=True)
        assert bytes(r.data) == _answer_events("m1", True), bytes(r.data)
        # No rename on the way up (no target model:): the bytes pass as the
        # runner wrote them.
        r = _chat(c, "m2", True)
        assert bytes(r.data) == _answer_events("m2", False), bytes(r.data)
        r = _chat(c, "m2", False)
        assert bytes(r.data) == _answer_json("m2"), bytes(r.data)
        # A fallback answered: its model's name, not the one asked for.
        for stream in (True, False):
            r = _chat(c, "m3", stream)
            assert r.status == 200 and r.header("x-sluice-model") == "m1"
            want = _answer_events("m1", False) if stream else _answer_json("m1")
            assert bytes(r.data) == want, bytes(r.data)
        # What the runner was sent each time.
        sent = [json.loads(q.split(b"\r\n\r\n", 1)[1])["model"] for q in up.requests]
        assert sent == ["org/Internal-1"] * 3 + ["m2"] * 2 + ["org/Internal-1"] * 2, sent
        # and none of it compressed: identity was asked for.
        for q in up.requests:
            assert b"\r\nAccept-Encoding: identity\r\n" in q, q


LONG_ALIAS = "a-client-facing-alias-" + "x" * 78


def _flood_runner(sock, req):
    """Tiny events, as fast as TCP takes them, each naming the short
    internal model: set back to a 100-byte alias, one read grows past the
    whole stream buffer."""
    data = b"".join(b'data: {"model":"x","seq":%d}\n\n' % i for i in range(20000))
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Connection: close\r\n\r\n" + data + b"data: [DONE]\n\n")


def test_a_paused_stream_is_set_back_byte_exact():
    text = RENAMED.replace('aliases: ["gpt-4o"]', 'aliases: ["%s"]' % LONG_ALIAS)
    text = text.replace('model: "org/Internal-1"', 'model: "x"')
    text += ('stream_buffer: "16KiB"\nlimits:\n  client_sndbuf: "16KiB"\n'
             'admin_listen: "127.0.0.1:%d"\n' % h.free_port())
    with h.RawUpstream(_flood_runner) as up:
        dead = "http://127.0.0.1:%d" % h.closed_port()
        with h.Gateway(text.format(port=h.free_port(), up=up.url, dead=dead)) as gw:
            c = gw.client(rcvbuf=4096, timeout=30)
            hd = dict(h.bearer("sk-acme"), **JSON_CT)
            # Not a chat completion: no usage scanner, the plain path.
            c.send("POST", "/v1/echo", hd, json.dumps({"model": LONG_ALIAS}).encode())
            r = c.read_response(timeout=10)
            assert r.status == 200 and r.header("x-sluice-model") == "m1"
            h.wait_until(lambda: h.scrape(gw).value("sluice_upstream_pauses_total") > 0,
                         10, msg="the stream to be paused")
            body = bytes(r.read_all(timeout=60))
            want = b"".join(b'data: {"model":"%s","seq":%d}\n\n' % (LONG_ALIAS.encode(), i)
                            for i in range(20000)) + b"data: [DONE]\n\n"
            assert len(body) == len(want), (len(body), len(want))
            assert body == want
            c.close()


# --------------------------------------------- with cluster: and prefix affinity

CLUSTER_MODELS = {
    "llama": {"aliases": ["gpt-4o"],
              "targets": [{"upstream": "main", "model": "stub-internal"}]},
    "other": {"targets": [{"upstream": "main"}]},
}


def test_with_cluster_the_tenants_one_lease_holds_whatever_model_it_names():
    import test_cluster as tc
    with h.Redis() as redis, h.Stub() as stub:
        a = tc.cluster_gw(stub, redis.addr, "gw-a", max_streams=1, models=CLUSTER_MODELS)
        b = tc.cluster_gw(stub, redis.addr, "gw-b", max_streams=1, models=CLUSTER_MODELS)
        with a, b:
            tc.wait_nodes([a, b], 2)
            # An alias on node a: routed, renamed, and the tenant's lease taken.
            c, r = a.open_stream(key=h.ACME_KEY, body=h.stream_body(model="gpt-4o"),
                                 events=100000, interval=200, tag="held")
            assert r.status == 200 and r.header("x-sluice-model") == "llama"
            tc.wait_leases(redis, 1)
            # Node b: the limit is the tenant's, across nodes, whatever model
            # the request names (decided at the head, before the body).
            r2 = b.request("POST", "/v1/chat/completions", JSON_CT,
                           h.stream_body(model="other"), key=h.ACME_KEY)
            h.assert_error(r2, 429, "concurrency_limit_exceeded", read=False)
            # /v1/models is answered on either node without a lease.
            for gw in (a, b):
                r3 = gw.request("GET", "/v1/models", key=h.ACME_KEY, body=b"")
                assert r3.status == 200
                assert [m["id"] for m in json.loads(bytes(r3.data))["data"]] == \
                    ["gpt-4o", "llama", "other"]
            assert redis.zcard(tc.LEASES) == 1
            c.close()
            tc.wait_leases(redis, 0)
            # The lease is back: node b routes by model, and a fallback-free
            # alias of llama reaches the runner under its internal name.
            hd = dict(JSON_CT, **h.stub_headers(events=2, interval=0))
            r4 = b.request("POST", "/v1/chat/completions", hd,
                           h.stream_body(model="gpt-4o"), key=h.ACME_KEY)
            assert r4.status == 200 and r4.header("x-sluice-model") == "llama"
            assert bytes(r4.data) == h.expected_events(2)
            last = stub.direct("GET", "/stub/last")
            last.read_all(timeout=10)
            assert json.loads(bytes(last.data))["model"] == "stub-internal"
            tc.wait_leases(redis, 0)


def test_with_prefix_affinity_a_models_target_keeps_each_conversation_on_one_replica():
    import test_routing as tr
    reps = [tr.LoadReplica("r%d" % i) for i in range(3)]
    for r in reps:
        r.__enter__()
    try:
        log = h.tmpfile("access", ".log")
        cfg = tr.pool_config([r.url for r in reps], workers=2, access_log=log,
                             balance="prefix_affinity")
        cfg["models"] = {"chat": {"aliases": ["gpt-4o"],
                                  "targets": [{"upstream": "main", "model": "org/Chat"}]}}
        with h.Gateway(cfg) as gw:
            convs = [tr.conversation(70 + k, 3) for k in range(6)]
            where = {}
            for t in range(3):
                for k, conv in enumerate(convs):
                    body = json.dumps({"model": "gpt-4o" if k % 2 else "chat",
                                       "messages": conv[t]}).encode()
                    r = gw.request("POST", "/v1/chat/completions", JSON_CT, body,
                                   key=h.ACME_KEY)
                    assert r.status == 200 and r.header("x-sluice-model") == "chat"
                    where.setdefault(k, []).append(json.loads(bytes(r.data))["replica"])
            for k, names in where.items():
                assert len(set(names)) == 1, (k, names)
            lines = h.wait_access_lines(log, 18)
            assert [l["upstream_model"] for l in lines] == ["org/Chat"] * 18
            kinds = [l["affinity"] for l in lines]
            assert kinds.count("hit") + kinds.count("miss") == 18, kinds
            assert kinds.count("hit") >= 6, kinds
    finally:
        for r in reps:
            r.__exit__(None, None, None)


def test_an_encoded_or_other_answer_passes_as_the_runner_wrote_it():
    import gzip
    answers = {
        # A runner that ignores the identity it was asked for.
        "gzip": (b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n",
                 gzip.compress(b'{"model":"org/Internal-1"}')),
        # Not JSON, not an event stream.
        "text": (b"Content-Type: text/plain\r\n", b'{"model":"org/Internal-1"}'),
    }

    def runner(sock, req):
        kind = re.search(rb"(?im)^x-kind: (\w+)", req).group(1).decode()
        head, body = answers[kind]
        sock.sendall(b"HTTP/1.1 200 OK\r\n" + head + b"Content-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % len(body) + body)

    with h.RawUpstream(runner) as up, _renamed_gw(up) as gw, gw.client() as c:
        for kind, (head, body) in answers.items():
            r = _echo(c, "sk-acme", b'{"model":"gpt-4o"}', path="/v1/chat/completions",
                      headers={"X-Kind": kind})
            assert r.status == 200 and r.header("x-sluice-model") == "m1"
            assert bytes(r.data) == body, (kind, bytes(r.data))
        assert r.header("content-encoding") is None
        r = _echo(c, "sk-acme", b'{"model":"gpt-4o"}', path="/v1/chat/completions",
                  headers={"X-Kind": "gzip"})
        assert r.header("content-encoding") == "gzip"


def test_a_kept_connections_next_answer_does_not_name_the_last_ones_model():
    with h.Stub("big") as big, h.Stub("small") as small, _routed(big, small) as gw:
        with gw.client() as c:
            r = _echo(c, "sk-acme", b'{"model":"tiny"}')
            assert r.status == 200 and r.header("x-sluice-model") == "llama-8b"
            # The next requests on the same connection are not routed by
            # model: none of their answers may name one.
            r = _echo(c, "sk-nobody", b'{"model":"tiny"}')
            h.assert_error(r, 401, "invalid_api_key", read=False)
            assert r.header("x-sluice-model") is None
            r = _get(c, "sk-acme", "/v1/models")
            assert r.status == 200 and r.header("x-sluice-model") is None
            r = _echo(c, "sk-beta", b'{"messages":[]}')
            assert r.status == 200 and r.header("x-sluice-model") is None
            r = _echo(c, "sk-acme", b'{"model":"tiny"}')
            assert r.status == 200 and r.header("x-sluice-model") == "llama-8b"

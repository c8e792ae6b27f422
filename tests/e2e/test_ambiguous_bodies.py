# SPDX-License-Identifier: BSD-2-Clause
"""The model allow-list against bodies a runner reads otherwise (issue 31).

A tenant may use whisper-small, not whisper-large-private. Every body here
goes through sluice to a runner that reads it as vLLM's FastAPI does
(formrunner: python-multipart and Starlette for forms, the last field of a
name; json.loads for JSON). For each, the assertion is exact: sluice refuses
it 400 bad_request naming what is ambiguous (and the runner sees nothing),
or the runner SERVES the allowed model. Before issue 31 several of these
reached the runner and it served the private model.
"""

import json

import formrunner
import harness as h

KEY = "sk-t"
OPEN_KEY = "sk-open"
ALLOWED, PRIVATE = "whisper-small", "whisper-large-private"
PATH = "/v1/audio/transcriptions"
WHY = "the request body cannot be read unambiguously: "


def _config(runner):
    return {
        "listen": "%s:%d" % (h.HOST, h.free_port()),
        "workers": 1,
        "admin_listen": "%s:%d" % (h.HOST, h.free_port()),
        "upstreams": {"runner": {"url": runner.url}},
        "models": {
            ALLOWED: {"targets": [{"upstream": "runner"}]},
            PRIVATE: {"targets": [{"upstream": "runner"}]},
        },
        "tenants": {
            # A default upstream too: a body naming no model goes there,
            # so one sluice cannot read must not pass as naming none.
            "t": {"keys": [KEY], "max_streams": 10, "upstream": "runner",
                  "models": [ALLOWED]},
            "open": {"keys": [OPEN_KEY], "max_streams": 10, "upstream": "runner"},
        },
    }


def _part(name_params, value, extra=b""):
    return (b"Content-Disposition: form-data; " + name_params + b"\r\n" + extra +
            b"\r\n" + value)


def _form(boundary, *parts, close=True):
    out = b""
    for p in parts:
        out += b"--" + boundary + b"\r\n" + p + b"\r\n"
    return out + (b"--" + boundary + b"--\r\n" if close else b"")


AUDIO = _part(b'name="file"; filename="a.wav"', b"RIFF\x00\x01WAVE",
              b"Content-Type: audio/wav\r\n")
M = lambda v: _part(b'name="model"', v)

# (label, content-type, body, what sluice says is ambiguous, what a Python
# runner makes of it: the model it serves, None for none, "refused" when its
# own reader refuses the body; None cases are refused for the readers that
# decode, trim or case-fold, or that complete an unterminated part)
REFUSED = [
    ("a second model field (Python keeps the last)",
     "multipart/form-data; boundary=XX",
     _form(b"XX", AUDIO, M(ALLOWED.encode()), M(PRIVATE.encode())),
     "more than one 'model' form field", PRIVATE),
    ("two boundary parameters, the body framed by the second",
     "multipart/form-data; boundary=XX; boundary=YY",
     _form(b"YY", AUDIO, M(PRIVATE.encode())),
     "a Content-Type with two boundary parameters", PRIVATE),
    ("an RFC 2231 field name",
     "multipart/form-data; boundary=XX",
     _form(b"XX", AUDIO, _part(b"name*=utf-8''model", PRIVATE.encode())),
     "an encoded form field name (name*=), which sluice does not decode", PRIVATE),
    ("RFC 2231 continuations",
     "multipart/form-data; boundary=XX",
     _form(b"XX", AUDIO, _part(b'name*0="mo"; name*1="del"', PRIVATE.encode())),
     "an encoded form field name (name*=), which sluice does not decode", PRIVATE),
    ("the field named twice in one Content-Disposition",
     "multipart/form-data; boundary=XX",
     _form(b"XX", AUDIO, M(ALLOWED.encode()),
           _part(b'name="x"; name="model"', PRIVATE.encode())),
     "a part that names its field twice", PRIVATE),
    ("two Content-Disposition headers in a part",
     "multipart/form-data; boundary=XX",
     _form(b"XX", AUDIO, M(ALLOWED.encode()),
           _part(b'name="x"', PRIVATE.encode(),
                 b'Content-Disposition: form-data; name="model"\r\n')),
     "a part with two Content-Disposition headers", PRIVATE),
    ("LF-only line ends",
     "multipart/form-data; boundary=XX",
     _form(b"XX", AUDIO, M(PRIVATE.encode())).replace(b"\r\n", b"\n"),
     "a line that ends in LF alone, not CRLF", "refused"),
    ("a delimiter followed by more than CRLF (data to python-multipart)",
     "multipart/form-data; boundary=XX",
     _form(b"XX", _part(b'name="file"', b"RIFF\r\n--XXjunk"), M(PRIVATE.encode())),
     "a boundary followed by more than CRLF or '--'", PRIVATE),
    ("a name that is model in another case",
     "multipart/form-data; boundary=XX",
     _form(b"XX", AUDIO, _part(b'name="Model"', PRIVATE.encode())),
     "a form field name that is 'model' only when decoded, trimmed or case-folded", None),
    ("a preamble",
     "multipart/form-data; boundary=XX",
     b"preamble\r\n" + _form(b"XX", AUDIO, M(ALLOWED.encode())),
     "a multipart body that does not open with its boundary", "refused"),
    ("a form without its close delimiter",
     "multipart/form-data; boundary=XX",
     _form(b"XX", AUDIO, M(PRIVATE.encode()), close=False),
     "a part that does not end with the boundary", None),
    ("an urlencoded form naming the model",
     "application/x-www-form-urlencoded",
     b"model=" + PRIVATE.encode(),
     "a 'model' in an application/x-www-form-urlencoded body, which sluice does not read", PRIVATE),
    ("JSON in UTF-16",
     "application/json",
     json.dumps({"model": PRIVATE}).encode("utf-16"),
     "a JSON body in UTF-16 or UTF-32 (sluice reads UTF-8, as RFC 8259 requires)", PRIVATE),
]

# Bodies sluice reads as the runner does: (label, content-type, body).
SERVED = [
    ("the form curl -F and the OpenAI SDKs send",
     "multipart/form-data; boundary=------------------------d74496d66958873e",
     _form(b"------------------------d74496d66958873e", AUDIO, M(ALLOWED.encode()),
           _part(b'name="language"', b"en"))),
    ("name = \"model\", which the email package reads as model",
     'multipart/form-data; boundary="XX"',
     _form(b"XX", AUDIO, _part(b'name = "model"', ALLOWED.encode()))),
    ("an epilogue after the close delimiter",
     "multipart/form-data; boundary=XX",
     _form(b"XX", M(ALLOWED.encode()), AUDIO) + b"epilogue\r\n--XX\r\n"),
    ("duplicate JSON keys (every one is rewritten)",
     "application/json",
     b'{"model":"' + ALLOWED.encode() + b'","model":"' + PRIVATE.encode() + b'"}'),
]


def _post(c, key, ctype, body, extra=()):
    hd = [("Authorization", "Bearer " + key)]
    if ctype is not None:
        hd.append(("Content-Type", ctype))
    hd.extend(extra)
    r = c.request("POST", PATH, hd, body)
    r.read_all(timeout=10)
    return r


def test_the_runner_never_serves_a_model_the_allow_list_refuses():
    with formrunner.FormRunner() as runner, h.Gateway(_config(runner)) as gw:
        with gw.client() as c:
            # What the runner itself makes of each body: the refused ones
            # are the ones it would have served the private model from (or
            # refused itself), so the test is about real readings.
            for label, ct, body, _, python in REFUSED:
                try:
                    served = formrunner.served_model(body, ct)[1]
                except ValueError:
                    served = "refused"
                assert served == python, (label, served)
            for label, ct, body, why, _ in REFUSED:
                for key in (KEY, OPEN_KEY):
                    seen = len(runner.server.seen)
                    r = _post(c, key, ct, body)
                    doc = h.assert_error(r, 400, "bad_request", read=False)
                    assert doc["error"]["message"] == WHY + why, (label, doc)
                    assert len(runner.server.seen) == seen, label
            for label, ct, body in SERVED:
                r = _post(c, KEY, ct, body)
                assert r.status == 200, (label, r.status, bytes(r.data[:300]))
                doc = json.loads(bytes(r.data))
                assert doc["served"] == ALLOWED, (label, doc)
            # The private model, named plainly, is refused as before.
            r = _post(c, KEY, "multipart/form-data; boundary=XX",
                      _form(b"XX", AUDIO, M(PRIVATE.encode())))
            h.assert_error(r, 404, "model_not_found")
            # The same body to a tenant without an allow-list: served.
            r = _post(c, OPEN_KEY, "multipart/form-data; boundary=XX",
                      _form(b"XX", AUDIO, M(PRIVATE.encode())))
            assert r.status == 200 and json.loads(bytes(r.data))["served"] == PRIVATE


def test_a_head_that_leaves_the_body_open_is_refused():
    form = _form(b"XX", AUDIO, M(ALLOWED.encode()))
    with formrunner.FormRunner() as runner, h.Gateway(_config(runner)) as gw:
        with gw.client() as c:
            cases = [
                ("two Content-Type headers",
                 [("Content-Type", "application/json")]),
                ("a Content-Encoding, which sluice does not decode to read the model",
                 [("Content-Encoding", "gzip")]),
            ]
            for why, extra in cases:
                r = _post(c, KEY, "multipart/form-data; boundary=XX", form, extra)
                doc = h.assert_error(r, 400, "bad_request", read=False)
                assert doc["error"]["message"] == WHY + why, doc
            assert runner.server.seen == []
            # Content-Encoding: identity is no encoding.
            r = _post(c, KEY, "multipart/form-data; boundary=XX", form,
                      [("Content-Encoding", "identity")])
            assert r.status == 200, bytes(r.data[:300])
            assert json.loads(bytes(r.data))["served"] == ALLOWED
        # Nothing leaked: the tenant's slots are all back.
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="t")

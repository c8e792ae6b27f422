# SPDX-License-Identifier: BSD-2-Clause
"""Real client SDKs against sluice: the OpenAI Node SDK (tests/js, installed
by ./quickstart) lists models, streams a chat under an alias, and reads
sluice's own errors as the typed exceptions its users catch."""

import json
import os
import shutil
import subprocess

import harness as h

JS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "js")

CONFIG = """\
listen: "127.0.0.1:{port}"
workers: 1
upstreams:
  main:
    url: "{stub}"
models:
  llama:
    aliases: ["gpt-4o"]
    targets: [{{upstream: main, model: "org/Llama-Internal"}}]
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 5
    models: [llama]
"""


def _run_sdk(base_url, key, env=None):
    node = shutil.which("node")
    assert node, "node is not installed (./quickstart installs the test tools)"
    assert os.path.isdir(os.path.join(JS, "node_modules", "openai")), \
        "tests/js/node_modules/openai is missing: run ./quickstart build"
    p = subprocess.run([node, os.path.join(JS, "openai_sdk.mjs"), base_url, key],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **(env or {})))
    assert p.returncode == 0, "node exited %d: %s" % (p.returncode, p.stderr[-2000:])
    return json.loads(p.stdout)


def test_the_openai_sdk_lists_streams_and_reads_errors_through_sluice():
    with h.Stub() as stub:
        with h.Gateway(CONFIG.format(port=h.free_port(), stub=stub.url)) as gw:
            out = _run_sdk("http://127.0.0.1:%d/v1" % gw.port, "sk-acme")
        _check(out, stub)


def test_the_openai_sdk_over_tls():
    """The same, to a TLS listener: the SDK trusts the test CA the way a
    user's deployment would trust its own (NODE_EXTRA_CA_CERTS)."""
    files = h.TLSFiles()
    cert, key = files.leaf()
    config = CONFIG + "tls:\n  cert: %s\n  key: %s\n" % (cert, key)
    with h.Stub() as stub:
        with h.Gateway(config.format(port=h.free_port(), stub=stub.url)) as gw:
            out = _run_sdk("https://localhost:%d/v1" % gw.port, "sk-acme",
                           env={"NODE_EXTRA_CA_CERTS": files.ca})
        _check(out, stub)


def _check(out, stub):
    """What the SDK saw, exactly; stub: the runner (still running)."""
    assert stub.stats()["requests"] == 2
    last = stub.direct("GET", "/stub/last")
    last.read_all(timeout=10)
    assert json.loads(bytes(last.data))["model"] == "org/Llama-Internal"
    created = out["models"][0]["created"]
    assert out["models"] == [
        {"id": "gpt-4o", "object": "model", "created": created, "owned_by": "sluice"},
        {"id": "llama", "object": "model", "created": created, "owned_by": "sluice"}]
    assert out["model"] == out["models"][0]
    # The stream: the stub's 16 events, each content delta in order; the
    # usage chunk sluice asked for is not the client's (it did not ask).
    chunks = out["chunks"]
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == \
        ["tok%d " % i for i in range(16)], chunks[:2]
    assert all("usage" not in c for c in chunks)
    # Each event named the runner's model; the client sees its alias.
    assert [c["model"] for c in chunks] == ["gpt-4o"] * 16
    # Non-streamed: the stub's answer, routed as llama.
    assert out["sluiceModel"] == "llama"
    assert out["completion"]["choices"][0]["message"]["content"] == \
        "".join("tok%d " % i for i in range(16))
    assert out["completion"]["usage"]["completion_tokens"] == 16
    # sluice's errors are the SDK's typed errors, with OpenAI's codes.
    msg = "The model 'nope' does not exist or you do not have access to it."
    for k in ("notFound", "notFoundRetrieve"):
        assert out[k]["name"] == "NotFoundError", out[k]
        assert (out[k]["status"], out[k]["code"], out[k]["type"]) == \
            (404, "model_not_found", "invalid_request_error"), out[k]
        assert out[k]["message"] == "404 " + msg, out[k]
    assert out["noModel"]["name"] == "BadRequestError", out["noModel"]
    assert (out["noModel"]["status"], out["noModel"]["code"]) == (400, "bad_request")

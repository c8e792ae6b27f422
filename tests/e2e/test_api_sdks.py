# SPDX-License-Identifier: BSD-2-Clause
"""Real SDKs of the APIs sluice governs besides chat (issue 34), from
tests/js/api_sdks.mjs: the Anthropic SDK and the Vercel AI SDK with
@ai-sdk/anthropic (both send X-Api-Key), and the OpenAI SDK's Responses
API, through sluice to the stub runner speaking each API as vLLM does."""

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
    aliases: ["claude-x", "gpt-x"]
    targets: [{{upstream: main, model: "org/Llama-Internal"}}]
tenants:
  acme:
    keys: ["sk-acme"]
    max_streams: 5
    models: [llama]
"""

TEXT16 = "".join("tok%d " % i for i in range(16))


def _sdk(scenario, gw, key="sk-acme", headers=None):
    node = shutil.which("node")
    assert node, "node is not installed (./quickstart installs the test tools)"
    for m in ("@anthropic-ai/sdk", "ai", "@ai-sdk/anthropic", "openai"):
        assert os.path.isdir(os.path.join(JS, "node_modules", m)), \
            "tests/js/node_modules/%s is missing: run ./quickstart build" % m
    args = [node, os.path.join(JS, "api_sdks.mjs"), scenario,
            "http://127.0.0.1:%d" % gw.port, key]
    if headers:
        args.append(json.dumps(headers))
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, "node exited %d: %s" % (p.returncode, p.stderr[-2000:])
    return json.loads(p.stdout)


def _gw(stub):
    return h.Gateway(CONFIG.format(port=h.free_port(), stub=stub.url))


def test_the_anthropic_sdk_streams_and_creates_under_an_alias_with_x_api_key():
    with h.Stub() as stub, _gw(stub) as gw:
        out = _sdk("anthropic", gw, headers={"X-Stub-Usage": "21,16"})
        last = stub.direct("GET", "/stub/last")
        last.read_all(timeout=10)
        assert json.loads(bytes(last.data))["model"] == "org/Llama-Internal"
    # Every event (the SDK yields all but ping), the alias set back in
    # message_start and in the JSON body.
    assert out["events"] == ["message_start", "content_block_start"] + \
        ["content_block_delta"] * 16 + ["content_block_stop", "message_delta",
                                        "message_stop"], out["events"]
    assert out["startModel"] == "claude-x"
    assert out["final"] == {"model": "claude-x", "text": TEXT16, "stop": "end_turn",
                            "usage": {"input_tokens": 21, "output_tokens": 16}}, out["final"]
    assert out["created"] == {"model": "claude-x", "text": TEXT16,
                              "usage": {"input_tokens": 21, "output_tokens": 16}}
    assert out["sluiceModel"] == "llama"
    # sluice's own errors are the SDK's typed errors, in Anthropic's shape.
    assert out["unknown"]["name"] == "NotFoundError", out["unknown"]
    assert (out["unknown"]["status"], out["unknown"]["type"], out["unknown"]["code"]) == \
        (404, "not_found_error", "model_not_found"), out["unknown"]
    assert out["badKey"]["name"] == "AuthenticationError", out["badKey"]
    assert (out["badKey"]["status"], out["badKey"]["type"], out["badKey"]["code"]) == \
        (401, "authentication_error", "invalid_api_key"), out["badKey"]


def test_the_vercel_ai_sdk_with_anthropic_streams_and_generates_through_sluice():
    with h.Stub() as stub, _gw(stub) as gw:
        out = _sdk("ai-sdk", gw, headers={"X-Stub-Usage": "21,16"})
    assert out["parts"] == ["tok%d " % i for i in range(16)], out["parts"]
    assert out["text"] == TEXT16
    for k in ("usage", "genUsage"):
        assert (out[k]["inputTokens"], out[k]["outputTokens"]) == (21, 16), out[k]
    assert out["responseModel"] == out["genModel"] == "claude-x", out


WHY = "the model runner failed mid-stream: connection closed before the response ended"


def test_a_runner_dying_mid_stream_is_told_to_each_sdk_in_its_api():
    cut = {"X-Stub-Abort-After": "3", "X-Stub-Interval-Ms": "0"}
    with h.Stub() as stub, _gw(stub) as gw:
        # Anthropic's SDK raises its APIError, after the text that arrived.
        out = _sdk("anthropic-cut", gw, headers=cut)
        assert out["text"] == "tok0 tok1 tok2 ", out
        assert (out["error"]["name"], out["error"]["type"]) == ("APIError", "api_error"), out
        assert out["error"]["message"].startswith(WHY), out["error"]
        # OpenAI's chat: its APIError with vLLM's code, not "terminated".
        out = _sdk("chat-cut", gw, headers=cut)
        assert out["text"] == "tok0 tok1 tok2 ", out
        assert (out["error"]["name"], out["error"]["type"], out["error"]["code"],
                out["error"]["message"]) == ("APIError", "server_error", "upstream_failed", WHY)
        # OpenAI's Responses: the SDK hands its user the error event (it
        # throws on no Responses event), numbered after the 7 relayed; the
        # cut after it is then the network error it always was.
        out = _sdk("responses-cut", gw, headers=cut)
        assert out["text"] == "tok0 tok1 tok2 ", out
        assert out["errors"] == [{"type": "error", "code": "upstream_failed", "message": WHY,
                                  "sequence_number": 7}], out["errors"]
        assert out["error"]["message"] == "terminated", out["error"]

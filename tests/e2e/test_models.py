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

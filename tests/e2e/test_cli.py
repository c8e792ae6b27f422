# SPDX-License-Identifier: BSD-2-Clause
"""Command line: `sluice [-c FILE] [-t] [-V] [-h]` and config checking."""

import os
import re
import socket
import time

import harness as h

VALID = """\
listen: "127.0.0.1:{port}"
workers: 2
stream_buffer: 64KiB
drain_timeout: 30s
timeouts:
  upstream_connect: 5s
  upstream_first_byte: 120s
  upstream_idle: 120s
  client_header: 10s
  client_stall: 30s
  keepalive: 60s
limits:
  max_header_bytes: 32KiB
  max_body_bytes: 16MiB
  max_connections: 20000
upstreams:
  main:
    url: "http://127.0.0.1:9000"
    api_key: "secret"
tenants:
  acme:
    keys: ["sk-acme-1", "sk-acme-2"]
    max_streams: 100
    retry_after: 1
    upstream: main
"""

# Line numbers matter: the test asserts them.
SEVERAL_PROBLEMS = """\
workers: 2
stream_buffer: 12XB
bogus_key: 1
workers: 3
upstreams:
  main:
    url: "http://127.0.0.1:9000"
tenants:
  acme:
    keys: ["sk-1"]
    max_streams: -1
    retry_after: 1
    upstream: main
"""

LINE_RE = r"^{file}:(\d+):(\d+): (.+)$"


def problems(path, text):
    """{line: [(col, message)]} from FILE:LINE:COL: message lines."""
    rx = re.compile(LINE_RE.format(file=re.escape(path)))
    found = {}
    for line in text.splitlines():
        m = rx.match(line.strip())
        if m:
            found.setdefault(int(m.group(1)), []).append((int(m.group(2)), m.group(3)))
    return found


def test_check_valid_file_prints_ok():
    path = h.write_config(VALID.format(port=h.free_port()))
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 0, "exit %d, output %r %r" % (rc, out, err)
    lines = (out + err).strip().splitlines()
    assert "%s: ok" % path in lines, "no '%s: ok' line in %r" % (path, out + err)


def test_check_reports_every_problem_with_line_and_column():
    path = h.write_config(SEVERAL_PROBLEMS)
    rc, out, err = h.run_sluice(["-t", "-c", path])
    text = out + err
    assert rc == 1, "exit %d (want 1), output %r" % (rc, text)
    assert "%s: ok" % path not in text
    found = problems(path, text)
    for line, what in ((2, "bad size stream_buffer: 12XB"), (3, "unknown key bogus_key"),
                       (4, "duplicate key workers"), (11, "max_streams: -1 out of range")):
        assert line in found, "no problem reported at line %d (%s); output:\n%s" % (
            line, what, text)
        for col, _ in found[line]:
            assert col >= 1, "column %d at line %d" % (col, line)
    assert any(c == 1 and "bogus_key" in m for c, m in found[3]), \
        "unknown key must be reported at 3:1 and named: %r" % found[3]
    assert any(c == 1 for c, _ in found[4]), "duplicate key must be at 4:1: %r" % found[4]
    listen = [l for l, msgs in found.items() for _, m in msgs if "listen" in m]
    assert listen, "missing 'listen' not reported as FILE:LINE:COL: ...listen...; output:\n" + text
    assert len([1 for msgs in found.values() for _ in msgs]) >= 5, \
        "expected at least 5 problems, got:\n" + text


def test_check_reports_wrong_type_alias_and_nested_unknown_key():
    text = (
        'listen: "127.0.0.1:%d"\n'      # 1
        "workers: many\n"               # 2  wrong type
        "upstreams:\n"                  # 3
        "  main:\n"                     # 4
        '    url: "http://127.0.0.1:9000"\n'  # 5
        "tenants:\n"                    # 6
        "  acme:\n"                     # 7
        '    keys: ["sk-1"]\n'          # 8
        "    retry_after: &ra 5\n"      # 9
        "    max_streams: *ra\n"        # 10 alias
        "    upstream: main\n"          # 11
        "    max_stream: 3\n"           # 12 misspelt key
    ) % h.free_port()
    path = h.write_config(text)
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 1, "exit %d (want 1), output %r" % (rc, out + err)
    found = problems(path, out + err)
    for line, what in ((2, "workers: many"), (10, "alias *ra"), (12, "unknown key max_stream")):
        assert line in found, "no problem reported at line %d (%s); output:\n%s" % (
            line, what, out + err)
    assert any("max_stream" in m for _, m in found[12]), found[12]


def test_check_reports_out_of_range_and_unknown_upstream():
    text = (
        'listen: "127.0.0.1:%d"\n'      # 1
        "workers: 1000\n"               # 2 out of range
        "upstreams:\n"                  # 3
        "  main:\n"                     # 4
        '    url: "http://127.0.0.1:9000"\n'  # 5
        "tenants:\n"                    # 6
        "  acme:\n"                     # 7
        '    keys: ["sk-1"]\n'          # 8
        "    max_streams: 4\n"          # 9
        "    retry_after: 1\n"          # 10
        "    upstream: nowhere\n"       # 11 no such upstream
    ) % h.free_port()
    path = h.write_config(text)
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 1, "exit %d (want 1), output %r" % (rc, out + err)
    found = problems(path, out + err)
    assert 2 in found, "workers: 1000 not reported at line 2:\n" + out + err
    assert 11 in found, "unknown upstream 'nowhere' not reported at line 11:\n" + out + err


def test_check_missing_file_fails():
    path = os.path.join(h.tmpdir(), "does-not-exist.yaml")
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 1, "exit %d (want 1)" % rc
    assert path in out + err, "the missing file is not named: %r" % (out + err)


def _configure_version():
    src = os.environ.get("SLUICE_SRCDIR")
    if not src:
        return None
    try:
        with open(os.path.join(src, "configure.ac")) as f:
            m = re.search(r"AC_INIT\(\[sluice\],\s*\[([^\]]+)\]", f.read())
            return m.group(1) if m else None
    except OSError:
        return None


def test_version_flag_prints_version():
    rc, out, err = h.run_sluice(["-V"])
    assert rc == 0, "exit %d" % rc
    text = out + err
    assert "sluice" in text, text
    want = _configure_version()
    if want:
        assert want in text, "version %s not in %r" % (want, text)
    else:
        assert re.search(r"\d+\.\d+", text), text


def test_help_flag_prints_usage():
    rc, out, err = h.run_sluice(["-h"])
    assert rc == 0, "exit %d" % rc
    text = out + err
    assert re.search(r"usage", text, re.I), text
    for opt in ("-c", "-t", "-V", "-h"):
        assert opt in text, "%s missing from usage: %r" % (opt, text)


def test_bad_option_fails():
    rc, out, err = h.run_sluice(["-Z"])
    assert rc != 0, "exit 0 on an unknown option"
    assert out + err, "no message on an unknown option"


def test_gateway_refuses_to_start_on_invalid_file():
    port = h.free_port()
    path = h.write_config(VALID.format(port=port).replace("max_streams: 100",
                                                          "max_streams: lots"))
    rc, out, err = h.run_sluice(["-c", path], timeout=10)
    assert rc != 0, "sluice started (exit 0) on an invalid file"
    found = problems(path, out + err)
    line = VALID.splitlines().index("    max_streams: 100") + 1
    assert line in found, "problem at line %d not reported: %r" % (line, out + err)
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect((h.HOST, port))
        raise AssertionError("port %d accepts connections after a refused start" % port)
    except ConnectionRefusedError:
        pass
    finally:
        s.close()


def test_check_accepts_access_log_and_log_level():
    for extra in ('access_log: stderr\nlog_level: debug\n',
                  'access_log: off\nlog_level: error\n',
                  'access_log: "%s"\nlog_level: warn\n' % os.path.join(h.tmpdir(), "access.log"),
                  'workers: auto\nlog_level: info\n'):
        text = VALID.format(port=h.free_port()).replace("workers: 2\n", "") + extra
        path = h.write_config(text)
        rc, out, err = h.run_sluice(["-t", "-c", path])
        assert rc == 0, "%r rejected: %r" % (extra, out + err)
        assert "%s: ok" % path in (out + err).splitlines()


def test_check_rejects_bad_log_level_and_bad_duration():
    text = VALID.format(port=h.free_port()) + "log_level: loud\n"
    text = text.replace("drain_timeout: 30s", "drain_timeout: 30 parsecs")
    path = h.write_config(text)
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 1, "exit %d, output %r" % (rc, out + err)
    found = problems(path, out + err)
    nlines = len(text.splitlines())
    assert nlines in found, "log_level: loud (line %d) not reported: %r" % (nlines, out + err)
    assert 4 in found, "drain_timeout: 30 parsecs (line 4) not reported: %r" % (out + err)


def test_workers_auto_starts_one_worker_per_cpu():
    with h.Stub() as stub:
        cfg = h.gateway_config(stub, workers="auto")
        with h.Gateway(cfg, allow_worker_changes=True) as gw:
            ncpu = {os.cpu_count(), len(os.sched_getaffinity(0))}
            n = len(h.wait_until(lambda: gw.worker_pids() if len(gw.worker_pids()) in ncpu
                                 else None, 10, msg="one worker per CPU %r" % ncpu))
            assert n in ncpu


def _line_col(text, needle, at=None):
    """1-based (line, column) of `at` (default: needle itself) in the line
    of `text` that contains `needle`."""
    for n, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return n, line.index(at if at is not None else needle) + 1
    raise AssertionError("%r not in the config" % needle)


def test_check_and_start_refuse_a_fifo_at_once():
    path = os.path.join(h.tmpdir(), "fifo.yaml")
    os.mkfifo(path, 0o600)
    want = "%s:1:1: not a regular file (a FIFO)" % path
    for args in (["-t", "-c", path], ["-c", path]):
        rc, out, err = h.run_sluice(args, timeout=10)
        assert rc == 1, "%r: exit %d, output %r" % (args, rc, out + err)
        assert want in err.splitlines(), "%r: no %r line in %r" % (args, want, err)


def test_check_warns_about_a_config_readable_by_others_and_still_passes():
    for mode, warns in ((0o644, True), (0o604, True), (0o640, False), (0o600, False)):
        path = h.write_config(VALID.format(port=h.free_port()))
        os.chmod(path, mode)
        rc, out, err = h.run_sluice(["-t", "-c", path])
        assert rc == 0, "mode %o: exit %d, output %r" % (mode, rc, out + err)
        assert "%s: ok" % path in out.splitlines(), out
        lines = [ln for ln in err.splitlines() if "readable by others" in ln]
        if warns:
            assert lines == ["sluice: warning: %s holds API keys and is readable "
                             "by others (chmod o-r)" % path], \
                "mode %o: stderr %r" % (mode, err)
        else:
            assert not lines, "mode %o warned: %r" % (mode, err)


def test_check_and_start_report_an_access_log_that_cannot_be_opened():
    for dest, why in (("/nonexistent-sluice-dir/access.log", "No such file or directory"),
                      (h.tmpdir(), "Is a directory")):
        text = VALID.format(port=h.free_port()) + 'access_log: "%s"\n' % dest
        path = h.write_config(text)
        line, col = _line_col(text, "access_log:", '"')
        want = "%s:%d:%d: access_log: cannot open '%s': %s" % (path, line, col, dest, why)
        for args in (["-t", "-c", path], ["-c", path]):
            rc, out, err = h.run_sluice(args, timeout=10)
            assert rc == 1, "%r: exit %d, output %r" % (args, rc, out + err)
            assert want in err.splitlines(), "%r: no %r line in %r" % (args, want, err)


def test_check_accepts_200k_keys_and_rejects_deep_nesting_quickly():
    """Bounded, not timed: run_sluice's watchdog (30 s) is two orders of
    magnitude above what linear loading takes, and below what the old
    quadratic checks took (about 56 s for 200k keys, 42 s for the nesting)."""
    parts = [VALID.format(port=h.free_port())]
    for t in range(2000):
        parts.append("  t%d:\n    max_streams: 1\n    keys:\n" % t)
        parts.extend('      - "sk-%d-%d"\n' % (t, k) for k in range(100))
    path = h.write_config("".join(parts))
    rc, out, err = h.run_sluice(["-t", "-c", path], timeout=30)
    assert rc == 0, "exit %d, output %r" % (rc, (out + err)[:2000])
    assert "%s: ok" % path in out.splitlines(), out

    path = h.write_config("listen: " + "[" * 100000 + "]" * 100000 + "\n")
    rc, out, err = h.run_sluice(["-t", "-c", path], timeout=30)
    assert rc == 1, "exit %d" % rc
    assert err.splitlines() == [
        "%s:1:40: nesting deeper than 32 levels (lists and mappings inside "
        "each other)" % path], err[:2000]


POOL = """\
listen: "127.0.0.1:{port}"
upstreams:
  llama:
    replicas:
      - url: "http://127.0.0.1:9001"
        weight: 2
        max_streams: 64
      - url: "http://127.0.0.1:9002"
    api_key: "secret"
    balance: least_loaded
    retries: 2
    retry_on: [connect, busy]
    health:
      path: /health
      interval: 2s
      timeout: 1s
      fall: 3
      rise: 2
    eject:
      failures: 5
      duration: 30s
      max_percent: 50
  single:
    url: "http://127.0.0.1:9000"
tenants:
  acme:
    keys: ["sk-acme-1"]
    max_streams: 10
    upstream: llama
"""


def test_check_accepts_an_upstream_pool():
    path = h.write_config(POOL.format(port=h.free_port()))
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 0, "exit %d, output %r" % (rc, out + err)
    assert out.splitlines() == ["%s: ok" % path], out
    assert err == "", err


def test_check_rejects_a_duplicate_replica_url_at_the_second():
    # The same replica twice once its trailing slash is stripped.
    text = POOL.format(port=h.free_port()).replace(
        'url: "http://127.0.0.1:9002"', 'url: "http://127.0.0.1:9001/"')
    path = h.write_config(text)
    line, col = _line_col(text, '9001/"', '"')
    first, _ = _line_col(text, '9001"')
    rc, out, err = h.run_sluice(["-t", "-c", path])
    assert rc == 1, "exit %d (want 1), output %r" % (rc, out + err)
    assert "%s: ok" % path not in out
    assert err.splitlines() == [
        "%s:%d:%d: upstreams.llama.replicas[1].url: duplicate URL "
        "'http://127.0.0.1:9001' (first at line %d)" % (path, line, col, first)], err

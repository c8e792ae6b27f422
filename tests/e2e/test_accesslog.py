# SPDX-License-Identifier: BSD-2-Clause
"""The access log: one JSON line per request with the documented fields, the
right `end` for every way a request ends, never a key, SIGUSR1 reopen."""

import datetime
import json
import os
import re
import signal
import socket
import time

import harness as h
from harness import ACME_KEY, ACME_KEY2, BETA_KEY, UPSTREAM_KEY, Gateway, Stub

JSON_CT = {"Content-Type": "application/json"}
TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _created_mode():
    """0640 as the umask leaves it."""
    um = os.umask(0)
    os.umask(um)
    return 0o640 & ~um


def _log_gw(stub, path=None, **kw):
    path = path or h.tmpfile("access", ".log")
    gw = Gateway(stub=stub, access_log=path, **kw)
    gw.access_path = path
    return gw


def _post(gw, key=ACME_KEY, path="/v1/chat/completions", **stub_kw):
    return gw.request("POST", path, dict(h.stub_headers(**stub_kw), **JSON_CT),
                      h.stream_body(), key=key)


def _one_more(gw, before, timeout=5.0):
    """Wait for exactly one new line after `before` lines; return it."""
    lines = h.wait_access_lines(gw.access_path, before + 1, timeout)
    assert len(lines) == before + 1, "expected 1 new line, got %d: %r" % (
        len(lines) - before, lines[before:])
    return lines[-1]


def _check_line(line, nworkers=2):
    assert sorted(line) == sorted(h.ACCESS_LOG_FIELDS), "fields %r, documented %r" % (
        tuple(line), h.ACCESS_LOG_FIELDS)
    assert TIME_RE.match(line["time"]), line["time"]
    t = datetime.datetime.strptime(line["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc)
    skew = abs((datetime.datetime.now(datetime.timezone.utc) - t).total_seconds())
    assert skew < 30, "time %s is %.0fs off" % (line["time"], skew)
    assert isinstance(line["worker"], int) and 0 <= line["worker"] < nworkers, line["worker"]
    assert line["peer"] == "127.0.0.1", line["peer"]
    for k in ("tenant", "method", "path", "end"):
        assert isinstance(line[k], str) and line[k], (k, line)
    for k in ("status", "bytes_out"):
        assert isinstance(line[k], int) and line[k] >= 0, (k, line)
    for k in ("ttfb_ms", "duration_ms", "paused_ms", "queued_ms"):
        assert isinstance(line[k], (int, float)) and line[k] >= 0, (k, line)
    assert line["ttfb_ms"] <= line["duration_ms"] + 0.1, line
    assert line["paused_ms"] <= line["duration_ms"] + 0.1, line
    assert line["queued_ms"] <= line["duration_ms"] + 0.1, line


def test_access_log_has_one_json_line_per_request_with_the_documented_fields():
    with Stub() as stub, _log_gw(stub) as gw:
        # A relayed stream, read raw so its byte count is known exactly.
        with socket.create_connection((h.HOST, gw.port), timeout=10) as s:
            body = h.stream_body()
            s.sendall(("POST /v1/chat/completions?api_key=qs-secret&x=1 HTTP/1.1\r\n"
                       "Host: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                       "X-Stub-Events: 5\r\nX-Stub-Interval-Ms: 100\r\nX-Stub-Delay-Ms: 300\r\n"
                       "Connection: close\r\nContent-Length: %d\r\n\r\n"
                       % (ACME_KEY, len(body))).encode() + body)
            raw = bytearray()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                d = s.recv(65536)
                if not d:
                    break
                raw += d
        assert raw.startswith(b"HTTP/1.1 200 ") and raw.endswith(b"0\r\n\r\n"), raw[-100:]
        line = _one_more(gw, 0)
        _check_line(line)
        assert line["tenant"] == "acme" and line["method"] == "POST"
        assert line["path"] == "/v1/chat/completions", "query string logged: %r" % line["path"]
        assert line["status"] == 200 and line["end"] == "done", line
        assert line["bytes_out"] == len(raw), "bytes_out %d, client got %d bytes" % (
            line["bytes_out"], len(raw))
        # (Lower bounds only: a slower gateway, as under valgrind, only
        # makes them larger.)
        assert 290 <= line["ttfb_ms"], "ttfb_ms %r with a 300 ms head delay" % line["ttfb_ms"]
        assert line["duration_ms"] >= line["ttfb_ms"] + 350, \
            "duration_ms %r for 5 events 100 ms apart" % line["duration_ms"]
        assert line["paused_ms"] == 0 and line["queued_ms"] == 0, line
        # One line per request on a keep-alive connection, in order.
        c = gw.client()
        for key, want_tenant, want in ((ACME_KEY2, "acme", 200), (BETA_KEY, "beta", 200),
                                       ("sk-nope", "-", 401)):
            r = c.request("GET", "/v1/models", h.bearer(key))
            assert r.status == want, (key, r.status)
        r = c.request("GET", "/elsewhere?k=v", h.bearer(ACME_KEY))
        assert r.status == 404
        lines = h.wait_access_lines(gw.access_path, 5)
        assert len(lines) == 5, lines
        for ln in lines:
            _check_line(ln)
        got = [(ln["tenant"], ln["method"], ln["path"], ln["status"], ln["end"]) for ln in lines[1:]]
        assert got == [("acme", "GET", "/v1/models", 200, "done"),
                       ("beta", "GET", "/v1/models", 200, "done"),
                       ("-", "GET", "/v1/models", 401, "rejected"),
                       ("-", "GET", "/elsewhere", 404, "rejected")], got
        assert lines[3]["ttfb_ms"] == 0 and lines[4]["ttfb_ms"] == 0, "ttfb of unrelayed answers"
        with open(gw.access_path, "rb") as f:
            data = f.read()
        assert b"qs-secret" not in data and b"k=v" not in data
        assert os.stat(gw.access_path).st_mode & 0o777 == _created_mode(), \
            "access log mode %o, documented 0640" % (os.stat(gw.access_path).st_mode & 0o777)


def test_access_log_end_is_done_rejected_client_gone_and_upstream_error():
    with Stub() as stub:
        dead = "http://%s:%d" % (h.HOST, h.closed_port())
        with _log_gw(stub, upstreams={"dead": {"url": dead}},
                     tenants={"acme": {"max_streams": 1},
                              "beta": {"upstream": "dead"}}) as gw:
            n = 0
            # done
            r = _post(gw, events=3, interval=0)
            assert r.status == 200 and r.complete
            ln = _one_more(gw, n)
            n += 1
            assert (ln["status"], ln["end"], ln["tenant"]) == (200, "done", "acme"), ln
            # rejected: 401, then 429
            r = _post(gw, key="sk-unknown", events=1)
            assert r.status == 401
            ln = _one_more(gw, n)
            n += 1
            assert (ln["status"], ln["end"], ln["tenant"]) == (401, "rejected", "-"), ln
            held = gw.hold_hung(stub, "hung", 1)
            r = _post(gw, events=1)
            assert r.status == 429
            ln = _one_more(gw, n)
            n += 1
            assert (ln["status"], ln["end"], ln["tenant"]) == (429, "rejected", "acme"), ln
            assert ln["ttfb_ms"] == 0 and ln["bytes_out"] > 0
            # The hung request whose client leaves before any response: 499.
            held[0].close()
            ln = _one_more(gw, n)
            n += 1
            assert (ln["status"], ln["end"], ln["tenant"]) == (499, "client_gone", "acme"), ln
            # client_gone mid-stream
            c, r = gw.admit(events=1000, interval=20, delay=50, tag="gone")
            r.read_events(3, timeout=5)
            c.close()
            ln = _one_more(gw, n)
            n += 1
            assert (ln["status"], ln["end"]) == (200, "client_gone"), ln
            assert ln["ttfb_ms"] >= 45 and ln["bytes_out"] >= len(b"".join(
                e for _, e in r.events)), ln
            # upstream_error: the upstream aborts mid-stream ...
            c, r = gw.admit(events=10, size=300, interval=20, abort_after=3, tag="abort")
            r.read_all(timeout=10)
            assert r.cut
            ln = _one_more(gw, n)
            n += 1
            assert (ln["status"], ln["end"]) == (200, "upstream_error"), ln
            # ... or cannot be reached at all (502).
            r = _post(gw, key=BETA_KEY, events=1)
            assert r.status == 502
            ln = _one_more(gw, n)
            n += 1
            assert (ln["status"], ln["end"], ln["tenant"]) == (502, "upstream_error", "beta"), ln
            assert ln["ttfb_ms"] == 0, ln
            for ln in h.access_lines(gw.access_path):
                _check_line(ln)


def test_access_log_end_is_timeout_for_504_and_408():
    with Stub() as stub, _log_gw(stub, timeouts={"upstream_first_byte": "500ms",
                                                 "client_header": "500ms"}) as gw:
        c, r = gw.open_stream(hang=True, tag="hang", timeout=10)
        assert r.status == 504
        ln = _one_more(gw, 0)
        assert (ln["status"], ln["end"], ln["tenant"]) == (504, "timeout", "acme"), ln
        assert 400 <= ln["duration_ms"], ln
        c.close()
        c = gw.client()
        c.send_raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        r = c.read_response(timeout=5)
        assert r.status == 408
        ln = _one_more(gw, 1)
        assert (ln["status"], ln["end"]) == (408, "timeout"), ln
        for ln in h.access_lines(gw.access_path):
            _check_line(ln)


@h.timeout(90)
def test_access_log_end_is_stall_when_a_stalled_client_is_cut():
    with Stub() as stub, _log_gw(stub, stream_buffer="64KiB",
                                 timeouts={"client_stall": "1s"}) as gw:
        c, r = gw.open_stream(rcvbuf=4096, timeout=30, events=40000, size=1000,
                              interval=0, tag="stall")
        assert r.status == 200
        ln = _one_more(gw, 0, timeout=30)
        assert (ln["status"], ln["end"]) == (200, "stall"), ln
        assert ln["paused_ms"] > 0, "a stalled stream was paused: %r" % ln
        _check_line(ln)


def test_access_log_end_is_drained_when_drain_timeout_cuts_a_stream():
    with Stub() as stub, _log_gw(stub, drain_timeout="1s") as gw:
        c, r = gw.admit(events=200, interval=100, tag="long", timeout=15)
        r.read_events(1, timeout=5)
        os.kill(gw.pid, signal.SIGTERM)
        r.read_all(timeout=10)
        assert r.cut
        assert gw.wait_exit(6) == 0
        lines = h.access_lines(gw.access_path)
        assert [(ln["status"], ln["end"]) for ln in lines] == [(200, "drained")], lines


def test_api_key_never_in_access_log_or_stderr_even_at_debug():
    keys = ["sk-leakcheck-acme-7f3a9c", "sk-leakcheck-beta-41d2e8"]
    wrong = "sk-leakcheck-wrong-90b1aa"
    with Stub() as stub, _log_gw(stub, log_level="debug",
                                 tenants={"acme": {"keys": [keys[0]], "max_streams": 1},
                                          "beta": {"keys": [keys[1]]}}) as gw:
        n = 0
        for key in keys:
            r = _post(gw, key=key, events=2, interval=0)
            assert r.status == 200
            n += 1
        for auth in ("Bearer " + wrong, wrong, "Basic " + wrong, "Bearer  " + keys[0] + "x"):
            r = gw.request("POST", "/v1/chat/completions", dict(JSON_CT, Authorization=auth),
                           h.stream_body(), key=None)
            assert r.status == 401, (auth, r.status)
            n += 1
        held = gw.hold_hung(stub, "hung", 1, key=keys[0])
        r = _post(gw, key=keys[0], events=1)
        assert r.status == 429
        n += 1
        held[0].close()
        n += 1
        c, r = gw.admit(key=keys[1], events=10, abort_after=2, tag="abort")
        r.read_all(timeout=10)
        n += 1
        h.wait_access_lines(gw.access_path, n)
        with open(gw.access_path, "rb") as f:
            access = f.read()
        err = h.stderr_text(gw).encode()
        assert b" debug: " in err, "no debug lines on stderr at log_level debug"
        for secret in keys + [wrong, UPSTREAM_KEY]:
            assert secret.encode() not in access, "%r in the access log" % secret
            assert secret.encode() not in err, "%r in the gateway's stderr" % secret
        tenants = {ln["tenant"] for ln in h.access_lines(gw.access_path)}
        assert tenants == {"acme", "beta", "-"}, tenants


def test_access_log_stderr_writes_json_lines_to_stderr():
    with Stub() as stub, Gateway(stub=stub, access_log="stderr") as gw:
        assert _post(gw, events=2, interval=0).status == 200
        assert _post(gw, key="sk-nope", events=1).status == 401

        def lines():
            out = []
            for ln in h.stderr_text(gw).split("\n"):
                if ln.startswith("{"):
                    out.append(json.loads(ln))
            return out if len(out) >= 2 else None
        got = h.wait_until(lines, 5, msg="2 access lines on stderr")
        assert len(got) == 2, got
        for ln in got:
            _check_line(ln)
        assert [(ln["tenant"], ln["status"], ln["end"]) for ln in got] == \
            [("acme", 200, "done"), ("-", 401, "rejected")], got


def _log_fds(pid, path):
    return [p for p in h.open_files(pid).values()
            if p == path or p.startswith(path + ".")]


@h.timeout(60)
def test_sigusr1_after_rename_makes_workers_reopen_the_access_log():
    with Stub() as stub, _log_gw(stub, workers=2) as gw:
        path = gw.access_path
        n = 0
        for _ in range(6):
            assert _post(gw, events=1, interval=0).status == 200
            n += 1
        h.wait_access_lines(path, n)
        rotated = path + ".1"
        os.rename(path, rotated)
        # Until SIGUSR1, lines go on to the renamed file.
        for _ in range(4):
            assert _post(gw, events=1, interval=0).status == 200
            n += 1
        h.wait_access_lines(rotated, n)
        assert not os.path.exists(path)
        os.kill(gw.pid, signal.SIGUSR1)
        workers = gw.worker_pids()

        def reopened():
            return all(_log_fds(w, path) == [path] for w in workers)
        h.wait_until(reopened, 3, msg="every worker to hold the new file only: %r" % {
            w: _log_fds(w, path) for w in workers})
        assert os.path.exists(path)
        assert os.stat(path).st_mode & 0o777 == _created_mode()
        for _ in range(8):
            assert _post(gw, events=1, interval=0).status == 200
        new = h.wait_access_lines(path, 8)
        old = h.access_lines(rotated)
        assert len(old) == n, "renamed file has %d lines, expected %d" % (len(old), n)
        assert len(new) == 8, "new file has %d lines, expected 8" % len(new)
        for ln in old + new:
            _check_line(ln)
            assert (ln["status"], ln["end"]) == (200, "done"), ln
        assert gw.worker_pids() == workers, "SIGUSR1 replaced the workers"


@h.skip_under("valgrind")
def test_access_log_off_writes_nothing():
    # Started from an empty directory: "off" must not become a relative path.
    cwd = os.getcwd()
    empty = os.path.join(h.tmpdir(), "cwd")
    os.makedirs(empty)
    os.chdir(empty)
    try:
        with Stub() as stub, Gateway(stub=stub, access_log="off") as gw:
            before = set(os.listdir(h.tmpdir()))
            assert _post(gw, events=2, interval=0).status == 200
            assert _post(gw, key="sk-nope", events=1).status == 401
            c, r = gw.admit(events=100, interval=20, tag="off")
            r.read_events(2, timeout=5)
            c.close()
            # The gateway closes the upstream after it ended (and would have
            # logged) the request.
            h.wait_until(lambda: stub.tag("off")["aborted_by_client"] == 1, 3,
                         msg="the gateway to end the request")
            err = h.stderr_text(gw)
            assert not [ln for ln in err.split("\n") if ln.startswith("{")], err[-500:]
            assert set(os.listdir(h.tmpdir())) == before, "files appeared: %r" % (
                set(os.listdir(h.tmpdir())) - before)
            assert os.listdir(empty) == [], "files appeared in the gateway's cwd: %r" % (
                os.listdir(empty))
            for w in gw.worker_pids():
                files = [p for p in h.open_files(w).values() if p.startswith("/")
                         and not p.startswith("/dev/") and os.path.isfile(p)]
                assert all(p == gw.stderr_path or p == gw.stdout_path for p in files), \
                    "worker %d holds files open: %r" % (w, files)
    finally:
        os.chdir(cwd)

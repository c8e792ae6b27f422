# SPDX-License-Identifier: BSD-2-Clause
"""TLS on the listener (issue 25): a throw-away CA made with openssl(1),
curl and Python's ssl module as clients, exact answers and counters."""

import os
import signal
import socket
import ssl
import subprocess
import time

import harness as h
from harness import ACME_KEY, Stub, TLSFiles, expected_events


def _curl(args, timeout=30):
    p = subprocess.run(["curl", "-sS"] + list(args), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def _stream_args(gw, files, events, extra=()):
    return ["--cacert", files.ca, "--resolve", "localhost:%d:127.0.0.1" % gw.port,
            "-H", "Authorization: Bearer " + ACME_KEY, "-H", "Content-Type: application/json",
            "-H", "X-Stub-Events: %d" % events, "-H", "X-Stub-Interval-Ms: 0",
            "--data-binary", h.stream_body().decode()] + list(extra) + \
        ["https://localhost:%d/v1/chat/completions" % gw.port]


def _admin_tls_gw(files, stub, **kw):
    return h.tls_gateway(files, stub=stub, admin_listen="%s:%d" % (h.HOST, h.free_port()), **kw)


def test_curl_streams_over_tls_and_keeps_the_connection_alive():
    files = TLSFiles()
    log = h.tmpfile("access", ".log")
    with Stub() as stub, _admin_tls_gw(files, stub, access_log=log) as gw:
        # Two streams, one connection (curl reuses it for the second URL).
        args = _stream_args(gw, files, 5, ["--http1.1", "-w", "|%{http_code}|%{num_connects}\n"])
        url = args[-1]
        rc, out, err = _curl(args[:-1] + [url, "--next"] + args[:-1] + [url])
        assert rc == 0, err
        body = expected_events(5)
        assert out == body + b"|200|1\n" + body + b"|200|0\n", out[-300:]
        lines = h.wait_access_lines(log, 2)
        assert [(x["status"], x["end"], x["proto"]) for x in lines] == [(200, "done", "h1")] * 2
        m = h.scrape(gw)
        errs = m.series("sluice_tls_handshake_errors_total")
        assert sum(errs.values()) == 0, errs


def test_a_request_larger_than_one_read_arrives_whole_over_tls():
    """A 40 KB body sent in 16 KB TLS records: each record holds more
    plaintext than one read takes, and the socket does not wake the worker
    for what OpenSSL already holds."""
    files = TLSFiles()
    with Stub() as stub, h.tls_gateway(files, stub=stub) as gw:
        pad = "x" * 40000
        body = ('{"model":"stub","stream":true,"messages":[{"role":"user","content":"%s"}]}'
                % pad).encode()
        with gw.client() as c:
            for _ in range(3):   # and again on the same connection
                r = c.request("POST", "/v1/chat/completions",
                              dict(h.bearer(ACME_KEY), **{"Content-Type": "application/json",
                                                          "X-Stub-Events": "2"}), body)
                assert r.status == 200, (r.status, bytes(r.data[:200]))
                assert bytes(r.data) == expected_events(2)
        st = stub.stats()
        assert st["requests"] >= 3, st


def test_pipelined_requests_over_tls_are_answered_in_order():
    files = TLSFiles()
    with Stub() as stub, h.tls_gateway(files, stub=stub) as gw:
        with gw.client() as c:
            req = b""
            for n in (1, 2, 3):
                body = h.stream_body()
                req += (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Authorization: Bearer " + ACME_KEY.encode() + b"\r\n"
                        b"Content-Type: application/json\r\nX-Stub-Events: %d\r\n"
                        b"Content-Length: %d\r\n\r\n" % (n, len(body)) + body)
            c.send_raw(req)
            for n in (1, 2, 3):
                r = c.read_response(timeout=10)
                assert r.status == 200, r.status
                assert bytes(r.read_all(timeout=10)) == expected_events(n)


@h.skip_under("valgrind")
def test_a_slow_tls_client_pauses_its_upstream_and_loses_nothing():
    files = TLSFiles()
    with Stub() as stub, _admin_tls_gw(files, stub, stream_buffer="16KiB",
                                      limits={"client_sndbuf": "16KiB"}) as gw:
        n, size = 400, 1000
        c, r = gw.open_stream(events=n, size=size, interval=0, rcvbuf=4096, timeout=20)
        assert r.status == 200
        # The client reads nothing for a while: 400 KB cannot all be in
        # flight, so the upstream must be paused.
        h.wait_metric(gw, "sluice_upstream_paused_streams", 1, timeout=5)
        data = bytes(r.read_all(timeout=30))
        assert data == expected_events(n, size), (len(data), len(expected_events(n, size)))
        m = h.scrape(gw)
        assert m.value("sluice_upstream_pauses_total") >= 1
        c.close()


def test_failed_handshakes_are_counted_by_reason_and_log_no_request():
    files = TLSFiles()
    log = h.tmpfile("access", ".log")
    with Stub() as stub, _admin_tls_gw(files, stub, access_log=log,
                                      timeouts={"client_header": "1s"}) as gw:
        base = ["--cacert", files.ca, "--max-time", "10"]
        # Plain HTTP to the TLS port: a plain 400 that says why.
        rc, out, err = _curl(["-o", "-", "-w", "|%{http_code}",
                              "http://127.0.0.1:%d/v1/models" % gw.port])
        assert out.endswith(b"|400"), (out, err)
        assert b'"code":"plain_http_to_tls"' in out, out
        # A version below min_version (TLS 1.2 by default).
        rc, out, err = _curl(base + ["--tlsv1.0", "--tls-max", "1.1",
                                     "https://localhost:%d/" % gw.port,
                                     "--resolve", "localhost:%d:127.0.0.1" % gw.port])
        assert rc != 0
        # A server name the certificate does not cover.
        rc, out, err = _curl(base + ["--resolve", "wrong.example:%d:127.0.0.1" % gw.port,
                                     "https://wrong.example:%d/" % gw.port])
        assert rc != 0 and "unrecognized name" in err, err
        # A client that does not trust the certificate aborts (alert).
        rc, out, err = _curl(["--max-time", "10", "--resolve",
                              "localhost:%d:127.0.0.1" % gw.port,
                              "https://localhost:%d/" % gw.port])
        assert rc == 60, (rc, err)
        # A client that leaves in the middle: a ClientHello cut short.
        hello = _client_hello()
        with socket.create_connection((h.HOST, gw.port)) as s:
            s.sendall(hello[:40])
        # A client that starts and never finishes: the timeout.
        t = socket.create_connection((h.HOST, gw.port))
        t.sendall(hello[:40])
        # One that connects and sends nothing is a preconnect, not a TLS error.
        u = socket.create_connection((h.HOST, gw.port))
        want = {"http_request": 1, "version": 1, "sni": 1, "alert": 1, "eof": 1,
                "timeout": 1, "cipher": 0, "alpn": 0, "other": 0}
        got = {}

        def counted():
            m = h.scrape(gw)
            got.update({k: m.value("sluice_tls_handshake_errors_total", reason=k)
                        for k in want if k != "idle"})
            # The silent one is closed as idle, after the same timeout as
            # the handshake that never ends: wait for both (under valgrind
            # the two timers fire a scrape apart).
            got["idle"] = m.value("sluice_idle_connections_closed_total")
            return m if got == want else None
        want["idle"] = 1
        try:
            m = h.wait_until(counted, 6, interval=0.1, msg="handshake error counters")
        except AssertionError:
            raise AssertionError("handshake errors %r, expected %r" % (got, want))
        t.close()
        u.close()
        # Nothing of it was a request.
        assert h.access_lines(log) == []
        assert m.value("sluice_requests_total", tenant="-", code="400") == 0
        # And a good client is served all along.
        r = gw.request("GET", "/v1/models")
        assert r.status == 200, r.status


def _client_hello():
    """The first bytes of a real ClientHello (from Python's ssl)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def test_min_version_tls13_and_alpn_http11_only_refuse_what_they_exclude():
    files = TLSFiles()
    with Stub() as stub, _admin_tls_gw(files, stub, tls={"min_version": "TLSv1.3",
                                                          "alpn": ["http/1.1"]}) as gw:
        res = ["--cacert", files.ca, "--resolve", "localhost:%d:127.0.0.1" % gw.port,
               "-H", "Authorization: Bearer " + ACME_KEY, "-o", "/dev/null",
               "-w", "%{http_code} %{ssl_verify_result}"]
        url = "https://localhost:%d/v1/models" % gw.port
        rc, out, err = _curl(res + ["--tls-max", "1.2", url])
        assert rc != 0, out
        rc, out, err = _curl(res + ["--tlsv1.3", url])
        assert rc == 0 and out == b"200 0", (out, err)
        # A client that offers only h2: no protocol in common.
        ctx = files.context(alpn=["h2"])
        try:
            with socket.create_connection((h.HOST, gw.port), timeout=5) as s:
                ctx.wrap_socket(s, server_hostname="localhost")
            raise AssertionError("handshake offering only h2 succeeded")
        except ssl.SSLError as e:
            assert "no application protocol" in str(e), e
        # One that offers both gets http/1.1.
        ctx = files.context(alpn=["h2", "http/1.1"])
        with socket.create_connection((h.HOST, gw.port), timeout=5) as s:
            with ctx.wrap_socket(s, server_hostname="localhost") as t:
                assert t.selected_alpn_protocol() == "http/1.1"
        m = h.wait_metric(gw, "sluice_tls_handshake_errors_total", 1, reason="alpn")
        assert m.value("sluice_tls_handshake_errors_total", reason="version") == 1


def test_sluice_t_checks_the_certificate_and_key():
    files = TLSFiles()
    cert, key = files.leaf()
    other_cert, other_key = files.leaf(cn="other")
    old_cert, _ = files.leaf(days=-1)
    soon_cert, soon_key = files.leaf(days=5)

    def check(tls, mode=0o600):
        cfg = h.gateway_config(None, tls=tls)
        path = h.write_config(h.config_text(cfg), "tlscheck")
        return h.run_sluice(["-t", "-c", path]), path

    (rc, out, err), path = check({"cert": cert, "key": key})
    assert rc == 0 and err == "", err
    # Each problem at the line of the key that names the file.
    (rc, out, err), path = check({"cert": cert, "key": other_key})
    assert rc == 1
    assert err.startswith(path + ":"), err
    assert "tls.key: %s does not match the certificate in %s" % (other_key, cert) in err, err
    (rc, out, err), path = check({"cert": cert + ".missing", "key": key})
    assert rc == 1 and "tls.cert: %s.missing: No such file or directory" % cert in err, err
    (rc, out, err), path = check({"cert": old_cert, "key": _key_of(old_cert)})
    assert rc == 1 and "tls.cert: %s expired on " % old_cert in err, err
    (rc, out, err), path = check({"cert": key, "key": key})
    assert rc == 1 and "not a PEM certificate chain" in err, err
    (rc, out, err), path = check({"key": key})
    assert rc == 1 and "tls: missing required key 'cert'" in err, err
    (rc, out, err), path = check({"cert": cert, "key": key, "min_version": "TLSv1.1",
                                  "alpn": ["h3"]})
    assert rc == 1
    assert "tls.min_version: 'TLSv1.1' must be TLSv1.2 or TLSv1.3" in err, err
    assert "tls.alpn: 'h3' must be h2 or http/1.1" in err, err
    # Warnings, not errors: expiry within 14 days, a key others can read.
    os.chmod(soon_key, 0o644)
    (rc, out, err), path = check({"cert": soon_cert, "key": soon_key})
    assert rc == 0, err
    assert "tls.cert: %s expires on " % soon_cert in err and "within 14 days" in err, err
    assert "%s holds the TLS private key and is readable by others" % soon_key in err, err


def _key_of(cert):
    return cert[:-len(".pem")] + ".key"


def test_reload_takes_a_new_certificate_for_new_connections_only():
    files = TLSFiles()
    cert1, key1 = files.leaf(cn="first")
    cert2, key2 = files.leaf(cn="second")
    with Stub() as stub, _admin_tls_gw(files, stub, cert=(cert1, key1), log_level="info",
                                      allow_worker_changes=True) as gw:
        first = h.peer_cert_der(gw.port, files)
        # A stream opened under the first pair runs across the reloads.
        c, r = gw.open_stream(events=30, interval=100, timeout=20)
        assert r.status == 200
        assert c.sock.getpeercert(binary_form=True) == first
        cfg = dict(gw.config)
        cfg["tls"] = {"cert": cert2, "key": key2}
        h.reload(gw, cfg)
        second = h.peer_cert_der(gw.port, files)
        assert second != first
        assert second == ssl.PEM_cert_to_DER_cert(open(cert2).read())
        # A bad pair is refused; serving goes on with the second.
        cfg = dict(gw.config)
        cfg["tls"] = {"cert": cert1, "key": key2}
        h.reload(gw, cfg, expect="failed")
        assert "does not match the certificate" in h.stderr_text(gw)
        assert h.peer_cert_der(gw.port, files) == second
        assert bytes(r.read_all(timeout=20)) == expected_events(30)
        assert r.complete

# SPDX-License-Identifier: BSD-2-Clause
"""HTTP/2 to clients (issue 25): curl, nghttp and Node's http2 client (one
connection, many streams) against a TLS listener with a throw-away CA, and
a raw-frame client for the hostile cases. Exact answers and counters."""

import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import time

import harness as h
from harness import ACME_KEY, BETA_KEY, Stub, TLSFiles, expected_events

JS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "js")


def _gw(files, stub, **kw):
    kw.setdefault("admin_listen", "%s:%d" % (h.HOST, h.free_port()))
    return h.tls_gateway(files, stub=stub, **kw)


def _curl(args, timeout=30):
    p = subprocess.run(["curl", "-sS"] + list(args), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def _stream_req(events, key=ACME_KEY, hold=False, **extra):
    hd = {"authorization": "Bearer " + key, "content-type": "application/json",
          "x-stub-events": str(events), "x-stub-interval-ms": "0"}
    hd.update({k.lower(): str(v) for k, v in extra.pop("headers", {}).items()})
    s = {"path": "/v1/chat/completions", "headers": hd, "body": h.stream_body().decode()}
    if hold:
        s["hold"] = True
    s.update(extra)
    return s


class H2Client:
    """tests/js/h2_client.cjs: one HTTP/2 connection, the given streams."""

    def __init__(self, gw, files, streams):
        node = shutil.which("node")
        assert node, "node is not installed (./quickstart installs the test tools)"
        spec = h.tmpfile("h2spec", ".json")
        with open(spec, "w") as f:
            json.dump({"port": gw.port, "ca": files.ca, "streams": streams}, f)
        self.p = subprocess.Popen([node, os.path.join(JS, "h2_client.cjs"), spec],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        h._register(self.p.pid)

    def line(self, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise AssertionError("h2 client said nothing for %ss" % timeout)
            line = self.p.stdout.readline()
            if not line:
                raise AssertionError("h2 client exited: %s" % self.p.stderr.read()[-2000:])
            ev = json.loads(line)
            if ev["event"] == "session_error":
                raise AssertionError("h2 session error: %s" % ev["error"])
            return ev

    def go(self):
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def close(self):
        if self.p.poll() is None:
            h.kill_pid(self.p.pid)
        self.p.wait(timeout=5)
        h._unregister(self.p.pid)


def _run(gw, files, streams, timeout=30):
    c = H2Client(gw, files, streams)
    try:
        return c.line(timeout)["streams"]
    finally:
        c.close()


def test_curl_speaks_http2_and_http11_on_the_same_listener():
    files = TLSFiles()
    log = h.tmpfile("access", ".log")
    with Stub() as stub, _gw(files, stub, access_log=log) as gw:
        base = ["--cacert", files.ca, "--resolve", "localhost:%d:127.0.0.1" % gw.port,
                "-H", "Authorization: Bearer " + ACME_KEY, "-H", "Content-Type: application/json",
                "-H", "X-Stub-Events: 7", "--data-binary", h.stream_body().decode(),
                "-w", "|%{http_code}|%{http_version}",
                "https://localhost:%d/v1/chat/completions" % gw.port]
        for flag, version in (("--http2", b"2"), ("--http1.1", b"1.1")):
            rc, out, err = _curl([flag] + base)
            assert rc == 0, err
            assert out == expected_events(7) + b"|200|" + version, out[-200:]
        lines = h.wait_access_lines(log, 2)
        assert [(x["proto"], x["status"], x["end"], x["tenant"]) for x in lines] == \
            [("h2", 200, "done", "acme"), ("h1", 200, "done", "acme")]
        # Errors keep their shape over HTTP/2.
        rc, out, err = _curl(["--http2", "--cacert", files.ca, "--resolve",
                              "localhost:%d:127.0.0.1" % gw.port, "-H",
                              "Authorization: Bearer sk-nope", "-w", "|%{http_code}",
                              "https://localhost:%d/v1/models" % gw.port])
        body, code = out.rsplit(b"|", 1)
        assert code == b"401", out
        assert json.loads(body)["error"]["code"] == "invalid_api_key", body


def test_fifty_streams_on_one_connection_one_read_slowly():
    """49 streams finish whole while one, whose client reads nothing, fills
    its window and buffer: its upstream is paused (the metric says so), and
    once read it is byte-exact."""
    files = TLSFiles()
    with Stub() as stub, _gw(files, stub, stream_buffer="16KiB",
                             limits={"upstream_rcvbuf": "16KiB"}) as gw:
        n, size = 200, 2000          # 400 KB for the slow one: past any window
        streams = [_stream_req(20, tag="fast") for _ in range(49)]
        streams.insert(17, _stream_req(n, hold=True, headers={"X-Stub-Event-Size": size}))
        c = H2Client(gw, files, streams)
        try:
            ready = c.line(60)["streams"]
            fast = [r for i, r in enumerate(ready) if i != 17]
            assert [r["status"] for r in fast] == [200] * 49
            assert all(r["body"].encode("latin1") == expected_events(20) for r in fast)
            assert ready[17] is None
            # Gauges: each worker sets its own once a second, one after
            # another; wait for one scrape in which all three agree.
            def settled():
                m = h.scrape(gw)
                got = (m.value("sluice_upstream_paused_streams"),
                       m.value("sluice_h2_streams"),
                       m.value("sluice_connections", proto="h2"))
                return got if got == (1, 1, 1) else None
            h.wait_until(settled, 5, interval=0.05,
                         msg="one paused stream, one h2 stream, one h2 connection")
            c.go()
            done = c.line(60)["streams"]
            slow = done[17]
            assert slow["status"] == 200 and slow["error"] is None, slow["error"]
            assert slow["body"].encode("latin1") == expected_events(n, size)
        finally:
            c.close()
        m = h.scrape(gw)
        assert m.value("sluice_requests_total", tenant="acme", code="200") == 50
        assert m.value("sluice_upstream_pauses_total") >= 1


def test_a_429_on_one_stream_leaves_the_others_streaming():
    files = TLSFiles()
    with Stub() as stub, _gw(files, stub, tenants={"acme": {"max_streams": 2}}) as gw:
        streams = [_stream_req(30, headers={"X-Stub-Interval-Ms": 20}) for _ in range(3)]
        got = _run(gw, files, streams)
        codes = sorted(r["status"] for r in got)
        assert codes == [200, 200, 429], codes
        for r in got:
            if r["status"] == 429:
                assert r["headers"]["retry-after"] == "1"
                assert json.loads(r["body"])["error"]["code"] == "concurrency_limit_exceeded", r
            else:
                assert r["body"].encode("latin1") == expected_events(30)
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")


def test_a_reset_stream_frees_its_slot_and_stops_its_upstream():
    files = TLSFiles()
    log = h.tmpfile("access", ".log")
    with Stub() as stub, _gw(files, stub, access_log=log,
                             tenants={"acme": {"max_streams": 1}}) as gw:
        # A long stream, reset by the client after its first bytes.
        streams = [_stream_req(500, headers={"X-Stub-Interval-Ms": 20}, reset_after=1)]
        got = _run(gw, files, streams)
        assert got[0]["status"] == 200, got
        assert got[0]["error"] == "RST_8", got[0]["error"]
        assert got[0]["bytes"] < len(expected_events(500)), got[0]["bytes"]
        lines = h.wait_access_lines(log, 1)
        assert (lines[0]["proto"], lines[0]["end"]) == ("h2", "client_gone")
        h.wait_until(lambda: stub.stats()["aborted_by_client"] == 1, 5,
                     msg="the upstream transfer to stop")
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")
        # The slot is free: the tenant's next stream is admitted.
        got = _run(gw, files, [_stream_req(3)])
        assert got[0]["status"] == 200


def test_a_large_request_body_over_http2_reaches_the_runner_whole():
    """Bodies with and without content-length, larger than the stream's
    window, through an exchange that opens the window as it reads."""
    files = TLSFiles()
    with Stub() as stub, _gw(files, stub) as gw:
        content = "y" * 300000
        body = json.dumps({"model": "stub", "stream": True,
                           "messages": [{"role": "user", "content": content}]})
        with_cl = _stream_req(2, headers={"content-length": len(body)})
        with_cl["body"] = body
        without = _stream_req(2)
        without["body"] = body
        got = _run(gw, files, [with_cl, without])
        assert [r["status"] for r in got] == [200, 200], [r["body"][:200] for r in got]
        st = stub.stats()
        assert st["requests"] == 2, st


def test_nghttp_fifty_concurrent_streams():
    if shutil.which("nghttp") is None:
        raise AssertionError("nghttp is not installed (./quickstart installs nghttp2-client)")
    files = TLSFiles()
    with Stub() as stub, _gw(files, stub) as gw:
        path = h.tmpfile("body", ".json")
        with open(path, "wb") as f:
            f.write(h.stream_body())
        p = subprocess.run(["nghttp", "-n", "-s", "-m", "50", "--no-verify-peer",
                            "-d", path, "-H", "authorization: Bearer " + ACME_KEY,
                            "-H", "content-type: application/json", "-H", "x-stub-events: 10",
                            "https://127.0.0.1:%d/v1/chat/completions" % gw.port],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr[-1000:]
        rows = [ln.split() for ln in p.stdout.splitlines() if "/v1/chat/completions" in ln]
        assert len(rows) == 50, p.stdout[-2000:]
        assert [r[4] for r in rows] == ["200"] * 50, p.stdout[-2000:]
        m = h.wait_metric(gw, "sluice_requests_total", 50, tenant="acme", code="200")
        assert m.value("sluice_h2_protocol_errors_total", reason="protocol") == 0


# ---------------------------------------------------------------- raw frames

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = \
    0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + \
        struct.pack(">I", sid) + payload


def _hint(n, prefix_bits):
    top = (1 << prefix_bits) - 1
    if n < top:
        return bytes([n])
    out = [top]
    n -= top
    while n >= 128:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def hpack(headers):
    """Literal fields without indexing, no Huffman: any decoder takes it."""
    out = b""
    for k, v in headers:
        k, v = k.encode(), v.encode()
        out += b"\x00" + _hint(len(k), 7) + k + _hint(len(v), 7) + v
    return out


def req_headers(port, key=ACME_KEY, method="GET", path="/v1/models"):
    return hpack([(":method", method), (":scheme", "https"), (":path", path),
                  (":authority", "localhost:%d" % port), ("authorization", "Bearer " + key)])


def _split_frames(buf):
    """The whole HTTP/2 frames at the start of buf, each (type, flags,
    stream id, payload), and the bytes after them."""
    out = []
    while len(buf) >= 9:
        n = struct.unpack(">I", b"\0" + buf[:3])[0]
        if len(buf) < 9 + n:
            break
        sid = struct.unpack(">I", buf[5:9])[0] & 0x7fffffff
        out.append((buf[3], buf[4], sid, buf[9:9 + n]))
        buf = buf[9 + n:]
    return out, buf


class Raw:
    """A TLS connection that says h2 and sends what it is told."""

    def __init__(self, gw, files, preface=True):
        ctx = files.context(alpn=["h2"])
        s = socket.create_connection((h.HOST, gw.port), timeout=5)
        self.s = ctx.wrap_socket(s, server_hostname="localhost")
        assert self.s.selected_alpn_protocol() == "h2"
        self.buf = b""
        if preface:
            self.s.sendall(PREFACE + frame(SETTINGS, 0, 0))

    def send(self, data):
        try:
            self.s.sendall(data)
            return True
        except (OSError, ssl.SSLError):
            return False

    def frames(self, timeout=5.0):
        """Every frame until the server closes (or timeout): [(type, flags,
        sid, payload)]."""
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.s.settimeout(max(0.05, deadline - time.monotonic()))
                d = self.s.recv(65536)
            except (socket.timeout, TimeoutError):
                break
            except (OSError, ssl.SSLError):
                d = b""
            if not d:
                break
            self.buf += d
            frames, self.buf = _split_frames(self.buf)
            out.extend(frames)
        return out

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


def goaway_code(frames):
    for t, _, _, p in frames:
        if t == GOAWAY:
            return struct.unpack(">I", p[4:8])[0]
    return None


def rst_codes(frames):
    return {sid: struct.unpack(">I", p[:4])[0] for t, _, sid, p in frames if t == RST_STREAM}


def test_hostile_http2_clients_end_in_goaway_or_rst_and_are_counted():
    files = TLSFiles()
    with Stub() as stub, _gw(files, stub, limits={"h2_max_streams": 2},
                             tenants={"acme": {"max_streams": 10}}) as gw:
        port = gw.port
        # More streams than h2_max_streams: the third is refused.
        r = Raw(gw, files)
        hang = req_headers(port, method="POST", path="/v1/chat/completions")
        stub_hang = hpack([("content-type", "application/json"), ("x-stub-hang", "1")])
        body = h.stream_body()
        for sid in (1, 3, 5):
            r.send(frame(HEADERS, END_HEADERS, sid, hang + stub_hang) +
                   frame(DATA, END_STREAM, sid, body))
        fr = r.frames(2)
        assert rst_codes(fr).get(5) == 7, fr           # REFUSED_STREAM
        r.close()
        # A window update past 2^31-1: FLOW_CONTROL_ERROR.
        r = Raw(gw, files)
        r.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7fffffff)) +
               frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7fffffff)))
        assert goaway_code(r.frames(3)) == 3, "FLOW_CONTROL_ERROR expected"
        r.close()
        # Not the preface.
        r = Raw(gw, files, preface=False)
        r.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 64)
        r.frames(3)
        r.close()
        # Rapid reset: streams opened and reset at once, past the limit.
        r = Raw(gw, files)
        get = req_headers(port)
        batch = b"".join(frame(HEADERS, END_HEADERS | END_STREAM, sid, get) +
                         frame(RST_STREAM, 0, sid, struct.pack(">I", 8))
                         for sid in range(1, 2 * 1100, 2))
        r.send(batch)
        assert goaway_code(r.frames(5)) == 2, "INTERNAL_ERROR (nghttp2's answer) expected"
        r.close()
        # A CONTINUATION flood: a header block in more than 8 pieces.
        r = Raw(gw, files)
        block = req_headers(port) + hpack([("x-pad", "p" * 10)] * 20)
        pieces = [block[i:i + 16] for i in range(0, len(block), 16)]
        data = frame(HEADERS, END_STREAM, 1, pieces[0])
        for k, piece in enumerate(pieces[1:]):
            data += frame(CONTINUATION, END_HEADERS if k == len(pieces) - 2 else 0, 1, piece)
        r.send(data)
        assert goaway_code(r.frames(3)) == 11, "ENHANCE_YOUR_CALM expected"
        r.close()
        # An HPACK bomb: one small field repeated into a header list far over
        # max_header_bytes (32 KiB): the stream is reset, the connection lives.
        r = Raw(gw, files)
        bomb = req_headers(port) + b"\x40" + _hint(5, 7) + b"x-big" + _hint(3000, 7) + \
            b"b" * 3000 + b"\xbe" * 40            # indexed: dynamic entry 62, 40 times
        r.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, bomb) +
               frame(HEADERS, END_HEADERS | END_STREAM, 3, get))
        fr = r.frames(2)
        assert 1 in rst_codes(fr), fr
        assert any(t == HEADERS and sid == 3 for t, _, sid, _ in fr), \
            "the next stream on the same connection is answered"
        r.close()
        m = h.scrape(gw)
        got = {k: m.value("sluice_h2_protocol_errors_total", reason=k) for k in
               ("refused_stream", "flow_control", "bad_preface", "flood", "rapid_reset",
                "header_size")}
        assert got["refused_stream"] >= 1 and got["flow_control"] == 1, got
        assert got["bad_preface"] == 1 and got["header_size"] == 1, got
        assert got["rapid_reset"] == 1 and got["flood"] == 1, got
        # Nothing of it cost a good client anything.
        rc, out, err = _curl(["--http2", "--cacert", files.ca, "--resolve",
                              "localhost:%d:127.0.0.1" % port, "-H",
                              "Authorization: Bearer " + ACME_KEY, "-o", "/dev/null",
                              "-w", "%{http_code} %{http_version}",
                              "https://localhost:%d/v1/models" % port])
        assert out == b"200 2", (out, err)
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme", timeout=5)


def test_a_client_that_never_opens_its_window_is_cut_by_the_stall_timeout():
    files = TLSFiles()
    log = h.tmpfile("access", ".log")
    with Stub() as stub, _gw(files, stub, access_log=log, stream_buffer="16KiB",
                             timeouts={"client_stall": "1s"}) as gw:
        r = Raw(gw, files, preface=False)
        # Initial window 0: not one body byte may be sent to this client.
        r.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 0)))
        hd = req_headers(gw.port, method="POST", path="/v1/chat/completions") + \
            hpack([("content-type", "application/json"), ("x-stub-events", "100"),
                   ("x-stub-event-size", "1000")])
        r.send(frame(HEADERS, END_HEADERS, 1, hd) + frame(DATA, END_STREAM, 1, h.stream_body()))
        fr = r.frames(4)
        assert rst_codes(fr).get(1) == 2, fr            # INTERNAL_ERROR: cut
        lines = h.wait_access_lines(log, 1)
        assert (lines[0]["proto"], lines[0]["end"], lines[0]["status"]) == ("h2", "stall", 200)
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme")
        r.close()


# ------------------------------------------- request bodies and flow control

SETTINGS_HEADER_TABLE_SIZE = 1
SETTINGS_INITIAL_WINDOW_SIZE = 4
DEFAULT_WINDOW = 65535            # RFC 9113 6.9.2: until SETTINGS say otherwise
XIN_LOW = 64 * 1024               # exchange_int.h: an exchange gives the window back
                                  # while less than this of its input waits
CONN_IN_SIZE = 4096               # exchange_int.h: the exchange's input block
RSS_PER_STREAM_KB = 1536          # a refused stream's bytes (~400 KiB), its
                                  # TLS and nghttp2 state, allocator slack


class _DeafRunner:
    """A model runner that accepts connections and never reads a byte."""

    def __enter__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((h.HOST, 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.url = "http://%s:%d" % (h.HOST, self.sock.getsockname()[1])
        self.conns = []
        return self

    def accept(self):
        """Takes what waits in the backlog (called from the test's loop)."""
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except (BlockingIOError, OSError):
                return

    def __exit__(self, *exc):
        for c in self.conns + [self.sock]:
            c.close()
        return False


class _Upload:
    """One HTTP/2 connection sending one request body (stream 1, without
    content-length: the exchange gets it chunked) as fast as sluice's flow
    control allows. `granted` counts what sluice allowed: the stream window
    its SETTINGS gave plus every WINDOW_UPDATE for the stream."""

    CHUNK = b"x" * 16384

    def __init__(self, gw, files, total):
        self.r = Raw(gw, files)
        self.total = total
        self.sent = 0
        self.window = DEFAULT_WINDOW      # the stream's initial window (SETTINGS)
        self.granted = DEFAULT_WINDOW
        self.swin = self.cwin = DEFAULT_WINDOW
        self.answered = False             # a response HEADERS on stream 1
        self.body = b""                   # the response's DATA
        self.reset = None                 # RST_STREAM code, if any
        self.t_moved = time.monotonic()   # the window grew or bytes went
        hd = req_headers(gw.port, method="POST", path="/v1/chat/completions") + \
            hpack([("content-type", "application/json")])
        self.r.send(frame(HEADERS, END_HEADERS, 1, hd))

    def _frames(self):
        self.r.s.settimeout(0.005)
        try:
            d = self.r.s.recv(65536)
        except (socket.timeout, TimeoutError, ssl.SSLWantReadError):
            d = None
        if d == b"":
            raise AssertionError("sluice closed an upload's connection")
        self.r.buf += d or b""
        while len(self.r.buf) >= 9:
            n = struct.unpack(">I", b"\0" + self.r.buf[:3])[0]
            if len(self.r.buf) < 9 + n:
                return
            t, fl = self.r.buf[3], self.r.buf[4]
            sid = struct.unpack(">I", self.r.buf[5:9])[0] & 0x7fffffff
            p, self.r.buf = self.r.buf[9:9 + n], self.r.buf[9 + n:]
            yield t, fl, sid, p

    def pump(self):
        """Read what sluice sent, then send what the windows allow."""
        for t, fl, sid, p in self._frames():
            if t == SETTINGS and not fl & 1:
                for i in range(0, len(p) - 5, 6):
                    k, v = struct.unpack(">HI", p[i:i + 6])
                    if k == SETTINGS_INITIAL_WINDOW_SIZE:
                        self.swin += v - self.window
                        self.granted += v - self.window
                        self.window = v
                self.r.send(frame(SETTINGS, 1, 0))
            elif t == WINDOW_UPDATE:
                inc = struct.unpack(">I", p)[0] & 0x7fffffff
                if sid == 0:
                    self.cwin += inc
                else:
                    self.swin += inc
                    self.granted += inc
                self.t_moved = time.monotonic()
            elif t == HEADERS and sid == 1:
                self.answered = True
            elif t == DATA and sid == 1:
                self.body += p
            elif t == RST_STREAM and sid == 1:
                self.reset = struct.unpack(">I", p[:4])[0]
        self.r.s.settimeout(10)       # a send waits for sluice to read
        while self.reset is None and self.sent < self.total:
            k = min(len(self.CHUNK), self.swin, self.cwin, self.total - self.sent)
            if k <= 0:
                return
            end = END_STREAM if self.sent + k == self.total else 0
            assert self.r.send(frame(DATA, end, 1, self.CHUNK[:k])), "send failed"
            self.sent += k
            self.swin -= k
            self.cwin -= k
            self.t_moved = time.monotonic()


def _push(uploads, refused, quiet, deadline_s=60.0, runner=None):
    """Pump every upload until each settled: its whole body sent, or (those
    in refused) answered and no window given for `quiet` seconds."""
    deadline = time.monotonic() + deadline_s
    while True:
        for u in uploads:
            u.pump()
        if runner is not None:
            runner.accept()
        now = time.monotonic()
        if all(u.sent == u.total or (u in refused and u.answered and
                                     now - u.t_moved >= quiet) for u in uploads):
            return
        assert now < deadline, "uploads still moving after %ss: %r" % (
            deadline_s, [(u.sent, u.granted, u.answered) for u in uploads])


def _window_bound(max_body, window):
    """What a client may send on a stream whose exchange takes no more:
    what the exchange took (max_body_bytes and the input block that found
    it too large), the input block it still fills, less than XIN_LOW
    waiting when its window was last given back, and that one window."""
    return max_body + 2 * CONN_IN_SIZE + XIN_LOW + window


def test_a_stream_whose_body_sluice_stops_taking_gets_no_more_window():
    """Request windows open as the exchange takes the bytes, not as they
    arrive (nghttp2_option_set_no_auto_window_update in h2.c). Three
    clients push 4 MiB bodies that the exchange stops taking once it has
    refused them past max_body_bytes (256 KiB): each can send only about
    two windows more, not the 4 MiB. A fourth, within the limit, goes
    whole although its runner reads nothing: the exchange takes a body
    whole before the runner is asked, so only the exchange opens windows."""
    files = TLSFiles()
    max_body, big, small = 256 * 1024, 4 << 20, 192 * 1024
    quiet = 3.0 if "valgrind" in os.environ.get("SLUICE_UNDER", "") else 1.0
    with _DeafRunner() as runner, \
            _gw(files, None, upstream_url=runner.url, workers=1,
                limits={"max_body_bytes": "256KiB"}) as gw:
        over = [_Upload(gw, files, big) for _ in range(3)]
        within = _Upload(gw, files, small)
        try:
            _push(over + [within], over, quiet, runner=runner)
            got = [(u.sent, u.granted) for u in over]
            print("initial window %d; over the limit (sent, granted): %r; within: %r"
                  % (over[0].window, got, (within.sent, within.granted)))
            assert over[0].window == DEFAULT_WINDOW, over[0].window
            bound = _window_bound(max_body, over[0].window)
            for u in over:
                assert u.answered and b'"request_too_large"' in u.body, (u.body[:200], u.reset)
                assert max_body < u.sent <= u.granted <= bound, \
                    "sent %d, granted %d: bound %d (max_body_bytes %d), body %d" % (
                        u.sent, u.granted, bound, max_body, big)
            assert within.sent == small and not within.answered, \
                (within.sent, within.answered, within.body[:200])
        finally:
            for u in over + [within]:
                u.r.close()


@h.skip_under("sanitizers", "valgrind")
def test_http2_bodies_sluice_does_not_take_leave_its_memory_bounded():
    """Twelve clients push 8 MiB bodies (96 MiB) past max_body_bytes
    (256 KiB): the worker holds of each its refused body, its input and a
    window (about 400 KiB), and its RSS grows by that and the connection's
    state, not by what the clients tried to send."""
    files = TLSFiles()
    n, big, max_body = 12, 8 << 20, 256 * 1024
    with _DeafRunner() as runner, \
            _gw(files, None, upstream_url=runner.url, workers=1,
                limits={"max_body_bytes": "256KiB"}) as gw:
        worker = gw.worker_pids()[0]
        base = gw.rss_kb(worker)
        ups = [_Upload(gw, files, big) for _ in range(n)]
        try:
            _push(ups, ups, 1.0, runner=runner)
            growth = gw.rss_kb(worker) - base
            sent = sum(u.sent for u in ups)
            print("worker RSS growth %d KiB (base %d KiB); %d bytes sent of %d"
                  % (growth, base, sent, n * big))
            assert sent <= n * _window_bound(max_body, ups[0].window), \
                "%d bytes sent of %d" % (sent, n * big)
            assert growth < n * RSS_PER_STREAM_KB, \
                "worker RSS grew by %d KiB holding %d refused streams (bound %d)" % (
                    growth, n, n * RSS_PER_STREAM_KB)
        finally:
            for u in ups:
                u.r.close()


def test_drain_sends_goaway_and_lets_open_streams_finish():
    files = TLSFiles()
    with Stub() as stub, _gw(files, stub, drain_timeout="10s") as gw:
        c = H2Client(gw, files, [_stream_req(20, headers={"X-Stub-Interval-Ms": 50}, hold=True)])
        try:
            h.wait_metric(gw, "sluice_h2_streams", 1, timeout=5)
            os.kill(gw.pid, 15)
            c.line(10)
            c.go()
            done = c.line(20)["streams"]
            assert done[0]["status"] == 200
            assert done[0]["body"].encode("latin1") == expected_events(20)
        finally:
            c.close()
        assert gw.wait_exit(10) == 0


def _browser(gw, n):
    node = shutil.which("node")
    if not os.path.exists("/usr/bin/chromium") or node is None or \
            not os.path.isdir(os.path.join(JS, "node_modules", "playwright-core")):
        h.skip("chromium, node or tests/js/node_modules/playwright-core missing "
               "(./quickstart build installs them)")
    shot = os.path.join(os.environ.get("SLUICE_BUILD_DIR", h.tmpdir()),
                        "h2-browser-%d.png" % gw.port)
    p = subprocess.run([node, os.path.join(JS, "h2_browser.mjs"),
                        "https://localhost:%d" % gw.port, ACME_KEY, str(n), shot],
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


@h.skip_under("valgrind")
def test_a_browser_opens_twenty_streams_at_once_over_http2_and_six_over_http11():
    """Chromium holds 6 HTTP/1.1 connections per origin: the 7th stream of
    a chat UI waits for one of the first six to end. Over HTTP/2 all 20
    share one connection and each gets its first event at once. Each stream
    sends an event at once and two more 1.5 s apart; what is counted is how
    many streams had their first event before the first stream ended."""
    files = TLSFiles()
    with Stub() as stub:
        for alpn, want, proto in ((["h2", "http/1.1"], 20, "h2"), (["http/1.1"], 6, "http/1.1")):
            with _gw(files, stub, tls={"alpn": alpn}) as gw:
                out = _browser(gw, 20)
                assert out["protocol"] == proto, out["protocol"]
                assert all(e is not None for e in out["ends"]), out
                first_end = min(out["ends"])
                early = sum(1 for f in out["firsts"] if f is not None and f < first_end)
                assert early == want, (proto, early, out)


# ---------------------------------------------------------------- reload stress

_STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}
_HUFF_DIGITS = {"00000": "0", "00001": "1", "00010": "2", "011001": "3", "011010": "4",
                "011011": "5", "011100": "6", "011101": "7", "011110": "8", "011111": "9"}


def _hpack_status(block):
    """:status of a response header block (nghttp2 puts it first): a static
    entry, or a literal (name: static entry 8) of digits; None otherwise."""
    b = block[0]
    if b & 0x80:
        return _STATIC_STATUS.get(b & 0x7f)
    if b not in (0x48, 0x08, 0x18):
        return None
    huff, n = block[1] & 0x80, block[1] & 0x7f
    raw = block[2:2 + n]
    if not huff:
        return int(raw)
    bits, code, out = "".join("{:08b}".format(x) for x in raw), "", ""
    for bit in bits:
        code += bit
        if code in _HUFF_DIGITS:
            out, code = out + _HUFF_DIGITS[code], ""
    return int(out) if out else None


class _H2Conn:
    """One HTTP/2 connection (TLS, ALPN h2), many streams, frame by frame,
    read at the client's own pace through a small socket buffer (RCVBUF):
    what the server writes waits in its kernel. Each stream's window is
    WINDOW bytes; what is read is given back at once (stream and
    connection, as browsers and SDKs do), except on a held stream, whose
    window stays shut until release() opens it wide. Records each stream's
    status, body, END_STREAM or RST, and the GOAWAY, in arrival order."""

    WINDOW = 1024
    RCVBUF = 4096

    def __init__(self, gw, files):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.RCVBUF)
        s.settimeout(10)
        s.connect((h.HOST, gw.port))
        self.s = files.context(alpn=["h2"]).wrap_socket(s, server_hostname="localhost")
        assert self.s.selected_alpn_protocol() == "h2"
        self.buf = b""
        self.st = {}
        self.held = set()
        self.order = []              # ("end", sid), ("rst", sid), ("goaway", last)
        self.goaway = None           # (last stream id, error code)
        self.closed = None           # "eof", or the error that ended the socket
        self._send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, self.WINDOW)) +
                   frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 24)))

    def _send(self, data):
        try:
            self.s.sendall(data)
        except (OSError, ssl.SSLError):
            pass                     # pump() sees the socket's end

    def open(self, sid, block, body, hold=False):
        self.st[sid] = {"status": None, "body": b"", "end": False, "rst": None}
        if hold:
            self.held.add(sid)
        self._send(frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, body))

    def release(self, sid):
        self.held.discard(sid)
        self._send(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", 1 << 24)))

    def _frame(self, t, fl, sid, p):
        st = self.st.get(sid)
        if t == SETTINGS and not fl & 1:
            self._send(frame(SETTINGS, 1, 0))
        elif t == HEADERS and st is not None:
            if st["status"] is None:
                st["status"] = _hpack_status(p)
            if fl & END_STREAM:
                st["end"] = True
                self.order.append(("end", sid))
        elif t == DATA and st is not None:
            st["body"] += p
            if p:
                give = frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", len(p)))
                if sid not in self.held and not fl & END_STREAM:
                    give += frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", len(p)))
                self._send(give)
            if fl & END_STREAM:
                st["end"] = True
                self.order.append(("end", sid))
        elif t == RST_STREAM and st is not None:
            st["rst"] = struct.unpack(">I", p[:4])[0]
            self.order.append(("rst", sid))
        elif t == GOAWAY:
            last, code = struct.unpack(">II", p[:8])
            self.goaway = (last & 0x7fffffff, code)
            self.order.append(("goaway", self.goaway[0]))

    def pump(self, until, what, timeout=30.0, poll=1.0):
        """Read and answer frames until until() holds (asked at least every
        poll seconds) or the socket ends; timeout is a watchdog, not a time
        limit: past it the state is reported."""
        deadline = time.monotonic() + timeout
        while not until() and self.closed is None:
            if time.monotonic() > deadline:
                raise AssertionError("waiting for %s: streams %r, goaway %r" % (
                    what, {k: dict(v, body=len(v["body"])) for k, v in self.st.items()},
                    self.goaway))
            try:
                self.s.settimeout(poll)
                d = self.s.recv(65536)
            except (socket.timeout, TimeoutError):
                continue
            except (OSError, ssl.SSLError) as e:
                self.closed = repr(e)
                break
            if not d:
                self.closed = "eof"
                break
            self.buf += d
            frames, self.buf = _split_frames(self.buf)
            for t, fl, sid, p in frames:
                self._frame(t, fl, sid, p)
        return until()

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


@h.timeout(150)
def test_reload_retires_h2_connections_with_running_queued_and_refused_streams_whole():
    """Issue 31, defect 3. sluice.8: a retired worker finishes every stream
    in flight. One worker, a pool of max_streams 2 with queue max 3; on each
    of many HTTP/2 connections two long streams run (their windows shut, so
    they are still running when the worker retires), three wait in the
    queue and a fourth is refused 503 queue_full; then SIGHUP. After the
    GOAWAY the windows open wide, in odd rounds only once the runner has
    sent all of both long streams (the waiters are served meanwhile): the
    rest of each goes out at once and waits in the kernel for a client that
    reads at its own pace and answers each DATA frame with WINDOW_UPDATE.
    Every admitted stream must end byte-exact with data: [DONE] and
    END_STREAM, every waiter be served, and no slot stay held."""
    slow = "valgrind" in os.environ.get("SLUICE_UNDER", "")
    rounds = 12 if slow else 120
    scale = 10 if slow else 1
    files = TLSFiles()
    with Stub() as stub:
        cfg = h.gateway_config(None, workers=1, log_level="info",
                               admin_listen="%s:%d" % (h.HOST, h.free_port()))
        cfg["upstreams"] = {"main": {
            "replicas": [{"url": stub.url, "max_streams": 2}],
            "api_key": h.UPSTREAM_KEY, "queue": {"max": 3, "timeout": "60s"}}}
        cert, key = files.leaf()
        cfg["tls"] = {"cert": cert, "key": key}
        with h.Gateway(cfg, allow_worker_changes=True) as gw:
            gw.tls = files.context()
            body = h.stream_body()
            base = req_headers(gw.port, method="POST", path="/v1/chat/completions") + \
                hpack([("content-type", "application/json")])

            def block(events, size, interval, tag):
                return base + hpack([("x-stub-events", str(events)),
                                     ("x-stub-event-size", str(size)),
                                     ("x-stub-interval-ms", str(interval * scale)),
                                     ("x-stub-tag", tag)])
            # Each within the stream buffer: the runner can send it all while
            # its window is shut.
            running = {1: (16, 2500), 3: (20, 2500)}          # events, size
            want = {s: expected_events(n, z) for s, (n, z) in running.items()}
            waiters = (5, 7, 9, 11)
            checked = 0
            t0 = time.monotonic()
            for k in range(rounds):
                c = _H2Conn(gw, files)
                try:
                    for s, (n, z) in running.items():
                        c.open(s, block(n, z, 5, "run"), body, hold=True)
                    c.pump(lambda: all(c.st[s]["status"] for s in running),
                           "the heads of the running streams")
                    for s in waiters:
                        c.open(s, block(2, 0, 0, "wait"), body)
                    c.pump(lambda: any(c.st[s]["end"] for s in waiters), "the refusal")
                    refused = [s for s in waiters if c.st[s]["end"]]
                    assert len(refused) == 1 and c.st[refused[0]]["status"] == 503, \
                        (k, c.st)
                    assert json.loads(c.st[refused[0]]["body"])["error"]["code"] == \
                        "queue_full", c.st[refused[0]]
                    served = [s for s in waiters if s not in refused]
                    assert not any(c.st[s]["end"] for s in running), (k, c.order)
                    h.kill_pid(gw.pid, signal.SIGHUP)
                    c.pump(lambda: c.goaway is not None, "GOAWAY")
                    if k % 2:
                        c.pump(lambda: stub.tag("run")["completed"] == 2 * (k + 1) and
                               all(c.st[s]["end"] for s in served),
                               "the runner to send both running streams", poll=0.01)
                    c.release(1)
                    c.release(3)
                    c.pump(lambda: False, "the server to close")
                    assert c.goaway[1] == 0 and c.goaway[0] >= 11, (k, c.goaway)
                    ok = dict(want)
                    ok.update((s, expected_events(2)) for s in served)
                    for s, w in ok.items():
                        st = c.st[s]
                        assert st["status"] == 200 and st["rst"] is None and st["end"] \
                            and st["body"] == w, \
                            "round %d, stream %d: status %r, rst %r, END_STREAM %r, %d " \
                            "of %d bytes, ends with %r; the connection: %s, frames %r" % (
                                k, s, st["status"], st["rst"], st["end"], len(st["body"]),
                                len(w), st["body"][-20:], c.closed, c.order)
                    checked += len(waiters) + len(running)
                finally:
                    c.close()
                h.wait_until(lambda: h.reload_results(gw) == (k + 1, 0), 10,
                             msg="reload %d logged" % (k + 1))
                h.wait_workers_ready(gw, 1)
            elapsed = time.monotonic() - t0
            m = h.wait_metric(gw, "sluice_tenant_streams", 0, timeout=5, tenant="acme")
            assert m.value("sluice_queue_waiting", upstream="main", tenant="acme") == 0
            assert m.value("sluice_replica_streams", upstream="main", replica=stub.url) == 0
            assert m.value("sluice_queue_total", upstream="main", outcome="full") == rounds
            assert m.value("sluice_queue_total", upstream="main",
                           outcome="dispatched") == 3 * rounds
            assert m.value("sluice_requests_total", tenant="acme", code="200") == 5 * rounds
            print("h2 reload stress: checked %d streams over %d reloads in %.1fs "
                  "(%d rounds with both running streams sent whole before their "
                  "windows opened)" % (checked, rounds, elapsed, rounds // 2))


# ------------------------------------- an early answer on a shared connection

class _Uploads(_H2Conn):
    """_H2Conn whose streams send their request bodies as sluice's windows
    allow (16 KiB DATA frames, round robin, the last with END_STREAM), and
    stop sending on a stream once it is reset, as RFC 9113 8.1 asks. Its
    HPACK table size is 0, so every :status is one _hpack_status reads."""

    WINDOW = 1 << 20
    RCVBUF = 1 << 20
    CHUNK = 16384

    def __init__(self, gw, files):
        self.out = {}                    # sid -> [body, bytes sent, window]
        self.initial = DEFAULT_WINDOW    # the stream window sluice's SETTINGS give
        self.cwin = DEFAULT_WINDOW       # the connection's
        super().__init__(gw, files)
        self._send(frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_HEADER_TABLE_SIZE, 0)))

    def open(self, sid, block, body, hold=False):
        self.st[sid] = {"status": None, "body": b"", "end": False, "rst": None}
        self.out[sid] = [body, 0, self.initial]
        self._send(frame(HEADERS, END_HEADERS, sid, block))
        self._flow()

    def _frame(self, t, fl, sid, p):
        if t == SETTINGS and not fl & 1:
            for i in range(0, len(p) - 5, 6):
                k, v = struct.unpack(">HI", p[i:i + 6])
                if k == SETTINGS_INITIAL_WINDOW_SIZE:
                    for o in self.out.values():
                        o[2] += v - self.initial
                    self.initial = v
        elif t == WINDOW_UPDATE:
            inc = struct.unpack(">I", p)[0] & 0x7fffffff
            if sid == 0:
                self.cwin += inc
            elif sid in self.out:
                self.out[sid][2] += inc
        elif t == HEADERS:
            while p and p[0] & 0xe0 == 0x20:
                p = p[1:]                # the table size update (to 0): one byte
        super()._frame(t, fl, sid, p)
        if t in (SETTINGS, WINDOW_UPDATE):
            self._flow()

    def _flow(self):
        moved = True
        while moved:
            moved = False
            for sid, o in self.out.items():
                body, off, win = o
                k = min(self.CHUNK, win, self.cwin, len(body) - off)
                if self.st[sid]["rst"] is not None or k <= 0:
                    continue
                end = END_STREAM if off + k == len(body) else 0
                self._send(frame(DATA, end, sid, body[off:off + k]))
                o[1] += k
                o[2] -= k
                self.cwin -= k
                moved = True


def test_a_stream_answered_before_its_body_ended_is_reset_and_costs_the_others_nothing():
    """RFC 9113 8.1: once a stream's response is complete although its
    request body is not (413 past max_body_bytes), sluice resets it with
    NO_ERROR, and what the client sent for it is given back to the
    connection's window. On one connection two 8 MiB bodies over the 2 MiB
    limit (one with content-length, found at once; one without, found as it
    arrives) share the connection with three 1 MiB bodies within it: these
    reach the runner byte for byte and are answered 200, not 408 after the
    refused streams held the connection's window."""
    files = TLSFiles()
    big, small = 8 << 20, 1 << 20
    with Stub() as stub, _gw(files, stub, limits={"max_body_bytes": "2MiB"}) as gw:
        c = _Uploads(gw, files)
        try:
            echo = req_headers(gw.port, method="POST", path="/v1/echo") + \
                hpack([("content-type", "application/octet-stream")])
            over = {1: b"o" * big, 3: b"p" * big}
            within = {s: os.urandom(small // 2).hex().encode() for s in (5, 7, 9)}
            c.open(1, echo, over[1])
            c.open(3, echo + hpack([("content-length", str(big))]), over[3])
            for s in (5, 7):
                c.open(s, echo + hpack([("content-length", str(small))]), within[s])
            c.open(9, echo, within[9])

            def settled(s):
                st = c.st[s]
                return st["rst"] is not None or (st["end"] and st["status"] != 413)
            c.pump(lambda: all(settled(s) for s in c.st), "every stream to settle",
                   timeout=90)
            got = {s: (st["status"], st["end"], st["rst"]) for s, st in c.st.items()}
            print("streams (status, END_STREAM, RST_STREAM code): %r; body bytes sent: %r"
                  % (got, {s: o[1] for s, o in c.out.items()}))
            for s in over:
                st = c.st[s]
                assert (st["status"], st["end"], st["rst"]) == (413, True, 0), (s, got)
                assert json.loads(st["body"])["error"]["code"] == "request_too_large", st
                assert c.order.index(("end", s)) < c.order.index(("rst", s)), c.order
                assert c.out[s][1] < big, (s, c.out[s][1])
            for s, body in within.items():
                st = c.st[s]
                assert (st["status"], st["end"], st["rst"]) == (200, True, None), (s, got)
                assert c.out[s][1] == small, (s, c.out[s][1])
                assert json.loads(st["body"])["body"].encode() == body, \
                    "stream %d: the runner got other bytes" % s
            assert c.closed is None, c.closed
        finally:
            c.close()
        h.wait_metric(gw, "sluice_tenant_streams", 0, tenant="acme", timeout=5)
        assert stub.stats()["requests"] == 3, stub.stats()

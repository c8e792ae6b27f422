# SPDX-License-Identifier: BSD-2-Clause
"""Helpers shared by the end-to-end tests.

Everything here talks to real processes over 127.0.0.1: the built `sluice`
gateway ($SLUICE_BIN) and the model-runner stub ($STUB_BIN). Python 3.11
standard library only.

Every process a helper starts is registered and ended by pid when its
context manager exits (and, as a last resort, tests/run.py kills the whole
process group of the test). Every wait is bounded in time.
"""

import http.client
import json
import os
import re
import select
import signal
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time

HOST = "127.0.0.1"

# Keys of the default tenants built by gateway_config().
ACME_KEY = "sk-acme-1"
ACME_KEY2 = "sk-acme-2"
BETA_KEY = "sk-beta-1"
UPSTREAM_KEY = "upstream-secret"


class HarnessError(AssertionError):
    """A precondition of the harness failed (binary missing, no start...)."""


# ---------------------------------------------------------------- basics

def skip_under(*tools):
    """Mark a test that measures what a tool distorts (RSS under the
    sanitizers' quarantine, fds and timing under valgrind). tests/run.py
    reads the decorator statically and skips the test when $SLUICE_UNDER
    names one of the tools; at run time it changes nothing."""
    def wrap(fn):
        return fn
    return wrap


class Skip(Exception):
    """Raised by skip(): the test cannot run on this machine (a tool it
    needs is not installed). tests/run.py reports it as SKIP with the
    reason, counted in ", N skipped", never as a pass."""


def skip(reason):
    """End the test as skipped, saying why (decided at run time; for what
    is known before, see skip_under and pending)."""
    raise Skip(reason)


def pending(reason):
    """Mark a test that pins a known defect whose fix belongs to another
    change (the reason says where). tests/run.py reads the decorator
    statically and reports the test as SKIP with the reason, unless
    $SLUICE_RUN_PENDING is set (to check the fix: the test must pass
    then); at run time it changes nothing."""
    def wrap(fn):
        return fn
    return wrap


def timeout(seconds):
    """Decorator: per-test watchdog budget read by tests/run.py."""
    def deco(fn):
        fn.timeout = seconds
        return fn
    return deco


def env_bin(name):
    path = os.environ.get(name)
    if not path:
        raise HarnessError("%s is not set" % name)
    if not os.access(path, os.X_OK):
        raise HarnessError("%s=%s is not an executable file" % (name, path))
    return path


def sluice_bin():
    return env_bin("SLUICE_BIN")


def stub_bin():
    return env_bin("STUB_BIN")


_tmpdir = None


def tmpdir():
    """Directory for this test's files (set per test by tests/run.py)."""
    global _tmpdir
    if _tmpdir is None:
        d = os.environ.get("SLUICE_E2E_TMPDIR")
        if not d:
            d = tempfile.mkdtemp(prefix="sluice-e2e-")
        os.makedirs(d, exist_ok=True)
        _tmpdir = d
    return _tmpdir


_seq = [0]


def tmpfile(prefix, suffix=""):
    _seq[0] += 1
    return os.path.join(tmpdir(), "%s-%d%s" % (prefix, _seq[0], suffix))


_ports_given = set()


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago and that this run
    has not handed out before. The kernel may return the same port to two
    bind(0) calls in a row once the first socket is closed: two gateways
    configured before either starts then share a listen port, the second
    exits on EADDRINUSE and the first answers for it."""
    for _ in range(64):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        finally:
            s.close()
        if port not in _ports_given:
            _ports_given.add(port)
            return port
    raise HarnessError("no fresh free port after 64 tries")


def closed_port():
    """A port on 127.0.0.1 where nothing listens (connect is refused)."""
    for _ in range(20):
        p = free_port()
        c = socket.socket()
        c.settimeout(1.0)
        try:
            c.connect((HOST, p))
        except ConnectionRefusedError:
            return p
        except OSError:
            pass
        finally:
            c.close()
    raise HarnessError("could not find a closed port")


def wait_until(pred, timeout=5.0, interval=0.02, msg="condition"):
    """Poll pred() until it returns a truthy value; return that value.
    Raises AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.1fs waiting for %s (last: %r)"
                                 % (timeout, msg, last))
        time.sleep(interval)


def file_tail(path, nbytes=4000):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def pid_alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
    except OSError:
        return False
    state = st[st.rindex(")") + 2:].split()[0]
    return state not in ("Z", "X")


def kill_pid(pid, sig=signal.SIGKILL):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def children_of(pid):
    """Pids of the direct children of pid (all its threads)."""
    kids = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return kids
    have_file = False
    for t in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                have_file = True
                kids += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            pass
        except OSError:
            pass
    if not have_file:  # kernel without CONFIG_PROC_CHILDREN: scan /proc
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % d) as f:
                    st = f.read()
            except OSError:
                continue
            rest = st[st.rindex(")") + 2:].split()
            if int(rest[1]) == pid:
                kids.append(int(d))
    return sorted(k for k in kids if pid_alive(k))


def rss_kb(pid):
    """VmRSS of pid in KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise HarnessError("no VmRSS for pid %d" % pid)


# ---------------------------------------------------------------- stub events

_EVENT_FMT = ('data: {"id":"chatcmpl-stub","object":"chat.completion.chunk",'
              '"seq":%d,"choices":[{"index":0,"delta":{"content":"tok%d "}}],'
              '"pad":"%s"}\n\n')
DONE_EVENT = b"data: [DONE]\n\n"


def stub_event(i, size=0):
    """Event i of a stub stream, byte-exact."""
    base = len(_EVENT_FMT % (i, i, ""))
    return (_EVENT_FMT % (i, i, "x" * max(0, size - base))).encode()


def expected_events(n, size=0):
    """The whole SSE body the stub sends for n events of `size` bytes."""
    return b"".join(stub_event(i, size) for i in range(n)) + DONE_EVENT


def stream_body(model="stub", stream=True):
    return json.dumps({"model": model, "stream": stream,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()


# How a stream's bytes go through the relay (issue 22): "injected" through
# the usage scanner that holds and drops (sluice asked for the usage chunk,
# the default); the others through the plain path, where the relay itself
# must pause the upstream: usage off, inject off, a client that asked for
# usage itself (its chunk passes), and a request that is not counted (a
# body that is not a JSON object, which the stub still streams for).
RELAY_PATHS = ("injected", "usage_off", "inject_false", "client_asked", "uncounted")
_ASKED_USAGE = (7, 3)


def relay_path_config(kind):
    """Gateway config overrides for a RELAY_PATHS kind."""
    return {"usage_off": {"usage": {"enabled": False}},
            "inject_false": {"usage": {"inject": False}}}.get(kind, {})


def relay_path_request(kind):
    """(body, extra headers) of a stub stream on a RELAY_PATHS kind."""
    if kind == "client_asked":
        body = json.dumps({"model": "stub", "stream": True,
                           "stream_options": {"include_usage": True},
                           "messages": [{"role": "user", "content": "hello"}]}).encode()
        return body, {"X-Stub-Usage": "%d,%d" % _ASKED_USAGE}
    if kind == "uncounted":
        return b'{"model":"stub","stream":true,"messages":[]', {}
    return stream_body(), {}


def relay_path_expected(kind, n, size=0):
    """The bytes the client gets for n events of `size` on a RELAY_PATHS kind."""
    if kind != "client_asked":
        return expected_events(n, size)
    p, c = _ASKED_USAGE
    usage = ('data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":0,'
             '"model":"stub","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,'
             '"total_tokens":%d}}\n\n' % (p, c, p + c)).encode()
    return b"".join(stub_event(i, size) for i in range(n)) + usage + DONE_EVENT


def failure_event(api, why, seq=0):
    """The terminal event sluice appends when the runner fails after the
    head of an event stream (sluice.8, STREAMS CUT BY THE RUNNER)."""
    msg = "the model runner failed mid-stream: " + why
    if api == "messages":
        return ('event: error\ndata: {"type":"error","error":{"type":"api_error",'
                '"message":"%s"}}\n\n' % msg).encode()
    if api == "responses":
        return ('event: error\ndata: {"type":"error","code":"upstream_failed",'
                '"message":"%s","sequence_number":%d}\n\n' % (msg, seq)).encode()
    return ('data: {"error":{"message":"%s","type":"server_error",'
            '"code":"upstream_failed"}}\n\n' % msg).encode()


CUT_CLOSED = "connection closed before the response ended"
CUT_IDLE_1S = "no byte for 1 s (timeouts.upstream_idle)"


def stub_headers(events=None, size=None, interval=None, abort_after=None,
                 status=None, delay=None, hang=False, tag=None):
    h = {}
    if events is not None:
        h["X-Stub-Events"] = str(events)
    if size is not None:
        h["X-Stub-Event-Size"] = str(size)
    if interval is not None:
        h["X-Stub-Interval-Ms"] = str(interval)
    if abort_after is not None:
        h["X-Stub-Abort-After"] = str(abort_after)
    if status is not None:
        h["X-Stub-Status"] = str(status)
    if delay is not None:
        h["X-Stub-Delay-Ms"] = str(delay)
    if hang:
        h["X-Stub-Hang"] = "1"
    if tag is not None:
        h["X-Stub-Tag"] = tag
    return h


def bearer(key):
    return {"Authorization": "Bearer %s" % key}


# ---------------------------------------------------------------- HTTP client

class StreamCut(Exception):
    pass


class Response:
    """A response read from a Client. The body is read on demand."""

    def __init__(self, client, status, reason, version, headers, t_head, method):
        self.client = client
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers          # [(name, value)] in order
        self.t_head = t_head            # monotonic time the head was complete
        self.data = bytearray()         # de-chunked body read so far
        self.chunk_times = []           # (monotonic time, size) per chunk read
        self.complete = False           # body framing reached its end
        self.cut = False                # connection closed before the end
        self._event_pos = 0
        self.events = []                # (monotonic time, bytes) per SSE event
        te = (self.header("transfer-encoding") or "").lower()
        cl = self.header("content-length")
        self.chunked = "chunked" in te
        self.content_length = int(cl) if cl is not None and not self.chunked else None
        self._left = 0                  # bytes left in the current chunk
        self._need_crlf = False
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            self.complete = True
        elif not self.chunked and self.content_length is not None:
            self._left = self.content_length
            if self._left == 0:
                self.complete = True

    # headers
    def header(self, name):
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def header_all(self, name):
        name = name.lower()
        return [v for k, v in self.headers if k.lower() == name]

    @property
    def done(self):
        return self.complete or self.cut

    def json(self):
        return json.loads(bytes(self.data).decode())

    # body
    def _got(self, piece):
        now = time.monotonic()
        self.data += piece
        self.chunk_times.append((now, len(piece)))
        while True:
            i = self.data.find(b"\n\n", self._event_pos)
            if i < 0:
                break
            self.events.append((now, bytes(self.data[self._event_pos:i + 2])))
            self._event_pos = i + 2

    def read_some(self, deadline=None):
        """Read and decode more body bytes; returns the new bytes (b"" at
        the end of the body, clean or cut)."""
        c = self.client
        if self.done:
            return b""
        try:
            if self.chunked:
                return self._read_chunked(deadline)
            if self.content_length is not None:
                if not c._fill_some(deadline):
                    self.cut = True
                    return b""
                n = min(self._left, len(c.buf))
                piece = bytes(c.buf[:n])
                del c.buf[:n]
                self._left -= n
                if self._left == 0:
                    self.complete = True
                self._got(piece)
                return piece
            # no framing: read until close
            if not c._fill_some(deadline):
                self.complete = True
                return b""
            piece = bytes(c.buf)
            c.buf.clear()
            self._got(piece)
            return piece
        except StreamCut:
            self.cut = True
            return b""

    def _read_chunked(self, deadline):
        c = self.client
        while True:
            if self._need_crlf:
                line = c._readline(deadline)
                if line != b"":
                    raise AssertionError("bad chunk terminator %r" % line[:40])
                self._need_crlf = False
            if self._left == 0:
                line = c._readline(deadline)
                size_s = line.split(b";", 1)[0].strip()
                try:
                    size = int(size_s, 16)
                except ValueError:
                    raise AssertionError("bad chunk size line %r" % line[:80])
                if size == 0:
                    while c._readline(deadline) != b"":   # trailers
                        pass
                    self.complete = True
                    return b""
                self._left = size
            if not c.buf and not c._fill_some(deadline):
                raise StreamCut()
            n = min(self._left, len(c.buf))
            piece = bytes(c.buf[:n])
            del c.buf[:n]
            self._left -= n
            if self._left == 0:
                self._need_crlf = True
            self._got(piece)
            return piece

    def read_all(self, timeout=30.0):
        """Read the body to its end (clean or cut). Returns the data."""
        deadline = time.monotonic() + timeout
        while not self.done:
            self.read_some(deadline)
        return bytes(self.data)

    def read_events(self, n, timeout=30.0):
        """Read until at least n SSE events were received (or the body ended)."""
        deadline = time.monotonic() + timeout
        while len(self.events) < n and not self.done:
            self.read_some(deadline)
        return self.events[:n]


class Client:
    """HTTP/1.1 over one raw TCP connection, with keep-alive."""

    def __init__(self, port, host=HOST, timeout=10.0, rcvbuf=None, connect=True,
                 tls=None, server_hostname="localhost"):
        """tls: an ssl.SSLContext (TLSFiles.context()) to speak TLS."""
        self.host = host
        self.port = port
        self.timeout = timeout
        self.buf = bytearray()
        self.eof = False
        self.reset = False
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        if connect:
            self.sock.connect((host, port))
            if tls is not None:
                self.sock = tls.wrap_socket(self.sock, server_hostname=server_hostname)

    # low level
    def _recv(self, deadline):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("client read deadline passed")
            self.sock.settimeout(min(left, self.timeout))
        else:
            self.sock.settimeout(self.timeout)
        try:
            d = self.sock.recv(262144)
        except ConnectionResetError:
            self.reset = True
            d = b""
        except socket.timeout:
            raise TimeoutError("no data from server for %.1fs" % self.sock.gettimeout())
        if not d:
            self.eof = True
        return d

    def _fill_some(self, deadline=None):
        """Ensure buf is non-empty; False at EOF."""
        if self.buf:
            return True
        if self.eof:
            return False
        d = self._recv(deadline)
        self.buf += d
        return bool(d)

    def _readline(self, deadline=None):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            if len(self.buf) > 1 << 20:
                raise AssertionError("line too long from server")
            if self.eof:
                raise StreamCut()
            d = self._recv(deadline)
            if not d:
                raise StreamCut()
            self.buf += d

    # requests
    def send_raw(self, data):
        self.sock.sendall(data)

    def send(self, method, path, headers=None, body=b"", host=True,
             content_length=True):
        if isinstance(body, str):
            body = body.encode()
        lines = ["%s %s HTTP/1.1" % (method, path)]
        hl = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        names = {k.lower() for k, _ in hl}
        if host and "host" not in names:
            lines.append("Host: %s:%d" % (self.host, self.port))
        if content_length and body and "content-length" not in names \
                and "transfer-encoding" not in names:
            lines.append("Content-Length: %d" % len(body))
        if content_length and not body and method in ("POST", "PUT", "PATCH") \
                and "content-length" not in names and "transfer-encoding" not in names:
            lines.append("Content-Length: 0")
        for k, v in hl:
            lines.append("%s: %s" % (k, v))
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.sock.sendall(head + body)
        self._method = method

    def read_response(self, timeout=None):
        """Read a status line and headers; returns a Response whose body is
        not read yet. Raises StreamCut if the connection closed first."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            line = self._readline(deadline)
            m = re.match(rb"^HTTP/(\d\.\d) (\d{3})(?: (.*))?$", line)
            if not m:
                raise AssertionError("bad status line %r" % line[:120])
            headers = []
            while True:
                h = self._readline(deadline)
                if h == b"":
                    break
                if b":" not in h:
                    raise AssertionError("bad header line %r" % h[:120])
                k, v = h.split(b":", 1)
                headers.append((k.decode("latin-1").strip(), v.decode("latin-1").strip()))
            status = int(m.group(2))
            resp = Response(self, status, (m.group(3) or b"").decode("latin-1"),
                            m.group(1).decode(), headers, time.monotonic(),
                            getattr(self, "_method", "GET"))
            if 100 <= status < 200 and status != 101:
                continue
            return resp

    def request(self, method, path, headers=None, body=b"", timeout=30.0):
        """Send a request and read the whole response (body included)."""
        self.send(method, path, headers, body)
        resp = self.read_response(timeout=timeout)
        resp.read_all(timeout=timeout)
        return resp

    def wait_closed(self, timeout=5.0):
        """True if the server closes the connection within timeout (any data
        still arriving is read and kept in self.buf)."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            if time.monotonic() >= deadline:
                return False
            try:
                d = self._recv(deadline)
            except TimeoutError:
                return False
            self.buf += d
        return True

    def close(self, rst=False):
        if self.sock is None:
            return
        if rst:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                     b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:
                pass
        try:
            self.sock.close()
        finally:
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def send_head_then_body(c, method, path, headers, body, wait=2.0):
    """Send the head (with Content-Length) alone; if no response comes within
    `wait` seconds, send the body too. Returns the Response (head read).
    Avoids racing a server that answers on the head and closes (a close with
    unread bytes resets the connection and can destroy the response)."""
    hd = dict(headers)
    hd["Content-Length"] = str(len(body))
    c.send(method, path, hd, b"")
    try:
        return c.read_response(timeout=wait)
    except TimeoutError:
        pass
    c.send_raw(body)
    return c.read_response()


def assert_error(resp, status, code, read=True):
    """The response is a JSON error in the OpenAI shape with this status
    and error code."""
    if read:
        resp.read_all(timeout=10)
    assert resp.status == status, "expected status %d, got %d (body %r)" % (
        status, resp.status, bytes(resp.data[:300]))
    ct = resp.header("content-type") or ""
    assert "application/json" in ct, "error content-type %r" % ct
    try:
        doc = json.loads(bytes(resp.data).decode())
    except ValueError:
        raise AssertionError("error body is not JSON: %r" % bytes(resp.data[:300]))
    assert isinstance(doc, dict) and isinstance(doc.get("error"), dict), \
        "error body lacks an 'error' object: %r" % doc
    err = doc["error"]
    for k in ("message", "type", "code"):
        assert k in err, "error object lacks %r: %r" % (k, err)
    assert isinstance(err["message"], str) and err["message"], \
        "empty error message: %r" % err
    assert isinstance(err["type"], str) and err["type"], "empty error type: %r" % err
    assert err["code"] == code, "expected error code %r, got %r" % (code, err["code"])
    return doc


# ---------------------------------------------------------------- stub

class Stub:
    """The model-runner stub on an ephemeral port of 127.0.0.1. args: extra
    command-line options, appended (e.g. ("--busy",) or ("--slow-start", "2"))."""

    def __init__(self, name="stub", args=()):
        self.name = name
        self.args = [str(a) for a in args]
        self.proc = None
        self.port = None

    def start(self):
        self.stdout_path = tmpfile(self.name, ".stdout")
        self.stderr_path = tmpfile(self.name, ".stderr")
        out = open(self.stdout_path, "wb")
        err = open(self.stderr_path, "wb")
        try:
            self.proc = subprocess.Popen([stub_bin(), "-l", "%s:0" % HOST, "-q"] + self.args,
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=err, close_fds=True)
        finally:
            out.close()
            err.close()
        _register(self.proc.pid)
        deadline = time.monotonic() + 10
        while True:
            with open(self.stdout_path, "rb") as f:
                first = f.readline()
            if first.endswith(b"\n"):
                break
            if self.proc.poll() is not None:
                raise HarnessError("stub exited with status %s before listening "
                                   "(stderr below)" % self.proc.returncode)
            if time.monotonic() > deadline:
                self.kill()
                raise HarnessError("stub printed no listening line in 10s")
            time.sleep(0.01)
        m = re.match(rb"^sluice-stub listening on 127\.0\.0\.1:(\d+)\s*$", first)
        if not m:
            self.kill()
            raise HarnessError("unexpected first stub line %r" % first)
        self.port = int(m.group(1))
        self.url = "http://%s:%d" % (HOST, self.port)
        return self

    def _http(self, method, path, body=None, headers=None, timeout=10):
        c = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def stats(self):
        st, _, body = self._http("GET", "/stub/stats")
        assert st == 200, "stub stats: %d %r" % (st, body[:200])
        return json.loads(body)

    def tag(self, name):
        """Per-tag stats (zeros when the tag was never seen)."""
        t = self.stats().get("tags", {}).get(name)
        if t is None:
            return {"requests": 0, "inflight": 0, "max_inflight": 0, "completed": 0,
                    "aborted_by_client": 0, "bytes_sent": 0}
        return t

    def reset(self):
        st, _, body = self._http("POST", "/stub/reset", body=b"")
        assert st == 200, "stub reset: %d %r" % (st, body[:200])

    def direct(self, method, path, headers=None, body=b""):
        """A request straight to the stub (no gateway); the whole Response."""
        with Client(self.port) as c:
            r = c.request(method, path, headers, body)
            return r

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            kill_pid(self.proc.pid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None:
            _unregister(self.proc.pid)

    def stderr_tail(self, n=3000):
        return file_tail(self.stderr_path, n)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()
        return False


# ---------------------------------------------------------------- config

def _yaml_scalar(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return str(v)
    s = str(v)
    if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]*", s) and \
            s.lower() not in ("true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"):
        return s
    return json.dumps(s)


def to_yaml(value, indent=0):
    """Render dicts / lists / scalars as block YAML (lists of scalars in
    flow style)."""
    pad = " " * indent
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, dict) and v:
                out.append("%s%s:" % (pad, k))
                out.append(to_yaml(v, indent + 2))
            elif isinstance(v, (list, tuple)):
                if all(not isinstance(x, (dict, list, tuple)) for x in v):
                    out.append("%s%s: [%s]" % (pad, k, ", ".join(
                        json.dumps(x) if isinstance(x, str) else _yaml_scalar(x) for x in v)))
                else:
                    out.append("%s%s:" % (pad, k))
                    for x in v:
                        out.append("%s  - %s" % (pad, to_yaml(x, indent + 4).lstrip()))
            else:
                out.append("%s%s: %s" % (pad, k, _yaml_scalar(v)))
        return "\n".join(out)
    return pad + _yaml_scalar(value)


def deep_merge(base, over):
    """Merge `over` into a copy of `base`; a None value deletes the key."""
    res = dict(base)
    for k, v in over.items():
        if v is None:
            res.pop(k, None)
        elif isinstance(v, dict) and isinstance(res.get(k), dict):
            res[k] = deep_merge(res[k], v)
        else:
            res[k] = v
    return res


def gateway_config(stub=None, upstream_url=None, **overrides):
    """A config dict with sensible defaults: listen on a free port, two
    workers, upstream `main` pointing at the stub (api_key set), tenants
    acme (keys sk-acme-1, sk-acme-2) and beta (sk-beta-1)."""
    url = upstream_url or (stub.url if stub is not None else "http://127.0.0.1:9")
    cfg = {
        "listen": "%s:%d" % (HOST, free_port()),
        "workers": 2,
        "drain_timeout": "3s",
        "upstreams": {"main": {"url": url, "api_key": UPSTREAM_KEY}},
        "tenants": {
            "acme": {"keys": [ACME_KEY, ACME_KEY2], "max_streams": 100,
                     "retry_after": 1, "upstream": "main"},
            "beta": {"keys": [BETA_KEY], "max_streams": 100,
                     "retry_after": 2, "upstream": "main"},
        },
    }
    return deep_merge(cfg, overrides)


def write_config(text, name="sluice"):
    path = tmpfile(name, ".yaml")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds keys
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


# ---------------------------------------------------------------- gateway

_SAN_PATTERNS = (b"AddressSanitizer", b"LeakSanitizer", b"runtime error:",
                 b"UndefinedBehaviorSanitizer",
                 # valgrind (SLUICE_WRAPPER): invalid accesses, definite leaks
                 b"Invalid read", b"Invalid write", b"Invalid free",
                 b"uninitialised value", b"are definitely lost")


class Gateway:
    """The built sluice, in the foreground, with a temp config.

    Gateway(config_text_or_dict) or Gateway(stub=stub, **overrides) where
    overrides are merged into gateway_config(). allow_worker_changes=False
    makes the exit check fail if a worker died during the test (a crash the
    master hid by respawning it).

    Set before start(): `preexec_fn` (run in the child before exec, e.g. to
    lower RLIMIT_NOFILE) and `config_mode` (chmod of the config file)."""

    preexec_fn = None
    config_mode = None
    tls = None          # an ssl.SSLContext: client(), request() and
                        # open_stream() speak TLS (the listener has tls:)

    def __init__(self, config=None, stub=None, allow_worker_changes=False,
                 name="gateway", **overrides):
        if config is None:
            config = gateway_config(stub, **overrides)
        elif isinstance(config, dict) and overrides:
            config = deep_merge(config, overrides)
        self.config = config
        self.name = name
        self.allow_worker_changes = allow_worker_changes
        if isinstance(config, dict):
            self.text = _render(config)
            listen = config.get("listen", "")
            workers = config.get("workers", 2)
        else:
            self.text = config
            m = re.search(r'^listen:\s*"?([^"\s]+)"?', config, re.M)
            listen = m.group(1) if m else ""
            m = re.search(r"^workers:\s*(\S+)", config, re.M)
            workers = m.group(1) if m else None
        m = re.match(r"^(.*):(\d+)$", str(listen))
        self.port = int(m.group(2)) if m else None
        if workers == "auto":
            workers = None          # CPU count as the gateway sees it: not waited for
        try:
            self.nworkers = int(workers) if workers is not None else None
        except ValueError:
            self.nworkers = None
        self.drain_s = 3.0
        if isinstance(config, dict):
            self.drain_s = _duration_s(config.get("drain_timeout", "30s"))
        self.proc = None
        self.pid = None
        self.clients = []
        self.initial_workers = []
        self.exit_code = None

    # lifecycle
    def start(self, wait_workers=True):
        self.path = write_config(self.text, self.name)
        if self.config_mode is not None:
            os.chmod(self.path, self.config_mode)
        self.stderr_path = tmpfile(self.name, ".stderr")
        self.stdout_path = tmpfile(self.name, ".stdout")
        out = open(self.stdout_path, "wb")
        err = open(self.stderr_path, "wb")
        try:
            # SLUICE_WRAPPER runs the gateway under a tool, e.g. valgrind
            # (make check-valgrind); workers are forks, so it covers them.
            wrapper = os.environ.get("SLUICE_WRAPPER", "").split()
            self.proc = subprocess.Popen(wrapper + [sluice_bin(), "-c", self.path],
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=err, close_fds=True,
                                         preexec_fn=self.preexec_fn)
        finally:
            out.close()
            err.close()
        self.pid = self.proc.pid
        _register(self.pid)
        if self.port is None:
            raise HarnessError("no listen port in the config")
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise HarnessError("sluice exited with status %s before listening "
                                   "(stderr below)" % self.proc.returncode)
            try:
                s = socket.create_connection((HOST, self.port), timeout=1)
                s.close()
                if self.proc.poll() is not None:
                    raise HarnessError("sluice exited with status %s; something "
                                       "else answers on its port %d (stderr below)"
                                       % (self.proc.returncode, self.port))
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise HarnessError("sluice did not accept on port %d within 10s "
                                   "(stderr below)" % self.port)
            time.sleep(0.02)
        if wait_workers and self.nworkers:
            self.wait_workers(self.nworkers, timeout=10)
            self.initial_workers = self.worker_pids()
        return self

    def wait_workers(self, n, timeout=10, exclude=()):
        """Wait until the master has exactly n live children, none in exclude."""
        def ok():
            w = self.worker_pids()
            return w if len(w) == n and not set(w) & set(exclude) else None
        try:
            return wait_until(ok, timeout, msg="%d workers" % n)
        except AssertionError as e:
            raise AssertionError("%s; workers now %r" % (e, self.worker_pids()))

    def worker_pids(self):
        return children_of(self.pid)

    def rss_kb(self, pid):
        return rss_kb(pid)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=None):
        """Send SIGTERM, wait up to the drain time (+3 s); SIGKILL and fail if
        it is still running. Returns the exit status."""
        if timeout is None:
            timeout = self.drain_s + 3.0
        self._stopped = True
        if self.proc.poll() is None:
            kill_pid(self.pid, sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                workers = self.worker_pids()
                self.kill()
                raise AssertionError("sluice still running %.1fs after %s; killed (workers %r)"
                                     % (timeout, signal.Signals(sig).name, workers))
        self.exit_code = self.proc.returncode
        self._reap_workers()
        return self.exit_code

    def wait_exit(self, timeout):
        """Wait (sending nothing) for the master to exit; returns its status.
        Fails, after SIGKILL, if it is still running after timeout."""
        self._stopped = True
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            workers = self.worker_pids()
            self.kill()
            raise AssertionError("sluice still running after %.1fs; killed (workers %r)"
                                 % (timeout, workers))
        self.exit_code = self.proc.returncode
        self._reap_workers()
        return self.exit_code

    def _reap_workers(self):
        # Workers orphaned by a dead master are ours: end them by pid.
        for w in set(self.initial_workers) | set(getattr(self, "_last_workers", [])):
            if pid_alive(w) and _is_sluice(w):
                kill_pid(w, signal.SIGKILL)

    def kill(self):
        if self.proc is None:
            return
        self._last_workers = self.worker_pids() if self.proc.poll() is None else []
        if self.proc.poll() is None:
            kill_pid(self.pid, signal.SIGKILL)   # first, so it respawns nothing
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for w in self._last_workers:
            if pid_alive(w):
                kill_pid(w, signal.SIGKILL)
        self._reap_workers()
        _unregister(self.pid)

    def stderr_tail(self, n=3000):
        return file_tail(self.stderr_path, n)

    def sanitizer_report(self):
        try:
            with open(self.stderr_path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        for p in _SAN_PATTERNS:
            i = data.find(p)
            if i >= 0:
                return data[max(0, i - 200):i + 2000].decode("utf-8", "replace")
        return None

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        for c in self.clients:
            c.close()
        if exc_type is not None:
            self.kill()
            return False
        problems = []
        if self.proc.poll() is not None and not getattr(self, "_stopped", False):
            problems.append("sluice exited during the test with status %s"
                            % self.proc.returncode)
        elif not self.allow_worker_changes and self.initial_workers \
                and not getattr(self, "_stopped", False):
            now = self.worker_pids()
            if set(now) != set(self.initial_workers):
                problems.append("workers changed during the test (a worker died?): "
                                "%r -> %r" % (self.initial_workers, now))
        if self.proc.poll() is None:
            try:
                code = self.stop()
                if code != 0:
                    problems.append("sluice exited with status %s after SIGTERM" % code)
            except AssertionError as e:
                problems.append(str(e))
        else:
            self.kill()
            self._reap_workers()
        san = self.sanitizer_report()
        if san:
            problems.append("sanitizer report in sluice stderr:\n" + san)
        _unregister(self.pid)
        if problems:
            raise AssertionError("; ".join(problems))
        return False

    # clients
    def client(self, **kw):
        kw.setdefault("tls", self.tls)
        c = Client(self.port, **kw)
        self.clients.append(c)
        return c

    def request(self, method, path, headers=None, body=b"", key=ACME_KEY, timeout=30.0):
        """One request on a fresh connection, whole response read."""
        h = dict(bearer(key)) if key else {}
        h.update(headers or {})
        with Client(self.port, tls=self.tls) as c:
            return c.request(method, path, h, body, timeout=timeout)

    def open_stream(self, key=ACME_KEY, path="/v1/chat/completions", read_head=True,
                    timeout=10.0, rcvbuf=None, body=None, headers=None, **stub_kw):
        """Send a streaming completion (body: stream_body() unless given;
        headers: more request headers) on a new connection; returns
        (client, response-or-None)."""
        c = self.client(rcvbuf=rcvbuf, timeout=timeout)
        h = dict(bearer(key)) if key else {}
        h["Content-Type"] = "application/json"
        h.update(stub_headers(**stub_kw))
        h.update(headers or {})
        c.send("POST", path, h, stream_body() if body is None else body)
        if not read_head:
            return c, None
        return c, c.read_response(timeout=timeout)

    def admit(self, within=1.0, key=ACME_KEY, **stream_kw):
        """Open a stream that must be admitted (head 200) within `within`
        seconds: a 429 is retried every 50 ms until then (a slot given back
        by another worker a moment after its stream ended). Returns (client,
        response)."""
        deadline = time.monotonic() + within
        seen = []
        while True:
            c, r = self.open_stream(key=key, **stream_kw)
            seen.append(r.status)
            if r.status != 429:
                assert r.status == 200, "stream refused with %d: %r" % (
                    r.status, bytes(r.read_all(timeout=5))[:200])
                return c, r
            r.read_all(timeout=5)
            c.close()
            if time.monotonic() >= deadline:
                raise AssertionError("not admitted within %.1fs (a slot leaked?): %r"
                                     % (within, seen))
            time.sleep(0.05)

    def hold_hung(self, stub, tag, n, within=1.0, key=ACME_KEY):
        """Open n requests the stub never answers (X-Stub-Hang), each of
        which must be admitted (reach the stub) within `within` seconds; a
        429 is retried until then. Returns the clients."""
        held = []
        base = stub.tag(tag)["inflight"]
        for i in range(n):
            deadline = time.monotonic() + within
            seen = []
            while True:
                c, _ = self.open_stream(key=key, hang=True, tag=tag, read_head=False)
                def reached():
                    if stub.tag(tag)["inflight"] >= base + i + 1:
                        return "admitted"
                    r, _, _ = select.select([c.sock], [], [], 0)
                    return "answered" if r else None
                what = wait_until(reached, 5, interval=0.01,
                                  msg="request %d to reach the stub or be answered" % i)
                if what == "admitted":
                    held.append(c)
                    break
                resp = c.read_response(timeout=5)
                resp.read_all(timeout=5)
                seen.append(resp.status)
                assert resp.status == 429, "hung request answered %d" % resp.status
                c.close()
                if time.monotonic() >= deadline:
                    raise AssertionError("request %d of %d not admitted within %.1fs: %r"
                                         % (i + 1, n, within, seen))
                time.sleep(0.05)
        return held


def _duration_s(v):
    s = str(v).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)", s)
    if not m:
        return 30.0
    n = float(m.group(1))
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _is_sluice(pid):
    try:
        exe = os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return False
    try:
        return os.path.samefile(exe, sluice_bin())
    except OSError:
        return os.path.basename(exe).startswith("sluice")


# Registry of pids started by this process, so tests/run.py (or an atexit
# hook) can end them by pid if a test body escapes its context managers.
_started = set()


def _register(pid):
    _started.add(pid)


def _unregister(pid):
    _started.discard(pid)


def kill_started():
    for pid in list(_started):
        for w in children_of(pid):
            kill_pid(w, signal.SIGKILL)
        kill_pid(pid, signal.SIGKILL)
        _started.discard(pid)


def run_sluice(args, timeout=10):
    """Run sluice with args to completion: (exit status, stdout, stderr)."""
    p = subprocess.Popen([sluice_bin()] + list(args), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _register(p.pid)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_pid(p.pid, signal.SIGKILL)
        p.communicate()
        raise AssertionError("sluice %s did not exit within %ss" % (" ".join(args), timeout))
    finally:
        _unregister(p.pid)
    return p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")



# ---------------------------------------------------------------- TLS

class TLSFiles:
    """A throw-away CA and leaves it signed, made with openssl(1) in this
    test's directory. leaf() makes a certificate and key (PEM, key mode
    0600) for localhost and 127.0.0.1 unless told other names; days < 0
    makes one that expired."""

    def __init__(self, name="tls"):
        self.dir = tempfile.mkdtemp(prefix=name + "-", dir=tmpdir())
        self.ca_key = os.path.join(self.dir, "ca.key")
        self.ca = os.path.join(self.dir, "ca.pem")
        self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt",
                      "ec_paramgen_curve:P-256", "-nodes", "-keyout", self.ca_key,
                      "-out", self.ca, "-days", "30", "-subj", "/CN=sluice test CA")
        self._n = 0

    def _openssl(self, *args):
        p = subprocess.run(["openssl"] + list(args), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        if p.returncode != 0:
            raise HarnessError("openssl %s: %s" % (args[0], p.stderr.decode()[-500:]))
        return p.stdout

    def leaf(self, cn="localhost", days=30, sans=("DNS:localhost", "IP:127.0.0.1")):
        """(cert path, key path) of a new leaf signed by the CA."""
        self._n += 1
        base = os.path.join(self.dir, "leaf%d" % self._n)
        key, csr, cert, ext = base + ".key", base + ".csr", base + ".pem", base + ".ext"
        self._openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                      "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=" + cn)
        os.chmod(key, 0o600)
        with open(ext, "w") as f:
            f.write("subjectAltName=%s\n" % ",".join(sans))
        self._openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key,
                      "-CAcreateserial", "-out", cert, "-days", str(days),
                      "-extfile", ext)
        return cert, key

    def context(self, alpn=None):
        """A client context that trusts the CA (and offers alpn, a list)."""
        ctx = ssl.create_default_context(cafile=self.ca)
        if alpn:
            ctx.set_alpn_protocols(alpn)
        return ctx


def tls_gateway(files, stub=None, cert=None, **overrides):
    """A Gateway whose listener speaks TLS with a leaf of files (or
    cert=(cert, key)); its clients trust files' CA."""
    cert, key = cert or files.leaf()
    tls = dict({"cert": cert, "key": key}, **overrides.pop("tls", {}))
    gw = Gateway(stub=stub, tls=tls, **overrides)
    gw.tls = files.context()
    return gw


def peer_cert_der(port, files, server_hostname="localhost"):
    """The DER certificate the listener presents to a new connection."""
    with socket.create_connection((HOST, port), timeout=5) as s:
        with files.context().wrap_socket(s, server_hostname=server_hostname) as t:
            return t.getpeercert(binary_form=True)


# ---------------------------------------------------------------- reload

# Under valgrind, a dict config without limits.max_tenants gets this much
# room instead of the default 100,000: memcheck's leak check reads every
# page of every mapping at each process's exit, the region's reserved but
# never written room included (MAP_NORESERVE, sl_shm.h), and 100,000
# tenants' room (about 700 MB) takes a worker seconds to exit. Tests that
# are about the room set the key themselves.
VALGRIND_MAX_TENANTS = 10000
# ... and reload() waits this long at least for the old workers to retire.
VALGRIND_RELOAD_TIMEOUT = 20.0


def under_valgrind():
    """Do the gateways of this run start under memcheck (check-valgrind)?"""
    return "valgrind" in os.environ.get("SLUICE_WRAPPER", "")


def _render(config):
    if "valgrind" in os.environ.get("SLUICE_WRAPPER", "") and \
            "max_tenants" not in (config.get("limits") or {}):
        config = deep_merge(config, {"limits": {"max_tenants": VALGRIND_MAX_TENANTS}})
    return to_yaml(config) + "\n"


def config_text(config):
    """YAML text for a config dict (as Gateway renders it) or a string."""
    return _render(config) if isinstance(config, dict) else config


def rewrite_config(gw, config):
    """Replace the running gateway's config file (same path, mode 0600)
    with `config` (dict or text), atomically; sends no signal."""
    text = config_text(config)
    tmp = gw.path + ".new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, gw.path)
    gw.config = config
    gw.text = text
    if isinstance(config, dict):
        gw.drain_s = _duration_s(config.get("drain_timeout", "30s"))


def stderr_text(gw):
    try:
        with open(gw.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


_RELOAD_OK_RE = re.compile(r" master: info: reloaded: generation (\d+)")
_RELOAD_FAILED_RE = re.compile(r" master: error: reload failed")


def reload_results(gw):
    """(reloads logged ok, reloads logged failed) so far. Needs log_level
    info or debug for the ok count."""
    text = stderr_text(gw)
    return len(_RELOAD_OK_RE.findall(text)), len(_RELOAD_FAILED_RE.findall(text))


def wait_retired(gw, pids, timeout=5.0):
    """Wait until each worker in pids has exited or logged that it drains
    (it then no longer accepts). Needs log_level info or debug."""
    def done():
        text = stderr_text(gw)
        return all(not pid_alive(p) or
                   re.search(r"sluice\[%d\] worker\d+: info: draining " % p, text)
                   for p in pids)
    wait_until(done, timeout, interval=0.01,
               msg="the old workers %r to stop accepting" % (list(pids),))


WORKER_COMM = "sluice-worker"


def proc_comm(pid):
    """/proc/PID/comm of pid (its process name), or None once it is gone."""
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().rstrip("\n")
    except OSError:
        return None


def wait_workers_ready(gw, n=None, timeout=10.0):
    """Wait until the master has n children (default: the configured count)
    and each of them is named "sluice-worker": a worker takes that name
    once its setup is done (the master's sockets it must not keep are
    closed by then). Returns their pids. Works under valgrind too."""
    n = gw.nworkers if n is None else n

    def ok():
        w = gw.worker_pids()
        return w if len(w) == n and all(proc_comm(p) == WORKER_COMM for p in w) else None
    try:
        return wait_until(ok, timeout, msg="%d ready workers" % n)
    except AssertionError as e:
        raise AssertionError("%s; workers now %r" % (
            e, [(p, proc_comm(p)) for p in gw.worker_pids()]))


def reload(gw, config=None, expect="ok", timeout=5.0):
    """Write `config` (if given) over the gateway's file, send SIGHUP to the
    master and wait until it logs the outcome ("reloaded: generation N" or
    "reload failed"). Asserts the outcome is `expect` ("ok" or "failed")
    and returns it. After an ok reload, also waits until the workers of the
    previous generations stopped accepting, so that a new connection is
    served by the new configuration."""
    if "valgrind" in os.environ.get("SLUICE_WRAPPER", ""):
        # An old worker retires by exiting when its log level hides its
        # "draining" line, and memcheck's leak check at exit reads every
        # mapping, the shared region's reserved room too: seconds.
        timeout = max(timeout, VALGRIND_RELOAD_TIMEOUT)
    before = reload_results(gw)
    old_workers = gw.worker_pids()
    if config is not None:
        rewrite_config(gw, config)
    kill_pid(gw.pid, signal.SIGHUP)

    def outcome():
        ok, failed = reload_results(gw)
        if ok > before[0]:
            return "ok"
        if failed > before[1]:
            return "failed"
        return None
    got = wait_until(outcome, timeout, interval=0.01, msg="the master to log the reload")
    assert got == expect, "reload %s, expected %s; stderr tail:\n%s" % (
        got, expect, gw.stderr_tail(1500))
    if got == "ok":
        wait_retired(gw, old_workers, timeout)
    return got


# ---------------------------------------------------------------- admin

def admin_port(gw):
    """The port of the gateway's admin_listen (config dict or text)."""
    if isinstance(gw.config, dict):
        addr = gw.config.get("admin_listen")
    else:
        m = re.search(r'^admin_listen:\s*"?([^"\s]+)"?', gw.config, re.M)
        addr = m.group(1) if m else None
    if not addr:
        raise HarnessError("the gateway has no admin_listen")
    return int(str(addr).rsplit(":", 1)[1])


class AdminResponse:
    def __init__(self, raw, method="GET"):
        self.raw = raw
        head, sep, body = raw.partition(b"\r\n\r\n")
        if not sep:
            raise AssertionError("admin response without a complete head: %r" % raw[:300])
        lines = head.decode("latin-1").split("\r\n")
        m = re.match(r"^HTTP/1\.[01] (\d{3}) ", lines[0] + " ")
        if not m:
            raise AssertionError("bad admin status line %r" % lines[0])
        self.status = int(m.group(1))
        self.headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.body = body
        cl = self.headers.get("content-length")
        if cl is not None and method != "HEAD" and int(cl) != len(body):
            raise AssertionError("admin Content-Length %s but %d body bytes" % (cl, len(body)))

    @property
    def text(self):
        return self.body.decode("utf-8")


def admin_request(port, method="GET", path="/metrics", timeout=5.0):
    """One request to the admin listener (it answers and closes); returns
    an AdminResponse with the raw bytes kept."""
    deadline = time.monotonic() + timeout
    s = socket.create_connection((HOST, port), timeout=timeout)
    try:
        s.sendall(("%s %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n"
                   % (method, path, HOST, port)).encode())
        raw = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("admin %s %s: no complete answer in %.1fs (got %r)"
                                     % (method, path, timeout, bytes(raw[:200])))
            s.settimeout(left)
            d = s.recv(65536)
            if not d:
                break
            raw += d
    finally:
        s.close()
    return AdminResponse(bytes(raw), method)


_METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
# A label value may hold any character, braces included (escaped: \\ \" \n).
_SAMPLE_RE = re.compile(r'^(%s)(\{(?:[^"}]|"(?:[^"\\\n]|\\[\\"n])*")*\})?[ ]+(\S+)'
                        r'(?:[ ]+(-?\d+))?$' % _METRIC_NAME)


class Metrics:
    """Parsed Prometheus text exposition (version 0.0.4). Parsing is strict:
    a line that is not a comment, HELP, TYPE or `name{labels} value` fails,
    as does a sample whose family has no HELP and TYPE before it."""

    def __init__(self, text):
        self.text = text
        self.samples = {}           # (name, ((label, value), ...)) -> float
        self.order = []
        self.types = {}
        self.helps = {}
        for n, line in enumerate(text.split("\n"), 1):
            if line == "":
                continue
            if line.startswith("#"):
                m = re.match(r"^# (HELP|TYPE) (%s) (.*)$" % _METRIC_NAME, line)
                if m is None:
                    if re.match(r"^# (HELP|TYPE)\b", line):
                        raise AssertionError("metrics line %d: bad %r" % (n, line))
                    continue
                kind, name, rest = m.groups()
                if kind == "TYPE":
                    assert rest in ("counter", "gauge", "histogram", "summary", "untyped"), \
                        "metrics line %d: bad type %r" % (n, line)
                    assert name not in self.types, "metrics line %d: second TYPE for %s" % (n, name)
                    self.types[name] = rest
                else:
                    assert name not in self.helps, "metrics line %d: second HELP for %s" % (n, name)
                    self.helps[name] = rest
                continue
            m = _SAMPLE_RE.match(line)
            assert m, "metrics line %d does not parse as `name{labels} value`: %r" % (n, line)
            name, lbl, val, _ts = m.groups()
            labels = ()
            if lbl:
                inner = lbl[1:-1]
                pos, pairs = 0, []
                while pos < len(inner):
                    lm = _LABEL_RE.match(inner, pos)
                    assert lm, "metrics line %d: bad labels %r" % (n, lbl)
                    # one escape at a time: backslash, backslash, n is a backslash and an n
                    pairs.append((lm.group(1), re.sub(
                        r'\\(.)', lambda e: "\n" if e.group(1) == "n" else e.group(1),
                        lm.group(2))))
                    pos = lm.end()
                    if pos < len(inner):
                        assert inner[pos] == ",", "metrics line %d: bad labels %r" % (n, lbl)
                        pos += 1
                names = [k for k, _ in pairs]
                assert len(set(names)) == len(names), "metrics line %d: repeated label" % n
                labels = tuple(sorted(pairs))
            try:
                v = float(val)
            except ValueError:
                raise AssertionError("metrics line %d: bad value %r" % (n, line))
            fam = self.family(name)
            assert fam in self.types and fam in self.helps, \
                "metrics line %d: sample of %s before its HELP and TYPE" % (n, fam)
            key = (name, labels)
            assert key not in self.samples, "metrics line %d: duplicate sample %r" % (n, line)
            self.samples[key] = v
            self.order.append(key)

    def family(self, name):
        for suf in ("_bucket", "_sum", "_count"):
            if name.endswith(suf) and self.types.get(name[:-len(suf)]) in ("histogram", "summary"):
                return name[:-len(suf)]
        return name

    def get(self, name, **labels):
        """The sample's value, or None when it is not exposed."""
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def value(self, name, default=0.0, **labels):
        v = self.get(name, **labels)
        return default if v is None else v

    def series(self, name):
        """{labels dict as sorted tuple: value} for every sample of name."""
        return {lb: v for (n, lb), v in self.samples.items() if n == name}

    def counters(self):
        """{(name, labels): value} of every counter and histogram sample."""
        return {k: v for k, v in self.samples.items()
                if self.types.get(self.family(k[0])) in ("counter", "histogram")}


def scrape(gw, timeout=5.0):
    """GET /metrics from the gateway's admin listener, parsed (strictly)."""
    r = admin_request(admin_port(gw), "GET", "/metrics", timeout)
    assert r.status == 200, "GET /metrics: %d %r" % (r.status, r.body[:200])
    return Metrics(r.text)


def wait_metric(gw, name, want, timeout=3.0, **labels):
    """Poll /metrics until name{labels} == want (a missing sample counts as
    0); returns the Metrics. Counters move when a request ends and gauges
    once a second, so a bounded poll is the exact way to read them."""
    last = [None]

    def ok():
        m = scrape(gw)
        last[0] = m.get(name, **labels)
        return m if m.value(name, **labels) == want else None
    try:
        return wait_until(ok, timeout, interval=0.05,
                          msg="%s%r == %r" % (name, labels, want))
    except AssertionError:
        raise AssertionError("%s%r is %r, expected %r (after %.1fs)"
                             % (name, labels, last[0], want, timeout))


# ---------------------------------------------------------------- access log

ACCESS_LOG_FIELDS = ("time", "worker", "peer", "tenant", "method", "path", "status",
                     "bytes_out", "ttfb_ms", "duration_ms", "paused_ms", "queued_ms", "end",
                     "replica",
                     "tries", "prompt_tokens", "completion_tokens", "usage", "affinity",
                     "model", "upstream_model", "proto", "api")


def access_lines(path):
    """The access log's lines as dicts; every line must be whole JSON."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    out = []
    # A line is written with one write(2); a reader racing it may see its
    # first part only: leave that for the next read.
    for i, line in enumerate(data.split(b"\n")[:-1], 1):
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError("access log %s line %d is not JSON: %r" % (path, i, line[:300]))
    return out


def wait_access_lines(path, n, timeout=5.0):
    """Wait until the access log has at least n lines; returns them all."""
    def ok():
        lines = access_lines(path)
        return lines if len(lines) >= n else None
    try:
        return wait_until(ok, timeout, interval=0.02, msg="%d access log lines" % n)
    except AssertionError:
        raise AssertionError("access log %s has %d lines, expected %d"
                             % (path, len(access_lines(path)), n))


def open_files(pid):
    """Paths of the regular files pid has open (fd -> path)."""
    res = {}
    d = "/proc/%d/fd" % pid
    try:
        fds = os.listdir(d)
    except OSError:
        return res
    for fd in fds:
        try:
            res[int(fd)] = os.readlink(os.path.join(d, fd))
        except OSError:
            pass
    return res


# ---------------------------------------------------------------- hostile peers

def close_rst(sock):
    """Close a socket with SO_LINGER 0: the peer gets a RST, not a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def exchange_raw(port, data, timeout=5.0, host=HOST):
    """Send raw bytes on a fresh connection and read until the server
    closes it or `timeout` passes. Returns (bytes, closed) where closed is
    True on EOF or reset."""
    s = socket.create_connection((host, port), timeout=timeout)
    deadline = time.monotonic() + timeout
    got = bytearray()
    closed = False
    try:
        s.sendall(data)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            s.settimeout(left)
            try:
                d = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not d:
                closed = True
                break
            got += d
    finally:
        s.close()
    return bytes(got), closed


def split_responses(data):
    """Split raw bytes holding whole HTTP/1.1 responses framed by
    Content-Length into [(status, {lower name: value}, body)]; a trailing
    incomplete part is returned as (None, {}, rest)."""
    out = []
    rest = data
    while rest:
        head, sep, tail = rest.partition(b"\r\n\r\n")
        if not sep:
            out.append((None, {}, rest))
            break
        lines = head.decode("latin-1").split("\r\n")
        m = re.match(r"^HTTP/1\.[01] (\d{3})", lines[0])
        if not m:
            out.append((None, {}, rest))
            break
        hd = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            hd[k.strip().lower()] = v.strip()
        n = int(hd.get("content-length", "0"))
        if len(tail) < n:
            out.append((None, {}, rest))
            break
        out.append((int(m.group(1)), hd, tail[:n]))
        rest = tail[n:]
    return out


class RawUpstream:
    """A minimal upstream on 127.0.0.1 that answers with whatever bytes a
    test gives it: malformed heads, resets, anything the stub refuses to
    produce. For each connection it reads one request (head and a
    Content-Length body), records it in `requests`, and calls
    handler(sock, request_bytes) in the connection's thread; the socket is
    closed when the handler returns. Every wait is bounded. A handler that
    frames a whole answer (Content-Length, chunked) says `Connection: close`
    unless the test is about reuse: otherwise the gateway may pool the
    connection and send the next request on it just as it closes, and a
    POST is rightly not sent twice (502)."""

    def __init__(self, handler, read_timeout=5.0):
        self.handler = handler
        self.read_timeout = read_timeout
        self.requests = []
        self.connections = 0
        self._lock = threading.Lock()
        self._stop = False
        self._threads = []

    def start(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.url = "http://%s:%d" % (HOST, self.port)
        t = threading.Thread(target=self._accept_loop, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept_loop(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, c):
        try:
            c.settimeout(self.read_timeout)
            data = bytearray()
            try:
                while b"\r\n\r\n" not in data and len(data) < 1 << 20:
                    d = c.recv(65536)
                    if not d:
                        break
                    data += d
                head = bytes(data).split(b"\r\n\r\n", 1)[0]
                m = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
                if m:
                    want = len(head) + 4 + int(m.group(1))
                    while len(data) < want:
                        d = c.recv(65536)
                        if not d:
                            break
                        data += d
            except OSError:
                pass
            with self._lock:
                self.requests.append(bytes(data))
            try:
                self.handler(c, bytes(data))
            except OSError:
                pass
        finally:
            try:
                c.close()
            except OSError:
                pass

    def stop(self):
        self._stop = True
        try:
            self.sock.close()
        except OSError:
            pass
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def fd_count(pid):
    """Number of open descriptors of pid."""
    return len(os.listdir("/proc/%d/fd" % pid))


def _socket_inodes(pid):
    res = set()
    d = "/proc/%d/fd" % pid
    for fd in os.listdir(d):
        try:
            t = os.readlink(os.path.join(d, fd))
        except OSError:
            continue
        if t.startswith("socket:["):
            res.add(int(t[8:-1]))
    return res


def _proc_net_tcp(pid):
    """[(local (ip, port), remote (ip, port), state hex, inode)] from the
    network namespace of pid (IPv4 and IPv6)."""
    rows = []
    for fn, v6 in (("tcp", False), ("tcp6", True)):
        try:
            with open("/proc/%d/net/%s" % (pid, fn)) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            p = ln.split()
            rows.append((_hexaddr(p[1], v6), _hexaddr(p[2], v6), p[3], int(p[9])))
    return rows


def _hexaddr(s, v6):
    ip, port = s.split(":")
    raw = bytes.fromhex(ip)
    if not v6:
        addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
        addr = socket.inet_ntop(socket.AF_INET6, raw)
    return addr, int(port, 16)


def listening_addrs(pids):
    """Set of (ip, port) TCP addresses that the processes `pids` listen on."""
    inodes = set()
    for p in pids:
        try:
            inodes |= _socket_inodes(p)
        except OSError:
            pass
    if not pids:
        return set()
    return {loc for loc, _, st, ino in _proc_net_tcp(pids[0])
            if st == "0A" and ino in inodes}


# ---------------------------------------------------------------- redis

class RedisError(Exception):
    """An error reply (-ERR ...) from Redis."""


def _resp_encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if not isinstance(a, bytes):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class _RespReader:
    """Reads RESP2 replies from a socket; every read is bounded by the
    socket's timeout."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _fill(self):
        d = self.sock.recv(65536)
        if not d:
            raise ConnectionError("redis closed the connection")
        self.buf += d

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            self._fill()

    def _exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        d = bytes(self.buf[:n])
        del self.buf[:n + 2]
        return d

    def reply(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            return RedisError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode("utf-8", "replace")
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise AssertionError("bad RESP line from redis: %r" % line[:100])


def redis_server_bin():
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(":") + ["/usr/bin", "/usr/sbin"]:
        p = os.path.join(d, "redis-server")
        if os.access(p, os.X_OK):
            return p
    raise HarnessError("redis-server is not installed (Debian package redis-server)")


class Redis:
    """A real redis-server on a free port of 127.0.0.1, empty (no RDB, no
    AOF), in the test's temp dir. `addr` is what a `cluster.redis` takes.

    command(*args) speaks RESP over a fresh connection (so a frozen or
    stopped server only fails that call, within `timeout`). stop() ends it
    with SIGTERM, kill() with SIGKILL, start() again uses the same port
    (it comes back empty). freeze()/thaw() stop and continue the process:
    the kernel still accepts connections, nothing answers."""

    def __init__(self, port=None, password=None, name="redis", args=()):
        self.port = port or free_port()
        self.password = password
        self.args = [str(a) for a in args]
        self.name = name
        self.proc = None
        self.starts = 0

    @property
    def addr(self):
        return "%s:%d" % (HOST, self.port)

    def start(self, timeout=10.0):
        self.starts += 1
        d = os.path.join(tmpdir(), "%s-%d" % (self.name, self.port))
        os.makedirs(d, exist_ok=True)
        self.stdout_path = tmpfile(self.name, ".stdout")
        argv = [redis_server_bin(), "--port", str(self.port), "--bind", HOST,
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--dir", d, "--logfile", "", "--protected-mode", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        argv += self.args
        return self._spawn(argv, "redis-server", timeout)

    def _spawn(self, argv, what, timeout):
        """Start argv (output to stdout_path), registered by pid; return
        self once it answers PING, or raise (killed) by `timeout` s."""
        with open(self.stdout_path, "wb") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, close_fds=True)
        _register(self.proc.pid)
        self.pid = self.proc.pid
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise HarnessError("%s exited with status %s at start: %s"
                                   % (what, self.proc.returncode,
                                      file_tail(self.stdout_path, 1500)))
            try:
                if self.command("PING", timeout=1.0) == "PONG":
                    return self
            except (OSError, RedisError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise HarnessError("%s did not answer PING in %.0fs" % (what, timeout))
            time.sleep(0.02)

    def restart(self, timeout=10.0):
        """Start again on the same port (after stop() or kill()): empty."""
        assert self.proc is None or self.proc.poll() is not None, "redis still running"
        return self.start(timeout)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def command(self, *args, timeout=3.0):
        """One command on a new connection; the reply (a RedisError reply
        raises)."""
        s = socket.create_connection((HOST, self.port), timeout=timeout)
        try:
            s.settimeout(timeout)
            r = _RespReader(s)
            if self.password:
                s.sendall(_resp_encode(["AUTH", self.password]))
                a = r.reply()
                if isinstance(a, RedisError):
                    raise a
            s.sendall(_resp_encode(args))
            rep = r.reply()
        finally:
            s.close()
        if isinstance(rep, RedisError):
            raise rep
        return rep

    # the keys sluice uses
    @staticmethod
    def lease_key(tenant):
        return "sluice:{%s}:leases" % tenant

    def zcard(self, key):
        return self.command("ZCARD", key)

    def zrange(self, key, withscores=False):
        """Members (lowest score first); with scores: [(member, float)]."""
        if not withscores:
            return self.command("ZRANGE", key, 0, -1)
        flat = self.command("ZRANGE", key, 0, -1, "WITHSCORES")
        return [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]

    def leases(self, tenant):
        return self.zcard(self.lease_key(tenant))

    def lease_members(self, tenant):
        return self.zrange(self.lease_key(tenant))

    def exists(self, key):
        return self.command("EXISTS", key) == 1

    def nodes(self):
        """Members of sluice:nodes (registered node names)."""
        return self.zrange("sluice:nodes")

    def time_ms(self):
        t = self.command("TIME")
        return int(t[0]) * 1000 + int(t[1]) // 1000

    def clients(self):
        """Number of client connections (this one included)."""
        return int(re.search(r"connected_clients:(\d+)",
                             self.command("INFO", "clients")).group(1))

    def pause(self, ms):
        """CLIENT PAUSE ms ALL: nothing is answered for ms (queued meanwhile)."""
        assert self.command("CLIENT", "PAUSE", int(ms), "ALL") == "OK"

    def freeze(self):
        kill_pid(self.pid, signal.SIGSTOP)

    def thaw(self):
        kill_pid(self.pid, signal.SIGCONT)

    def stop(self, timeout=10.0):
        """SIGTERM, wait for the exit (SIGKILL after timeout)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kill_pid(self.pid, signal.SIGCONT)
            kill_pid(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_pid(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        _unregister(self.pid)

    def kill(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kill_pid(self.pid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        _unregister(self.pid)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()
        return False


def redis_sentinel_bin():
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(":") + ["/usr/bin", "/usr/sbin"]:
        p = os.path.join(d, "redis-sentinel")
        if os.access(p, os.X_OK):
            return p
    raise HarnessError("redis-sentinel is not installed (Debian package redis-sentinel)")


class Sentinel(Redis):
    """A real redis-sentinel on a free port of 127.0.0.1 watching `master`
    (a Redis) under `name`, with its own config file in the test's temp dir
    (a sentinel rewrites it). `addr` is what `cluster.sentinels` lists;
    command() asks it (SENTINEL ...). Started and ended by pid, as Redis."""

    def __init__(self, master, name="sluice", quorum=2, down_after_ms=1000,
                 failover_timeout_ms=4000, password=None, port=None):
        Redis.__init__(self, port=port, password=password, name="sentinel")
        self.master = master
        self.master_name = name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def start(self, timeout=10.0):
        self.starts += 1
        d = os.path.join(tmpdir(), "%s-%d" % (self.name, self.port))
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "sentinel.conf")
        lines = ["port %d" % self.port, "bind %s" % HOST, "protected-mode no",
                 "daemonize no", 'logfile ""', "dir %s" % d,
                 "sentinel monitor %s %s %d %d" % (self.master_name, HOST, self.master.port,
                                                   self.quorum),
                 "sentinel down-after-milliseconds %s %d" % (self.master_name,
                                                            self.down_after_ms),
                 "sentinel failover-timeout %s %d" % (self.master_name,
                                                     self.failover_timeout_ms),
                 "sentinel parallel-syncs %s 1" % self.master_name]
        if self.password:
            lines.append("requirepass %s" % self.password)
        if self.starts == 1 or not os.path.exists(conf):
            with open(conf, "w") as f:
                f.write("\n".join(lines) + "\n")
        self.stdout_path = tmpfile(self.name, ".stdout")
        return self._spawn([redis_sentinel_bin(), conf], "redis-sentinel", timeout)

    def master_addr(self):
        """What it answers to get-master-addr-by-name: "IP:port" or None."""
        a = self.command("SENTINEL", "get-master-addr-by-name", self.master_name)
        return None if a is None else "%s:%s" % (a[0], a[1])


class BlackHole:
    """A TCP listener on 127.0.0.1 that accepts connections, reads what
    it is sent and never answers (a Redis that hangs). `addr` for
    cluster.redis; `accepted` counts connections."""

    def __init__(self):
        self.accepted = 0
        self._stop = False
        self._conns = []

    @property
    def addr(self):
        return "%s:%d" % (HOST, self.port)

    def start(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()
        return self

    def _loop(self):
        socks = [self.sock]
        while not self._stop:
            try:
                r, _, _ = select.select(socks, [], [], 0.1)
            except (OSError, ValueError):
                return
            for s in r:
                if s is self.sock:
                    try:
                        c, _ = self.sock.accept()
                    except OSError:
                        continue
                    self.accepted += 1
                    socks.append(c)
                    self._conns.append(c)
                else:
                    try:
                        d = s.recv(65536)
                    except OSError:
                        d = b""
                    if not d:
                        socks.remove(s)
                        s.close()

    def stop(self):
        self._stop = True
        self._t.join(timeout=2)
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        self.sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

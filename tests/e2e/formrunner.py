# SPDX-License-Identifier: BSD-2-Clause
"""A model runner that reads request bodies as a Python runner does.

vLLM serves /v1/audio/transcriptions through FastAPI: Starlette reads the
multipart/form-data body with python-multipart and keeps the LAST field of
a name; JSON bodies go through json.loads (the last of duplicate keys).
This module ports those readings (python-multipart 0.0.x: its
parse_options_header, which is the email package's get_params, and its
MultipartParser state machine; Starlette's MultiPartParser callbacks) so
that a test can assert what such a runner would serve, not what sluice
thinks it sent. Standard library only (the e2e tests have no pip).

FormRunner() is a runner on 127.0.0.1 that answers every POST with
{"served": MODEL-or-null, "read": "form"|"json"|"urlencoded"|"none"} or,
when its reader refuses the body, 400 {"error": WHY}.
"""

import http.server
import json
import threading
import urllib.parse
from email.message import Message

CR, LF, HYPHEN, COLON, SPACE = 13, 10, 45, 58, 32
TOKEN = set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")


class ParseError(ValueError):
    pass


def parse_options_header(value):
    """python-multipart's parse_options_header (str in, str out)."""
    if not value:
        return "", {}
    if ";" not in value:
        return value.lower().strip(), {}
    m = Message()
    m["content-type"] = value
    params = m.get_params()
    ctype = params.pop(0)[0]
    options = {}
    for key, val in params:
        if isinstance(val, tuple):   # RFC 2231: (charset, language, value)
            val = val[-1]
        options[key] = val
    return ctype, options


def multipart_parts(body, boundary):
    """python-multipart's MultipartParser over a whole body: the list of
    completed parts, each (headers [(lowercased name, value)], data).
    Raises ParseError where it raises. Bytes after the close delimiter are
    ignored, and a part cut short by the end of the body never completes."""
    delim = b"\r\n--" + boundary
    n = len(body)
    i = 0
    while i < n and body[i] in (CR, LF):   # START skips leading newlines
        i += 1
    # START_BOUNDARY: "--boundary", then CRLF (or "-": an empty message)
    if body[i:i + len(delim) - 2] != delim[2:]:
        raise ParseError("did not find the boundary")
    i += len(delim) - 2
    if i < n and body[i] == HYPHEN:
        return []
    if body[i:i + 2] != b"\r\n":
        raise ParseError("did not find CR LF after the boundary")
    i += 2
    parts = []
    while True:
        # HEADER_FIELD_START .. HEADERS_ALMOST_DONE
        headers = []
        while True:
            if i >= n:
                return parts
            if body[i] == CR:
                if i + 1 < n and body[i + 1] != LF:
                    raise ParseError("no LF after the headers' CR")
                i += 2
                break
            s = i
            while i < n and body[i] != COLON:
                if body[i] not in TOKEN:
                    raise ParseError("invalid character in a header name")
                i += 1
            if i >= n:
                return parts
            if i == s:
                raise ParseError("0-length header")
            name = body[s:i].lower()
            i += 1
            while i < n and body[i] == SPACE:
                i += 1
            s = i
            while i < n and body[i] != CR:
                i += 1
            if i >= n:
                return parts
            value = body[s:i]
            if i + 1 < n and body[i + 1] != LF:
                raise ParseError("no LF after a header's CR")
            i += 2
            headers.append((name, value))
        # PART_DATA: up to a delimiter followed by CR LF or "--"; anything
        # else after "CRLF--boundary" is data.
        s = i
        while True:
            k = body.find(delim, i)
            if k < 0:
                return parts          # never completed
            after = body[k + len(delim):k + len(delim) + 2]
            if after == b"\r\n":
                parts.append((headers, body[s:k]))
                i = k + len(delim) + 2
                break
            if after == b"--":
                parts.append((headers, body[s:k]))
                return parts
            if len(after) < 2:
                return parts
            i = k + 1


def _safe_decode(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("latin-1")


def starlette_form(body, content_type):
    """Starlette's request.form() for a multipart body: [(name, value)]
    (a part with a filename gives ("name", "<file>"))."""
    _, params = parse_options_header(content_type)
    if "boundary" not in params:
        raise ParseError("missing boundary in multipart")
    items = []
    for headers, data in multipart_parts(body, params["boundary"].encode("latin-1")):
        disposition = None
        for name, value in headers:
            if name == b"content-disposition":
                disposition = value          # the last one
        _, options = parse_options_header(
            disposition.decode("latin-1") if disposition is not None else None)
        if "name" not in options:
            raise ParseError('The Content-Disposition header field "name" must be provided.')
        field = _safe_decode(options["name"].encode("latin-1"))
        items.append((field, "<file>" if "filename" in options else _safe_decode(data)))
    return items


def served_model(body, content_type):
    """(how it was read, the model a Python runner serves or None)."""
    ctype, _ = parse_options_header(content_type or "")
    if ctype == "multipart/form-data":
        return "form", dict(starlette_form(body, content_type)).get("model")
    if ctype == "application/x-www-form-urlencoded":
        fields = urllib.parse.parse_qsl(body.decode("latin-1"), keep_blank_values=True)
        return "urlencoded", dict(fields).get("model")
    if not body:
        return "none", None
    doc = json.loads(body)                   # bytes: UTF-8/16/32 detected
    if not isinstance(doc, dict):
        raise ParseError("not an object")
    model = doc.get("model")
    return "json", model if isinstance(model, str) else None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        ctype = self.headers.get("Content-Type")
        try:
            how, model = served_model(body, ctype)
            status, doc = 200, {"served": model, "read": how}
        except Exception as e:   # Starlette: 400, or 500 (a TypeError)
            status, doc = 400, {"error": str(e)}
        self.server.seen.append((body, ctype))
        out = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


class FormRunner:
    """The reader above as a runner on an ephemeral port of 127.0.0.1."""

    def __enter__(self):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.seen = []
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        return False

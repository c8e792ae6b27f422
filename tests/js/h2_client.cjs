// SPDX-License-Identifier: BSD-2-Clause
// An HTTP/2 client for the end-to-end tests: Node's http2 (nghttp2 inside),
// one connection, many streams at once.
//
//   node h2_client.cjs SPEC_FILE
//
// SPEC_FILE holds JSON: {"port": N, "ca": PATH, "servername": "localhost",
//        "streams": [{"path", "headers": {...}, "body": "...",
//                     "hold": true,     // do not read the body until told
//                     "reset_after": N  // RST_STREAM (CANCEL) after N bytes
//                    }, ...]}
//
// Prints one JSON line when every stream that is not held is done:
//   {"event": "ready", "streams": [RESULT|null, ...]}
// then, on a line "go" on stdin, reads the held streams and prints
//   {"event": "done", "streams": [RESULT, ...]}
// RESULT: {"status", "headers", "body" (latin1), "bytes", "ms", "error", "rst"}.
"use strict";

const http2 = require("node:http2");
const fs = require("node:fs");
const readline = require("node:readline");

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const t0 = Date.now();
const results = spec.streams.map(() => null);
const held = [];
let pending = 0;

const session = http2.connect("https://127.0.0.1:" + spec.port, {
  ca: fs.readFileSync(spec.ca),
  servername: spec.servername || "localhost",
});
session.on("error", (e) => {
  process.stdout.write(JSON.stringify({ event: "session_error", error: String(e) }) + "\n");
});

function finished() {
  pending--;
  if (pending === 0) {
    // A pipe is written asynchronously: exit once the line is out.
    process.stdout.write(JSON.stringify({ event: "ready", streams: results }) + "\n", () => {
      if (held.length === 0) {
        session.close();
        process.exit(0);
      }
    });
  }
}

spec.streams.forEach((s, i) => {
  const headers = Object.assign({ ":method": s.method || "POST", ":path": s.path },
                                s.headers || {});
  const req = session.request(headers, { endStream: s.body === undefined });
  const r = { status: 0, headers: {}, body: "", bytes: 0, ms: 0, error: null };
  const chunks = [];
  req.on("response", (h) => {
    r.status = h[":status"];
    for (const k of Object.keys(h)) if (k[0] !== ":") r.headers[k] = h[k];
  });
  if (s.hold) {
    // Read nothing: the stream's window stays shut once it is full.
    req.pause();
    held.push({ req, r, chunks, i });
  } else {
    pending++;
  }
  req.on("data", (d) => {
    chunks.push(d);
    r.bytes += d.length;
    if (s.reset_after !== undefined && r.bytes >= s.reset_after && !r.reset) {
      r.reset = true;
      req.close(http2.constants.NGHTTP2_CANCEL);
    }
  });
  let ended = false;
  const end = (err) => {
    if (ended) return;
    ended = true;
    r.ms = Date.now() - t0;
    r.error = r.reset ? "RST_8" : err ? String(err.code || err) : null;
    r.rst = req.rstCode || 0;   // the RST_STREAM code, 0: none
    r.body = Buffer.concat(chunks).toString("latin1");
    results[i] = r;
    if (!s.hold) finished();
    else if (held.every((h) => results[h.i] !== null)) {
      process.stdout.write(JSON.stringify({ event: "done", streams: results }) + "\n", () => {
        session.close();
        process.exit(0);
      });
    }
  };
  req.on("end", () => end(null));
  req.on("close", () => end(req.rstCode ? { code: "RST_" + req.rstCode } : null));
  req.on("error", (e) => end(e));
  if (s.body !== undefined) req.end(s.body);
});

if (pending === 0) {
  pending = 1;
  finished();
}

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  if (line.trim() === "go") for (const h of held) h.req.resume();
});

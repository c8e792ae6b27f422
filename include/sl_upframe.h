/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_upframe: sluice's own HTTP/1.1 framing of an upstream exchange (issue
 * 35), for connections libcurl only opened (CURLOPT_CONNECT_ONLY). Pure: no
 * sockets, no event loop; the caller reads and writes, this module turns
 * bytes into an answer and a request into bytes. Names carry sl_upf_.
 *
 * Three parts:
 *
 * - a field store (struct sl_upf_fields): name/value pairs as offsets into
 *   one owned, capped text buffer; a head is held as fields, never as text
 *   to be parsed again;
 *
 * - the response parser (struct sl_upf_resp), over http-parser 2.9.4 as
 *   HTTP_RESPONSE, fed any split of the runner's bytes (down to one byte)
 *   with the same outcome. It stops when a final head is complete
 *   (SL_UPF_HEAD_DONE: status, reason, filtered fields and framing are
 *   known before any body byte moves), hands de-chunked body bytes to a
 *   sink, and stops again when the answer is complete (SL_UPF_DONE) with a
 *   verdict: may the connection carry another request (reusable)? The
 *   head's fields go through sl_resp_head_field(), the rule today's libcurl
 *   path applies line by line (sl_http.h): what it drops never reaches the
 *   fields, what it refuses fails the answer. A byte lexer runs alongside
 *   http-parser, ahead of it, over heads and chunk framing, for what
 *   http-parser lets through (it is built lax: obs-fold, a CR followed by
 *   anything, "0200" as a status, any two bytes after chunk data taken for
 *   CRLF); http-parser only ever sees bytes the lexer accepted, so the
 *   first bad byte decides, however the bytes were split;
 *
 * - the request writer: a head (request line, Host, the fields, framing
 *   headers) from a method, a target and a field list, the field list built
 *   from the client's request by the rules of sl_transfer.h, and a chunked
 *   body framer.
 *
 * Response behaviours, each pinned by tests/unit/test_upframe.c:
 * - 1xx interim heads (100 Continue, 102, 103) are read, checked like
 *   final ones and dropped, as today (counted in `interim`, at most
 *   SL_UPF_MAX_INTERIM); their Connection says nothing of the final
 *   answer's. A 101 is an error: sluice never asks to switch protocols.
 * - A status line is "HTTP/" DIGIT "." DIGIT SP 3DIGIT [SP reason], bytes
 *   checked one by one (http-parser, built lax, takes "HTP/T1.1").
 * - A HEAD request's answer, a 204 and a 304 have no body whatever their
 *   head says; bytes after their head are extra (below).
 * - Content-Length: exactly that many bytes. Bytes after the end of an
 *   answer (past a Content-Length, after a chunked body's last CRLF, after
 *   a bodiless answer), in the same feed or a later one, are not consumed:
 *   they are counted in `extra` and the connection is not reusable.
 * - chunked: chunk extensions are accepted and ignored (a size line is at
 *   most SL_UPF_CHUNK_LINE_MAX bytes, its CRLF exact); trailer fields are
 *   checked like head lines, counted against max_header_bytes and dropped
 *   (RFC 9110 6.5.1 lets a recipient discard them; today's path does not
 *   relay them either). http-parser still reads framing fields there: a
 *   trailer Connection: close, or one whose name starts with
 *   Transfer-Encoding, makes the connection not reusable; a bad
 *   Content-Length trailer fails the answer.
 * - No length and not chunked: the body runs until the runner closes
 *   (sl_upf_resp_eof() completes it); never reusable.
 * - An EOF before any byte of the answer is SL_UPF_E_CLOSED (the runner
 *   closed a kept connection: the request may go again on a fresh one);
 *   inside a head, before a declared length or inside chunked framing it is
 *   SL_UPF_E_TRUNCATED, never a clean end.
 * - Connection: close, and any HTTP/1.0 answer (even with keep-alive): not
 *   reusable. Only HTTP/1.x is accepted.
 * - Two Content-Length fields (even equal: http-parser refuses them),
 *   Content-Length with Transfer-Encoding (RFC 9112 6.3 leaves a proxy the
 *   choice; chunked winning would still leave a connection nobody can
 *   trust, so it is an error, as http-parser makes it), a coding other than
 *   chunked, chunked twice, and any head http-parser frames otherwise
 *   than the rule reads it (a field named "Transfer-Encoding-x" is one to
 *   http-parser as Debian builds it; "chunked<HTAB>"):
 *   SL_UPF_E_MALFORMED before any body byte.
 * - A head over max_header_bytes (status line, fields, CRLFs, counted per
 *   head): SL_UPF_E_HEAD_TOO_LARGE.
 *
 * Pausing: the sink may return SL_UPF_PAUSE; the feed then returns right
 * after that piece and the caller keeps the unconsumed bytes until it
 * wants more. The parser buffers no body: what it holds is one head (at
 * most max_header_bytes of fields).
 */
#ifndef SL_UPFRAME_H
#define SL_UPFRAME_H

#include <http_parser.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "sl_http.h"

/* ---- field store ---- */

struct sl_upf_field {
	uint32_t name_off, name_len;
	uint32_t value_off, value_len;
};

struct sl_upf_fields {
	char *text;                 /* names and values, back to back */
	size_t len, cap, max;       /* max: cap on len, set at init */
	struct sl_upf_field *f;
	size_t n, fcap;
};

/* An empty store whose text may grow to max bytes. Allocates nothing. */
void sl_upf_fields_init(struct sl_upf_fields *, size_t max);

/* Forget the fields, keep the memory. */
void sl_upf_fields_clear(struct sl_upf_fields *);

void sl_upf_fields_free(struct sl_upf_fields *);

/* Append a field (copied). -1: over max, or out of memory. */
int sl_upf_fields_add(struct sl_upf_fields *, const char *name, size_t nlen,
    const char *value, size_t vlen);

/* Value of the first field named name (any case), or NULL. */
const char *sl_upf_fields_get(const struct sl_upf_fields *, const char *name,
    size_t *vlen);

/* The i-th field: 0, or -1 out of range. Pointers live until the next change. */
int sl_upf_fields_at(const struct sl_upf_fields *, size_t i,
    const char **name, size_t *nlen, const char **value, size_t *vlen);

/* ---- response parser ---- */

#define SL_UPF_MAX_INTERIM 16       /* 1xx heads before a final one */
#define SL_UPF_CHUNK_LINE_MAX 4096  /* a chunk-size line, extensions included */

enum sl_upf_state {
	SL_UPF_HEAD = 0,    /* reading a head (interim ones are dropped) */
	SL_UPF_HEAD_DONE,   /* a final head is complete: sl_upf_resp_continue() */
	SL_UPF_BODY,        /* body bytes go to the sink */
	SL_UPF_DONE,        /* the answer is complete: see reusable, extra */
	SL_UPF_ERROR        /* see error and why; the connection must close */
};

enum sl_upf_error {
	SL_UPF_E_NONE = 0,
	SL_UPF_E_MALFORMED,        /* a head, framing or chunk that is not HTTP/1.1 */
	SL_UPF_E_HEAD_TOO_LARGE,   /* a head (or trailer) over max_header_bytes */
	SL_UPF_E_UNSUPPORTED,      /* 101, too many 1xx, not HTTP/1.x */
	SL_UPF_E_CLOSED,           /* EOF before any byte of the answer */
	SL_UPF_E_TRUNCATED,        /* EOF inside the answer */
	SL_UPF_E_SINK,             /* the sink said -1 */
	SL_UPF_E_NOMEM
};

enum sl_upf_framing {
	SL_UPF_NO_BODY = 0,     /* HEAD, 1xx, 204, 304, or Content-Length: 0 */
	SL_UPF_LENGTH,          /* Content-Length */
	SL_UPF_CHUNKED,
	SL_UPF_UNTIL_CLOSE      /* neither: the body ends when the runner closes */
};

/* What the sink returns. */
#define SL_UPF_GO 0
#define SL_UPF_PAUSE 1

/*
 * Body bytes, de-chunked, n > 0; p lives only during the call. Return
 * SL_UPF_GO, SL_UPF_PAUSE (stop feeding after this piece) or -1 (fail the
 * answer with SL_UPF_E_SINK). Set state only: never call the parser back.
 */
typedef int (*sl_upf_sink)(void *arg, const char *p, size_t n);

struct sl_upf_resp {
	http_parser parser;
	enum sl_upf_state state;
	enum sl_upf_error error;
	const char *why;            /* on SL_UPF_ERROR: static text */
	size_t max_header_bytes;
	int head_request;           /* the request was HEAD */
	sl_upf_sink sink;
	void *sink_arg;

	/* The final head, once HEAD_DONE. */
	int status;
	int http_major, http_minor;
	char reason[64];            /* printable ASCII; others become ' ' */
	struct sl_upf_fields fields;    /* filtered (sl_resp_head_field) */
	struct sl_resp_head meta;   /* what the rule saw: types, Retry-After;
	                             * its block is never used */
	enum sl_upf_framing framing;
	long long content_length;   /* -1: none */

	/* The verdict, once DONE. */
	int reusable;               /* the connection may carry another request */
	uint64_t extra;             /* bytes seen after the end of the answer */

	unsigned interim;           /* 1xx heads dropped */
	uint64_t bytes_in;          /* bytes of the answer consumed so far */
	uint64_t body_bytes;        /* body bytes given to the sink */

	/* Private. */
	int stop;                   /* why http-parser paused */
	int last_was_value;
	size_t reason_len;
	int lex, lex_mode;          /* the byte lexer's state and mode */
	size_t lex_ahead;           /* bytes the lexer accepted, not yet parsed */
	size_t lex_head;            /* bytes of the current head (or trailer) */
	size_t lex_line;            /* bytes of the current chunk-size line */
	int lex_digits;             /* status digits; chunk-size digits */
	uint64_t lex_chunk;         /* chunk bytes the lexer still expects */
	int lex_bad;                /* the lexer refused the byte after lex_ahead */
	enum sl_upf_error lex_err;
	const char *lex_why;
};

/*
 * Prepare r for the answer to one request (head_request: it was HEAD);
 * body bytes go to sink(arg). Allocates nothing until a head arrives.
 * Heads over max_header_bytes fail; http-parser's own limit (process-wide,
 * http_parser_set_max_header_size) must be above it, as worker.c sets it.
 */
void sl_upf_resp_init(struct sl_upf_resp *r, size_t max_header_bytes,
    int head_request, sl_upf_sink sink, void *arg);

/* The next answer on the same connection: keeps memory, sink and limit. */
void sl_upf_resp_reset(struct sl_upf_resp *r, int head_request);

void sl_upf_resp_free(struct sl_upf_resp *r);

/*
 * Parse up to len bytes of the runner's answer; returns the bytes consumed.
 * Stops early at HEAD_DONE, when the sink pauses, at DONE (what is left is
 * extra: counted, not consumed) and at ERROR. The caller keeps what was
 * not consumed and feeds it again, unchanged, before newer bytes. In
 * HEAD_DONE, DONE and ERROR it consumes nothing (at DONE, len > 0 is
 * counted as extra). After a pause the count may stop short of what the
 * sink was given (http-parser keeps a Content-Length body's last byte to
 * see the end on it): feed the rest again as always, nothing is given
 * twice.
 */
size_t sl_upf_resp_feed(struct sl_upf_resp *r, const char *data, size_t len);

/*
 * After HEAD_DONE: go on to the body (state BODY). At least one byte of the
 * head (its last LF) is still unconsumed: an answer without a body
 * completes on the next feed.
 */
void sl_upf_resp_continue(struct sl_upf_resp *r);

/*
 * The runner closed (read 0 or ECONNRESET), after every byte it sent was
 * fed. A body read until close completes (DONE, not reusable); in DONE the
 * connection is only marked not reusable; anywhere else the answer fails:
 * SL_UPF_E_CLOSED if no byte of it came, SL_UPF_E_TRUNCATED otherwise.
 */
void sl_upf_resp_eof(struct sl_upf_resp *r);

/* Text for an error code (static). */
const char *sl_upf_error_str(enum sl_upf_error);

/* ---- request writer ---- */

enum sl_upf_body {
	SL_UPF_BODY_NONE = 0,   /* no body, no framing header (GET, HEAD) */
	SL_UPF_BODY_LENGTH,     /* Content-Length: content_length (0 allowed) */
	SL_UPF_BODY_CHUNKED     /* Transfer-Encoding: chunked */
};

struct sl_upf_req_spec {
	const char *method;             /* "POST": a token */
	const char *target;             /* origin form, "/v1/..." */
	size_t target_len;
	const char *host;               /* the replica's authority, "h:port" */
	const struct sl_upf_fields *fields;   /* may be NULL */
	enum sl_upf_body body;
	uint64_t content_length;
	int close;                      /* ask for Connection: close */
};

/*
 * The request head's bytes: request line (HTTP/1.1), Host, the fields in
 * order, the framing header, Connection: close if asked (keep-alive is
 * HTTP/1.1's default and is not written), the empty line. Fields that
 * would contradict the framing or the hop are left out whoever put them
 * there: hop-by-hop ones, Host, Content-Length, Expect. Returns a malloc'd
 * buffer the caller frees (*len bytes, NUL after them), or NULL with *why
 * set: a CR, LF, NUL or other control in any part, a method or name that
 * is not a token, a target not in origin form, out of memory.
 */
char *sl_upf_req_head(const struct sl_upf_req_spec *, size_t *len,
    const char **why);

/*
 * The upstream fields for client request r, by the rules of
 * sl_xfer_headers() (sl_transfer.h), in its order: r's fields but those
 * sl_req_header_dropped_upstream() drops and (identity set) Accept-Encoding;
 * Accept-Encoding: identity if identity; every X-Forwarded-For hop and
 * peer, as one field; Authorization: Bearer api_key if api_key is not
 * NULL. out is cleared first. -1: out of memory or over out's max.
 */
int sl_upf_fields_from_req(struct sl_upf_fields *out, const struct sl_req *r,
    const char *peer, int identity, const char *api_key);

/*
 * The framing a body of the client's request takes upstream, as
 * sl_xfer_prepare() has libcurl do it: none for a GET without a body and
 * for HEAD, else Content-Length (the body is whole by then).
 */
enum sl_upf_body sl_upf_req_framing(const struct sl_req *r);

/*
 * Chunked body framing for writev: one chunk of n > 0 bytes at p as
 * iov[0..2] (size line, data, CRLF) with the size line written into line;
 * returns 3. With n == 0, the last chunk and the end ("0\r\n\r\n") as
 * iov[0]; returns 1. line must stay alive until the bytes are written.
 */
#define SL_UPF_CHUNK_LINE 20
int sl_upf_chunk(char line[SL_UPF_CHUNK_LINE], const void *p, size_t n,
    struct iovec iov[3]);

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_http: the client request parser, a thin wrapper around http-parser
 * 2.9.4 (kept behind this interface so it can be swapped for llhttp).
 *
 * The parser stops twice per request so the caller can act at the right
 * moment: once when the head is complete (admission is decided before the
 * body is read) and once when the message is complete. Names, values and
 * the target are copied into an arena bounded by max_header_bytes; the body
 * is stored up to max_body_bytes (or discarded).
 */
#ifndef SL_HTTP_H
#define SL_HTTP_H

#include <http_parser.h>
#include <stddef.h>
#include <time.h>
#include <stdint.h>

#define SL_REQ_MAX_HEADERS 128

enum sl_req_state {
	SL_REQ_HEAD = 0,     /* reading the request head */
	SL_REQ_HEAD_DONE,    /* head parsed; call sl_req_continue() to read the body */
	SL_REQ_BODY,         /* reading the body */
	SL_REQ_DONE,         /* whole message read */
	SL_REQ_ERROR         /* see status / reason; the connection must close */
};

struct sl_req_header {
	uint32_t name_off, name_len;
	uint32_t value_off, value_len;
};

struct sl_req {
	http_parser parser;
	enum sl_req_state state;
	int status;              /* on SL_REQ_ERROR: 400, 413, 431, 501 */
	const char *reason;      /* on SL_REQ_ERROR: human readable, static */

	size_t max_header_bytes;
	size_t max_body_bytes;
	int discard_body;        /* set by the caller: count but do not keep */

	char *arena;             /* target + header names and values */
	size_t arena_len, arena_cap;
	uint32_t url_off, url_len;
	struct sl_req_header *headers;   /* grows with the head, up to the max */
	size_t nheaders, headers_cap;
	int last_was_value;      /* http-parser callback bookkeeping */
	size_t head_bytes;       /* bytes of head seen (request line + headers) */
	int lex;                 /* head_lex() state across feeds */
	size_t lex_headers;      /* header lines head_lex() has seen */
	size_t lex_end_at;       /* head offset of the LF that ended the head */

	char *body;              /* NULL when empty or discarded */
	size_t body_len, body_cap;
	uint64_t body_seen;      /* body bytes seen, kept or not */

	int method;              /* enum http_method, once method_known */
	int method_known;        /* the head was parsed: method is real */
	int http_major, http_minor;
	int keep_alive;          /* from http_should_keep_alive at head done */
	int has_body;            /* Content-Length > 0 or chunked */
	int too_large;           /* Content-Length over max_body_bytes: the
	                          * caller answers 413 after authenticating */
};

/* Prepare for a new connection. Allocates nothing until bytes arrive. */
void sl_req_init(struct sl_req *, size_t max_header_bytes, size_t max_body_bytes);

/* Forget the current request, keep the memory: next request on keep-alive. */
void sl_req_reset(struct sl_req *);

/* Free everything. */
void sl_req_free(struct sl_req *);

/*
 * The head was used (the upstream request is built): keep only the target
 * and method, give back the header table and the rest of the arena. A
 * stream then holds no copy of a head it no longer needs. Header lookups
 * find nothing afterwards.
 */
void sl_req_shed_head(struct sl_req *);

/*
 * Parse up to len bytes. Returns the number consumed; stops early when the
 * head completes (state HEAD_DONE), when the message completes (DONE) or on
 * error (ERROR). The caller keeps unconsumed bytes and feeds them again.
 */
size_t sl_req_feed(struct sl_req *, const char *data, size_t len);

/* After HEAD_DONE: go on reading the body (state becomes BODY or DONE). */
void sl_req_continue(struct sl_req *);

/* The request target as received ("/v1/chat/completions?x=1"). */
const char *sl_req_url(const struct sl_req *, size_t *len);

/* Value of the first header named name (case-insensitive), or NULL. */
const char *sl_req_header(const struct sl_req *, const char *name, size_t *len);

/* i-th header; returns 0 or -1 when out of range. */
int sl_req_header_at(const struct sl_req *, size_t i, const char **name,
    size_t *nlen, const char **value, size_t *vlen);

/* Method name ("GET") of the current request; "-" before its head parsed. */
const char *sl_req_method(const struct sl_req *);

/*
 * Bearer token of an Authorization header value ("Bearer KEY"), or NULL when
 * the value is not of that form. *len receives the token's length.
 */
const char *sl_http_bearer(const char *value, size_t vlen, size_t *len);

/* 1 if header name (nlen bytes) is hop-by-hop (RFC 9110 7.6.1 plus legacy ones). */
int sl_http_is_hop_by_hop(const char *name, size_t nlen);

/*
 * 1 if the client's header name (nlen bytes) of request r is not passed on
 * to an upstream as it came: hop-by-hop or named in r's Connection, Host
 * (the replica's goes instead), Authorization and X-Api-Key (sluice's
 * credentials, never the runner's: an upstream's api_key is added by the
 * caller), Content-Length and Expect (the body is framed anew). The upstream
 * request of sl_transfer.h and of sl_upframe.h both apply it; X-Forwarded-For
 * (merged) and Accept-Encoding (maybe replaced) are their callers' to handle.
 */
int sl_req_header_dropped_upstream(const struct sl_req *r, const char *name,
    size_t nlen);

/* 1 if ch is an RFC 9110 token character (header names, parameters). */
int sl_http_is_tchar(unsigned char ch);

/* 1 if header name (nlen bytes) is `want` (lower case), ignoring case. */
int sl_http_name_is(const char *name, size_t nlen, const char *want);

/* Reason phrase of a status sluice sends itself ("Unknown" for others). */
const char *sl_http_reason(int status);

/*
 * The upstream's response head, fed line by line as libcurl's header
 * callback hands it over. Filters what may reach the client: hop-by-hop
 * headers, those the head names in Connection, Content-Length (the body is
 * re-framed) and X-Accel-Buffering are dropped; a line with CR, LF or NUL
 * inside, an obs-fold, a bad name, a Content-Length that is not one decimal
 * length (or disagrees with another), a transfer coding other than chunked,
 * chunked named twice (RFC 9112 6.1: applied once at most) or a head over
 * SL_RESP_HEAD_MAX makes the whole head bad: libcurl would frame the body
 * by a guess, and a body cut short could look whole.
 */
#define SL_RESP_HEAD_MAX 65536

struct sl_resp_head {
	int status;
	char reason[64];          /* printable ASCII only */
	char *block;              /* kept headers, "Name: value\r\n" each */
	size_t len, cap;
	int is_sse;               /* Content-Type: text/event-stream */
	int is_json;              /* Content-Type: application/json */
	int has_cache_control;
	int encoded;              /* a Content-Encoding other than identity */
	int chunked;              /* a Transfer-Encoding: chunked line seen */
	int retry_after;          /* first Retry-After in seconds; -1: none */
	long long content_length; /* -1: none; every line must agree */
	char conn_names[128];     /* names listed in Connection, ",a,b," lower case */
	size_t conn_len;
};

enum sl_rh_result {
	SL_RH_MORE = 0,           /* keep feeding */
	SL_RH_DONE,               /* a final (>= 200) head is complete */
	SL_RH_BAD                 /* malformed: answer 502 / cut */
};

/* Forget the head, keep the memory (a 1xx head is followed by another). */
/*
 * A Retry-After value (v, n bytes) in seconds from `now` (time(NULL)):
 * delta-seconds or an HTTP-date (IMF-fixdate, RFC 850 or asctime form),
 * at most SL_RETRY_AFTER_MAX; 0 for a date already past or a value that
 * is neither.
 */
#define SL_RETRY_AFTER_MAX 86400
int sl_http_retry_after(const char *v, size_t n, time_t now);

void sl_resp_head_reset(struct sl_resp_head *);
void sl_resp_head_free(struct sl_resp_head *);

/* One header line as libcurl delivers it, CRLF included. */
enum sl_rh_result sl_resp_head_line(struct sl_resp_head *, const char *line,
    size_t len);

/*
 * The rule sl_resp_head_line() applies to each header field, for a framing
 * that has the field already split (sl_upframe.h): name (nl bytes) and value
 * (vl bytes, without leading or trailing whitespace). Records what h tracks
 * (Content-Length, chunked, Connection's names, content type, Retry-After).
 * 1: the field may reach the client; 0: it is dropped (hop-by-hop,
 * Content-Length, X-Accel-Buffering); -1: the whole head is bad. Fields that
 * Connection names are dropped once the head is complete: ask
 * sl_resp_head_conn_named() then (Connection may come after them).
 */
int sl_resp_head_field(struct sl_resp_head *h, const char *name, size_t nl,
    const char *value, size_t vl);

/* 1 if the head's Connection fields (so far) name header name (nlen bytes). */
int sl_resp_head_conn_named(const struct sl_resp_head *h, const char *name,
    size_t nlen);

/* Write the chunk-size line for n body bytes ("%zx\r\n"); returns its length. */
size_t sl_http_chunk_header(char *dst, size_t dstlen, size_t n);

/* Constant-time comparison of two byte strings; 1 if equal. */
int sl_ct_equal(const char *a, size_t alen, const char *b, size_t blen);

#endif

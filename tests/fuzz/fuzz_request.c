/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * fuzz_request: the client request path (sl_req_* over http-parser).
 *
 * Input: byte 0 chooses the limits and modes, bytes 1-2 a split point, the
 * rest is what a client sends on one connection. The bytes are parsed the
 * way the exchange drives the parser (feed what is buffered; at HEAD_DONE call
 * sl_req_continue(); at DONE reset and parse the next pipelined request),
 * once in a single read, once in two reads split at the chosen point and,
 * when byte 0 says so, one byte per read. Every run must reach the same
 * verdict: per request, its final state, status, method, version, target,
 * header list and body. Each run checks the request on its own: statuses,
 * header names and values, head and body limits, the Content-Length body
 * against the input, and the lookup helpers against plain loops.
 *
 * Each read is copied into a buffer of exactly its size and freed after
 * the feed, so ASan catches both over-reads and pointers kept into it.
 */
#include "config.h"

#include <http_parser.h>
#include <inttypes.h>
#include <strings.h>
#include <sys/types.h>

#include "sl_http.h"
#include "fuzz.h"

#define MAX_REQS 8   /* pipelined requests followed per input */

/* Byte 0: bit 0 one byte per read, bit 1 discard bodies, 2-3 head limit, 4-5 body limit. */
static const size_t head_limits[4] = { 128, 1024, 4096, 32768 };
static const size_t body_limits[4] = { 0, 64, 4096, 1 << 20 };

enum split_mode { SPLIT_NONE, SPLIT_AT, SPLIT_BYTES };

struct opts {
	size_t max_head, max_body;
	int discard;
};

/* What a run saw, compared byte for byte across runs. */
struct run {
	struct fz_buf verdict;
	const uint8_t *in;       /* the whole input (for the Content-Length check) */
	size_t len;
	size_t req_start;        /* offset where the current request began */
	size_t head_end;         /* offset of the head's last byte (its LF) */
	int head_seen;
	int nreq;
};

static int
is_ws(char c)
{
	return c == ' ' || c == '\t';
}

/* The Content-Length header, if exactly one with a plain decimal value. */
static int
content_length(const struct sl_req *r, uint64_t *cl)
{
	const char *name, *value;
	size_t i, nl, vl, k, n = 0;
	uint64_t v = 0;

	for (i = 0; sl_req_header_at(r, i, &name, &nl, &value, &vl) == 0; i++) {
		if (nl == 17 && strncasecmp(name, "transfer-encoding", 17) == 0)
			return 0;
		if (nl != 14 || strncasecmp(name, "content-length", 14) != 0)
			continue;
		if (++n > 1 || vl == 0 || vl > 18)
			return 0;
		for (k = 0, v = 0; k < vl; k++) {
			if (value[k] < '0' || value[k] > '9')
				return 0;
			v = v * 10 + (uint64_t)(value[k] - '0');
		}
	}
	*cl = v;
	return n == 1;
}

/* Index of the first header named key (nl bytes), by a plain loop. */
static size_t
first_named(const struct sl_req *r, const char *key, size_t nl)
{
	const char *name, *value;
	size_t i, l, vl;

	for (i = 0; sl_req_header_at(r, i, &name, &l, &value, &vl) == 0; i++)
		if (l == nl && strncasecmp(name, key, nl) == 0)
			break;
	return i;
}

/* Invariants of a parsed head, and its part of the verdict. */
static void
check_head(struct run *run, const struct sl_req *r, const struct opts *o)
{
	const char *url, *name, *value, *m, *first, *tok, *n2, *v2;
	size_t ulen, nl, vl, i, j, fl, tl, nl2, vl2;
	char key[256];
	uint64_t cl;

	/* The head's size counts its final LF, which is still unconsumed here. */
	fz_check(run->head_end + 1 - run->req_start <= o->max_head, "head-limit",
	    "head of %zu bytes (final LF included) accepted with max_header_bytes %zu",
	    run->head_end + 1 - run->req_start, o->max_head);

	url = sl_req_url(r, &ulen);
	fz_check(ulen > 0 && url[0] == '/', "url-origin", "target is not origin-form");
	for (i = 0; i < ulen; i++)
		fz_check(url[i] != ' ' && url[i] != '\r' && url[i] != '\n' &&
		    url[i] != '\0', "url-chars", "SP, CR, LF or NUL in the target at %zu", i);
	/* HTTP/1.2 and up are read as 1.1 (RFC 9110 2.5); only the major is fixed. */
	fz_check(r->http_major == 1, "version", "HTTP/%d.%d accepted", r->http_major,
	    r->http_minor);
	m = sl_req_method(r);
	fz_check(m != NULL && strcmp(m, "CONNECT") != 0, "method", "method %s", m ? m : "(null)");
	fz_check(r->nheaders <= SL_REQ_MAX_HEADERS, "nheaders", "%zu headers", r->nheaders);

	fz_addf(&run->verdict, "[head %s HTTP/%d.%d keep-alive=%d body=%d url=%zu:", m,
	    r->http_major, r->http_minor, r->keep_alive, r->has_body, ulen);
	fz_add(&run->verdict, url, ulen);
	fz_addf(&run->verdict, " %zu headers]", r->nheaders);

	for (i = 0; sl_req_header_at(r, i, &name, &nl, &value, &vl) == 0; i++) {
		fz_check(nl > 0, "header-name", "empty header name (#%zu)", i);
		for (j = 0; j < nl; j++)
			fz_check(fz_tchar((unsigned char)name[j]), "header-name",
			    "byte 0x%02x in header name #%zu", (unsigned char)name[j], i);
		for (j = 0; j < vl; j++)
			fz_check(value[j] != '\r' && value[j] != '\n' && value[j] != '\0',
			    "header-value", "CR, LF or NUL in header value #%zu", i);
		fz_check(vl == 0 || (!is_ws(value[0]) && !is_ws(value[vl - 1])),
		    "header-value-ows", "header value #%zu keeps leading or trailing whitespace", i);
		fz_addf(&run->verdict, "[%zu:", nl);
		fz_add(&run->verdict, name, nl);
		fz_addf(&run->verdict, " %zu:", vl);
		fz_add(&run->verdict, value, vl);
		fz_add(&run->verdict, "]", 1);

		/* sl_req_header() finds the first header of that name. */
		if (nl < sizeof(key)) {
			memcpy(key, name, nl);
			key[nl] = '\0';
			j = first_named(r, key, nl);
			(void)sl_req_header_at(r, j, &n2, &nl2, &v2, &vl2);
			first = sl_req_header(r, key, &fl);
			fz_check(first == v2 && fl == vl2, "header-lookup",
			    "sl_req_header(\"%s\") is not header #%zu", key, j);
		}

		/* The bearer token is a non-empty run of non-blanks inside the value. */
		if (nl == 13 && strncasecmp(name, "authorization", 13) == 0 &&
		    (tok = sl_http_bearer(value, vl, &tl)) != NULL) {
			fz_check(tok > value && tok + tl <= value + vl && tl > 0,
			    "bearer", "token outside the value");
			for (j = 0; j < tl; j++)
				fz_check(!is_ws(tok[j]), "bearer", "blank inside the token");
			fz_check(strncasecmp(value, "bearer", 6) == 0 && is_ws(value[6]),
			    "bearer", "token from a value not starting 'Bearer '");
			fz_check(sl_ct_equal(tok, tl, tok, tl) == 1, "ct-equal", "token != itself");
			fz_check(sl_ct_equal(tok, tl, tok, tl - 1) == 0, "ct-equal",
			    "token == its prefix");
			fz_check(sl_ct_equal(tok, tl, value, vl) ==
			    (tl == vl && memcmp(tok, value, vl) == 0), "ct-equal",
			    "sl_ct_equal disagrees with memcmp");
		}
	}

	/* A body is announced by chunked or a Content-Length over 0; bounded up front. */
	if (content_length(r, &cl)) {
		fz_check(r->has_body == (cl > 0), "has-body",
		    "Content-Length %" PRIu64 " but has_body %d", cl, r->has_body);
		/* Over the limit: flagged at the head, the relay answers 413. */
		fz_check((cl > o->max_body) == (r->too_large != 0), "body-limit",
		    "Content-Length %" PRIu64 " with max_body_bytes %zu: too_large %d",
		    cl, o->max_body, r->too_large);
	}
}

/* A request completed: invariants of its body, and its part of the verdict. */
static void
check_done(struct run *run, const struct sl_req *r, const struct opts *o, size_t off)
{
	uint64_t cl;

	fz_check(r->body_seen <= o->max_body && r->body_len <= o->max_body, "body-limit",
	    "body of %" PRIu64 " bytes with max_body_bytes %zu", r->body_seen, o->max_body);
	if (o->discard)
		fz_check(r->body_len == 0, "discard", "%zu body bytes kept while discarding",
		    r->body_len);
	else
		fz_check(r->body_len == r->body_seen, "body-kept",
		    "%zu bytes kept of %" PRIu64 " seen", r->body_len, r->body_seen);
	if (!r->has_body)
		fz_check(off == run->head_end + 1 && r->body_seen == 0, "no-body",
		    "a request without a body did not complete on its final LF");
	if (content_length(r, &cl)) {
		fz_check(r->body_seen == cl, "content-length",
		    "Content-Length %" PRIu64 ", %" PRIu64 " body bytes", cl, r->body_seen);
		fz_check(off == run->head_end + 1 + cl, "content-length",
		    "message ends at %zu, expected %zu", off, run->head_end + 1 + (size_t)cl);
		if (!o->discard && cl > 0)
			fz_check(r->body_len == cl &&
			    memcmp(r->body, run->in + run->head_end + 1, cl) == 0,
			    "body-bytes", "body differs from the bytes after the head");
	}
	fz_addf(&run->verdict, "[done %zu bytes, body %" PRIu64 " seen, %zu kept:",
	    off - run->req_start, r->body_seen, r->body_len);
	if (r->body_len > 0)
		fz_add(&run->verdict, r->body, r->body_len);
	fz_add(&run->verdict, "]", 1);
}

static size_t
next_read_end(enum split_mode mode, size_t avail, size_t split, size_t len)
{
	if (mode == SPLIT_BYTES)
		return avail + 1;
	if (mode == SPLIT_AT && avail < split)
		return split;
	return len;
}

/* Parse in[0..len) arriving in reads as mode says; the verdict goes to run. */
static void
parse(struct run *run, const struct opts *o, const uint8_t *in, size_t len,
    enum split_mode mode, size_t split)
{
	struct sl_req r;
	size_t avail = 0, off = 0, n, want;
	int stop = 0;
	char *copy;

	memset(run, 0, sizeof(*run));
	run->in = in;
	run->len = len;
	sl_req_init(&r, o->max_head, o->max_body);
	while (avail < len && !stop) {
		avail = next_read_end(mode, avail, split, len);
		/* exchange.c: feed while bytes are buffered and the parser moves on. */
		while (off < avail && !stop) {
			want = avail - off;
			if ((copy = malloc(want)) == NULL)
				abort();
			memcpy(copy, in + off, want);
			n = sl_req_feed(&r, copy, want);
			free(copy);
			fz_check(n <= want, "feed-count", "consumed %zu of %zu", n, want);
			off += n;
			switch (r.state) {
			case SL_REQ_ERROR:
				fz_check(r.status == 400 || r.status == 413 || r.status == 431,
				    "status", "error status %d (%s)", r.status,
				    r.reason ? r.reason : "no reason");
				fz_check(r.reason != NULL, "status", "error without a reason");
				fz_addf(&run->verdict, "[error %d]", r.status);
				stop = 1;
				break;
			case SL_REQ_HEAD_DONE:
				fz_check(!run->head_seen, "stops", "HEAD_DONE twice");
				run->head_seen = 1;
				run->head_end = off;
				check_head(run, &r, o);
				if (r.too_large) {
					/* exchange.c answers 413 and reads no body. */
					fz_addf(&run->verdict, "[error 413]");
					stop = 1;
					break;
				}
				if (o->discard)
					r.discard_body = 1;
				sl_req_continue(&r);
				fz_check(r.state == SL_REQ_BODY, "stops",
				    "state %d after sl_req_continue", (int)r.state);
				break;
			case SL_REQ_DONE:
				fz_check(run->head_seen, "stops", "DONE without HEAD_DONE");
				check_done(run, &r, o, off);
				if (++run->nreq == MAX_REQS) {
					stop = 1;
					break;
				}
				sl_req_reset(&r);
				run->req_start = off;
				run->head_seen = 0;
				break;
			default:
				/* Reading: the parser must take everything it was given. */
				fz_check(n == want, "feed-count",
				    "state %d: consumed %zu of %zu without stopping",
				    (int)r.state, n, want);
				break;
			}
		}
	}
	if (!stop) {
		/* Ran out of input mid-request (or between requests). */
		fz_addf(&run->verdict, "[end of input: state %d, head %d, body %" PRIu64 " seen]",
		    (int)r.state, run->head_seen, r.body_seen);
		if (r.state == SL_REQ_BODY)
			fz_check(r.body_seen <= o->max_body, "body-limit", "partial body over the limit");
	}
	sl_req_free(&r);
}

/* Length of the verdict before a final "[error NNN]" (NNN in *status), or -1. */
static ssize_t
error_tail(const struct fz_buf *v, int *status)
{
	const unsigned char *t;
	int i;

	if (v->len < 11)
		return -1;
	t = v->p + v->len - 11;
	if (memcmp(t, "[error ", 7) != 0 || t[10] != ']')
		return -1;
	for (i = 7, *status = 0; i < 10; i++) {
		if (t[i] < '0' || t[i] > '9')
			return -1;
		*status = *status * 10 + (t[i] - '0');
	}
	return (ssize_t)(v->len - 11);
}

/*
 * 1 if both runs refused the same request at the same point, only with a
 * different status: a check made after http_parser_execute() returns
 * (head size, obs-fold) racing one made in a callback during it.
 */
static int
differs_in_status_only(const struct fz_buf *a, const struct fz_buf *b)
{
	ssize_t la, lb;
	int sa, sb;

	la = error_tail(a, &sa);
	lb = error_tail(b, &sb);
	return la >= 0 && la == lb && sa != sb && memcmp(a->p, b->p, (size_t)la) == 0;
}

static void
compare(const struct run *a, const struct run *b, const char *what, size_t split)
{
	const char *name;

	if (a->verdict.len == b->verdict.len &&
	    memcmp(a->verdict.p, b->verdict.p, a->verdict.len) == 0)
		return;
	/* The known shape has its own name, so a campaign can go on past it. */
	name = differs_in_status_only(&a->verdict, &b->verdict) ? "split-status" : "split";
	if (fz_allowed(name))
		return;
	fz_dump("input", a->in, a->len);
	fz_dump("verdict, one read", a->verdict.p, a->verdict.len);
	fz_dump(what, b->verdict.p, b->verdict.len);
	fz_check(0, name, "the verdict depends on how the bytes are split (%s, split %zu)",
	    what, split);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct opts o;
	struct run whole, two, bytes;
	size_t split, len;
	const uint8_t *in;

	if (size < 3)
		return 0;
	o.max_head = head_limits[(data[0] >> 2) & 3];
	o.max_body = body_limits[(data[0] >> 4) & 3];
	o.discard = (data[0] >> 1) & 1;
	in = data + 3;
	len = size - 3;
	split = len ? (((size_t)data[1] << 8) | data[2]) % (len + 1) : 0;
	/* As the worker does: http-parser's own bound sits above ours. */
	http_parser_set_max_header_size((uint32_t)o.max_head + 1024);

	parse(&whole, &o, in, len, SPLIT_NONE, 0);
	parse(&two, &o, in, len, SPLIT_AT, split);
	compare(&whole, &two, "verdict, two reads", split);
	fz_free(&two.verdict);
	if ((data[0] & 1) && len <= 8192) {
		parse(&bytes, &o, in, len, SPLIT_BYTES, 0);
		compare(&whole, &bytes, "verdict, one byte per read", 0);
		fz_free(&bytes.verdict);
	}
	fz_free(&whole.verdict);
	return 0;
}

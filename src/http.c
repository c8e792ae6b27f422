/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Client request parsing on top of http-parser 2.9.4. See sl_http.h.
 */
#include "config.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "sl_http.h"

static int on_message_begin(http_parser *);
static int on_url(http_parser *, const char *, size_t);
static int on_header_field(http_parser *, const char *, size_t);
static int on_header_value(http_parser *, const char *, size_t);
static int on_headers_complete(http_parser *);
static int on_body(http_parser *, const char *, size_t);
static int on_message_complete(http_parser *);

static const http_parser_settings req_settings = {
	.on_message_begin = on_message_begin,
	.on_url = on_url,
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

static void
req_fail(struct sl_req *r, int status, const char *reason)
{
	if (r->state == SL_REQ_ERROR)
		return;
	r->state = SL_REQ_ERROR;
	r->status = status;
	r->reason = reason;
}

void
sl_req_init(struct sl_req *r, size_t max_header_bytes, size_t max_body_bytes)
{
	memset(r, 0, sizeof(*r));
	r->max_header_bytes = max_header_bytes;
	r->max_body_bytes = max_body_bytes;
	http_parser_init(&r->parser, HTTP_REQUEST);
	r->parser.data = r;
}

void
sl_req_reset(struct sl_req *r)
{
	char *arena = r->arena, *body = r->body;
	size_t acap = r->arena_cap, bcap = r->body_cap, hcap = r->headers_cap;
	struct sl_req_header *hd = r->headers;
	size_t mh = r->max_header_bytes, mb = r->max_body_bytes;

	/* Keep a small arena across requests; drop a large body buffer. */
	if (bcap > 65536) {
		free(body);
		body = NULL;
		bcap = 0;
	}
	sl_req_init(r, mh, mb);
	r->arena = arena;
	r->arena_cap = acap;
	r->body = body;
	r->body_cap = bcap;
	r->headers = hd;
	r->headers_cap = hcap;
}

void
sl_req_free(struct sl_req *r)
{
	free(r->arena);
	free(r->body);
	free(r->headers);
	r->arena = NULL;
	r->body = NULL;
	r->headers = NULL;
	r->arena_cap = r->body_cap = r->headers_cap = 0;
}

void
sl_req_shed_head(struct sl_req *r)
{
	char *na;

	free(r->headers);
	r->headers = NULL;
	r->headers_cap = r->nheaders = 0;
	if (r->arena == NULL)
		return;
	memmove(r->arena, r->arena + r->url_off, r->url_len);
	r->url_off = 0;
	r->arena_len = r->url_len;
	if (r->url_len == 0) {
		free(r->arena);
		r->arena = NULL;
		r->arena_cap = 0;
	} else if ((na = realloc(r->arena, r->url_len)) != NULL) {
		r->arena = na;
		r->arena_cap = r->url_len;
	}
}

/* Append to the arena; the arena is bounded by the head size limit. */
static int
arena_add(struct sl_req *r, const char *p, size_t n)
{
	size_t limit = r->max_header_bytes + 1024, ncap;
	char *na;

	if (r->arena_len + n > limit) {
		req_fail(r, 431, "request head too large");
		return -1;
	}
	if (r->arena_len + n > r->arena_cap) {
		ncap = r->arena_cap ? r->arena_cap : 1024;
		while (ncap < r->arena_len + n)
			ncap *= 2;
		if (ncap > limit)
			ncap = limit;
		na = realloc(r->arena, ncap);
		if (na == NULL) {
			req_fail(r, 503, "out of memory");
			return -1;
		}
		r->arena = na;
		r->arena_cap = ncap;
	}
	memcpy(r->arena + r->arena_len, p, n);
	r->arena_len += n;
	return 0;
}

int
sl_http_is_tchar(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	    (ch >= '0' && ch <= '9') || (ch != '\0' &&
	    strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

static int
on_message_begin(http_parser *p)
{
	struct sl_req *r = p->data;

	r->state = SL_REQ_HEAD;
	return 0;
}

static int
on_url(http_parser *p, const char *at, size_t n)
{
	struct sl_req *r = p->data;

	if (r->url_len == 0)
		r->url_off = (uint32_t)r->arena_len;
	if (arena_add(r, at, n) == -1)
		return -1;
	r->url_len += (uint32_t)n;
	return 0;
}

static int
on_header_field(http_parser *p, const char *at, size_t n)
{
	struct sl_req *r = p->data;
	struct sl_req_header *h;

	/*
	 * A chunked body's trailer fields: dropped, never merged into the
	 * head (RFC 9112 7.1.2), where they would reach the upstream as
	 * headers nobody checked (admission has been decided by then).
	 */
	if (r->state != SL_REQ_HEAD)
		return 0;
	if (r->nheaders == 0 || r->last_was_value) {
		if (r->nheaders == SL_REQ_MAX_HEADERS) {
			req_fail(r, 431, "too many request headers");
			return -1;
		}
		if (r->nheaders == r->headers_cap) {
			size_t nc = r->headers_cap ? 2 * r->headers_cap : 16;
			struct sl_req_header *nh;

			if (nc > SL_REQ_MAX_HEADERS)
				nc = SL_REQ_MAX_HEADERS;
			if ((nh = realloc(r->headers, nc * sizeof(*nh))) == NULL) {
				req_fail(r, 503, "out of memory");
				return -1;
			}
			r->headers = nh;
			r->headers_cap = nc;
		}
		h = &r->headers[r->nheaders++];
		memset(h, 0, sizeof(*h));
		h->name_off = (uint32_t)r->arena_len;
		r->last_was_value = 0;
	}
	h = &r->headers[r->nheaders - 1];
	for (size_t i = 0; i < n; i++)
		if (!sl_http_is_tchar((unsigned char)at[i])) {
			/* e.g. "Content-Length : 3": framing and lookups disagree */
			req_fail(r, 400, "invalid header name");
			return -1;
		}
	if (arena_add(r, at, n) == -1)
		return -1;
	h->name_len += (uint32_t)n;
	return 0;
}

static int
on_header_value(http_parser *p, const char *at, size_t n)
{
	struct sl_req *r = p->data;
	struct sl_req_header *h;

	if (r->state != SL_REQ_HEAD)
		return 0;   /* a trailer field's value (on_header_field) */
	if (r->nheaders == 0)
		return -1;
	h = &r->headers[r->nheaders - 1];
	if (!r->last_was_value) {
		/* The name's bytes were checked as they came (on_header_field). */
		h->value_off = (uint32_t)r->arena_len;
		h->value_len = 0;
		r->last_was_value = 1;
	}
	if (memchr(at, '\0', n) != NULL) {
		req_fail(r, 400, "NUL in a header value");
		return -1;
	}
	if (arena_add(r, at, n) == -1)
		return -1;
	h->value_len += (uint32_t)n;
	return 0;
}

static int
on_headers_complete(http_parser *p)
{
	struct sl_req *r = p->data;

	size_t i;

	/* Trailing whitespace is not part of a field value (RFC 9110 5.5). */
	for (i = 0; i < r->nheaders; i++) {
		struct sl_req_header *h = &r->headers[i];

		while (h->value_len > 0 &&
		    (r->arena[h->value_off + h->value_len - 1] == ' ' ||
		    r->arena[h->value_off + h->value_len - 1] == '\t'))
			h->value_len--;
	}
	if (p->http_major != 1) {
		req_fail(r, 400, "only HTTP/1.x is supported");
		return -1;
	}
	{
		size_t hosts = 0, auths = 0, xkeys = 0, tes = 0, k;

		for (k = 0; k < r->nheaders; k++) {
			const struct sl_req_header *h = &r->headers[k];
			const char *name = r->arena + h->name_off;
			const char *v = r->arena + h->value_off;

			if (sl_http_name_is(name, h->name_len, "host"))
				hosts++;
			if (sl_http_name_is(name, h->name_len, "authorization"))
				auths++;
			if (sl_http_name_is(name, h->name_len, "x-api-key"))
				xkeys++;
			/*
			 * We de-chunk and forward with a length: any other
			 * transfer coding would be silently dropped.
			 */
			if (sl_http_name_is(name, h->name_len, "transfer-encoding")) {
				if (!(h->value_len == 7 &&
				    strncasecmp(v, "chunked", 7) == 0)) {
					req_fail(r, 400, "unsupported transfer coding");
					return -1;
				}
				tes++;
			}
		}
		/*
		 * RFC 9112 6.1: chunked is applied once at most. Two lines
		 * may mean a body chunked twice, which we would de-chunk once
		 * and forward framing as content; or a smuggling probe aimed
		 * at a peer that reads the lines differently.
		 */
		if (tes > 1) {
			req_fail(r, 400, "chunked transfer coding named twice");
			return -1;
		}
		/* RFC 9112 3.2: exactly one Host in HTTP/1.1. */
		if (hosts > 1 || (hosts == 0 && p->http_minor >= 1)) {
			req_fail(r, 400, hosts ? "more than one Host header" :
			    "missing Host header");
			return -1;
		}
		/*
		 * Two credentials: we would authenticate one and a proxy in
		 * front may have checked the other.
		 */
		if (auths > 1) {
			req_fail(r, 400, "more than one Authorization header");
			return -1;
		}
		if (xkeys > 1) {
			req_fail(r, 400, "more than one X-Api-Key header");
			return -1;
		}
	}
	r->method = p->method;
	r->method_known = 1;
	r->http_major = p->http_major;
	r->http_minor = p->http_minor;
	r->keep_alive = http_should_keep_alive(p);
	if (p->upgrade || p->method == HTTP_CONNECT) {
		req_fail(r, 400, "upgrade and CONNECT are not supported");
		return -1;
	}
	if (r->url_len == 0 || r->arena[r->url_off] != '/') {
		req_fail(r, 400, "request target must be in origin form");
		return -1;
	}
	for (i = 0; i < r->url_len; i++) {
		unsigned char ch = (unsigned char)r->arena[r->url_off + i];

		if (ch <= 0x20 || ch >= 0x7f) {
			req_fail(r, 400, "invalid byte in the request target");
			return -1;
		}
	}
	if (p->flags & F_CHUNKED)
		r->has_body = 1;
	else if (p->content_length != ULLONG_MAX && p->content_length > 0) {
		r->has_body = 1;
		/*
		 * Not refused here: the caller authenticates and admits first,
		 * so the 413 is counted under the tenant (and a bad key gets
		 * its 401, whatever length it announces).
		 */
		if (p->content_length > r->max_body_bytes)
			r->too_large = 1;
	}
	r->state = SL_REQ_HEAD_DONE;
	http_parser_pause(p, 1);
	return 0;
}

static int
on_body(http_parser *p, const char *at, size_t n)
{
	struct sl_req *r = p->data;
	size_t ncap;
	char *nb;

	r->body_seen += n;
	if (r->body_seen > r->max_body_bytes) {
		req_fail(r, 413, "request body too large");
		return -1;
	}
	if (r->discard_body)
		return 0;
	if (r->body_len + n > r->body_cap) {
		/*
		 * Grow with what arrives, not with what Content-Length
		 * promises: a client announcing 16 MiB and sending nothing
		 * must not pin 16 MiB.
		 */
		/* A first block the size of what came (a short prompt is not 16 KiB). */
		ncap = r->body_cap ? r->body_cap * 2 : (n + 1023) / 1024 * 1024;
		while (ncap < r->body_len + n)
			ncap *= 2;
		if (ncap > r->max_body_bytes)
			ncap = r->max_body_bytes;
		nb = realloc(r->body, ncap);
		if (nb == NULL) {
			req_fail(r, 503, "out of memory");
			return -1;
		}
		r->body = nb;
		r->body_cap = ncap;
	}
	memcpy(r->body + r->body_len, at, n);
	r->body_len += n;
	return 0;
}

static int
on_message_complete(http_parser *p)
{
	struct sl_req *r = p->data;

	r->state = SL_REQ_DONE;
	http_parser_pause(p, 1);
	return 0;
}

static int
map_parser_error(enum http_errno e)
{
	switch (e) {
	case HPE_HEADER_OVERFLOW:
		return 431;
	default:
		return 400;
	}
}

/* Force a verdict, whatever a callback decided inside the same bytes. */
static void
req_force(struct sl_req *r, int status, const char *reason)
{
	r->state = SL_REQ_ERROR;
	r->status = status;
	r->reason = reason;
}

/*
 * A byte-level pass over the head, alongside http-parser, for what it lets
 * through or reports only lazily (its data callbacks fire at the end of a
 * read, so a check inside them lands at a position that depends on how the
 * bytes were split): obs-fold, whitespace before a header's colon, NUL, a
 * CR not followed by LF (RFC 9112 2.2; http-parser takes "\r " inside a
 * value as a fold). Returns the head offset of the first offending byte, or
 * SIZE_MAX.
 */
enum {
	LX_START = 0,   /* before the request line: empty lines are skipped */
	LX_REQLINE, LX_LINE_START, LX_NAME, LX_VALUE,
	LX_CR,          /* after a CR ending a line: LF must follow */
	LX_CR_END,      /* after the CR of the empty line ending the head */
	LX_END
};

static size_t
head_lex(struct sl_req *r, const char *data, size_t n, const char **why,
    int *status)
{
	size_t i;

	for (i = 0; i < n && r->lex != LX_END; i++) {
		char ch = data[i];

		*status = 400;
		if (ch == '\0') {
			*why = "NUL in the request head";
			return r->head_bytes + i;
		}
		switch (r->lex) {
		case LX_START:
			/*
			 * RFC 9112 2.2: CRLFs before the request line are
			 * ignored (http-parser skips them too); they end no
			 * head. Without this state a leading CRLF looked
			 * like the empty line ending the head, and nothing
			 * after it was checked.
			 */
			if (ch != '\r' && ch != '\n')
				r->lex = LX_REQLINE;
			break;
		case LX_REQLINE:
		case LX_VALUE:
			if (ch == '\n')
				r->lex = LX_LINE_START;
			else if (ch == '\r')
				r->lex = LX_CR;
			break;
		case LX_LINE_START:
			if (ch == ' ' || ch == '\t') {
				*why = "obsolete line folding";
				return r->head_bytes + i;
			}
			if (ch == '\n') {
				r->lex = LX_END;
				r->lex_end_at = r->head_bytes + i;
			} else if (ch == '\r')
				r->lex = LX_CR_END;
			else {
				r->lex = LX_NAME;
				/* Counted here, at its first byte, not when
				 * http-parser gets round to the name callback. */
				if (++r->lex_headers > SL_REQ_MAX_HEADERS) {
					*why = "too many request headers";
					*status = 431;
					return r->head_bytes + i;
				}
			}
			break;
		case LX_NAME:
			if (ch == ':')
				r->lex = LX_VALUE;
			else if (ch == ' ' || ch == '\t') {
				*why = "whitespace in a header name";
				return r->head_bytes + i;
			} else if (ch == '\n')
				r->lex = LX_LINE_START;   /* http-parser refuses it */
			else if (ch == '\r')
				r->lex = LX_CR;
			break;
		case LX_CR:
		case LX_CR_END:
			if (ch != '\n') {
				*why = "CR not followed by LF in the request head";
				return r->head_bytes + i;
			}
			r->lex = r->lex == LX_CR ? LX_LINE_START : LX_END;
			if (r->lex == LX_END)
				r->lex_end_at = r->head_bytes + i;
			break;
		}
	}
	return SIZE_MAX;
}

size_t
sl_req_feed(struct sl_req *r, const char *data, size_t len)
{
	size_t n, bad_at, head;
	const char *why = NULL;
	int bad_status = 400;
	enum http_errno e;
	int was_head;

	if (r->state == SL_REQ_ERROR || r->state == SL_REQ_DONE ||
	    r->state == SL_REQ_HEAD_DONE)
		return 0;
	was_head = r->state == SL_REQ_HEAD;
	n = http_parser_execute(&r->parser, &req_settings, data, len);
	e = HTTP_PARSER_ERRNO(&r->parser);
	if (was_head) {
		/*
		 * http-parser unfolds obs-fold lines and takes "Name :" as
		 * "Name"; RFC 9112 lets a server reject both, and a gateway
		 * should: peers may read them differently (smuggling).
		 */
		bad_at = head_lex(r, data, n, &why, &bad_status);
		/*
		 * The byte lexer saw the empty line that ends a head. It is
		 * never fed the final LF of a head http-parser completed (the
		 * parser pauses before it), so the parser did not end the head
		 * there: it read on (e.g. "GET / H\r\n\r\n1.1", taken for
		 * "HTTP/1.1" by its lax version check). The two disagree on
		 * where the head ends: that is the first problem, at that
		 * byte, however the bytes came.
		 */
		if (bad_at == SIZE_MAX && r->lex == LX_END) {
			bad_at = r->lex_end_at;
			why = "malformed request head";
			bad_status = 400;
		}
		/*
		 * Every byte of the head counts: request line, CRLFs, spaces,
		 * and the final LF that http-parser has not consumed yet when
		 * it pauses at the end of the head.
		 */
		r->head_bytes += n;
		head = r->head_bytes + (r->state == SL_REQ_HEAD_DONE ? 1 : 0);
		/*
		 * The first problem in byte order wins, however the bytes were
		 * split into reads: a fold within the limit, else the size,
		 * else what the callbacks found (they stopped the parser at
		 * their byte, which is after both).
		 */
		if (bad_at < r->max_header_bytes) {
			req_force(r, bad_status, why);
			return n;
		}
		if (head > r->max_header_bytes) {
			req_force(r, 431, "request head too large");
			return n;
		}
	}
	if (e == HPE_PAUSED) {
		/* on_headers_complete / on_message_complete stopped us. */
		return n;
	}
	if (e != HPE_OK) {
		/* Our callbacks may have set a precise status already. */
		if (r->state == SL_REQ_BODY && (r->parser.flags & F_CHUNKED)) {
			/*
			 * http-parser counts a chunk-size line against the
			 * header limit: an endless chunk extension is a
			 * malformed body, not a header too large. The trailer
			 * (after the last chunk) is header fields: its 431.
			 */
			if (e == HPE_INVALID_CONTENT_LENGTH)
				req_fail(r, 400,
				    "invalid chunk size in the request body");
			else if (e == HPE_HEADER_OVERFLOW &&
			    (r->parser.flags & F_TRAILING))
				req_fail(r, 431, "request trailer too large");
			else if (e == HPE_HEADER_OVERFLOW)
				req_fail(r, 400, "chunk extension too long");
		}
		req_fail(r, map_parser_error(e), http_errno_description(e));
		return n;
	}
	return n;
}

void
sl_req_continue(struct sl_req *r)
{
	if (r->state != SL_REQ_HEAD_DONE)
		return;
	http_parser_pause(&r->parser, 0);
	/*
	 * http-parser paused in on_headers_complete before consuming the
	 * head's final LF, so the caller always has at least one byte left
	 * to feed: a message without a body completes on that feed.
	 */
	r->state = SL_REQ_BODY;
}

const char *
sl_req_url(const struct sl_req *r, size_t *len)
{
	*len = r->url_len;
	return r->arena + r->url_off;
}

const char *
sl_req_header(const struct sl_req *r, const char *name, size_t *len)
{
	size_t i, nl = strlen(name);

	for (i = 0; i < r->nheaders; i++) {
		const struct sl_req_header *h = &r->headers[i];

		if (h->name_len == nl &&
		    strncasecmp(r->arena + h->name_off, name, nl) == 0) {
			*len = h->value_len;
			return r->arena + h->value_off;
		}
	}
	return NULL;
}

int
sl_req_header_at(const struct sl_req *r, size_t i, const char **name,
    size_t *nlen, const char **value, size_t *vlen)
{
	const struct sl_req_header *h;

	if (i >= r->nheaders)
		return -1;
	h = &r->headers[i];
	*name = r->arena + h->name_off;
	*nlen = h->name_len;
	*value = r->arena + h->value_off;
	*vlen = h->value_len;
	return 0;
}

const char *
sl_req_method(const struct sl_req *r)
{
	/*
	 * http-parser's method 0 is DELETE: before the head was parsed (or
	 * when the request line itself was bad) there is no method.
	 */
	if (!r->method_known)
		return "-";
	return http_method_str((enum http_method)r->method);
}

const char *
sl_http_bearer(const char *v, size_t vlen, size_t *len)
{
	size_t i = 0, start;

	if (v == NULL || vlen < 7 || strncasecmp(v, "bearer", 6) != 0)
		return NULL;
	i = 6;
	if (v[i] != ' ' && v[i] != '\t')
		return NULL;
	while (i < vlen && (v[i] == ' ' || v[i] == '\t'))
		i++;
	start = i;
	while (i < vlen && v[i] != ' ' && v[i] != '\t')
		i++;
	if (i == start)
		return NULL;
	/* Only trailing whitespace may follow the token. */
	for (size_t j = i; j < vlen; j++)
		if (v[j] != ' ' && v[j] != '\t')
			return NULL;
	*len = i - start;
	return v + start;
}

int
sl_http_is_hop_by_hop(const char *name, size_t nlen)
{
	static const char *const hop[] = {
		"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
		"proxy-authorization", "te", "trailer", "transfer-encoding",
		"upgrade", NULL
	};
	size_t i;

	for (i = 0; hop[i] != NULL; i++)
		if (sl_http_name_is(name, nlen, hop[i]))
			return 1;
	return 0;
}

/* Connection header tokens name more hop-by-hop headers. */
static int
req_listed_in_connection(const struct sl_req *r, const char *name, size_t nlen)
{
	const char *v, *p, *end;
	size_t vlen;

	if ((v = sl_req_header(r, "connection", &vlen)) == NULL)
		return 0;
	p = v;
	end = v + vlen;
	while (p < end) {
		const char *s, *e;

		while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
			p++;
		s = p;
		while (p < end && *p != ',')
			p++;
		e = p;
		while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
			e--;
		if ((size_t)(e - s) == nlen && strncasecmp(s, name, nlen) == 0)
			return 1;
	}
	return 0;
}

int
sl_req_header_dropped_upstream(const struct sl_req *r, const char *name,
    size_t nlen)
{
	return sl_http_is_hop_by_hop(name, nlen) ||
	    sl_http_name_is(name, nlen, "host") ||
	    sl_http_name_is(name, nlen, "authorization") ||
	    sl_http_name_is(name, nlen, "x-api-key") ||
	    sl_http_name_is(name, nlen, "content-length") ||
	    sl_http_name_is(name, nlen, "expect") ||
	    req_listed_in_connection(r, name, nlen);
}

int
sl_ct_equal(const char *a, size_t alen, const char *b, size_t blen)
{
	/*
	 * Time depends only on blen (the candidate key length an attacker
	 * chose), never on where the first difference is.
	 */
	unsigned char diff = (unsigned char)(alen != blen);
	size_t i;

	for (i = 0; i < blen; i++)
		diff |= (unsigned char)(b[i] ^ (i < alen ? a[i] : 0));
	return diff == 0;
}

void
sl_resp_head_reset(struct sl_resp_head *h)
{
	h->status = 0;
	h->reason[0] = '\0';
	h->len = 0;
	h->is_sse = h->is_json = h->has_cache_control = h->chunked = 0;
	h->encoded = 0;
	h->retry_after = -1;
	h->content_length = -1;
	h->conn_len = 0;
}

void
sl_resp_head_free(struct sl_resp_head *h)
{
	free(h->block);
	h->block = NULL;
	h->cap = 0;
	sl_resp_head_reset(h);
}

int
sl_http_name_is(const char *name, size_t nlen, const char *want)
{
	return strlen(want) == nlen && strncasecmp(name, want, nlen) == 0;
}

const char *
sl_http_reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 413: return "Content Too Large";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	default: return "Unknown";
	}
}

/*
 * A Content-Length line of an upstream head: one decimal length of at most
 * 18 digits (libcurl takes an overflow for "read until close"), the same on
 * every line. 0, or -1 when the head must be refused.
 */
static int
resp_content_length(struct sl_resp_head *h, const char *v, size_t vl)
{
	long long cl = 0;
	size_t i;

	if (vl == 0 || vl > 18)
		return -1;
	for (i = 0; i < vl; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -1;
		cl = cl * 10 + (v[i] - '0');
	}
	if (h->content_length >= 0 && h->content_length != cl)
		return -1;
	h->content_length = cl;
	return 0;
}

/*
 * Remember the names a Connection line lists (RFC 9110 7.6.1: they are
 * hop-by-hop), as ",name," in lower case. -1 when they do not fit.
 */
static int
resp_conn_names(struct sl_resp_head *h, const char *v, size_t vl)
{
	size_t i = 0, s, e;

	while (i < vl) {
		while (i < vl && (v[i] == ',' || v[i] == ' ' || v[i] == '\t'))
			i++;
		s = i;
		while (i < vl && v[i] != ',' && v[i] != ' ' && v[i] != '\t')
			i++;
		e = i;
		if (e == s)
			continue;
		if (h->conn_len + (e - s) + 2 > sizeof(h->conn_names))
			return -1;
		if (h->conn_len == 0)
			h->conn_names[h->conn_len++] = ',';
		for (; s < e; s++)
			h->conn_names[h->conn_len++] =
			    (char)tolower((unsigned char)v[s]);
		h->conn_names[h->conn_len++] = ',';
	}
	return 0;
}

/* 1 if header name (nlen bytes) was listed in the head's Connection. */
static int
resp_conn_named(const struct sl_resp_head *h, const char *name, size_t nlen)
{
	size_t i, k;

	for (i = 0; i + nlen + 1 < h->conn_len; i++) {
		if (h->conn_names[i] != ',' || h->conn_names[i + nlen + 1] != ',')
			continue;
		for (k = 0; k < nlen; k++)
			if (h->conn_names[i + 1 + k] !=
			    (char)tolower((unsigned char)name[k]))
				break;
		if (k == nlen)
			return 1;
	}
	return 0;
}

/*
 * Once the head is complete: drop the kept lines that Connection named (it
 * may come after them).
 */
static void
resp_drop_conn_named(struct sl_resp_head *h)
{
	size_t in = 0, out = 0, ll;
	const char *eol, *colon;

	if (h->conn_len == 0)
		return;
	while (in < h->len) {
		eol = memchr(h->block + in, '\n', h->len - in);
		ll = eol != NULL ? (size_t)(eol - (h->block + in)) + 1 : h->len - in;
		colon = memchr(h->block + in, ':', ll);
		if (colon == NULL || !resp_conn_named(h, h->block + in,
		    (size_t)(colon - (h->block + in)))) {
			memmove(h->block + out, h->block + in, ll);
			out += ll;
		}
		in += ll;
	}
	h->len = out;
}

int
sl_resp_head_conn_named(const struct sl_resp_head *h, const char *name,
    size_t nlen)
{
	return resp_conn_named(h, name, nlen);
}

int
sl_resp_head_field(struct sl_resp_head *h, const char *name, size_t nl,
    const char *v, size_t vl)
{
	size_t i;

	if (nl == 0)
		return -1;
	for (i = 0; i < nl; i++)
		if (!sl_http_is_tchar((unsigned char)name[i]))
			return -1;
	for (i = 0; i < vl; i++) {
		unsigned char ch = (unsigned char)v[i];

		/* Never let CR, LF, NUL or other controls reach the client. */
		if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
			return -1;
	}
	if (sl_http_name_is(name, nl, "content-length") &&
	    resp_content_length(h, v, vl) == -1)
		return -1;
	/* The body is de-chunked; any other coding would reach the client undone. */
	if (sl_http_name_is(name, nl, "transfer-encoding")) {
		if (!(vl == 7 && strncasecmp(v, "chunked", 7) == 0))
			return -1;
		/*
		 * Chunked named twice: the body may be chunked twice, and
		 * one layer comes off. Refuse rather than relay the inner
		 * framing as content.
		 */
		if (h->chunked)
			return -1;
		h->chunked = 1;
	}
	if (sl_http_name_is(name, nl, "connection") &&
	    resp_conn_names(h, v, vl) == -1)
		return -1;
	if (sl_http_is_hop_by_hop(name, nl) ||
	    sl_http_name_is(name, nl, "content-length") ||
	    sl_http_name_is(name, nl, "x-accel-buffering"))
		return 0;
	if (sl_http_name_is(name, nl, "content-type") && vl >= 17 &&
	    strncasecmp(v, "text/event-stream", 17) == 0)
		h->is_sse = 1;
	if (sl_http_name_is(name, nl, "content-type") && vl >= 16 &&
	    strncasecmp(v, "application/json", 16) == 0)
		h->is_json = 1;
	if (sl_http_name_is(name, nl, "cache-control"))
		h->has_cache_control = 1;
	if (sl_http_name_is(name, nl, "content-encoding") &&
	    !(vl == 8 && strncasecmp(v, "identity", 8) == 0))
		h->encoded = 1;
	if (sl_http_name_is(name, nl, "retry-after") && h->retry_after < 0)
		/* The first one. */
		h->retry_after = sl_http_retry_after(v, vl, time(NULL));
	return 1;
}

enum sl_rh_result
sl_resp_head_line(struct sl_resp_head *h, const char *p, size_t n)
{
	size_t len = n, nl, i, rl, vl;
	const char *colon, *v, *sp;
	int keep;

	/* libcurl hands each line with its CRLF (or bare LF). */
	if (len > 0 && p[len - 1] == '\n')
		len--;
	if (len > 0 && p[len - 1] == '\r')
		len--;
	for (i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)p[i];

		/* Never let CR, LF, NUL or other controls reach the client. */
		if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
			return SL_RH_BAD;
	}
	if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
		/* A status line: a new head (after a 1xx) starts. */
		sl_resp_head_reset(h);
		sp = memchr(p, ' ', len);
		if (sp == NULL || (size_t)(p + len - sp) < 4)
			return SL_RH_BAD;
		for (i = 1; i <= 3; i++)
			if (sp[i] < '0' || sp[i] > '9')
				return SL_RH_BAD;
		h->status = (sp[1] - '0') * 100 + (sp[2] - '0') * 10 + (sp[3] - '0');
		if (h->status < 100 || ((size_t)(p + len - sp) > 4 && sp[4] != ' '))
			return SL_RH_BAD;
		sp += 4;
		rl = (size_t)(p + len - sp);
		while (rl > 0 && *sp == ' ') {
			sp++;
			rl--;
		}
		if (rl >= sizeof(h->reason))
			rl = sizeof(h->reason) - 1;
		for (i = 0; i < rl; i++)
			h->reason[i] = (sp[i] >= 0x20 && sp[i] < 0x7f) ? sp[i] : ' ';
		h->reason[rl] = '\0';
		return SL_RH_MORE;
	}
	if (h->status == 0)
		return SL_RH_BAD;   /* a header before any status line */
	if (len == 0) {
		/* End of a head. Informational heads are not relayed. */
		if (h->status < 200) {
			sl_resp_head_reset(h);
			return SL_RH_MORE;
		}
		resp_drop_conn_named(h);
		return SL_RH_DONE;
	}
	if (p[0] == ' ' || p[0] == '\t')
		return SL_RH_BAD;   /* obs-fold: refuse rather than guess */
	colon = memchr(p, ':', len);
	if (colon == NULL || colon == p)
		return SL_RH_BAD;
	nl = (size_t)(colon - p);
	v = colon + 1;
	while (v < p + len && (*v == ' ' || *v == '\t'))
		v++;
	vl = (size_t)(p + len - v);
	while (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
		vl--;
	if ((keep = sl_resp_head_field(h, p, nl, v, vl)) == -1)
		return SL_RH_BAD;
	if (keep == 0)
		return SL_RH_MORE;
	if (h->len + len + 2 > SL_RESP_HEAD_MAX)
		return SL_RH_BAD;
	if (h->len + len + 2 > h->cap) {
		size_t ncap = h->cap ? h->cap : 1024;
		char *nb;

		while (ncap < h->len + len + 2)
			ncap *= 2;
		if ((nb = realloc(h->block, ncap)) == NULL)
			return SL_RH_BAD;
		h->block = nb;
		h->cap = ncap;
	}
	memcpy(h->block + h->len, p, len);
	h->len += len;
	memcpy(h->block + h->len, "\r\n", 2);
	h->len += 2;
	return SL_RH_MORE;
}

/*
 * Without printf: libcurl hands over an upstream's chunked body a chunk at
 * a time, so this runs once per SSE event (snprintf was 13 % of a worker's
 * instructions in bench/throughput's shape).
 */
size_t
sl_http_chunk_header(char *dst, size_t dstlen, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	char b[2 * sizeof(size_t)];
	size_t i = sizeof(b), k;

	do {
		b[--i] = hex[n & 0xf];
		n >>= 4;
	} while (n != 0);
	k = sizeof(b) - i;
	if (k + 3 > dstlen)   /* digits, CRLF and, like snprintf, a NUL */
		return 0;
	memcpy(dst, b + i, k);
	memcpy(dst + k, "\r\n", 3);
	return k + 2;
}

int
sl_http_retry_after(const char *v, size_t n, time_t now)
{
	/* RFC 9110 5.6.7: IMF-fixdate, then the two obsolete forms. */
	static const char *const fmt[] = {
		"%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT",
		"%a %b %d %H:%M:%S %Y", NULL
	};
	char buf[64];
	struct tm tm;
	time_t t;
	long secs = 0;
	size_t i;

	while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t' ||
	    v[n - 1] == '\r' || v[n - 1] == '\n'))
		n--;
	while (n > 0 && (*v == ' ' || *v == '\t')) {
		v++;
		n--;
	}
	if (n > 0 && *v >= '0' && *v <= '9') {
		/* delta-seconds (digits, then anything: read what leads). */
		for (i = 0; i < n && v[i] >= '0' && v[i] <= '9' &&
		    secs <= SL_RETRY_AFTER_MAX; i++)
			secs = secs * 10 + (v[i] - '0');
		return secs > SL_RETRY_AFTER_MAX ? SL_RETRY_AFTER_MAX : (int)secs;
	}
	if (n == 0 || n >= sizeof(buf))
		return 0;
	memcpy(buf, v, n);
	buf[n] = '\0';
	for (i = 0; fmt[i] != NULL; i++) {
		const char *end;

		memset(&tm, 0, sizeof(tm));
		if ((end = strptime(buf, fmt[i], &tm)) == NULL || *end != '\0')
			continue;
		if ((t = timegm(&tm)) == (time_t)-1 || t <= now)
			return 0;
		return t - now > SL_RETRY_AFTER_MAX ? SL_RETRY_AFTER_MAX :
		    (int)(t - now);
	}
	return 0;
}

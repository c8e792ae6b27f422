/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_reply: what sluice says by itself.
 *
 * One table of sluice's own errors: each row is a status, an OpenAI error
 * type and code, the message it says when the caller has none better,
 * and whether the connection closes after it and whether it carries
 * Retry-After. sluice.8's ERROR RESPONSES documents exactly these rows
 * (tests/unit/test_docs.c holds the two together).
 *
 * And the response head builder: a status line and header lines appended
 * without printf (this runs once per relayed response), into a buffer that
 * grows to at most SL_RESP_HEAD_MAX plus room for sluice's own lines.
 */
#ifndef SL_REPLY_H
#define SL_REPLY_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum sl_err {
	SL_ERR_BAD_REQUEST,          /* 400: the request, read whole, is refused */
	SL_ERR_BAD_FRAMING,          /* 400: its framing or head cannot be read */
	SL_ERR_PLAIN_HTTP_TO_TLS,    /* 400: plain HTTP to a TLS listener */
	SL_ERR_INVALID_API_KEY,      /* 401 */
	SL_ERR_TENANT_DISABLED,      /* 403 */
	SL_ERR_NOT_FOUND,            /* 404 */
	SL_ERR_MODEL_NOT_FOUND,      /* 404 */
	SL_ERR_METHOD_NOT_ALLOWED,   /* 405, with Allow */
	SL_ERR_REQUEST_TIMEOUT,      /* 408 */
	SL_ERR_REQUEST_TOO_LARGE,    /* 413 */
	SL_ERR_CONCURRENCY_LIMIT,    /* 429 */
	SL_ERR_TOKEN_BUDGET,         /* 429 */
	SL_ERR_HEADERS_TOO_LARGE,    /* 431 */
	SL_ERR_UPSTREAM_UNREACHABLE, /* 502 */
	SL_ERR_OVERLOADED,           /* 503 */
	SL_ERR_UPSTREAM_UNAVAILABLE, /* 503 */
	SL_ERR_QUEUE_FULL,           /* 503 */
	SL_ERR_QUEUE_TIMEOUT,        /* 503 */
	SL_ERR_CLUSTER_UNAVAILABLE,  /* 503 */
	SL_ERR_UPSTREAM_TIMEOUT,     /* 504 */
	SL_ERR_COUNT
};

#define SL_ERR_CLOSE 0x1   /* the connection is closed after the answer */
#define SL_ERR_RETRY 0x2   /* sent with Retry-After (1 s at least) */
#define SL_ERR_ALLOW 0x4   /* sent with Allow: the methods relayed */

struct sl_err_row {
	int status;
	unsigned flags;          /* SL_ERR_CLOSE | SL_ERR_RETRY | SL_ERR_ALLOW */
	const char *type;        /* "rate_limit_error", ... */
	const char *code;        /* "concurrency_limit_exceeded", ... */
	const char *message;     /* said when the caller gives none */
};

extern const struct sl_err_row sl_errs[SL_ERR_COUNT];

/* The Allow header's methods, for SL_ERR_ALLOW. */
#define SL_ALLOW_METHODS "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

/*
 * The row of status and code (what a module that answers in those words,
 * as model routing does, says), or `dflt` when none has both.
 */
enum sl_err sl_err_find(int status, const char *code, enum sl_err dflt);

/*
 * The row a request parser's verdict maps to: 431, 413, 503 (out of
 * memory) and, for any other status, 400 bad framing.
 */
enum sl_err sl_err_of_parse(int status);

/*
 * The JSON body of error e saying message (the row's own when NULL):
 * {"error":{"message":...,"type":...,"code":...}} and a newline, into dst.
 * message is JSON already (escaped by whoever built it). Returns the
 * length, or 0 when it does not fit (an empty body is then sent).
 */
size_t sl_err_body(char *dst, size_t len, enum sl_err e, const char *message);

/*
 * The same in the Anthropic Messages API's shape, for a request on
 * /v1/messages (its clients read no other):
 * {"type":"error","error":{"type":...,"message":...,"code":...}} and a
 * newline; the type is sl_err_anthropic_type() of the row's status, the
 * code the row's (so an operator still tells sluice's refusals apart).
 */
size_t sl_err_body_anthropic(char *dst, size_t len, enum sl_err e,
    const char *message);

/*
 * Anthropic's error type for an HTTP status: invalid_request_error (400,
 * 405, 408, 413, 431 and other 4xx), authentication_error (401),
 * permission_error (403), not_found_error (404), rate_limit_error (429),
 * overloaded_error (503), api_error (500, 502, 504 and other 5xx).
 */
const char *sl_err_anthropic_type(int status);

/*
 * The extra header lines of error e ("Retry-After: N\r\n", "Allow: ...")
 * into dst, always terminated; retry_after is the caller's seconds for a
 * row that carries it (1 at least is sent).
 */
void sl_err_headers(char *dst, size_t len, enum sl_err e, int retry_after);

/*
 * Error e as a whole response that closes its connection (head and body,
 * for a socket that has no exchange yet: a refusal at accept, plain HTTP
 * to a TLS port) into dst. Returns its length, or 0 when it does not fit.
 */
size_t sl_err_response(char *dst, size_t len, enum sl_err e,
    const char *message, int retry_after);

/* ---- the response head ------------------------------------------------ */

struct sl_head {
	char *p;
	size_t len, cap;
};

/* Room for add more bytes: 0, or -1 past the bound or out of memory. */
int sl_head_reserve(struct sl_head *, size_t add);

static inline int
sl_head_add(struct sl_head *h, const char *p, size_t n)
{
	if (n == 0)
		return 0;   /* p may be NULL (an upstream head with no headers) */
	if (h->len + n > h->cap && sl_head_reserve(h, n) == -1)
		return -1;
	memcpy(h->p + h->len, p, n);
	h->len += n;
	return 0;
}

#define SL_HEAD_LIT(h, lit) sl_head_add((h), (lit), sizeof(lit) - 1)

static inline int
sl_head_add_uint(struct sl_head *h, unsigned long v)
{
	char b[24];
	size_t i = sizeof(b);

	do {
		b[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v != 0);
	return sl_head_add(h, b + i, sizeof(b) - i);
}

/* "HTTP/1.1 200 OK\r\n" */
static inline int
sl_head_status_line(struct sl_head *h, int status, const char *reason)
{
	return SL_HEAD_LIT(h, "HTTP/1.1 ") |
	    sl_head_add_uint(h, (unsigned long)status) | SL_HEAD_LIT(h, " ") |
	    sl_head_add(h, reason, strlen(reason)) | SL_HEAD_LIT(h, "\r\n");
}

/* The Connection line and the blank line that ends the head. */
static inline int
sl_head_connection(struct sl_head *h, int close)
{
	return close ? SL_HEAD_LIT(h, "Connection: close\r\n\r\n") :
	    SL_HEAD_LIT(h, "Connection: keep-alive\r\n\r\n");
}

/* The buffer is given back (between responses, or at the end). */
static inline void
sl_head_free(struct sl_head *h)
{
	free(h->p);
	h->p = NULL;
	h->len = h->cap = 0;
}

#endif

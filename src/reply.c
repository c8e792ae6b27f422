/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * What sluice says by itself: the table of its own errors, their bodies
 * and header lines, and the response head buffer (sl_reply.h).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_http.h"
#include "sl_reply.h"

#define CLOSE SL_ERR_CLOSE
#define RETRY SL_ERR_RETRY
#define ALLOW SL_ERR_ALLOW
#define INVALID "invalid_request_error"

/* sluice.8, ERROR RESPONSES: a row there for each row here. */
const struct sl_err_row sl_errs[SL_ERR_COUNT] = {
	[SL_ERR_BAD_REQUEST] = { 400, 0, INVALID, "bad_request",
	    "bad request" },
	[SL_ERR_BAD_FRAMING] = { 400, CLOSE, INVALID, "bad_request",
	    "bad request" },
	[SL_ERR_PLAIN_HTTP_TO_TLS] = { 400, CLOSE, INVALID, "plain_http_to_tls",
	    "this port speaks TLS: use https://" },
	[SL_ERR_INVALID_API_KEY] = { 401, 0, INVALID, "invalid_api_key",
	    "missing or unknown API key" },
	[SL_ERR_TENANT_DISABLED] = { 403, 0, "permission_error",
	    "tenant_disabled", "this tenant is disabled (max_streams: 0)" },
	[SL_ERR_NOT_FOUND] = { 404, 0, INVALID, "not_found",
	    "only paths under /v1/ are served" },
	[SL_ERR_MODEL_NOT_FOUND] = { 404, 0, INVALID, "model_not_found",
	    "model not found" },
	[SL_ERR_METHOD_NOT_ALLOWED] = { 405, ALLOW, INVALID,
	    "method_not_allowed", "TRACE is not relayed" },
	[SL_ERR_REQUEST_TIMEOUT] = { 408, CLOSE, INVALID, "request_timeout",
	    "request head not received in time" },
	[SL_ERR_REQUEST_TOO_LARGE] = { 413, CLOSE, INVALID, "request_too_large",
	    "request body too large" },
	[SL_ERR_CONCURRENCY_LIMIT] = { 429, RETRY, "rate_limit_error",
	    "concurrency_limit_exceeded", "tenant is at its max_streams" },
	[SL_ERR_TOKEN_BUDGET] = { 429, RETRY, "rate_limit_error",
	    "token_budget_exceeded", "tenant is at its tokens_per_minute" },
	[SL_ERR_HEADERS_TOO_LARGE] = { 431, CLOSE, INVALID, "headers_too_large",
	    "request head too large" },
	[SL_ERR_UPSTREAM_UNREACHABLE] = { 502, 0, "upstream_error",
	    "upstream_unreachable", "cannot start the upstream request" },
	[SL_ERR_OVERLOADED] = { 503, CLOSE | RETRY, "server_error", "overloaded",
	    "the gateway is overloaded; retry later" },
	[SL_ERR_UPSTREAM_UNAVAILABLE] = { 503, RETRY, "server_error",
	    "upstream_unavailable", "no replica of the upstream can take it now" },
	[SL_ERR_QUEUE_FULL] = { 503, RETRY, "server_error", "queue_full",
	    "the upstream's queue is full" },
	[SL_ERR_QUEUE_TIMEOUT] = { 503, RETRY, "server_error", "queue_timeout",
	    "waited too long in the upstream's queue" },
	[SL_ERR_CLUSTER_UNAVAILABLE] = { 503, RETRY, "server_error",
	    "cluster_unavailable",
	    "the cluster's lease store (Redis) is unreachable; retry later" },
	[SL_ERR_UPSTREAM_TIMEOUT] = { 504, 0, "upstream_error",
	    "upstream_timeout", "upstream sent no response in time" },
};

enum sl_err
sl_err_find(int status, const char *code, enum sl_err dflt)
{
	int e;

	for (e = 0; e < SL_ERR_COUNT; e++)
		if (sl_errs[e].status == status && code != NULL &&
		    strcmp(sl_errs[e].code, code) == 0)
			return (enum sl_err)e;
	return dflt;
}

enum sl_err
sl_err_of_parse(int status)
{
	switch (status) {
	case 431:
		return SL_ERR_HEADERS_TOO_LARGE;
	case 413:
		return SL_ERR_REQUEST_TOO_LARGE;
	case 503:
		return SL_ERR_OVERLOADED;
	default:
		return SL_ERR_BAD_FRAMING;
	}
}

size_t
sl_err_body(char *dst, size_t len, enum sl_err e, const char *message)
{
	const struct sl_err_row *r = &sl_errs[e];
	int n;

	n = snprintf(dst, len,
	    "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"code\":\"%s\"}}\n",
	    message != NULL ? message : r->message, r->type, r->code);
	if (n < 0 || (size_t)n >= len) {
		if (len > 0)
			dst[0] = '\0';
		return 0;
	}
	return (size_t)n;
}

const char *
sl_err_anthropic_type(int status)
{
	switch (status) {
	case 401:
		return "authentication_error";
	case 403:
		return "permission_error";
	case 404:
		return "not_found_error";
	case 429:
		return "rate_limit_error";
	case 503:
		return "overloaded_error";
	default:
		return status >= 500 ? "api_error" : "invalid_request_error";
	}
}

size_t
sl_err_body_anthropic(char *dst, size_t len, enum sl_err e,
    const char *message)
{
	const struct sl_err_row *r = &sl_errs[e];
	int n;

	n = snprintf(dst, len,
	    "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"%s\","
	    "\"code\":\"%s\"}}\n", sl_err_anthropic_type(r->status),
	    message != NULL ? message : r->message, r->code);
	if (n < 0 || (size_t)n >= len) {
		if (len > 0)
			dst[0] = '\0';
		return 0;
	}
	return (size_t)n;
}

void
sl_err_headers(char *dst, size_t len, enum sl_err e, int retry_after)
{
	const struct sl_err_row *r = &sl_errs[e];
	int n = 0;

	if (len == 0)
		return;
	dst[0] = '\0';
	if (r->flags & SL_ERR_RETRY)
		n = snprintf(dst, len, "Retry-After: %d\r\n",
		    retry_after > 0 ? retry_after : 1);
	if ((r->flags & SL_ERR_ALLOW) && n >= 0 && (size_t)n < len)
		snprintf(dst + n, len - (size_t)n,
		    "Allow: " SL_ALLOW_METHODS "\r\n");
}

size_t
sl_err_response(char *dst, size_t len, enum sl_err e, const char *message,
    int retry_after)
{
	char body[512], extra[128];
	size_t blen;
	int n;

	blen = sl_err_body(body, sizeof(body), e, message);
	sl_err_headers(extra, sizeof(extra), e, retry_after);
	n = snprintf(dst, len, "HTTP/1.1 %d %s\r\n"
	    "Content-Type: application/json\r\nContent-Length: %zu\r\n"
	    "%sConnection: close\r\n\r\n%s", sl_errs[e].status,
	    sl_http_reason(sl_errs[e].status), blen, extra, body);
	return n < 0 || (size_t)n >= len ? 0 : (size_t)n;
}

int
sl_head_reserve(struct sl_head *h, size_t add)
{
	size_t ncap;
	char *n;

	if (h->len + add <= h->cap)
		return 0;
	ncap = h->cap ? h->cap : 1024;
	while (ncap < h->len + add)
		ncap *= 2;
	if (ncap > SL_RESP_HEAD_MAX + 4096)
		return -1;
	n = realloc(h->p, ncap);
	if (n == NULL)
		return -1;
	h->p = n;
	h->cap = ncap;
	return 0;
}

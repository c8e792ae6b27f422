/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_api: which API of a runner a request speaks, from its method and
 * path (percent-decoded, as the runners route: uvicorn, cpp-httplib).
 *
 *   chat         /v1/chat/completions
 *   completions  /v1/completions
 *   responses    /v1/responses and every path under it (stored responses:
 *                /v1/responses/{id}, .../cancel, .../input_items)
 *   messages     /v1/messages and every path under it (count_tokens)
 *   embeddings   /v1/embeddings
 *   other        anything else (/v1/models, ...)
 *
 * A request is metered (its tokens counted and charged) when it is a POST
 * to exactly one of chat, completions, responses, messages or embeddings:
 * GET/DELETE of a stored response and /v1/messages/count_tokens are not.
 */
#ifndef SL_API_H
#define SL_API_H

#include <stddef.h>

enum sl_api {
	SL_API_OTHER = 0,
	SL_API_CHAT,
	SL_API_COMPLETIONS,
	SL_API_RESPONSES,
	SL_API_MESSAGES,
	SL_API_EMBEDDINGS,
	SL_API_COUNT
};

/* "chat", "completions", "responses", "messages", "embeddings", "other". */
extern const char *const sl_api_names[SL_API_COUNT];

/*
 * The API of a request target (query ignored). *exact (may be NULL) is set
 * to 1 when the path is the API's own endpoint, 0 for a path under it.
 */
enum sl_api sl_api_of(const char *url, size_t len, int *exact);

/* 1 if a request with this method (http_parser's) and target is metered. */
int sl_api_metered(int method, const char *url, size_t len);

/*
 * A stored response's id named by the target: /v1/responses/{id}, or
 * /v1/responses/{id}/cancel or /input_items (query ignored; the id as
 * written, not decoded, 1..255 bytes without '%'). Returns a pointer into
 * url and sets *idlen, or NULL.
 */
const char *sl_api_response_id(const char *url, size_t len, size_t *idlen);

#endif

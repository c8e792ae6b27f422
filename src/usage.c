/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The usage object: a runner's "usage" member read into struct sl_usage,
 * from a whole non-streamed response (sl_usage_from_json()) and from the
 * copy the SSE scanner makes of one (usage_obj_read()); and the content
 * bytes of a non-streamed response without one. A usage object as runners
 * send it is read without jansson (usage_fast()); jansson reads anything
 * unusual.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "sl_json.h"
#include "sl_usage.h"
#include "usage_lexer.h"


/* ------------------------------------------------------------------ usage object */

/* u from a "usage" object: prompt and completion required, total optional. */
static int
usage_from_obj(const json_t *o, struct sl_usage *u)
{
	const json_t *p, *c, *t;

	if (!json_is_object(o))
		return -1;
	p = json_object_get(o, "prompt_tokens");
	c = json_object_get(o, "completion_tokens");
	t = json_object_get(o, "total_tokens");
	if (!json_is_integer(p) || json_integer_value(p) < 0 ||
	    !json_is_integer(c) || json_integer_value(c) < 0)
		return -1;
	if (t != NULL && (!json_is_integer(t) || json_integer_value(t) < 0))
		return -1;
	u->prompt_tokens = (uint64_t)json_integer_value(p);
	u->completion_tokens = (uint64_t)json_integer_value(c);
	u->total_tokens = t != NULL ? (uint64_t)json_integer_value(t) :
	    u->prompt_tokens + u->completion_tokens;
	u->have = 1;
	return 0;
}

int
sl_usage_from_json(const char *body, size_t len, struct sl_usage *u)
{
	json_t *root;
	json_error_t err;
	int rc = -1;

	memset(u, 0, sizeof(*u));
	if (body == NULL || len == 0 || len > SL_USAGE_MAX_JSON)
		return -1;
	if ((root = json_loadb(body, len, 0, &err)) == NULL)
		return -1;
	if (json_is_object(root))
		rc = usage_from_obj(json_object_get(root, "usage"), u);
	json_decref(root);
	if (rc != 0)
		memset(u, 0, sizeof(*u));
	return rc;
}

uint64_t
sl_usage_json_content(const char *body, size_t len)
{
	json_t *root, *choices, *ch, *v;
	json_error_t err;
	uint64_t n = 0;
	size_t i;

	if (body == NULL || len == 0 || len > SL_USAGE_MAX_JSON ||
	    (root = json_loadb(body, len, 0, &err)) == NULL)
		return 0;
	choices = json_object_get(root, "choices");
	json_array_foreach(choices, i, ch) {
		json_t *msg = json_object_get(ch, "message"), *calls, *call;
		size_t j;

		if ((v = json_object_get(msg, "content")) != NULL && json_is_string(v))
			n += json_string_length(v);
		if ((v = json_object_get(msg, "reasoning_content")) != NULL && json_is_string(v))
			n += json_string_length(v);
		if ((v = json_object_get(msg, "reasoning")) != NULL && json_is_string(v))
			n += json_string_length(v);
		calls = json_object_get(msg, "tool_calls");
		json_array_foreach(calls, j, call) {
			if ((v = json_object_get(json_object_get(call, "function"),
			    "arguments")) != NULL && json_is_string(v))
				n += json_string_length(v);
		}
		if ((v = json_object_get(ch, "text")) != NULL && json_is_string(v))
			n += json_string_length(v);
	}
	json_decref(root);
	return n;
}

/*
 * The usage object as runners send it, read without jansson
 * (usage_counts_read). Returns 1 with *u filled when it is a usage object
 * as usage_from_obj() reads it, 0 when jansson would parse it but
 * usage_from_obj() would not take it, -1 for anything else (let jansson
 * decide).
 */
static int
usage_fast(const char *p, size_t len, struct sl_usage *u)
{
	static const char *const names[3] = {
		"prompt_tokens", "completion_tokens", "total_tokens"
	};
	int r[3];
	uint64_t v[3];

	if (usage_counts_read(p, len, names, 3, r, v) == -1)
		return -1;
	if (r[0] != UCR_INT || r[1] != UCR_INT ||
	    (r[2] != UCR_INT && r[2] != UCR_ABSENT))
		return 0;
	u->have = 1;
	u->prompt_tokens = v[0];
	u->completion_tokens = v[1];
	u->total_tokens = r[2] == UCR_INT ? v[2] : v[0] + v[1];
	return 1;
}

int
usage_obj_read(const char *p, size_t len, struct sl_usage *u)
{
	json_error_t err;
	json_t *o;
	int r;

	if ((r = usage_fast(p, len, u)) >= 0)
		return r;
	if ((o = json_loadb(p, len, 0, &err)) == NULL)
		return 0;
	r = usage_from_obj(o, u) == 0;
	json_decref(o);
	return r;
}

/* ---- the scanner's lifetime, and the usage it found --------------------- */

void
sl_usage_scan_init(struct sl_usage_scan *s, int drop_usage_event)
{
	memset(s, 0, sizeof(*s));
	s->drop = drop_usage_event != 0;
	s->hs = H_NEW;
}

void
sl_usage_scan_keep(struct sl_usage_scan *s, int keep)
{
	s->keep = keep != 0;
	if (!keep && s->tpl != NULL) {
		free(s->tpl);
		s->tpl = NULL;
	}
}

void
sl_usage_scan_free(struct sl_usage_scan *s)
{
	free(s->hold);
	free(s->cap);
	free(s->tpl);
	s->tpl = NULL;
	s->hold = s->cap = NULL;
	s->hold_len = s->hold_alloc = s->cap_len = s->cap_alloc = 0;
}

void
sl_usage_scan_finish(struct sl_usage_scan *s, struct sl_usage_out *out)
{
	if (s->api != 0) {
		usage_api_finish(s, out);
		return;
	}
	memset(out, 0, sizeof(*out));
	if (holding(s) && s->hold_len > 0) {
		out->held = s->hold;
		out->held_len = s->hold_len;
		s->hold_len = 0;
	}
	s->hs = H_PASS;
	s->mt = MT_NONE;
	s->pending_ok = 0;
}

int
sl_usage_scan_result(const struct sl_usage_scan *s, struct sl_usage *u,
    uint64_t *content_bytes)
{
	memset(u, 0, sizeof(*u));
	if (s->have) {
		u->have = 1;
		u->prompt_tokens = s->prompt;
		u->completion_tokens = s->completion;
		u->total_tokens = s->total;
	}
	if (content_bytes != NULL)
		*content_bytes = s->content_bytes;
	return u->have;
}

int
sl_usage_scan_dropped(const struct sl_usage_scan *s)
{
	return s->dropped;
}

/* ---- the APIs besides chat: usage_api.c's, chosen here ---- */

int
sl_usage_from_json_api(enum sl_api api, const char *body, size_t len,
    struct sl_usage *u)
{
	if (api != SL_API_RESPONSES && api != SL_API_MESSAGES &&
	    api != SL_API_EMBEDDINGS)
		return sl_usage_from_json(body, len, u);
	return usage_api_from_json(api, body, len, u);
}

uint64_t
sl_usage_json_content_api(enum sl_api api, const char *body, size_t len)
{
	if (api == SL_API_EMBEDDINGS)
		return 0;
	if (api != SL_API_RESPONSES && api != SL_API_MESSAGES)
		return sl_usage_json_content(body, len);
	return usage_api_json_content(api, body, len);
}

void
sl_usage_scan_init_api(struct sl_usage_scan *s, enum sl_api api)
{
	sl_usage_scan_init(s, 0);
	if (api == SL_API_RESPONSES || api == SL_API_MESSAGES)
		usage_api_init(s, api);
}

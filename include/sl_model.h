/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_model: route a request by the model its body names.
 *
 * Pure functions over a request body plus one small per-worker state (the
 * smooth weighted round robin of each model's targets). The exchange calls
 * sl_model_route() once per request, after the body is read and before the
 * upstream is chosen; everything else here is used by it and by tests.
 *
 * Where the model is read (sluice.8, MODELS):
 *   - a JSON object body: its FIRST top-level "model" member, key and value
 *     compared with their escapes decoded; nested or later ones do not
 *     count. A member that is not a string is a 400.
 *   - a multipart/form-data body: its form field named "model", read
 *     strictly (read_form in model.c): a body a runner could read another
 *     way is AMBIGUOUS - no boundary or two, a preamble, a delimiter
 *     followed by more than CRLF or "--", a part head that is not plain
 *     "name: value" lines, two Content-Disposition headers, name*=, a
 *     name that is "model" only once decoded or case-folded, two "model"
 *     fields, a part or body that does not end.
 *   - an application/x-www-form-urlencoded body: no model, but AMBIGUOUS
 *     when a key decodes to "model" (sluice does not read forms).
 *   - a body json.loads reads as UTF-16/32 (sl_json_wide): AMBIGUOUS.
 *   - anything else (no body, not JSON): no model.
 * An AMBIGUOUS body is a 400 for every tenant: sluice routes and checks
 * the allow-list by the model, and never passes on one it could not read.
 */
#ifndef SL_MODEL_H
#define SL_MODEL_H

#include <stddef.h>

#include "sl_config.h"
#include "sl_json.h"

enum sl_model_kind {
	SL_MODEL_NONE = 0,     /* no body, not JSON, no "model" member */
	SL_MODEL_NAMED,        /* name/len hold it */
	SL_MODEL_NOT_STRING,   /* "model" is there but not a string */
	SL_MODEL_BAD_JSON,     /* a body that is not a JSON object */
	SL_MODEL_AMBIGUOUS     /* a body a runner may read otherwise: why */
};

/* The 400's message for an AMBIGUOUS body (exchange_tries.c's checks too). */
#define SL_MODEL_AMBIGUOUS_MSG "the request body cannot be read unambiguously: "

/* What a request body names. */
struct sl_model_req {
	enum sl_model_kind kind;
	char name[SL_MODEL_NAME_MAX + 1];   /* decoded; NUL-terminated */
	size_t len;            /* bytes of name (may hold NULs) */
	int too_long;          /* the name had more than SL_MODEL_NAME_MAX
	                        * bytes: no model has it; name is its start */
	int form;              /* read from a multipart/form-data field */
	struct sl_json_span v; /* where its value is in the body (JSON: the
	                        * string token, quotes included; form: the
	                        * field's bytes) */
	size_t count;          /* JSON: top-level "model" members */
	const char *why;       /* AMBIGUOUS: what (static, no quotes) */
};

/*
 * Read the model of a request body (len bytes; body may be NULL when len
 * is 0). ctype is its Content-Type value (ctlen bytes), or NULL.
 */
void sl_model_read(const char *body, size_t len, const char *ctype,
    size_t ctlen, struct sl_model_req *out);

/*
 * The body sent upstream for target model `to`: every top-level "model"
 * member of a JSON body (the form field of a multipart one) set to it,
 * every other byte as it was. Returns 1 and sets *out (malloc'd, caller
 * frees) and *out_len; 0 when no rewrite is needed (the name the client
 * sent is `to`, in one member); -1 without memory.
 */
int sl_model_rewrite(const char *body, size_t len, const struct sl_model_req *r,
    const char *to, char **out, size_t *out_len);

/* Per worker: which target each model's next request goes to. */
struct sl_models;

/* For cfg (which must outlive it); NULL without memory. */
struct sl_models *sl_models_new(const struct sl_config *cfg);
void sl_models_free(struct sl_models *);

/* Smooth weighted round robin: the index of model m's next target. */
size_t sl_models_pick(struct sl_models *, size_t m);

/* A form field's bytes in a (rewritten) body, for a later rewrite. */
struct sl_model_span {
	int form;              /* 0: a JSON body (found again by reading it) */
	size_t vs, ve;
};

/* How a request is routed. */
struct sl_route {
	int status;            /* 0: routed; else answer it (400 or 404) */
	const char *code;      /* with status: "bad_request", "model_not_found" */
	char message[400];     /* with status: JSON-escaped, for the error body */
	int model;             /* index into cfg->models; -1: none named */
	size_t target;         /* routed by model: its target's index */
	struct sl_model_span span;   /* routed by model: where the model is */
	size_t upstream;       /* routed: the upstream to use */
	const char *sent;      /* routed by model: the "model" sent upstream */
	char *body;            /* routed: a rewritten body (caller frees), or
	                        * NULL: send the client's */
	size_t body_len;
	char client[SL_MODEL_NAME_MAX + 1];   /* the name the client sent */
	size_t client_len;
};

/*
 * Route tenant t's request (cfg->models must be set): name or alias ->
 * model -> the tenant's allow-list -> a target (sl_models_pick) -> its
 * upstream. A request that names no model goes to the tenant's upstream,
 * or is a 400 when it has none. Returns 0 (out says what to do) or -1
 * without memory.
 */
int sl_model_route(struct sl_models *, const struct sl_config *cfg, size_t t,
    const char *body, size_t len, const char *ctype, size_t ctlen,
    struct sl_route *out);

/* A model's target. */
struct sl_model_pick {
	size_t model, target;
};

/*
 * The fallback chain of a request routed to target t0 of model m0, for
 * tenant: m0's other targets by decreasing weight, then the targets of
 * each fallback model (the models m0 names, then those they name, breadth
 * first, each once; one outside the tenant's list is skipped with its own
 * fallbacks), each model's by decreasing weight. *out (caller frees) holds
 * *n picks. 0, or -1 without memory.
 */
int sl_model_chain(const struct sl_config *cfg, size_t tenant, size_t m0,
    size_t t0, struct sl_model_pick **out, size_t *n);

/* Why a request's target cannot serve it, as the exchange knows it. */
enum sl_fb_cause {
	SL_FB_NO_REPLICA,   /* no replica of its upstream can take it now */
	SL_FB_CONNECT,      /* its tries failed to connect (retries spent) */
	SL_FB_BUSY,         /* a replica answered 429, 502 or 503 before any
	                     * body, and no other replica may try it */
	SL_FB_STARTED       /* a try failed after the request was written (a
	                     * close with no response, a timeout, a bad head):
	                     * the runner may have started on it */
};

/*
 * Whether a request may go on to its fallback chain (sluice.8, Fallback):
 * only one routed by model, only before the first byte of an answer went
 * to its client (answered: its response head was built, here or from an
 * upstream; nothing can be taken back or retried once bytes left), and
 * only for a cause where no runner can have started on it. 1 or 0. Ask it
 * before every fallback: it is the rule, and test_model pins it.
 */
int sl_model_may_fall_back(int routed, int answered, enum sl_fb_cause why);

/*
 * Set the model of a body already routed (*body, *len; malloc'd, replaced
 * when changed) to `to`, for a fallback target: every top-level "model"
 * member of a JSON body, or the form field at sp (updated). 0, or -1
 * without memory (the body is unchanged).
 */
int sl_model_retarget(char **body, size_t *len, struct sl_model_span *sp,
    const char *to);

/*
 * GET /v1/models and /v1/models/NAME (path: plen bytes, no query), for
 * tenant t: every model and alias it may use, sorted by id, in OpenAI's
 * list shape; or one of them. Returns 0 when the path is neither (nothing
 * set); 200 with *body (malloc'd, caller frees) and *blen; 404 with the
 * model_not_found message (JSON-escaped) in msg; -1 without memory.
 */
int sl_model_list(const struct sl_config *cfg, size_t t, const char *path,
    size_t plen, char **body, size_t *blen, char *msg, size_t msglen);

/*
 * Responses (sl_mrw): when the model's name changed on the way up, the
 * "model" member of the answer is set back to the name the client sees
 * (the name it sent, or the fallback model's). Which member, in a JSON
 * answer or in each "data:" line's JSON of an event stream (a line is
 * read on its own: one event's JSON split over several data lines is left
 * as it is): the first "model" member met either at the top level of the
 * object, or directly in a top-level member named "response" or "message"
 * whose value is an object (depth 2; not deeper, not in an array). That
 * covers every API a runner speaks: chat and completions (the top-level
 * "model" of the body and of each chunk), the Responses API ("model" of
 * the body; "response.model" in the response.created, .in_progress,
 * .completed, .incomplete and .failed events) and Anthropic's Messages
 * ("model" of the body; "message.model" in message_start). It is set when
 * its value is a string; either way that member decides, and the rest of
 * the answer, or of the line, passes unread: no API puts a model in both
 * places of one value, and reading on would cost every byte after it (a
 * chat chunk's text; a whole non-stream answer). In an event stream a
 * data line whose top-level "type" member, met before any such "model",
 * is a string naming an event that carries no model passes unread too
 * (the token deltas, that have none, would be read to their end): the
 * Responses API's "response.*" types (something after the dot) but
 * response.created, .in_progress, .queued, .completed, .incomplete and
 * .failed; the Messages API's content_block_start, content_block_delta,
 * content_block_stop, message_delta, message_stop and ping. So a "model"
 * after such a type is left as it is. A JSON answer is never skipped on
 * its type (a Messages body is "type":"message" with a top-level model);
 * a type with an escape, or not a string, is no such name (the line is
 * read on). So a "model" inside "choices":[{"message":{...}}], or under a
 * "response" that is not an object, is never touched. Keys and types are
 * compared as written (no escapes decoded: the runners write them
 * plain). Every other byte passes unchanged, nothing is buffered (a response.completed event carries the
 * whole output; it streams through), and the state carries over reads, so
 * a member split across reads at any byte is rewritten the same. The state
 * is a few words: copy it to undo a feed (exchange_response.c does when
 * the stream buffer is full and libcurl will hand the same bytes over
 * again).
 */
struct sl_mrw {
	const char *lit;       /* the value put: a JSON string, quotes included */
	size_t litlen;
	unsigned char sse;     /* an event stream: data lines only */
	unsigned char line;    /* sse: at a line's start, in data, in another */
	unsigned char pidx;    /* sse: bytes of "data:" matched */
	unsigned char in_str, esc, top_obj, phase, kidx, key, skip;
	unsigned short kmatch; /* candidates of a key or type matched bytewise */
	unsigned sub : 1;      /* in a top-level "response" / "message" object */
	unsigned done : 1;     /* the member is seen: the rest passes */
	unsigned depth;
};

/* A growing output buffer for sl_mrw_feed (reused; free p when done). */
struct sl_mrw_buf {
	char *p;
	size_t len, cap;
};

void sl_mrw_init(struct sl_mrw *, int sse, const char *lit, size_t litlen);

/*
 * Feed n bytes of the answer. Returns 0 when they pass unchanged (out is
 * not touched), 1 when out->p holds what replaces them (out->len bytes,
 * possibly 0), -1 without memory (the state is then undefined).
 */
int sl_mrw_feed(struct sl_mrw *, const char *in, size_t n, struct sl_mrw_buf *out);

/*
 * The JSON string literal for name (len bytes): quotes, escapes of '"',
 * '\\' and control bytes. malloc'd (caller frees), *outlen set; NULL
 * without memory.
 */
char *sl_mrw_literal(const char *name, size_t len, size_t *outlen);

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_meter: the tokens of one response.
 *
 * Before the first try it decides whether the request is counted (a POST
 * to a metered API's path, sl_api_metered(): chat, completions, responses,
 * messages, embeddings; with a JSON object body, usage on) and, for chat
 * and completions, has the body ask for the usage chunk where the config
 * says so (the other APIs report usage unasked: their bodies and streams
 * pass unchanged). At the
 * response head it chooses how the body is read: through the usage
 * scanner (sl_usage.h) for an event stream, as a copy for one JSON body.
 * At the end it says what the response cost, once: exact from the usage
 * the runner reported (if believable), else estimated from the prompt
 * and the content relayed. Charging the cost (tenant, cluster, fair
 * queue) is the exchange's.
 */
#ifndef SL_METER_H
#define SL_METER_H

#include <stddef.h>
#include <stdint.h>

#include "sl_api.h"

struct sl_req;
struct sl_usage_scan;

struct sl_meter {
	int on;                    /* a counted request: a metered API's
	                            * (sl_api_metered) with a JSON object body */
	enum sl_api api;           /* its API (set when on; SL_API_OTHER else) */
	int done;                  /* charged (or decided: nothing to charge) */
	const char *kind;          /* "exact", "estimated" or "none"; NULL */
	uint64_t prompt, completion;   /* the tokens charged */
	uint64_t prompt_est;       /* the request's prompt, estimated */
	struct sl_usage_scan *scan;   /* streamed: the SSE scanner */
	char *body;                /* not streamed: the body, for its usage */
	size_t body_len, body_cap;
	uint64_t body_total;       /* not streamed: body bytes relayed, for
	                            * the estimate of one too large to parse */
	int keep_json;             /* keep body: no scanner, or a JSON answer */
};

/*
 * Before the first try: is req counted (enabled: usage is on), is it
 * streamed, and is the runner asked for the usage chunk (inject; req's
 * body is then replaced by the edited one)?
 */
void sl_meter_request(struct sl_meter *, int enabled, int inject,
    struct sl_req *req);

/* The response head is in, before any body byte: how its body is read. */
void sl_meter_head(struct sl_meter *, int status, int body_allowed,
    int is_sse, int is_json);

/*
 * A non-streamed body's bytes, as given to the client, kept for its usage
 * up to SL_USAGE_MAX_JSON (past it, or without memory, only counted).
 */
void sl_meter_keep(struct sl_meter *, const char *p, size_t n);

/*
 * The response ended with status: 1 and its cost in n (sl_shm.h's
 * SL_TOKENS_* kinds) the first time there is one to charge, else 0.
 */
int sl_meter_end(struct sl_meter *, int status, uint64_t n[3]);

/* The request is over: what only its accounting needed goes. */
void sl_meter_free(struct sl_meter *);

/* Keep-alive: the next request starts with no accounting. */
void sl_meter_reset(struct sl_meter *);

#endif

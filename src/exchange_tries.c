/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Which replica serves the request, and what follows a failure: the route
 * by model (the allow-list, the body's target), the pool's pick, the fair
 * queue's wait and its grants, a try started on libcurl (sl_transfer.h),
 * retries before the first byte, the fallback chain, and the transfer's
 * end (sl_conn_upstream_done).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sl_api.h"
#include "sl_json.h"
#include "sl_log.h"
#include "sl_exchange.h"
#include "exchange_int.h"

/*
 * The current try ended without a response status of its own (code is
 * SL_CODE_CONNECT, _TIMEOUT or _RESET): count it for its replica, once.
 */
void
conn_report_try(struct sl_conn *c, int code)
{
	if (c->replica >= 0 && !c->reported) {
		sl_pool_report(c->w->pools, conn_upstream_idx(c), c->replica,
		    code, 0);
		c->reported = 1;
	}
}

/*
 * Stop the current try's transfer, if any, and give its replica slot back
 * (and that of a replica picked for a next try that will not happen).
 * Never call from a libcurl callback.
 */
static void
conn_stop_transfer(struct sl_conn *c)
{
	sl_xfer_stop(&c->xf, c->w->xfers);
	if (c->replica >= 0) {
		sl_pool_release(c->w->pools, conn_upstream_idx(c), c->replica);
		c->replica = -1;
	}
}

/*
 * A waiting request leaves the fair queue (why: gone or timeout); a slot
 * granted to it meanwhile goes on to the next waiter. Acts once.
 */
void
conn_queue_leave(struct sl_conn *c, enum sl_queue_outcome why)
{
	if (c->qhandle == 0)
		return;
	sl_queue_cancel(c->w->queue, c->w->row, c->qhandle, why);
	TAILQ_REMOVE(&c->w->queued, c, qentry);
	c->qhandle = 0;
	c->queued_total += ev_now(c->w->loop) - c->t_queued;
}

/* Stop the upstream side of the request. Never call from a libcurl callback. */
void
conn_abort_upstream(struct sl_conn *c)
{
	conn_queue_leave(c, SL_QUEUE_O_GONE);
	conn_stop_transfer(c);
	if (c->retry_next >= 0) {
		sl_pool_release(c->w->pools, c->fb_model >= 0 ?
		    c->w->cfg->models[c->fb_model].targets[c->fb_target].upstream_idx :
		    conn_upstream_idx(c), c->retry_next);
		c->retry_next = -1;
		c->fb_model = -1;
	}
	sl_xfer_clear(&c->xf);
	if (c->paused)   /* the pause ends here: count it for the access log */
		c->paused_total += ev_now(c->w->loop) - c->t_pause;
	c->paused = 0;
}

/*
 * A body a Python runner reads as JSON in UTF-16 or UTF-32 where sluice
 * reads it (counted paths; prefix_affinity): sluice reads UTF-8 only, so
 * relayed it would escape tokens_per_minute. RFC 8259 says UTF-8.
 */
static int
conn_body_wide(const struct sl_conn *c, const struct sl_upstream_conf *up)
{
	const char *url;
	size_t ulen;

	if (c->req.method != HTTP_POST || c->req.body == NULL ||
	    (!c->w->cfg->usage.enabled && up->balance != SL_BALANCE_PREFIX_AFFINITY))
		return 0;
	url = sl_req_url(&c->req, &ulen);
	return sl_api_metered(c->req.method, url, ulen) &&
	    sl_json_wide(c->req.body, c->req.body_len);
}

/*
 * Start a try of the request on replica r of its upstream, whose slot the
 * caller took (sl_pool_pick). Returns 0, or -1 when the transfer could not
 * be started (the slot is given back; the caller answers).
 */
int
conn_try(struct sl_conn *c, int r)
{
	struct sl_worker *w = c->w;

	c->replica = c->last_replica = r;
	c->tried |= 1ULL << r;
	c->tries++;
	c->reported = 0;
	if (sl_xfer_prepare(&c->xf, w->xfers, &c->sink,
	    (long)w->cfg->timeouts.upstream_connect_ms,
	    sl_pool_url(w->pools, conn_upstream_idx(c), r), &c->req) == -1)
		goto fail;
	c->t_upstream = ev_now(w->loop);
	c->status = 0;
	c->upstream_bad = 0;
	sl_resp_head_reset(&c->uh);
	conn_set_state(c, CS_UPSTREAM);
	if (sl_xfer_launch(&c->xf, w->xfers) == -1)
		goto fail;
	return 0;
fail:
	sl_err("conn %d: cannot start the upstream request", c->fd);
	conn_stop_transfer(c);
	return -1;
}

/*
 * Where the body decides the route and the allow-list: a head that leaves
 * its reading open. Two Content-Type headers (which one a runner takes is
 * its own choice), or a body in a Content-Encoding sluice does not undo
 * (a runner that did would read a model sluice never saw). NULL, or what
 * is wrong, for the 400.
 */
static const char *
conn_body_unreadable(const struct sl_conn *c)
{
	const char *name, *value;
	size_t i, nlen, vlen;
	int ncts = 0;

	for (i = 0; sl_req_header_at(&c->req, i, &name, &nlen, &value,
	    &vlen) == 0; i++) {
		if (sl_http_name_is(name, nlen, "content-type") && ncts++)
			return "two Content-Type headers";
		if (c->req.body_len > 0 &&
		    sl_http_name_is(name, nlen, "content-encoding") &&
		    !(vlen == 8 && strncasecmp(value, "identity", 8) == 0))
			return "a Content-Encoding, which sluice does not decode "
			    "to read the model";
	}
	return NULL;
}

/*
 * Choose the request's upstream: its tenant's, or with models: the one the
 * model its body names resolves to (sl_model.h), the body rewritten for
 * that target. Returns 0, or -1 with the answer in v (400, 404
 * model_not_found).
 */
static int
conn_route_model(struct sl_conn *c, struct sl_verdict *v)
{
	const struct sl_config *cfg = c->w->cfg;
	struct sl_route r;
	const char *ct, *why;
	size_t ctlen = 0;

	c->model = -1;
	c->up_idx = cfg->tenants[c->tenant].upstream_idx;
	if (cfg->models == NULL)
		return 0;
	ct = sl_req_header(&c->req, "content-type", &ctlen);
	if ((why = conn_body_unreadable(c)) != NULL) {
		char msg[200];

		snprintf(msg, sizeof(msg), "%s%s", SL_MODEL_AMBIGUOUS_MSG, why);
		return sl_verdict(v, SL_ERR_BAD_REQUEST, msg, 0);
	}
	if (sl_model_route(c->w->models, cfg, (size_t)c->tenant, c->req.body,
	    c->req.body_len, ct, ctlen, &r) == -1)
		return sl_verdict(v, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
	/* For the access log: the name as sent (a 404's too), and as sent on. */
	free(c->mname);
	c->mname = NULL;
	if (r.client_len > 0 && (c->mname = malloc(r.client_len)) != NULL) {
		memcpy(c->mname, r.client, r.client_len);
		c->mname_len = r.client_len;
	}
	c->msent = r.sent;
	if (r.status != 0)
		return sl_verdict(v, sl_err_find(r.status, r.code,
		    SL_ERR_BAD_REQUEST), r.message, 0);
	c->model = r.model;
	c->up_idx = r.upstream;
	c->mtarget = c->troute = r.target;
	c->mroute = r.model;
	c->mspan = r.span;
	c->fb_k = 0;
	if (r.body != NULL) {
		free(c->req.body);
		c->req.body = r.body;
		c->req.body_len = c->req.body_cap = r.body_len;
	}
	return 0;
}

/*
 * Fallback (sl_model.h): the next target of the request's chain, after
 * c->fb_k, that has a replica free now; its slot is taken. Returns the
 * replica and sets *m, *t, or -1 when none, or when the request may not
 * fall back for `why` (sl_model_may_fall_back: routed by model, nothing
 * of an answer sent, no runner started on it). Changes nothing but
 * c->fb_k: safe in a libcurl callback.
 */
int
conn_fallback_find(struct sl_conn *c, enum sl_fb_cause why, int *m, int *t)
{
	const struct sl_config *cfg = c->w->cfg;
	struct sl_model_pick *p;
	size_t n;
	int r = -1, wait;

	if (!sl_model_may_fall_back(c->model >= 0, c->head_sent, why) ||
	    sl_model_chain(cfg, (size_t)c->tenant, (size_t)c->mroute,
	    c->troute, &p, &n) == -1)
		return -1;
	for (; c->fb_k < n && r < 0; c->fb_k++) {
		const struct sl_model_target *tg =
		    &cfg->models[p[c->fb_k].model].targets[p[c->fb_k].target];

		if ((r = sl_pool_pick(c->w->pools, tg->upstream_idx, 0, &wait)) >=
		    0) {
			*m = (int)p[c->fb_k].model;
			*t = (int)p[c->fb_k].target;
		}
	}
	free(p);
	return r;
}

/*
 * Move the request to target t of model m, found by conn_fallback_find:
 * its upstream, its model in the body, that upstream's header tail. The
 * current try must be stopped first (its replica is released on the old
 * upstream). -1 without memory.
 */
static int
conn_fallback_switch(struct sl_conn *c, int m, int t)
{
	const struct sl_config *cfg = c->w->cfg;
	const struct sl_model_target *tg = &cfg->models[m].targets[t];

	sl_info("conn %d: model %s falls back to %s (upstream %s)", c->fd,
	    cfg->models[c->model].name, cfg->models[m].name,
	    cfg->upstreams[tg->upstream_idx].name);
	if (sl_model_retarget(&c->req.body, &c->req.body_len, &c->mspan,
	    tg->model) == -1)
		return -1;
	/* Moved: counted from the model it was at (itself: another target). */
	sl_shm_count_fallback(c->w->shm, conn_model_slot(c),
	    c->w->model_slot != NULL ? c->w->model_slot[m] : 0);
	c->req.body_cap = c->req.body_len;
	c->model = m;
	c->mtarget = (size_t)t;
	c->msent = tg->model;
	c->up_idx = tg->upstream_idx;
	c->tried = 0;
	c->tries_base = c->tries;   /* retries: per upstream */
	sl_xfer_retail(&c->xf, c->w->xfers, c->up_idx);
	return 0;
}

/*
 * The try in flight (if any) failed for `why`: when the request may fall
 * back, stop it and start one on the fallback chain. Returns 0 when it
 * fell back (a try started, or v says the one chosen could not start),
 * -1 when it may not (the caller answers).
 */
static int
conn_fallback(struct sl_conn *c, enum sl_fb_cause why, struct sl_verdict *v)
{
	int m, t, r;

	if ((r = conn_fallback_find(c, why, &m, &t)) < 0)
		return -1;
	conn_stop_transfer(c);
	if (conn_fallback_switch(c, m, t) == -1) {
		sl_pool_release(c->w->pools,
		    c->w->cfg->models[m].targets[t].upstream_idx, r);
		return -1;
	}
	if (conn_try(c, r) == -1)
		sl_verdict(v, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
	return 0;
}

/*
 * upstreams.*.inject_priority: a JSON object body gets "priority": -P (P:
 * the tenant's priority) as its last member, which is the one a Python
 * runner reads (duplicates: the last wins), so that vLLM's
 * --scheduling-policy priority (lower first) orders its own queue as the
 * fair queue does. Anything else goes unchanged. -1 without memory.
 */
static int
conn_inject_priority(struct sl_conn *c, const struct sl_upstream_conf *up)
{
	size_t open, close, nmemb, len = c->req.body_len;
	char ins[40], *nb;
	int n;

	if (!up->inject_priority || c->req.method != HTTP_POST ||
	    c->req.body == NULL || len == 0 ||
	    sl_json_object(c->req.body, len, NULL, 0, &open, &close,
	    &nmemb) == -1)
		return 0;
	n = snprintf(ins, sizeof(ins), "%s\"priority\":%d",
	    nmemb > 0 ? "," : "", -(int)c->w->cfg->tenants[c->tenant].priority);
	if (n < 0 || (size_t)n >= sizeof(ins) ||
	    (nb = malloc(len + (size_t)n + 1)) == NULL)
		return -1;
	memcpy(nb, c->req.body, close);
	memcpy(nb + close, ins, (size_t)n);
	memcpy(nb + close + n, c->req.body + close, len - close);
	nb[len + (size_t)n] = '\0';
	free(c->req.body);
	c->req.body = nb;
	c->req.body_len = c->req.body_cap = len + (size_t)n;
	return 0;
}

/* sl_json_decode's sink: the id's bytes, refused past SL_STORED_ID_MAX. */
struct id_buf {
	char b[SL_STORED_ID_MAX];
	size_t n;
};

static int
id_sink(void *arg, const unsigned char *b, size_t n)
{
	struct id_buf *ib = arg;

	if (n > sizeof(ib->b) - ib->n)
		return 1;
	memcpy(ib->b + ib->n, b, n);
	ib->n += n;
	return 0;
}

/*
 * The stored response a POST /v1/responses body continues: its top-level
 * "previous_response_id" string, decoded into ib. 0, or -1: none.
 */
static int
conn_previous_id(const struct sl_conn *c, struct id_buf *ib)
{
	static const char key[] = "previous_response_id";
	struct sl_json_first f = { key, { 0, 0 }, 0 };
	const char *b = c->req.body;

	ib->n = 0;
	/* The path that names none pays a memmem, not a JSON pass. */
	if (b == NULL || c->req.body_len == 0 ||
	    memmem(b, c->req.body_len, key, sizeof(key) - 1) == NULL ||
	    sl_json_object_first(b, c->req.body_len, &f) == -1 ||
	    f.count == 0 || f.v.ve - f.v.vs < 3 || b[f.v.vs] != '"' ||
	    sl_json_decode(b, f.v.vs, f.v.ve, id_sink, ib) != 0)
		return -1;
	return ib->n > 0 ? 0 : -1;
}

/*
 * Does a POST /v1/responses body say "store": false? The runner then keeps
 * nothing a later request could name, so there is no id to learn (and no
 * table entry, lock or page to pay for). A body that names "store" twice
 * is learnt from: an entry that names nothing stored costs only its room.
 */
static int
conn_store_false(const struct sl_conn *c)
{
	struct sl_json_first f = { "store", { 0, 0 }, 0 };
	const char *b = c->req.body;

	return b != NULL && c->req.body_len > 0 &&
	    memmem(b, c->req.body_len, "\"store\"", 7) != NULL &&
	    sl_json_object_first(b, c->req.body_len, &f) == 0 &&
	    f.count == 1 && f.v.ve - f.v.vs == 5 &&
	    memcmp(b + f.v.vs, "false", 5) == 0;
}

/*
 * Stored responses (sl_stored.h): a request of the Responses API that
 * names one (previous_response_id, or /v1/responses/{id} and its cancel
 * and input_items) goes to the replica that made it while that replica
 * is up. Sets c->learn (the answer's id is to be learnt), c->pinned and
 * c->owner, and counts what the table said. Before the head is shed.
 */
static void
conn_stored_route(struct sl_conn *c)
{
	struct sl_worker *w = c->w;
	size_t u = conn_upstream_idx(c), ulen, idlen;
	const char *url, *id;
	struct id_buf ib;
	enum sl_stored_result res;
	uint64_t rid;
	int exact = 0, up, r;

	c->pinned = c->learn = 0;
	c->owner = -1;
	if (c->api != SL_API_RESPONSES ||
	    !sl_stored_on(w->stored, w->upstream_slot[u]))
		return;
	url = sl_req_url(&c->req, &ulen);
	if (sl_api_of(url, ulen, &exact) == SL_API_RESPONSES && exact) {
		if (c->req.method != HTTP_POST)
			return;
		c->learn = !conn_store_false(c);
		if (conn_previous_id(c, &ib) == -1)
			return;
		id = ib.b;
		idlen = ib.n;
	} else if ((id = sl_api_response_id(url, ulen, &idlen)) == NULL)
		return;
	if (sl_stored_get(w->stored, w->upstream_slot[u], id, idlen,
	    sl_mono_ms(), &rid) == -1)
		res = SL_STORED_UNKNOWN;
	else if ((r = sl_pool_owner(w->pools, u, rid, &up)) < 0 || !up)
		res = SL_STORED_OWNER_DOWN;
	else {
		res = SL_STORED_OWNER;
		c->pinned = 1;
		c->owner = r;
	}
	sl_shm_count_stored(w->shm, w->row, w->upstream_slot[u], res);
}

/* Does the request's pool have a queue with waiters now? */
static int
conn_queue_in_use(const struct sl_conn *c)
{
	size_t u = conn_upstream_idx(c);

	return c->w->queue != NULL && c->w->cfg->upstreams[u].queue.enabled &&
	    sl_queue_waiting(c->w->queue, c->w->queue_slot[u]) > 0;
}

/*
 * Every replica of the request's pool that could take it is full: wait
 * in the fair queue (CS_QUEUED), holding the tenant slot. Returns 0 when
 * waiting or when v says 503 queue_full; -1 when it may not wait (tenant
 * priority below 0, no queue): the caller answers upstream_unavailable.
 */
static int
conn_enqueue(struct sl_conn *c, int retry_after, struct sl_verdict *v)
{
	struct sl_worker *w = c->w;
	size_t u = conn_upstream_idx(c), qp = w->queue_slot[u];
	uint64_t h;
	char msg[160];

	/* A request pinned to its stored response's replica waits for it. */
	switch (sl_queue_enqueue_for(w->queue, w->row, qp,
	    w->tenant_slot[c->tenant], sl_mono_ms(), c->meter.prompt_est,
	    c->pinned ? sl_pool_slot(w->pools, u, c->owner) : SL_QUEUE_ANY,
	    &h)) {
	case SL_QUEUE_OK:
		break;
	case SL_QUEUE_FULL:
		snprintf(msg, sizeof(msg), "every replica of upstream '%s' is "
		    "full and its queue too", w->cfg->upstreams[u].name);
		sl_verdict(v, SL_ERR_QUEUE_FULL, msg, retry_after);
		return 0;
	default:
		return -1;
	}
	c->qhandle = h;
	c->qpool = qp;
	c->t_queued = ev_now(w->loop);
	c->q_retry_after = retry_after > 0 ? retry_after : 1;
	TAILQ_INSERT_TAIL(&w->queued, c, qentry);
	conn_set_state(c, CS_QUEUED);
	/*
	 * Counted as waiting, look again: a slot given back just before we
	 * were counted is taken now and offered (to the best waiter, maybe
	 * this one: its grant comes through the eventfd like any other).
	 */
	sl_pool_pump(w->pools, u);
	return 0;
}

/*
 * The request is read whole: build its upstream head, choose a replica and
 * start a try, or wait in the fair queue; or v says how to answer.
 */
void
conn_start_upstream(struct sl_conn *c, struct sl_verdict *v)
{
	const struct sl_config *cfg = c->w->cfg;
	const struct sl_upstream_conf *up;
	int r, retry_after;

	if (conn_route_model(c, v) == -1)
		return;
	up = &cfg->upstreams[conn_upstream_idx(c)];
	if (conn_body_wide(c, up)) {
		sl_verdict(v, SL_ERR_BAD_REQUEST, "request body must be UTF-8 JSON",
		    0);
		return;
	}
	sl_meter_request(&c->meter, cfg->usage.enabled, cfg->usage.inject,
	    &c->req);
	if (conn_inject_priority(c, up) == -1 ||
	    sl_xfer_headers(&c->xf, c->w->xfers, conn_upstream_idx(c), &c->req,
	    c->peer, c->meter.on || c->model >= 0) == -1) {
		sl_verdict(v, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
		return;
	}
	conn_stored_route(c);
	/* The upstream head is built: the client's is not needed any more. */
	sl_req_shed_head(&c->req);
	c->tried = 0;
	c->tries = c->tries_base = 0;
	c->q_charged = 0;
	if (conn_queue_in_use(c)) {
		/* Others wait for this pool: no overtaking them. */
		r = -1;
		retry_after = 1;
	} else if (c->pinned)
		r = sl_pool_pick_one(c->w->pools, conn_upstream_idx(c), c->owner,
		    &retry_after);
	else if (c->req.method == HTTP_POST && up->balance ==
	    SL_BALANCE_PREFIX_AFFINITY && c->req.body_len > 0) {
		int outcome;

		r = sl_pool_pick_prompt(c->w->pools, conn_upstream_idx(c),
		    c->req.body, c->req.body_len, &retry_after, &outcome);
		c->affinity = outcome + 1;
		if (outcome >= 0)
			sl_shm_count_affinity(c->w->shm, c->w->row,
			    c->w->upstream_slot[conn_upstream_idx(c)],
			    (enum sl_aff_outcome)outcome);
	} else
		r = sl_pool_pick(c->w->pools, conn_upstream_idx(c), 0,
		    &retry_after);
	if (r < 0 && !c->pinned && c->model >= 0 &&
	    conn_fallback(c, SL_FB_NO_REPLICA, v) == 0)
		return;   /* another model's or target's pool took it */
	if (r < 0 && (c->pinned ? sl_pool_queueable_one(c->w->pools,
	    conn_upstream_idx(c), c->owner) :
	    sl_pool_queueable(c->w->pools, conn_upstream_idx(c))) &&
	    conn_enqueue(c, retry_after, v) == 0)
		return;   /* waiting, or 503 queue_full */
	if (r < 0) {
		char msg[200];

		/* Like a full tenant: answer at once, free the slot at once. */
		if (c->pinned)
			snprintf(msg, sizeof(msg), "the replica of upstream '%s' "
			    "that holds the stored response cannot take the "
			    "request now (busy or at capacity)", up->name);
		else
			snprintf(msg, sizeof(msg), "no replica of upstream '%s' "
			    "can take the request now (down, ejected, busy or "
			    "at capacity)", up->name);
		sl_verdict(v, SL_ERR_UPSTREAM_UNAVAILABLE, msg, retry_after);
		return;
	}
	if (c->w->queue != NULL && up->queue.enabled) {
		/* Served now: its prompt counts now, as a waiter's would. */
		sl_queue_charge(c->w->queue, c->w->queue_slot[
		    conn_upstream_idx(c)], c->w->tenant_slot[c->tenant],
		    c->meter.prompt_est);
		c->q_charged = c->meter.prompt_est;
	}
	if (conn_try(c, r) == -1)
		sl_verdict(v, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
}

/*
 * Move the request to replica r2 (its slot taken by sl_pool_pick): count
 * why, end the current try, start the next; v says 502 when it cannot.
 */
static void
conn_next_try(struct sl_conn *c, int r2, enum sl_retry_reason why,
    struct sl_verdict *v)
{
	size_t u = conn_upstream_idx(c);

	sl_shm_count_retry(c->w->shm, c->w->row, c->w->upstream_slot[u], why);
	if (why == SL_RETRY_R_BUSY)
		sl_info("conn %d: replica %s answered %d; trying %s", c->fd,
		    sl_pool_url(c->w->pools, u, c->replica), c->busy_code,
		    sl_pool_url(c->w->pools, u, r2));
	else
		sl_info("conn %d: replica %s failed (%s); trying %s", c->fd,
		    sl_pool_url(c->w->pools, u, c->replica),
		    sl_shm_retry_label(why), sl_pool_url(c->w->pools, u, r2));
	conn_stop_transfer(c);
	if (conn_try(c, r2) == -1)
		sl_verdict(v, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
}

/*
 * A try failed before any response byte reached the client: report it, and
 * move the request to another replica when the pool's policy allows it
 * (retry_on, retries), or down its fallback chain. Returns 0 when it moved
 * (a next try started, or v says why none could), -1 when the caller
 * answers the failure.
 */
int
conn_retry(struct sl_conn *c, enum sl_uerr kind, CURLcode result,
    struct sl_verdict *v)
{
	const struct sl_upstream_conf *up =
	    &c->w->cfg->upstreams[conn_upstream_idx(c)];
	enum sl_retry_reason why;
	int r2, wait;

	conn_report_try(c, kind == SL_UERR_CONNECT ? SL_CODE_CONNECT :
	    SL_CODE_RESET);
	if (kind == SL_UERR_CONNECT) {
		if (!(up->retry_on & SL_RETRY_CONNECT))
			return conn_fallback(c, SL_FB_CONNECT, v);
		why = SL_RETRY_R_CONNECT;
	} else if (kind == SL_UERR_RESET && c->uh.status == 0 &&
	    (c->xf.resend_refused || result == CURLE_GOT_NOTHING ||
	    result == CURLE_RECV_ERROR || result == CURLE_SEND_ERROR)) {
		/*
		 * Closed after the request was written, before any response
		 * byte: the runner may have started on it. Only an explicit
		 * `empty` sends it to another replica.
		 */
		if (!(up->retry_on & SL_RETRY_EMPTY))
			return conn_fallback(c, SL_FB_STARTED, v);
		why = SL_RETRY_R_EMPTY;
	} else
		return conn_fallback(c, SL_FB_STARTED, v);
	/* No replica of this pool may try it again: the fallback chain may. */
	if (c->tries - c->tries_base > up->retries ||
	    (r2 = sl_pool_pick(c->w->pools,
	    conn_upstream_idx(c), c->tried, &wait)) < 0)
		return conn_fallback(c, why == SL_RETRY_R_CONNECT ?
		    SL_FB_CONNECT : SL_FB_STARTED, v);
	conn_next_try(c, r2, why, v);
	return 0;
}

void
sl_conn_queue_tick(struct sl_worker *w)
{
	struct sl_conn *c, *next;

	/*
	 * A waiter's deadline reads its pool's timeout now: re-arm each
	 * one, so that a reload that shortened it applies within a second.
	 */
	for (c = TAILQ_FIRST(&w->queued); c != NULL; c = next) {
		next = TAILQ_NEXT(c, qentry);
		conn_timer_update(c);
	}
}

/*
 * A busy head (429, 502, 503) stopped the try, and the header callback
 * picked where the request goes next (retry_next: a replica of its pool,
 * or of a fallback target's): start that try, or v says 502.
 */
void
conn_busy_next(struct sl_conn *c, struct sl_verdict *v)
{
	int r2 = c->retry_next, m, t;

	c->retry_next = -1;
	if (c->fb_model < 0) {
		conn_next_try(c, r2, SL_RETRY_R_BUSY, v);
		return;
	}
	/* No other replica of its pool: a target of its fallback chain. */
	m = c->fb_model;
	t = c->fb_target;
	c->fb_model = -1;
	conn_stop_transfer(c);
	if (conn_fallback_switch(c, m, t) == -1) {
		sl_pool_release(c->w->pools,
		    c->w->cfg->models[m].targets[t].upstream_idx, r2);
		sl_verdict(v, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
	} else if (conn_try(c, r2) == -1)
		sl_verdict(v, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
}

/* The upstream of w's config whose queue pool index is qp, or -1. */
static int64_t
queue_upstream(const struct sl_worker *w, size_t qp)
{
	size_t u;

	for (u = 0; u < w->cfg->nupstreams; u++)
		if (qp != 0 && w->queue_slot[u] == qp)
			return (int64_t)u;
	return -1;
}

/*
 * A grant of the fair queue for one of w's waiters: the waiter, out of the
 * queue, its request started on the replica granted, or v says how to
 * answer. NULL when no waiter has it (the slot is passed on).
 */
struct sl_conn *
conn_queue_grant(struct sl_worker *w, const struct sl_queue_grant *g,
    struct sl_verdict *v)
{
	struct sl_conn *c;
	int64_t u;
	int r = -1;

	TAILQ_FOREACH(c, &w->queued, qentry)
		if (c->qhandle == g->handle)
			break;
	u = queue_upstream(w, g->pool);
	if (g->slot != SL_QUEUE_CLOSED && u >= 0)
		r = sl_pool_replica_of(w->pools, (size_t)u, g->slot);
	if (c == NULL) {
		/* Cannot happen (a waiter that leaves cancels): pass it on. */
		if (r >= 0)
			sl_pool_release(w->pools, (size_t)u, r);
		else if (g->slot != SL_QUEUE_CLOSED)
			sl_shm_release(w->shm, w->row, g->slot);
		return NULL;
	}
	TAILQ_REMOVE(&w->queued, c, qentry);
	c->qhandle = 0;
	c->queued_total += ev_now(w->loop) - c->t_queued;
	c->q_charged = c->meter.prompt_est;   /* sl_queue_enqueue's dispatch cost */
	if (r < 0 || (size_t)u != conn_upstream_idx(c)) {
		/*
		 * The pool was removed by a reload, or the slot is of a
		 * replica this generation does not know.
		 */
		if (g->slot != SL_QUEUE_CLOSED) {
			if (r >= 0)
				sl_pool_release(w->pools, (size_t)u, r);
			else
				sl_shm_release(w->shm, w->row, g->slot);
		}
		sl_verdict(v, SL_ERR_UPSTREAM_UNAVAILABLE,
		    "the upstream was removed by a reload", 1);
	} else if (conn_try(c, r) == -1)
		sl_verdict(v, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
	return c;
}

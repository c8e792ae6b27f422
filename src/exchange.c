/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The exchange: one request's life, whatever carries it. Its states and
 * deadlines; the head's rules, the key to a tenant and admission (the
 * node's slot, the cluster's lease, the token budget); the answers sluice
 * makes itself (a row of sl_reply.h's error table); the request's end,
 * counted and logged once. exchange_int.h draws the state machine and
 * names the other rooms.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "sl_exchange.h"
#include "sl_log.h"
#include "sl_usage.h"
#include "exchange_int.h"


static void conn_on_timer(struct ev_loop *loop, ev_timer *t, int revents);
static void conn_timer_event(struct sl_conn *c);
static void conn_admitted(struct sl_conn *c);

/*
 * Answer the current request here: status, a JSON body of blen bytes, and
 * the header lines in extra ("Name: value\r\n" each, or ""). When the
 * request body was not read yet, it is read and discarded so that the
 * connection can be kept; unless close is set (or the request or worker
 * says so). A body larger than the stream buffer stretches it: what is
 * answered here is bounded by the config, not by a client.
 */
static void
conn_local_answer(struct sl_conn *c, int status, const char *extra,
    const char *body, size_t blen, int close)
{
	if (c->req.state == SL_REQ_ERROR || !c->req.keep_alive ||
	    c->w->draining || c->w->cfg->timeouts.keepalive_ms == 0)
		close = 1;
	c->rh.len = c->rh_off = 0;
	sl_buf_consume(&c->out, sl_buf_len(&c->out));
	sl_head_status_line(&c->rh, status, sl_http_reason(status));
	SL_HEAD_LIT(&c->rh, "Content-Type: application/json\r\nContent-Length: ");
	sl_head_add_uint(&c->rh, (unsigned long)blen);
	SL_HEAD_LIT(&c->rh, "\r\nCache-Control: no-store\r\n");
	sl_head_add(&c->rh, extra, strlen(extra));
	conn_head_model(c);
	conn_head_ratelimit(c);
	sl_head_connection(&c->rh, close);
	/*
	 * A HEAD answer has no content (RFC 9110 9.3.2): on a kept connection
	 * the client would read this body as the start of its next response.
	 */
	if ((!c->req.method_known || c->req.method != HTTP_HEAD) && blen > 0) {
		if (c->out.cap < blen)
			c->out.cap = blen;
		if (sl_buf_append(&c->out, body, blen) == -1)
			close = 1;   /* cut short: the length tells the client */
	}
	c->close_after = close;
	c->head_sent = 1;
	c->resp_done = 1;
	c->status = status;
	if (c->req.state == SL_REQ_HEAD_DONE) {
		c->req.discard_body = 1;
		sl_req_continue(&c->req);
	}
	conn_set_state(c, CS_LOCAL);
	if (conn_flush(c) == -1) {
		conn_close(c, SL_CLOSE_CLIENT_GONE);
		return;
	}
	conn_after_write(c);
}

/*
 * Answer the current request here with error e of sluice's own (sl_reply.h:
 * the row's status, type, code and header lines), saying message (the row's
 * own when NULL), its slot and any upstream try given up first (see
 * conn_local_answer).
 */
/*
 * The API the request speaks: its head's, or what the target says of a
 * head refused before it was whole (a 431 or 408 on /v1/messages).
 */
static enum sl_api
conn_api(struct sl_conn *c)
{
	if (c->api == SL_API_OTHER && c->req.url_len > 0) {
		const char *url;
		size_t ulen;

		url = sl_req_url(&c->req, &ulen);
		c->api = sl_api_of(url, ulen, NULL);
	}
	return c->api;
}

void
conn_error(struct sl_conn *c, enum sl_err e, const char *message,
    int retry_after)
{
	const struct sl_err_row *r = &sl_errs[e];
	char body[512], extra[128];
	size_t blen;

	if (!c->req_active) {
		c->req_active = 1;
		c->t_start = c->t_rx > 0 ? c->t_rx : c->t_req;
	}
	if (c->end == SL_END_NONE) {
		if (r->status == 408 || r->status == 504)
			c->end = SL_END_TIMEOUT;
		else if (r->status == 502)
			c->end = SL_END_UPSTREAM_ERROR;
		else
			c->end = SL_END_REJECTED;
	}
	conn_abort_upstream(c);
	conn_release(c);
	/* In the client's protocol: Anthropic's clients read only their own. */
	if (conn_api(c) == SL_API_MESSAGES)
		blen = sl_err_body_anthropic(body, sizeof(body), e, message);
	else
		blen = sl_err_body(body, sizeof(body), e, message);
	sl_err_headers(extra, sizeof(extra), e, retry_after);
	sl_debug("conn %d: %d %s", c->fd, r->status, r->code);
	conn_local_answer(c, r->status, extra, body, blen,
	    (r->flags & SL_ERR_CLOSE) != 0);
}

/* What a decision of exchange_tries.c left to answer, if anything. */
static void
conn_answer(struct sl_conn *c, const struct sl_verdict *v)
{
	if (v->answer)
		conn_error(c, v->err, v->msg[0] != '\0' ? v->msg : NULL,
		    v->retry_after);
}

/*
 * GET /v1/models[/NAME] with models: answered here from the config, for
 * the tenant's models (sl_model_list): no slot, no upstream. Returns 1 when
 * the request was answered, 0 when it is not one of these.
 */
static int
conn_models_list(struct sl_conn *c)
{
	const char *url, *q;
	size_t ulen, blen;
	char *body, msg[400];
	int st;

	if (c->w->cfg->models == NULL || (c->req.method != HTTP_GET &&
	    c->req.method != HTTP_HEAD))
		return 0;
	url = sl_req_url(&c->req, &ulen);
	if ((q = memchr(url, '?', ulen)) != NULL)
		ulen = (size_t)(q - url);
	st = sl_model_list(c->w->cfg, (size_t)c->tenant, url, ulen, &body, &blen,
	    msg, sizeof(msg));
	if (st == 0)
		return 0;
	if (st == 404)
		conn_error(c, SL_ERR_MODEL_NOT_FOUND, msg, 0);
	else if (st != 200)
		conn_error(c, SL_ERR_OVERLOADED, "out of memory", 1);
	else {
		c->end = SL_END_DONE;
		conn_local_answer(c, 200, "", body, blen, 0);
		free(body);
	}
	return 1;
}

/* What every exchange starts with (fd is its connection's, for the logs). */
void
conn_init(struct sl_conn *c, struct sl_worker *w, int fd)
{
	c->w = w;
	c->fd = fd;
	c->tenant = -1;
	c->lease = -1;
	c->model = -1;
	c->fb_model = -1;
	c->replica = c->last_replica = c->retry_next = -1;
	sl_req_init(&c->req, w->cfg->limits.max_header_bytes,
	    w->cfg->limits.max_body_bytes);
	sl_buf_init(&c->out, BASE_CAP(c));
	c->out.pool = &w->blocks;
	ev_init(&c->timer, conn_on_timer);
	c->timer.data = c;
	/* Where each try's head and body go (exchange_response.c). */
	c->sink.head = upstream_header_cb;
	c->sink.body = upstream_write_cb;
	c->sink.arg = c;
	TAILQ_INSERT_TAIL(&w->conns, c, entry);
	c->state = CS_HEAD;
	c->t_req = ev_now(w->loop);
}

/* The access log's affinity, by sl_conn.affinity. */
static const char *const aff_words[SL_AFF_MAX + 1] = {
	"-", "hit", "miss", "spill"
};

static void
conn_access_log(struct sl_conn *c, enum sl_end end, ev_tstamp now)
{
	struct sl_worker *w = c->w;
	struct sl_access_rec r;

	if (w->access_fd < 0)
		return;
	memset(&r, 0, sizeof(r));
	r.worker = w->index;
	r.peer = c->peer;
	if (c->req.url_len > 0)
		r.url = sl_req_url(&c->req, &r.url_len);
	if (c->tenant >= 0)
		r.tenant = w->cfg->tenants[c->tenant].name;
	if (c->tenant >= 0 && c->last_replica >= 0)
		r.replica = sl_pool_url(w->pools, conn_upstream_idx(c),
		    c->last_replica);
	r.method = sl_req_method(&c->req);
	r.status = c->status;
	r.bytes_out = c->bytes_out;
	r.ttfb_ms = c->t_first > 0 ? (c->t_first - c->t_start) * 1000.0 : 0.0;
	r.duration_ms = (now - c->t_start) * 1000.0;
	r.paused_ms = c->paused_total * 1000.0;
	r.queued_ms = c->queued_total * 1000.0;
	r.end = end;
	r.tries = c->tries;
	r.prompt_tokens = c->meter.prompt;
	r.completion_tokens = c->meter.completion;
	r.usage = c->meter.kind;
	r.affinity = aff_words[c->affinity >= 0 && c->affinity <= SL_AFF_MAX ?
	    c->affinity : 0];
	r.model = c->mname;
	r.model_len = c->mname_len;
	r.upstream_model = c->msent;
	r.proto = c->fr->proto;
	r.api = sl_api_names[conn_api(c)];
	sl_access_write(w->access_fd, &r);
}

/*
 * A relayed response's latencies, under its model (sluice.8): the whole
 * request; for a successful one, its time to first token (t_content) and,
 * for an event stream of two completion tokens or more (reported or
 * estimated), the time per output token after the first.
 */
static void
conn_model_latency(struct sl_conn *c, ev_tstamp now)
{
	struct sl_worker *w = c->w;
	size_t ms = conn_model_slot(c);

	sl_shm_model_observe(w->shm, w->row, ms, SL_MHIST_DURATION,
	    now - c->t_start);
	if (c->status / 100 != 2 || c->t_content == 0)
		return;
	sl_shm_model_observe(w->shm, w->row, ms, SL_MHIST_TTFT,
	    c->t_content - c->t_start);
	if (c->resp_sse && c->meter.done && c->meter.completion >= 2)
		sl_shm_model_observe(w->shm, w->row, ms, SL_MHIST_TPOT,
		    (now - c->t_content) / (double)(c->meter.completion - 1));
}

/*
 * The current request is over, one way or another: count it and log it.
 * Called exactly once per request (req_active guards).
 */
void
conn_request_end(struct sl_conn *c, enum sl_end end)
{
	struct sl_worker *w = c->w;
	ev_tstamp now;
	size_t tslot;

	if (!c->req_active)
		return;
	c->req_active = 0;
	/*
	 * The slot is held until the client has the whole response (or it
	 * is cut), not only until the upstream finished: max_streams also
	 * bounds what a tenant keeps buffered here, and the gauge says so.
	 * Freed before the log line: once the log says a request ended,
	 * its slot is free.
	 */
	conn_release(c);
	/*
	 * The loop's clock, fresh: a refusal is answered within one loop
	 * iteration. Not ev_time(): t_start and t_first are the loop's
	 * clock, which runs on the monotonic one and re-reads the real time
	 * only every half second, so under NTP slew it may be ahead of
	 * ev_time() by a few hundred microseconds and a quick refusal would
	 * last a negative time. A resync may still step it back: clamp.
	 */
	ev_now_update(w->loop);
	now = ev_now(w->loop);
	if (now < c->t_start)
		now = c->t_start;
	if (c->t_first > now)
		now = c->t_first;
	if (c->end != SL_END_NONE)
		end = c->end;
	if (c->paused)
		c->paused_total += now - c->t_pause;
	if (c->status == 0)
		c->status = 499;   /* nginx's "client closed request" */
	tslot = c->tenant >= 0 ? w->tenant_slot[c->tenant] :
	    SL_TENANT_NONE(w->shm);
	conn_usage_charge(c);   /* a client that left: what was relayed */
	/*
	 * Latencies before the request counters: whoever sees the request
	 * counted (a scrape, a test waiting on it) sees its latencies too.
	 */
	if (c->t_first > 0) {
		/* Relayed responses feed the latency histograms. */
		sl_shm_observe(w->shm, w->row, SL_HIST_TTFB, c->t_first - c->t_start);
		sl_shm_observe(w->shm, w->row, SL_HIST_DURATION, now - c->t_start);
		conn_model_latency(c, now);
	}
	sl_shm_count_request(w->shm, w->row, tslot, c->status);
	sl_shm_count_model_request(w->shm, w->row, conn_model_slot(c), c->status);
	conn_access_log(c, end, now);
	sl_meter_free(&c->meter);
	free(c->mname);
	c->mname = NULL;
	c->msent = NULL;
	conn_mrw_free(c);
	free(c->idscan);
	c->idscan = NULL;
}

void
conn_close(struct sl_conn *c, enum sl_close why)
{
	struct sl_worker *w = c->w;

	if (c->dead)
		return;
	sl_debug("conn %d: close (%s) in state %s", c->fd, sl_close_names[why],
	    conn_state_name(c->state));
	c->dead = 1;
	/*
	 * Upstream first, then the slot, then the log line: the runner never
	 * sees the next admitted stream before this one's close, and once the
	 * access log says a request ended, its slot is free.
	 */
	conn_abort_upstream(c);
	conn_release(c);
	conn_request_end(c, sl_end_of_close(why));
	ev_timer_stop(w->loop, &c->timer);
	TAILQ_REMOVE(&w->conns, c, entry);
	if (c->dirty) {
		TAILQ_REMOVE(&w->dirty, c, dirty_entry);
		c->dirty = 0;
	}
	c->depth++;
	/*
	 * Its framing goes on without it, or not: an HTTP/1.x connection
	 * closes, an HTTP/2 stream is reset (cut if the response was not
	 * whole) and its connection goes on. Not when the framing let go
	 * first (the response done, the stream closed).
	 */
	if (c->fr_ctx != NULL) {
		void *ctx = c->fr_ctx;

		c->fr_ctx = NULL;
		c->fr->reset(ctx, !c->end_out);
	}
	conn_unref(c);
}

static void
conn_on_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_conn *c = t->data;

	c->depth++;
	conn_timer_event(c);
	conn_unref(c);
}

/*
 * The runner failed after the response head went out (its transfer is
 * over): what arrived is delivered, then a terminal event says so in the
 * stream's protocol, and the response ends cut, never as complete: the
 * HTTP/1.1 connection closes without the last chunk, the HTTP/2 stream is
 * reset. why is for the client (plain text); closing is the reason the
 * connection closes for when nothing waits.
 */
static void
conn_cut(struct sl_conn *c, const char *why, enum sl_close closing)
{
	conn_usage_finish(c);
	conn_tell_failure(c, why);
	c->close_after = 1;
	c->resp_done = 1;
	c->cut = 1;
	c->cut_close = closing;
	c->chunked = 0;
	if (conn_flush(c) == -1) {
		conn_close(c, SL_CLOSE_CLIENT_GONE);
		return;
	}
	/* HTTP/2 pulls: the last pull arms the reset (sl_exchange_pull). */
	if (c->fr->http1 && c->rh_off == c->rh.len && sl_buf_len(&c->out) == 0)
		conn_close(c, closing);
	else
		conn_timer_update(c);
}

static void
conn_timer_event(struct sl_conn *c)
{
	ev_tstamp now = ev_now(c->w->loop), d = conn_deadline(c);

	if (d > now + 0.0005) {
		/* Activity moved the deadline since the timer was armed. */
		conn_timer_update(c);
		return;
	}
	if (c->t_cut > 0) {
		conn_close(c, c->cut_close);   /* HTTP/2: reset, cut */
		return;
	}
	switch (c->state) {
	case CS_HEAD:
		if (c->req.head_bytes == 0) {
			/*
			 * Not one byte of a request's head (only what comes
			 * before one): as a connection that sent nothing
			 * (h1.c), closed silently and counted apart.
			 */
			sl_shm_stat_add(c->w->shm, c->w->row,
			    SL_STAT_IDLE_CLOSED, 1);
			conn_close(c, SL_CLOSE_IDLE);
			return;
		}
		conn_error(c, SL_ERR_REQUEST_TIMEOUT, NULL, 0);
		return;
	case CS_BODY:
		conn_error(c, SL_ERR_REQUEST_TIMEOUT, "request body not received in time", 0);
		return;
	case CS_UPSTREAM:
		conn_count_uerr(c, SL_UERR_TIMEOUT);
		conn_report_try(c, SL_CODE_TIMEOUT);
		conn_error(c, SL_ERR_UPSTREAM_TIMEOUT, NULL, 0);
		return;
	case CS_STREAM:
		if (c->paused || c->xf.easy == NULL) {
			sl_info("conn %d: client stalled, stream cut", c->fd);
			conn_close(c, SL_CLOSE_STALL);
		} else {
			char why[96];

			sl_info("conn %d: upstream idle, stream cut", c->fd);
			conn_count_uerr(c, SL_UERR_IDLE);
			if (c->replica >= 0)
				sl_pool_failed(c->w->pools, conn_upstream_idx(c),
				    c->replica);
			conn_abort_upstream(c);
			snprintf(why, sizeof(why), "no byte for %.0f s "
			    "(timeouts.upstream_idle)",
			    sl_ms_to_s(c->w->cfg->timeouts.upstream_idle_ms));
			if (c->end == SL_END_NONE)
				c->end = SL_END_TIMEOUT;
			conn_cut(c, why, SL_CLOSE_UPSTREAM_IDLE);
		}
		return;
	case CS_QUEUED: {
		char msg[160];

		conn_queue_leave(c, SL_QUEUE_O_TIMEOUT);
		snprintf(msg, sizeof(msg), "no replica of upstream '%s' became "
		    "free within the queue's timeout",
		    c->w->cfg->upstreams[conn_upstream_idx(c)].name);
		conn_error(c, SL_ERR_QUEUE_TIMEOUT, msg, c->q_retry_after);
		return;
	}
	case CS_ADMIT:
	case CS_LOCAL:
		conn_close(c, SL_CLOSE_TIMEOUT);
		return;
	}
}

/*
 * A tenant of this worker's configuration that a reload removed, and
 * whose shared index went to another tenant since (its epoch moved): its
 * keys are unknown now, as they are to the workers of the new
 * configuration, and nothing of it may count under the new tenant.
 */
static int
conn_tenant_gone(const struct sl_worker *w, int tenant)
{
	size_t idx = w->tenant_slot[tenant];

	return w->index_epoch != NULL &&
	    sl_shm_epoch(w->shm, idx) != w->index_epoch[idx];
}

/*
 * Find the tenant whose key the request names: the bearer token of
 * Authorization (OpenAI's clients), or X-Api-Key (Anthropic's), the same
 * keys either way; -1 if none. Both present, they must name the same key:
 * two credentials that differ are refused rather than one of them chosen
 * (a proxy in front may have checked the other).
 */
static int
conn_find_tenant(struct sl_conn *c)
{
	const char *v, *tok = NULL, *x;
	size_t vlen, tlen = 0, xlen;

	if ((v = sl_req_header(&c->req, "authorization", &vlen)) != NULL &&
	    (tok = sl_http_bearer(v, vlen, &tlen)) == NULL)
		return -1;
	if ((x = sl_req_header(&c->req, "x-api-key", &xlen)) != NULL) {
		if (xlen == 0)
			return -1;
		if (tok != NULL && !sl_ct_equal(tok, tlen, x, xlen))
			return -1;
		tok = x;
		tlen = xlen;
	}
	if (tok == NULL)
		return -1;
	return sl_keyidx_lookup(c->w->keys, tok, tlen);
}

/*
 * 1 if the path part of a target could walk out of /v1/ once an upstream
 * normalises or decodes it: a "." or ".." segment, spelt plainly or with
 * %2e, or an encoded slash or backslash (%2f, %5c) inside a segment.
 */
static int
path_has_dot_segment(const char *p, size_t len)
{
	size_t i = 0, dots = 0, other = 0;

	for (;;) {
		int end = i == len || p[i] == '?' || p[i] == '#';

		if (end || p[i] == '/') {
			if (other == 0 && (dots == 1 || dots == 2))
				return 1;
			if (end)
				return 0;
			dots = other = 0;
			i++;
			continue;
		}
		if (p[i] == '%' && i + 2 < len) {
			char h1 = p[i + 1], h2 = (char)(p[i + 2] | 0x20);

			if ((h1 == '2' && h2 == 'f') || (h1 == '5' && h2 == 'c'))
				return 1;
			if (h1 == '2' && h2 == 'e') {
				dots++;
				i += 3;
				continue;
			}
		}
		if (p[i] == '.')
			dots++;
		else
			other++;
		i++;
	}
}

/* 429: the tenant is at max_streams (on this node, or in the cluster). */
static void
conn_refuse_full(struct sl_conn *c)
{
	struct sl_worker *w = c->w;
	const struct sl_tenant_conf *t = &w->cfg->tenants[c->tenant];
	char msg[160];

	sl_shm_stat_add(w->shm, w->row, SL_STAT_REJECTED, 1);
	sl_shm_count_rejected(w->shm, w->row, w->tenant_slot[c->tenant],
	    SL_REJECT_MAX_STREAMS);
	snprintf(msg, sizeof(msg),
	    "tenant concurrency limit reached (%d streams); retry later",
	    (int)t->max_streams);
	conn_error(c, SL_ERR_CONCURRENCY_LIMIT, msg, t->retry_after);
}

/*
 * 429: the tenant's tokens in the last 60 s reached its budget (used of
 * budget; used 0: counted by the cluster, in Redis).
 */
static void
conn_refuse_tokens(struct sl_conn *c, uint64_t used, uint64_t budget, int ra)
{
	struct sl_worker *w = c->w;
	char msg[200];

	sl_shm_stat_add(w->shm, w->row, SL_STAT_REJECTED, 1);
	sl_shm_count_rejected(w->shm, w->row, w->tenant_slot[c->tenant],
	    SL_REJECT_TOKEN_BUDGET);
	if (used > 0)
		snprintf(msg, sizeof(msg), "tenant token budget reached (%"
		    PRIu64 " of %" PRIu64 " tokens in the last 60 s); retry later",
		    used, budget);
	else
		snprintf(msg, sizeof(msg), "tenant token budget reached (%"
		    PRIu64 " tokens in the last 60 s, across the cluster); retry "
		    "later", budget);
	conn_error(c, SL_ERR_TOKEN_BUDGET, msg, ra > 0 ? ra : 1);
}

/* The cluster refused, or cannot be asked and on_redis_down is closed. */
static void
conn_on_verdict(struct sl_conn *c, enum sl_cl_verdict v, int ra)
{
	c->lease = -1;
	if (v == SL_CL_FULL) {
		conn_refuse_full(c);
		return;
	}
	if (v == SL_CL_TOKENS) {
		/* The node slot taken for it goes back (conn_error frees it). */
		conn_refuse_tokens(c, 0, (uint64_t)sl_shm_token_budget(c->w->shm,
		    c->w->tenant_slot[c->tenant]), ra);
		return;
	}
	conn_error(c, SL_ERR_CLUSTER_UNAVAILABLE, NULL,
	    c->w->cfg->tenants[c->tenant].retry_after);
}

/* The cluster's answer to a request in CS_ADMIT. */
static void
conn_on_lease(void *arg, enum sl_cl_verdict v, int ra)
{
	struct sl_conn *c = arg;

	c->admit_wait = NULL;
	if (c->dead || c->state != CS_ADMIT)
		return;   /* cannot happen: closing cancels the wait */
	c->depth++;
	conn_set_state(c, CS_HEAD);   /* the head path continues from here */
	if (v == SL_CL_ADMIT)
		conn_admitted(c);
	else
		conn_on_verdict(c, v, ra);
	/*
	 * A request read whole while it waited goes on now; bytes its client
	 * sent meanwhile come from the framing (input(), above).
	 */
	conn_process(c, NULL, 0);
	conn_unref(c);
}

/* The head is parsed: route, authenticate, admit. */
static void
conn_on_head(struct sl_conn *c)
{
	struct sl_worker *w = c->w;
	const char *url;
	size_t ulen;
	int tenant;
	int32_t tpm;

	c->req_active = 1;
	c->t_start = ev_now(w->loop);
	url = sl_req_url(&c->req, &ulen);
	c->api = sl_api_of(url, ulen, NULL);
	c->t_content = 0;
	c->resp_sse = 0;
	c->model = -1;
	if (c->req.method == HTTP_TRACE) {
		/*
		 * A runner that echoes TRACE would hand the client the head
		 * sluice sends upstream: the api_key in Authorization.
		 */
		conn_error(c, SL_ERR_METHOD_NOT_ALLOWED, NULL, 0);
		return;
	}
	url = sl_req_url(&c->req, &ulen);
	if (ulen < 4 || strncmp(url, "/v1/", 4) != 0) {
		conn_error(c, SL_ERR_NOT_FOUND, NULL, 0);
		return;
	}
	if (path_has_dot_segment(url, ulen)) {
		conn_error(c, SL_ERR_BAD_REQUEST,
		    "dot segments are not allowed in the path", 0);
		return;
	}
	if ((tenant = conn_find_tenant(c)) < 0) {
		conn_error(c, SL_ERR_INVALID_API_KEY, NULL, 0);
		return;
	}
	if (conn_tenant_gone(w, tenant)) {
		conn_error(c, SL_ERR_INVALID_API_KEY, NULL, 0);
		return;
	}
	c->tenant = tenant;
	if (sl_shm_limit(w->shm, w->tenant_slot[tenant]) == 0) {
		/*
		 * Not "full, retry later": the operator switched it off. The
		 * limit the master published, not this worker's copy: a retired
		 * worker finishing a head that spans a reload says 403 too.
		 */
		conn_error(c, SL_ERR_TENANT_DISABLED, NULL, 0);
		return;
	}
	if (conn_models_list(c))
		return;   /* answered from the config: no slot, no budget */
	/*
	 * The budget the master published last, not this worker's copy: a
	 * retired worker still admitting a request whose head was in flight
	 * at a reload applies the new one, as it does the new max_streams.
	 */
	tpm = sl_shm_token_budget(w->shm, w->tenant_slot[tenant]);
	if (tpm > 0) {
		int ra;
		int64_t budget = w->cluster != NULL ?
		    sl_cluster_token_budget(w->cluster, tenant) : tpm;
		uint64_t used = budget <= 0 ? 0 : sl_shm_tokens_window(w->shm,
		    w->tenant_slot[tenant], sl_mono_sec(), (uint64_t)budget, &ra);

		/* budget -1: the cluster's window, checked with the lease. */
		if (budget > 0 && used >= (uint64_t)budget) {
			conn_refuse_tokens(c, used, (uint64_t)budget, ra);
			return;
		}
		/*
		 * Redis refused this tenant's window a moment ago: refuse
		 * here, before a node slot is taken (a burst would otherwise
		 * fill the slots with requests waiting on Redis, and the rest
		 * would hear "concurrency limit" for a budget refusal).
		 */
		if (budget == -1 &&
		    sl_cluster_tokens_full(w->cluster, tenant, &ra)) {
			conn_refuse_tokens(c, 0, (uint64_t)tpm, ra);
			return;
		}
	}
	if (sl_shm_try_acquire(w->shm, w->row, w->tenant_slot[tenant]) !=
	    SL_ADMIT_OK) {
		conn_refuse_full(c);
		return;
	}
	if (conn_tenant_gone(w, tenant)) {
		/* Reused between the look above and the slot: not ours. */
		sl_shm_release(w->shm, w->row, w->tenant_slot[tenant]);
		c->tenant = -1;
		conn_error(c, SL_ERR_INVALID_API_KEY, NULL, 0);
		return;
	}
	c->slot_held = 1;
	if (w->cluster != NULL) {
		/* The node's slot is the local cap; the lease the cluster's. */
		enum sl_cl_verdict v = sl_cluster_acquire(w->cluster, tenant,
		    conn_on_lease, c, &c->lease, &c->admit_wait);

		if (v == SL_CL_PENDING) {
			conn_set_state(c, CS_ADMIT);
			return;
		}
		if (v != SL_CL_ADMIT) {
			conn_on_verdict(c, v, 0);
			return;
		}
	}
	conn_admitted(c);
}

/* Admitted (node slot, and the cluster lease if there is a cluster). */
static void
conn_admitted(struct sl_conn *c)
{
	struct sl_worker *w = c->w;

	sl_shm_stat_add(w->shm, w->row, SL_STAT_ADMITTED, 1);
	if (c->req.too_large) {
		/*
		 * Known from Content-Length alone. Decided after the key and
		 * admission, so the answer is counted under the tenant; the
		 * body is not read (the connection closes after the answer).
		 */
		conn_error(c, SL_ERR_REQUEST_TOO_LARGE, NULL, 0);
		return;
	}
	/* RFC 9110 15.2: no 1xx to an HTTP/1.0 client. */
	if (c->req.has_body && c->req.http_minor >= 1) {
		const char *e;
		size_t elen;

		/*
		 * Admitted: a client waiting for 100-continue may send its body
		 * now. (Refused requests get their final status instead.)
		 */
		e = sl_req_header(&c->req, "expect", &elen);
		if (e != NULL && elen == 12 && strncasecmp(e, "100-continue", 12) == 0)
			if (c->fr->interim != NULL)
				c->fr->interim(c->fr_ctx,
				    "HTTP/1.1 100 Continue\r\n\r\n", 25);
	}
	sl_req_continue(&c->req);
	c->t_body = ev_now(c->w->loop);
	conn_set_state(c, CS_BODY);
}

static void
conn_req_error(struct sl_conn *c)
{
	conn_error(c, sl_err_of_parse(c->req.status),
	    c->req.reason ? c->req.reason : "bad request", 0);
}

/*
 * Request bytes to the parser, and what it finds acted on, while the
 * exchange takes input (reading a head or a body, or discarding the body
 * of a request answered here). Returns how many of the n bytes it took.
 */
size_t
conn_process(struct sl_conn *c, const char *p, size_t len)
{
	size_t n, took = 0;

	if (len > 0 && c->state == CS_BODY)
		c->t_req = ev_now(c->w->loop);   /* body: idle, not total */
	for (;;) {
		if (c->dead)
			return took;
		if (c->state != CS_HEAD && c->state != CS_BODY &&
		    !(c->state == CS_LOCAL && c->req.state != SL_REQ_DONE &&
		    c->req.state != SL_REQ_ERROR))
			return took;
		n = took < len ? sl_req_feed(&c->req, p + took, len - took) : 0;
		took += n;
		switch (c->req.state) {
		case SL_REQ_ERROR:
			if (c->state == CS_LOCAL) {
				/* Discarding a refused body failed: just close. */
				c->close_after = 1;
				conn_after_write(c);
				return took;
			}
			conn_req_error(c);
			return took;
		case SL_REQ_HEAD_DONE:
			if (c->state == CS_HEAD)
				conn_on_head(c);
			continue;
		case SL_REQ_DONE:
			if (c->state == CS_BODY) {
				struct sl_verdict v = { 0 };

				conn_start_upstream(c, &v);
				conn_answer(c, &v);
				return took;
			}
			if (c->state == CS_LOCAL) {
				conn_after_write(c);
				return took;
			}
			return took;
		default:
			if (n == 0)
				return took;   /* need more bytes */
			continue;
		}
	}
}

/* ---- the response to the framing, and its end ---------------------------- */

/*
 * Hand what waits to the framing. Returns 0, or -1 when the client is
 * gone. Safe inside libcurl callbacks: it never calls libcurl.
 */
int
conn_flush(struct sl_conn *c)
{
	int regain = 0;

	if (c->fr_ctx == NULL) {
		c->client_gone = 1;
		return -1;
	}
	/*
	 * The whole response is here and this write may finish it: free the
	 * slot before the bytes go, not after. A client that reads its last
	 * byte and sends its next request at once must find its slot free,
	 * even on another worker and even if this one is preempted right
	 * after the write. If the client does not take it all, the slot is
	 * taken back below (the bytes left still count).
	 */
	if (c->resp_done && c->slot_held && c->fr->http1) {
		conn_release(c);
		regain = 1;
	}
	/*
	 * Time to first token: the first relayed body bytes handed to the
	 * client, or for an event stream sluice scans, the first bytes once
	 * an event carried content (sl_usage.h: the bytes the estimate
	 * counts). Once per request: a compare per flush.
	 */
	if (c->t_content == 0 && c->t_first > 0 && sl_buf_len(&c->out) > 0 &&
	    (c->meter.scan == NULL || !c->resp_sse || c->meter.scan->content_bytes > 0))
		c->t_content = ev_now(c->w->loop);
	conn_queue_charge_running(c);
	if (c->fr->send(c->fr_ctx) == -1) {
		c->client_gone = 1;
		return -1;
	}
	if (!c->fr->http1)
		return 0;   /* pulled: sl_exchange_pull keeps the buffer */
	/*
	 * Retaken unless another worker took the slot in the meantime; then
	 * these bytes wait without one (at most a stream buffer, for as long
	 * as timeouts.client_stall).
	 */
	if (regain && sl_exchange_waiting(c) &&
	    sl_shm_try_acquire(c->w->shm, c->w->row,
	    c->w->tenant_slot[c->tenant]) == SL_ADMIT_OK)
		c->slot_held = 1;
	/*
	 * Nothing kept that waits for nothing: a slow stream holds no
	 * buffer between its events (the block goes back to the pool), and
	 * a head once written is not kept either.
	 */
	sl_buf_release(&c->out);
	if (sl_buf_len(&c->out) == 0)
		c->out.cap = BASE_CAP(c);
	if (c->rh.p != NULL && c->rh_off == c->rh.len) {
		sl_head_free(&c->rh);
		c->rh_off = 0;
	}
	return 0;
}

/*
 * The response is written and the request read: it ends here, and the
 * framing carries on (the next request, a linger, or its close).
 */
static void
conn_response_done(struct sl_conn *c)
{
	struct sl_worker *w = c->w;
	const struct sl_framing *fr = c->fr;
	void *ctx = c->fr_ctx;
	int close, linger;

	conn_request_end(c, c->state == CS_LOCAL ? SL_END_REJECTED :
	    SL_END_DONE);
	close = c->close_after || w->draining || w->cfg->timeouts.keepalive_ms == 0;
	linger = close && c->state == CS_LOCAL && c->req.state != SL_REQ_DONE;
	c->depth++;
	c->fr_ctx = NULL;   /* let go first: closing resets nothing */
	conn_close(c, SL_CLOSE_DONE);
	fr->done(ctx, close, linger);
	conn_unref(c);
}

/* After a flush: finish the response if everything is out. */
void
conn_after_write(struct sl_conn *c)
{
	if (c->dead || c->fr->done == NULL)
		return;   /* a stream ends when its framing closes it */
	if (sl_exchange_waiting(c) || !c->resp_done)
		return;
	if (c->state == CS_LOCAL && c->req.state != SL_REQ_DONE &&
	    !c->close_after)
		return;   /* still discarding the refused request's body */
	conn_response_done(c);
}

void
sl_conn_flush_dirty_hook(void *arg)
{
	sl_conn_flush_dirty(arg);
}

void
sl_conn_flush_dirty(struct sl_worker *w)
{
	struct sl_conn *c;

	while ((c = TAILQ_FIRST(&w->dirty)) != NULL) {
		TAILQ_REMOVE(&w->dirty, c, dirty_entry);
		c->dirty = 0;
		c->depth++;
		if (conn_flush(c) == -1)
			conn_close(c, SL_CLOSE_CLIENT_GONE);
		else {
			conn_maybe_resume(c);
			conn_after_write(c);
		}
		conn_unref(c);
	}
}

/* ---- a try's end, a queue's grant -------------------------------------- */

void
sl_conn_upstream_done(void *arg, struct sl_shard *sh, CURL *easy,
    CURLcode result)
{
	struct sl_worker *w = arg;
	struct sl_conn *c = NULL;

	curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&c);
	if (c == NULL || c->xf.easy != easy) {
		sl_transfers_discard(w->xfers, sh, easy);
		return;
	}
	c->depth++;
	if (c->retry_next >= 0 && !c->client_gone) {
		/* A busy head: on to the replica chosen in the header callback. */
		struct sl_verdict v = { 0 };

		conn_busy_next(c, &v);
		conn_answer(c, &v);
		goto out;
	}
	if (!c->client_gone && c->xf.no_fds) {
		/* Our descriptors ran out, not the upstream: not its error. */
		sl_warn("upstream %.*s: out of file descriptors",
		    (int)strcspn(c->xf.url, "?#"), c->xf.url);
		conn_abort_upstream(c);
		conn_error(c, SL_ERR_OVERLOADED,
		    "the gateway is out of file descriptors; retry later", 1);
		goto out;
	}
	if (!c->client_gone && (result != CURLE_OK || c->upstream_bad)) {
		enum sl_uerr kind = SL_UERR_RESET;

		/* The query string may carry secrets: log the path only. */
		sl_warn("upstream %.*s: %s", (int)strcspn(c->xf.url, "?#"), c->xf.url,
		    c->upstream_bad ? "malformed response head" :
		    c->xf.resend_refused ? "connection closed after the request "
		    "was sent, without a response (not sent again)" :
		    curl_easy_strerror(result));
		if (c->upstream_bad || result == CURLE_WEIRD_SERVER_REPLY ||
		    result == CURLE_UNSUPPORTED_PROTOCOL)
			kind = SL_UERR_BAD_RESPONSE;
		else if (result == CURLE_COULDNT_CONNECT ||
		    result == CURLE_COULDNT_RESOLVE_HOST ||
		    result == CURLE_OPERATION_TIMEDOUT ||
		    result == CURLE_SSL_CONNECT_ERROR)
			kind = SL_UERR_CONNECT;
		conn_count_uerr(c, kind);
		if (c->head_sent) {
			/* Cut mid-stream: the replica failed all the same. */
			sl_pool_failed(c->w->pools, conn_upstream_idx(c),
			    c->replica);
		} else {
			struct sl_verdict v = { 0 };

			if (conn_retry(c, kind, result, &v) == 0) {
				conn_answer(c, &v);
				goto out;
			}
		}
		c->end = SL_END_UPSTREAM_ERROR;
	} else if (!c->client_gone && !c->head_sent) {
		/* Done without a final head: only 1xx, or nothing usable. */
		conn_report_try(c, SL_CODE_RESET);
	}
	conn_abort_upstream(c);    /* removes and frees the handle */
	if (c->client_gone) {
		conn_close(c, SL_CLOSE_CLIENT_GONE);
		goto out;
	}
	if (result != CURLE_OK || c->upstream_bad) {
		if (!c->head_sent || c->state == CS_UPSTREAM) {
			conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE, c->upstream_bad ?
			    "upstream sent a malformed response" :
			    "upstream unreachable or failed", 0);
			goto out;
		}
		sl_info("conn %d: upstream cut the stream: %s", c->fd,
		    curl_easy_strerror(result));
		conn_cut(c, c->upstream_bad ? "malformed response" :
		    result == CURLE_PARTIAL_FILE ? "connection closed before "
		    "the response ended" : result == CURLE_RECV_ERROR ?
		    "connection reset" : curl_easy_strerror(result),
		    SL_CLOSE_UPSTREAM_ERROR);
		goto out;
	}
	if (!c->head_sent) {
		/* Done without a final head: only 1xx, or nothing usable. */
		conn_count_uerr(c, SL_UERR_BAD_RESPONSE);
		c->end = SL_END_UPSTREAM_ERROR;
		conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE,
		    "upstream sent no final response", 0);
		goto out;
	}
	if (c->state == CS_UPSTREAM)
		conn_set_state(c, CS_STREAM);
	conn_usage_finish(c);   /* tokens charged before the last byte goes */
	if (c->chunked && sl_buf_append(&c->out, "0\r\n\r\n", 5) == -1) {
		/* CHUNK_FRAMING slack guarantees room; this is a bug. */
		sl_err("conn %d: no room for the last chunk", c->fd);
		conn_close(c, SL_CLOSE_BUG);
		goto out;
	}
	c->resp_done = 1;
	if (conn_flush(c) == -1) {
		conn_close(c, SL_CLOSE_CLIENT_GONE);
		goto out;
	}
	conn_timer_update(c);
	conn_after_write(c);
out:
	conn_unref(c);
}


void
sl_conn_queue_event(struct sl_worker *w)
{
	struct sl_queue_grant g[32];
	size_t n, i;

	if (w->queue == NULL)
		return;
	do {
		n = sl_queue_collect(w->queue, w->row, g, 32, sl_mono_ms());
		for (i = 0; i < n; i++) {
			struct sl_verdict v = { 0 };
			struct sl_conn *c;

			if ((c = conn_queue_grant(w, &g[i], &v)) != NULL) {
				c->depth++;
				conn_answer(c, &v);
				conn_unref(c);
			}
		}
	} while (n == 32);
	sl_conn_flush_dirty(w);
}

/* ---- the worker's --------------------------------------------------------- */

void
sl_conn_gauges(struct sl_worker *w)
{
	struct sl_conn *c;
	uint64_t paused = 0, buffered = 0, streams = 0;

	TAILQ_FOREACH(c, &w->conns, entry) {
		paused += c->paused ? 1 : 0;
		buffered += sl_buf_len(&c->out) + (c->rh.len - c->rh_off);
		streams += c->xf.easy != NULL ? 1 : 0;
	}
	sl_shm_stat_set(w->shm, w->row, SL_STAT_PAUSED_STREAMS, paused);
	sl_shm_stat_set(w->shm, w->row, SL_STAT_BUFFERED_BYTES, buffered);
	sl_shm_stat_set(w->shm, w->row, SL_STAT_STREAMS, streams);
	sl_shm_stat_set(w->shm, w->row, SL_STAT_CONNECTIONS, w->nconns);
}

void
sl_conn_close_all(struct sl_worker *w)
{
	struct sl_conn *c;

	while ((c = TAILQ_FIRST(&w->conns)) != NULL)
		conn_close(c, SL_CLOSE_DRAINED);
	/* The response path's scratch goes with the last exchange. */
	free(w->mrw_buf.p);
	memset(&w->mrw_buf, 0, sizeof(w->mrw_buf));
	free(w->scan_buf);
	w->scan_buf = NULL;
	w->scan_buf_cap = 0;
}

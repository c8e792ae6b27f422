/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The exchange's ground floor: what every other room of it uses and that
 * uses none of them. Its state and the deadline each state has, the
 * tenant slot given back, the flush queue, a request's counters' slots,
 * and the free at the last reference.
 */
#include "config.h"

#include <stdlib.h>

#include "sl_log.h"
#include "sl_util.h"
#include "exchange_int.h"

static const char *const state_names[] = {
	"head", "admit", "body", "upstream", "stream", "local", "queued"
};

const char *
conn_state_name(enum conn_state s)
{
	return (unsigned)s < sizeof(state_names) / sizeof(state_names[0]) ?
	    state_names[s] : "?";
}

void
conn_set_state(struct sl_conn *c, enum conn_state s)
{
	sl_debug("conn %d: %s -> %s", c->fd, state_names[c->state], state_names[s]);
	c->state = s;
	conn_timer_update(c);
	/*
	 * An exchange that can take input again (admitted after a wait, say)
	 * goes on with what its client already sent: no socket will say so.
	 */
	if ((s == CS_HEAD || s == CS_BODY || s == CS_LOCAL) && c->fr_ctx != NULL &&
	    c->fr->input != NULL)
		c->fr->input(c->fr_ctx);
}

/* Give the tenant slot back; safe to call on every path, acts once. */
void
conn_release(struct sl_conn *c)
{
	if (c->slot_held) {
		sl_shm_release(c->w->shm, c->w->row,
		    c->w->tenant_slot[c->tenant]);
		c->slot_held = 0;
	}
	/*
	 * The cluster lease goes with the slot, not with a retaken slot
	 * (conn_flush): a stream whose response is complete holds none.
	 */
	if (c->admit_wait != NULL) {
		sl_cluster_cancel(c->w->cluster, c->admit_wait);
		c->admit_wait = NULL;
		c->lease = -1;
	}
	if (c->lease >= 0) {
		sl_cluster_release(c->w->cluster, c->lease);
		c->lease = -1;
	}
}

/* Earliest deadline that applies in the current state, or 0 for none. */
ev_tstamp
conn_deadline(struct sl_conn *c)
{
	const struct sl_config *cfg = c->w->cfg;
	int waiting = c->rh_off < c->rh.len || sl_buf_len(&c->out) > 0;

	if (c->t_cut > 0)
		return c->t_cut + SL_CUT_GRACE;
	switch (c->state) {
	case CS_HEAD:
		return c->t_req + sl_ms_to_s(cfg->timeouts.client_header_ms);
	case CS_BODY: {
		/* A pause between reads, and the whole body, are both bounded. */
		ev_tstamp idle = c->t_req + sl_ms_to_s(cfg->timeouts.client_header_ms);
		ev_tstamp total = c->t_body + sl_ms_to_s(cfg->timeouts.client_body_ms);

		return idle < total ? idle : total;
	}
	case CS_ADMIT:
		return 0;   /* the cluster decides within cluster.timeout */
	case CS_UPSTREAM:
		return c->t_upstream + sl_ms_to_s(cfg->timeouts.upstream_first_byte_ms);
	case CS_STREAM:
		if (c->paused || (c->xf.easy == NULL && waiting))
			return c->t_client + sl_ms_to_s(cfg->timeouts.client_stall_ms);
		if (c->xf.easy != NULL)
			return c->t_upstream + sl_ms_to_s(cfg->timeouts.upstream_idle_ms);
		return 0;
	case CS_LOCAL:
		if (waiting)
			return c->t_client + sl_ms_to_s(cfg->timeouts.client_stall_ms);
		return c->t_req + sl_ms_to_s(cfg->timeouts.client_header_ms);
	case CS_QUEUED:
		/* The pool's timeout now: a reload's applies to waiters. */
		return c->t_queued +
		    sl_ms_to_s((uint64_t)sl_queue_timeout_ms(c->w->queue, c->qpool));
	}
	return 0;
}

void
conn_timer_update(struct sl_conn *c)
{
	ev_tstamp d = conn_deadline(c), now = ev_now(c->w->loop);

	ev_timer_stop(c->w->loop, &c->timer);
	if (d <= 0)
		return;
	ev_timer_set(&c->timer, d > now ? d - now : 0.0, 0.0);
	ev_timer_start(c->w->loop, &c->timer);
}

/* The shared model slot the request counts under: 0 ("-") when none. */
size_t
conn_model_slot(const struct sl_conn *c)
{
	return c->model >= 0 && c->w->model_slot != NULL ?
	    c->w->model_slot[c->model] : 0;
}

void
conn_count_uerr(struct sl_conn *c, enum sl_uerr kind)
{
	if (c->tenant < 0)
		return;
	sl_shm_count_uerr(c->w->shm, c->w->row,
	    c->w->upstream_slot[conn_upstream_idx(c)], kind);
}

/*
 * Leave an entry point. The exchange is freed here, never in the middle
 * of a call chain that may still look at it.
 */
void
conn_unref(struct sl_conn *c)
{
	if (--c->depth > 0 || !c->dead)
		return;
	sl_req_free(&c->req);
	free(c->mname);
	free(c->mlit);
	free(c->idscan);
	sl_buf_free(&c->out);
	sl_meter_free(&c->meter);
	sl_head_free(&c->rh);
	sl_resp_head_free(&c->uh);
	free(c);
}

/*
 * Queue the exchange for a flush once libcurl returns from the socket
 * event that fed it (sl_conn_flush_dirty; the ev_prepare catches the rest).
 * What libcurl hands over in one socket event (head, chunks, the last
 * chunk) leaves in one writev instead of one each. Safe inside libcurl
 * callbacks.
 */
void
conn_mark_dirty(struct sl_conn *c)
{
	if (!c->dirty) {
		TAILQ_INSERT_TAIL(&c->w->dirty, c, dirty_entry);
		c->dirty = 1;
	}
}

/* Bytes wait to be written (sl_exchange.h). */
int
sl_exchange_waiting(const struct sl_conn *c)
{
	return c->rh_off < c->rh.len || sl_buf_len(&c->out) > 0;
}

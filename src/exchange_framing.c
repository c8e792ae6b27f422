/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The exchange's side of its framing (sl_exchange.h): opened by an
 * HTTP/1.x connection at a request's first byte or by an HTTP/2 stream,
 * fed request bytes, and holding the response for the framing to take:
 * written at once where the framing writes (peek and drain: one writev of
 * head and body, no copy), pulled as the window allows where it pulls.
 * The response over, the framing carries on (the next request, or its
 * close) and the exchange ends.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_exchange.h"
#include "sl_log.h"
#include "sl_usage.h"
#include "exchange_int.h"

struct sl_conn *
sl_exchange_open(struct sl_worker *w, const struct sl_framing *fr, void *ctx,
    int fd, const char *peer, ev_tstamp t_ready, ev_tstamp t_rx)
{
	struct sl_conn *c;

	if ((c = calloc(1, sizeof(*c))) == NULL)
		return NULL;
	c->fr = fr;
	c->fr_ctx = ctx;
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	conn_init(c, w, fd);
	c->t_req = t_ready;
	c->t_rx = t_rx;
	conn_timer_update(c);
	return c;
}

size_t
sl_exchange_feed(struct sl_conn *c, const char *p, size_t n)
{
	if (c->dead)
		return 0;
	return conn_process(c, p, n);
}

void
sl_exchange_hold(struct sl_conn *c)
{
	c->depth++;
}

void
sl_exchange_unhold(struct sl_conn *c)
{
	conn_unref(c);
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

/* ---- output ------------------------------------------------------------ */

int
sl_exchange_peek(const struct sl_conn *c, struct iovec iov[3])
{
	int cnt = 0;

	if (c->rh_off < c->rh.len) {
		iov[cnt].iov_base = c->rh.p + c->rh_off;
		iov[cnt].iov_len = c->rh.len - c->rh_off;
		cnt++;
	}
	return cnt + sl_buf_iov(&c->out, &iov[cnt]);
}

int
sl_exchange_waiting(const struct sl_conn *c)
{
	return c->rh_off < c->rh.len || sl_buf_len(&c->out) > 0;
}

void
sl_exchange_drain(struct sl_conn *c, size_t n)
{
	size_t k = c->rh.len - c->rh_off;

	c->t_client = ev_now(c->w->loop);
	c->bytes_out += (uint64_t)n;
	sl_shm_stat_add(c->w->shm, c->w->row, SL_STAT_BYTES_OUT, (uint64_t)n);
	if (n <= k) {
		c->rh_off += n;
	} else {
		c->rh_off = c->rh.len;
		sl_buf_consume(&c->out, n - k);
	}
}

int
sl_exchange_head(const struct sl_conn *c, const char **head, size_t *len,
    int *body)
{
	if (c->rh_off >= c->rh.len)
		return 0;
	*head = c->rh.p + c->rh_off;
	*len = c->rh.len - c->rh_off;
	*body = !(c->resp_done && sl_buf_len(&c->out) == 0);
	return 1;
}

void
sl_exchange_head_sent(struct sl_conn *c)
{
	c->end_out = c->resp_done && sl_buf_len(&c->out) == 0;
	c->bytes_out += c->rh.len - c->rh_off;
	sl_head_free(&c->rh);
	c->rh_off = 0;
	c->t_client = ev_now(c->w->loop);
}

size_t
sl_exchange_pull(struct sl_conn *c, uint8_t *buf, size_t len, int *eof)
{
	struct iovec iov[2];
	size_t n = 0;

	*eof = 0;
	while (n < len && sl_buf_len(&c->out) > 0) {
		size_t took = 0, m;
		int k = sl_buf_iov(&c->out, iov), i;

		for (i = 0; i < k && n + took < len; i++) {
			m = iov[i].iov_len;
			if (m > len - n - took)
				m = len - n - took;
			memcpy(buf + n + took, iov[i].iov_base, m);
			took += m;
		}
		sl_buf_consume(&c->out, took);
		n += took;
	}
	if (n > 0) {
		c->t_client = ev_now(c->w->loop);
		c->bytes_out += (uint64_t)n;
		sl_shm_stat_add(c->w->shm, c->w->row, SL_STAT_BYTES_OUT,
		    (uint64_t)n);
		/* Room made: a paused upstream may go on (after this send). */
		conn_mark_dirty(c);
	}
	if (sl_buf_len(&c->out) == 0) {
		sl_buf_release(&c->out);
		c->out.cap = BASE_CAP(c);
		if (c->resp_done) {
			*eof = 1;
			c->end_out = 1;
		}
	}
	return n;
}

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
sl_exchange_writable(struct sl_conn *c)
{
	if (c->dead)
		return;
	if (conn_flush(c) == -1) {
		conn_close(c, SL_CLOSE_CLIENT_GONE);
		return;
	}
	conn_maybe_resume(c);
	conn_after_write(c);
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

void
sl_exchange_closed(struct sl_conn *c, int done)
{
	c->depth++;
	c->fr_ctx = NULL;
	if (done) {
		conn_request_end(c, c->state == CS_LOCAL ? SL_END_REJECTED :
		    SL_END_DONE);
		conn_close(c, SL_CLOSE_DONE);
	} else {
		c->client_gone = 1;
		conn_close(c, SL_CLOSE_CLIENT_GONE);
	}
	conn_unref(c);
}

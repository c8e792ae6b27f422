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
		if (c->resp_done && c->cut) {
			/*
			 * Cut: never an end a client takes for complete. The
			 * reset waits a moment: curl and Node discard the data
			 * of a stream whose RST_STREAM they read with it.
			 */
			if (c->t_cut == 0) {
				c->t_cut = ev_now(c->w->loop);
				conn_timer_update(c);
			}
		} else if (c->resp_done) {
			*eof = 1;
			c->end_out = 1;
		}
	}
	return n;
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

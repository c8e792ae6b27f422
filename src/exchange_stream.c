/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The exchange of an HTTP/2 stream (sl_exchange.h): no socket of its own.
 * Request bytes arrive in xin and are fed as a socket's reads would be,
 * the client's window given back as they are taken; the response leaves
 * through the framing's function table, its body pulled from the stream
 * buffer as the window allows.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_exchange.h"
#include "sl_log.h"
#include "exchange_int.h"

/*
 * A stream's flush: the head, once, to the framing, which pulls the body
 * as the client's window allows (sl_exchange_pull); later, a word that
 * more waits. -1 when the stream is gone.
 */
int
conn_x_flush(struct sl_conn *c)
{
	int body;

	if (c->fr_ctx == NULL) {
		c->client_gone = 1;
		return -1;
	}
	if (!c->x_responded) {
		if (c->rh.len == 0)
			return 0;   /* no head yet */
		body = !(c->resp_done && sl_buf_len(&c->out) == 0);
		if (c->fr->respond(c->fr_ctx, c->rh.p, c->rh.len, body) == -1) {
			c->client_gone = 1;
			return -1;
		}
		c->x_responded = 1;
		c->x_eof = !body;
		c->bytes_out += c->rh.len;
		sl_head_free(&c->rh);
		c->rh_off = 0;
		c->t_client = ev_now(c->w->loop);
		return 0;
	}
	if (sl_buf_len(&c->out) > 0 || c->resp_done)
		c->fr->resume(c->fr_ctx);
	return 0;
}

/*
 * A stream's request bytes into the input buffer, as a socket's reads
 * would put them, while the exchange takes them; then the client's window
 * opens again for what was taken (all of it once little waits).
 */
void
conn_x_drain(struct sl_conn *c)
{
	size_t k, space;

	while (!c->dead && c->reading && c->xin_off < c->xin_len &&
	    (c->state == CS_HEAD || c->state == CS_BODY || c->state == CS_LOCAL)) {
		if (c->in == NULL && (c->in = sl_block_get(&c->w->blocks)) == NULL) {
			sl_err("conn %d: out of memory for its input", c->fd);
			conn_close(c, SL_CLOSE_CLIENT_GONE);
			return;
		}
		space = CONN_IN_SIZE - c->in_len;
		if (space == 0)
			break;
		k = c->xin_len - c->xin_off;
		if (k > space)
			k = space;
		memcpy(c->in + c->in_len, c->xin + c->xin_off, k);
		c->in_len += k;
		c->xin_off += k;
		if (c->state == CS_BODY)
			c->t_req = ev_now(c->w->loop);   /* body: idle, not total */
		conn_process(c);
	}
	if (c->dead)
		return;
	if (c->xin_off == c->xin_len)
		c->xin_off = c->xin_len = 0;
	if (c->xin_raw > 0 && c->fr_ctx != NULL &&
	    c->xin_len - c->xin_off < XIN_LOW) {
		c->fr->consume(c->fr_ctx, c->xin_raw);
		c->xin_raw = 0;
	}
}

struct sl_conn *
sl_exchange_open(struct sl_worker *w, const struct sl_framing *fr, void *ctx,
    int fd, const char *peer)
{
	struct sl_conn *c;

	if ((c = calloc(1, sizeof(*c))) == NULL)
		return NULL;
	c->fr = fr;
	c->fr_ctx = ctx;
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	conn_init(c, w, fd);
	c->reading = 1;
	conn_timer_update(c);
	return c;
}

int
sl_exchange_input(struct sl_conn *c, const void *p, size_t n, size_t raw)
{
	size_t keep = c->xin_len - c->xin_off;
	/* A head, about two windows and their chunk framing, with room. */
	size_t max = c->w->cfg->limits.max_header_bytes + 4 * XIN_LOW;

	if (c->dead)
		return -1;
	if (keep + n > max) {
		sl_err("conn %d: stream sent past its window", c->fd);
		return -1;
	}
	if (c->xin_off > 0 && c->xin_len + n > c->xin_cap) {
		memmove(c->xin, c->xin + c->xin_off, keep);
		c->xin_off = 0;
		c->xin_len = keep;
	}
	if (sl_bytes_reserve(&c->xin, &c->xin_cap, c->xin_len + n, 1024) == -1)
		return -1;
	memcpy(c->xin + c->xin_len, p, n);
	c->xin_len += n;
	c->xin_raw += raw;
	if (c->reading)
		ev_feed_event(c->w->loop, &c->rio, EV_READ);
	return 0;
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
			c->x_eof = 1;
		}
	}
	return n;
}

size_t
sl_exchange_closed(struct sl_conn *c, int done)
{
	size_t held = c->xin_raw;

	c->depth++;
	c->fr_ctx = NULL;
	c->xin_raw = 0;
	if (done) {
		conn_request_end(c, c->state == CS_LOCAL ? SL_END_REJECTED :
		    SL_END_DONE);
		conn_close(c, SL_CLOSE_DONE);
	} else {
		c->client_gone = 1;
		conn_close(c, SL_CLOSE_CLIENT_GONE);
	}
	conn_unref(c);
	return held;
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The HTTP/1.x connection an exchange rides on: accept and the socket's
 * options, the TLS handshake and ALPN's hand-over to HTTP/2, reads into
 * the input block (pipelined bytes wait in the kernel), writev of the
 * response head and the stream buffer, keep-alive and the next request,
 * linger after a refusal, idle connections reaped at max_connections,
 * and the worker's flush of what libcurl's callbacks queued.
 */
#include "config.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sl_log.h"
#include "sl_net.h"
#include "sl_relay.h"
#include "sl_usage.h"
#include "exchange_int.h"

static void conn_read_event(struct sl_conn *c);
static void conn_write_event(struct sl_conn *c);

/*
 * Reading stopped with input still unread: a FIN behind it would never be
 * read, so ask the kernel for EPOLLRDHUP instead (libev cannot).
 */
static void
conn_hup_watch(struct sl_conn *c)
{
	struct epoll_event ev;

	if (c->hup_watched || c->w->hup_fd < 0)
		return;
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLRDHUP;
	ev.data.ptr = c;
	if (epoll_ctl(c->w->hup_fd, EPOLL_CTL_ADD, c->fd, &ev) == 0)
		c->hup_watched = 1;
}

void
conn_hup_unwatch(struct sl_conn *c)
{
	if (c->hup_watched) {
		epoll_ctl(c->w->hup_fd, EPOLL_CTL_DEL, c->fd, NULL);
		c->hup_watched = 0;
	}
}

/*
 * Plaintext OpenSSL already holds (the rest of a record longer than the
 * input buffer took) does not make the socket readable again: feed the
 * read watcher once more. Only while it is started: stopping it (or the
 * close) clears the fed event, so it never outlives the connection.
 */
static void
conn_tls_feed(struct sl_conn *c)
{
	if (c->ssl != NULL && c->reading && !c->tls_hs && !c->dead &&
	    sl_tls_pending(c->ssl))
		ev_feed_event(c->w->loop, &c->rio, EV_READ);
}

void
conn_read_start(struct sl_conn *c)
{
	if (c->fr != NULL) {
		/* A stream: what waits in xin is fed from its own event. */
		c->reading = 1;
		if (c->xin_off < c->xin_len && !c->dead)
			ev_feed_event(c->w->loop, &c->rio, EV_READ);
		return;
	}
	conn_hup_unwatch(c);
	if (!c->reading) {
		ev_io_start(c->w->loop, &c->rio);
		c->reading = 1;
		conn_tls_feed(c);
	}
}

/*
 * The transport: plain socket calls, or TLS. Both answer as read(2) and
 * writev(2) do: bytes, 0 at the peer's end (read), or -1 with errno
 * (EAGAIN: try when the socket is ready; anything else: the client is
 * gone). A TLS read that must write first (a handshake message) asks for
 * the write watcher (tls_rwant).
 */
static ssize_t
conn_recv(struct sl_conn *c, void *buf, size_t len)
{
	ssize_t n;

	if (c->ssl == NULL)
		return read(c->fd, buf, len);
	n = sl_tls_read(c->ssl, buf, len);
	if (n >= 0)
		return n;
	switch (n) {
	case SL_TLS_CLOSED:
		return 0;
	case SL_TLS_WANT_WRITE:
		c->tls_rwant = 1;
		ev_io_start(c->w->loop, &c->wio);
		/* FALLTHROUGH */
	case SL_TLS_WANT_READ:
		errno = EAGAIN;
		return -1;
	default:
		errno = EPROTO;
		return -1;
	}
}

static ssize_t
conn_send(struct sl_conn *c, const struct iovec *iov, int cnt)
{
	ssize_t n;

	if (c->ssl == NULL)
		return writev(c->fd, iov, cnt);
	n = sl_tls_writev(c->ssl, iov, cnt);
	if (n >= 0)
		return n;
	errno = n == SL_TLS_WANT_WRITE || n == SL_TLS_WANT_READ ? EAGAIN :
	    EPIPE;
	return -1;
}

/* A few bytes now or never (100 Continue): they fit any socket buffer. */
void
conn_send_small(struct sl_conn *c, const char *p, size_t n)
{
	struct iovec v = { (void *)p, n };

	if (c->fr == NULL)   /* HTTP/2 has no 100 Continue to send */
		(void)conn_send(c, &v, 1);
}

/* Half-close: TLS says close_notify first. */
static void
conn_shut_wr(struct sl_conn *c)
{
	if (c->fr != NULL)
		return;
	if (c->ssl != NULL && !c->tls_hs)
		sl_tls_close_notify(c->ssl);
	shutdown(c->fd, SHUT_WR);
}

void
conn_read_stop(struct sl_conn *c)
{
	if (c->reading) {
		ev_io_stop(c->w->loop, &c->rio);   /* a fed event too */
		c->reading = 0;
	}
}

/*
 * Queue the connection for a flush once libcurl returns from the socket
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

void
sl_conn_refuse(struct sl_worker *w, int fd)
{
	char resp[768];
	size_t n;

	if (w->cfg->tls.ctx != NULL) {
		/* No words before a handshake: the refusal is the close. */
		close(fd);
		sl_shm_count_request(w->shm, w->row, SL_TENANT_NONE(w->shm), 503);
		return;
	}
	n = sl_err_response(resp, sizeof(resp), SL_ERR_OVERLOADED,
	    "too many connections", 1);
	if (n > 0)
		(void)!write(fd, resp, n);
	close(fd);
	sl_shm_count_request(w->shm, w->row, SL_TENANT_NONE(w->shm), 503);
}

void
sl_conn_new(struct sl_worker *w, int fd)
{
	struct sl_conn *c;

	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		free(c);
		sl_conn_refuse(w, fd);
		return;
	}
	if (w->cfg->tls.ctx != NULL) {
		if ((c->ssl = sl_tls_new(w->cfg->tls.ctx, fd)) == NULL) {
			free(c);
			sl_conn_refuse(w, fd);
			return;
		}
		c->tls_hs = 1;
	}
	/*
	 * Every write is a flush of what the upstream just sent: Nagle would
	 * hold a token back until the previous one is acknowledged (40 ms with
	 * delayed ACKs).
	 */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 }, sizeof(int));
	if (w->cfg->limits.client_sndbuf > 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF,
		    &(int){ (int)w->cfg->limits.client_sndbuf }, sizeof(int));
	sl_net_peer(fd, c->peer, sizeof(c->peer));
	conn_init(c, w, fd);
	w->nconns++;
	conn_read_start(c);
	conn_timer_update(c);
}

void
conn_idle_unlist(struct sl_conn *c)
{
	if (c->idle_listed) {
		TAILQ_REMOVE(&c->w->idle, c, idle_entry);
		c->idle_listed = 0;
	}
}

/* Between requests on a kept-alive connection, no byte of the next one. */
static int
conn_is_idle(const struct sl_conn *c)
{
	return !c->dead && c->state == CS_HEAD && c->nreq > 0 &&
	    c->req.head_bytes == 0 && c->in_len == 0;
}

/*
 * At max_connections: close the connection idle the longest between two
 * requests, as nginx reuses its keep-alive connections, so that a new
 * client is not refused while kept-alive ones only wait. The list holds
 * every connection that was idle after a response, in that order; one
 * that got a request since is dropped from it here. 1 if one was closed.
 */
int
sl_conn_reap_idle(struct sl_worker *w)
{
	struct sl_conn *c;

	while ((c = TAILQ_FIRST(&w->idle)) != NULL) {
		conn_idle_unlist(c);
		if (conn_is_idle(c)) {
			c->depth++;
			conn_close(c, SL_CLOSE_KEEPALIVE);
			conn_unref(c);
			return 1;
		}
	}
	return 0;
}

/* The response is written and the request read: next request or close. */
static void
conn_response_done(struct sl_conn *c)
{
	struct sl_worker *w = c->w;

	conn_request_end(c, c->state == CS_LOCAL ? SL_END_REJECTED :
	    SL_END_DONE);

	if (c->close_after || w->draining || w->cfg->timeouts.keepalive_ms == 0) {
		if (c->state == CS_LOCAL && c->req.state != SL_REQ_DONE) {
			/*
			 * The client may still be sending the body we refused:
			 * closing now could reset the connection and destroy the
			 * response in flight. Half-close and read to EOF first.
			 */
			conn_shut_wr(c);
			c->in_len = 0;
			conn_set_state(c, CS_LINGER);
			conn_read_start(c);
			return;
		}
		conn_close(c, SL_CLOSE_DONE);
		return;
	}
	/* Keep-alive: reset per-request state, keep the buffers' memory. */
	c->nreq++;
	sl_req_reset(&c->req);
	c->tenant = -1;
	c->lease = -1;
	conn_usage_reset(c);
	c->rh.len = c->rh_off = 0;
	sl_resp_head_reset(&c->uh);
	c->head_sent = c->resp_done = c->close_after = 0;
	c->status = 0;
	c->upstream_bad = 0;
	c->pending = 0;
	c->end = SL_END_NONE;
	c->t_first = c->t_pause = c->paused_total = c->queued_total = 0;
	c->bytes_out = 0;
	c->xf.sends = c->xf.resend_refused = c->xf.no_fds = 0;
	c->tried = 0;
	c->tries = 0;
	c->last_replica = -1;
	c->t_req = ev_now(w->loop);
	/* A pipelined request already waiting begins now. */
	c->t_rx = c->in_len > 0 ? c->t_req : 0;
	sl_buf_release(&c->out);   /* a past burst need not pin memory */
	conn_set_state(c, CS_HEAD);
	if (c->in_len == 0) {
		/* The newest idle connection, last to be closed for room. */
		conn_idle_unlist(c);
		TAILQ_INSERT_TAIL(&w->idle, c, idle_entry);
		c->idle_listed = 1;
	}
	conn_read_start(c);
	conn_process(c);
}

/* After a flush: finish the response if everything is out. */
void
conn_after_write(struct sl_conn *c)
{
	if (c->fr != NULL)
		return;   /* a stream ends when its framing closes it */
	if (c->rh_off < c->rh.len || sl_buf_len(&c->out) > 0)
		return;
	if (!c->resp_done)
		return;
	if (c->state == CS_LOCAL && c->req.state != SL_REQ_DONE &&
	    !c->close_after)
		return;   /* still discarding the refused request's body */
	conn_response_done(c);
}

/*
 * Write what is pending (response head, then body). Returns 0, or -1 when
 * the client is gone. Safe inside libcurl callbacks: it never calls libcurl.
 */
int
conn_flush(struct sl_conn *c)
{
	struct iovec iov[3];
	int cnt, regain = 0;
	ssize_t n;
	size_t total, k;

	/*
	 * The whole response is here and this write may finish it: free the
	 * slot before the bytes go, not after. A client that reads its last
	 * byte and sends its next request at once must find its slot free,
	 * even on another worker and even if this one is preempted right
	 * after the write. If the client does not take it all, the slot is
	 * taken back below (the bytes left still count).
	 */
	if (c->resp_done && c->slot_held && c->fr == NULL) {
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
	if (c->fr != NULL)
		return conn_x_flush(c);
	for (;;) {
		cnt = 0;
		total = 0;
		if (c->rh_off < c->rh.len) {
			iov[cnt].iov_base = c->rh.p + c->rh_off;
			iov[cnt].iov_len = c->rh.len - c->rh_off;
			total += iov[cnt++].iov_len;
		}
		k = (size_t)sl_buf_iov(&c->out, &iov[cnt]);
		while (k-- > 0)
			total += iov[cnt++].iov_len;
		if (cnt == 0)
			break;
		n = conn_send(c, iov, cnt);
		if (n == -1) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			c->client_gone = 1;
			return -1;
		}
		c->t_client = ev_now(c->w->loop);
		c->bytes_out += (uint64_t)n;
		sl_shm_stat_add(c->w->shm, c->w->row, SL_STAT_BYTES_OUT,
		    (uint64_t)n);
		k = c->rh.len - c->rh_off;
		if ((size_t)n <= k) {
			c->rh_off += (size_t)n;
		} else {
			c->rh_off = c->rh.len;
			sl_buf_consume(&c->out, (size_t)n - k);
		}
		if ((size_t)n < total)
			break;
	}
	if (c->rh_off < c->rh.len || sl_buf_len(&c->out) > 0) {
		ev_io_start(c->w->loop, &c->wio);
		/*
		 * Retaken unless another worker took the slot in the
		 * meantime; then these bytes wait without one (at most a
		 * stream buffer, for as long as timeouts.client_stall).
		 */
		if (regain && sl_shm_try_acquire(c->w->shm, c->w->row,
		    c->w->tenant_slot[c->tenant]) == SL_ADMIT_OK)
			c->slot_held = 1;
	} else if (!c->tls_rwant)
		ev_io_stop(c->w->loop, &c->wio);
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

void
conn_on_read(struct ev_loop *loop, ev_io *io, int revents)
{
	struct sl_conn *c = io->data;

	c->depth++;
	conn_read_event(c);
	conn_tls_feed(c);
	conn_in_release(c);
	conn_unref(c);
}

/*
 * A handshake that failed (or timed out): counted by why, no request.
 * Plain HTTP to the TLS port gets a plain 400 that says so, as nginx
 * does: the operator's curl http:// then explains itself. What the client
 * sent is read first, so the close does not reset the answer away.
 */
void
conn_tls_failed(struct sl_conn *c, enum sl_tls_err why)
{
	char sink[4096];
	size_t n;

	sl_debug("conn %d: TLS handshake failed: %s", c->fd,
	    sl_tls_err_name(why));
	sl_shm_stat_add(c->w->shm, c->w->row, SL_STAT_TLS_ERR_FIRST + why, 1);
	if (why == SL_TLS_E_HTTP) {
		while (recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
			;
		n = sl_err_response(sink, sizeof(sink),
		    SL_ERR_PLAIN_HTTP_TO_TLS, NULL, 0);
		(void)!write(c->fd, sink, n);
		shutdown(c->fd, SHUT_WR);
	}
	c->client_gone = 1;
	conn_close(c, SL_CLOSE_TLS);
}

/* Drive the handshake: 1 done, 0 waiting for the socket, -1 closed. */
static int
conn_tls_handshake(struct sl_conn *c)
{
	enum sl_tls_err why = SL_TLS_E_OTHER;
	int r;
	char b;

	if (!c->tls_seen) {
		/*
		 * A connection closed before its first byte is a preconnect
		 * or a health check that gave up, not a failed handshake.
		 */
		r = (int)recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
		if (r == 0 || (r == -1 && errno != EAGAIN && errno != EINTR)) {
			c->client_gone = 1;
			conn_close(c, SL_CLOSE_CLIENT_GONE);
			return -1;
		}
		if (r == -1)
			return 0;
		c->tls_seen = 1;
	}
	r = sl_tls_handshake(c->ssl, &why);
	c->tls_rwant = 0;
	switch (r) {
	case 1:
		c->tls_hs = 0;
		ev_io_stop(c->w->loop, &c->wio);
		if (sl_tls_alpn(c->ssl) == SL_ALPN_H2 && c->w->h2_start != NULL) {
			/* HTTP/2 takes the socket and the TLS state over. */
			void *ssl = c->ssl;

			c->ssl = NULL;
			c->handed_over = 1;
			conn_read_stop(c);
			c->w->h2_start(c->w, c->fd, ssl, c->peer);
			conn_close(c, SL_CLOSE_H2);
			return -1;
		}
		/* The request head's time begins once the channel is up. */
		c->t_req = ev_now(c->w->loop);
		conn_timer_update(c);
		return 1;
	case SL_TLS_WANT_WRITE:
		c->tls_rwant = 1;
		ev_io_start(c->w->loop, &c->wio);
		return 0;
	case SL_TLS_WANT_READ:
		ev_io_stop(c->w->loop, &c->wio);
		return 0;
	default:
		conn_tls_failed(c, why);
		return -1;
	}
}

static void
conn_read_event(struct sl_conn *c)
{
	struct ev_loop *loop = c->w->loop;
	ssize_t n;
	char sink[4096];

	if (c->fr != NULL) {
		conn_x_drain(c);
		return;
	}
	if (c->tls_hs && conn_tls_handshake(c) <= 0)
		return;
	if (c->state == CS_LINGER) {
		do
			n = conn_recv(c, sink, sizeof(sink));
		while (n > 0);
		if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
			conn_close(c, SL_CLOSE_DONE);
		return;
	}
	if (c->in_len == CONN_IN_SIZE) {
		/*
		 * More pipelined bytes than we keep while a response is in
		 * progress: leave the rest in the kernel (TCP pushes back on
		 * the client) until this response is done and the buffer
		 * drains. Nothing is dropped. A client that leaves meanwhile
		 * is noticed through EPOLLRDHUP (conn_hup_watch).
		 */
		conn_read_stop(c);
		conn_hup_watch(c);
		return;
	}
	if (c->in == NULL && (c->in = sl_block_get(&c->w->blocks)) == NULL) {
		sl_err("conn %d: out of memory for its input", c->fd);
		conn_close(c, SL_CLOSE_CLIENT_GONE);
		return;
	}
	n = conn_recv(c, c->in + c->in_len, CONN_IN_SIZE - c->in_len);
	if (n == 0 || (n == -1 && errno != EAGAIN && errno != EWOULDBLOCK &&
	    errno != EINTR)) {
		c->client_gone = 1;
		conn_close(c, SL_CLOSE_CLIENT_GONE);
		return;
	}
	if (n < 0)
		return;
	if (c->in_len == 0 && c->req.head_bytes == 0 && c->t_rx == 0 &&
	    c->state == CS_HEAD)
		c->t_rx = ev_now(loop);   /* the request begins at its first byte */
	c->in_len += (size_t)n;
	if (c->state == CS_HEAD || c->state == CS_BODY) {
		if (c->state == CS_BODY)
			c->t_req = ev_now(loop);   /* body: idle, not total */
		conn_process(c);
	} else if (c->state == CS_LOCAL) {
		conn_process(c);
	}
}

void
conn_on_write(struct ev_loop *loop, ev_io *io, int revents)
{
	struct sl_conn *c = io->data;

	c->depth++;
	conn_write_event(c);
	conn_unref(c);
}

static void
conn_write_event(struct sl_conn *c)
{
	if (c->tls_rwant) {
		/* A handshake or a read waited for room: it goes on first. */
		c->tls_rwant = 0;
		conn_read_event(c);
		conn_tls_feed(c);
		if (c->dead || c->tls_rwant)
			return;
	}
	if (conn_flush(c) == -1) {
		conn_close(c, SL_CLOSE_CLIENT_GONE);
		return;
	}
	conn_maybe_resume(c);
	conn_after_write(c);
}

void
sl_conn_drain_all(struct sl_worker *w)
{
	struct sl_conn *c, *next;

	for (c = TAILQ_FIRST(&w->conns); c != NULL; c = next) {
		char b;

		next = TAILQ_NEXT(c, entry);
		/*
		 * Close keep-alive connections idle between requests. Not a
		 * connection just accepted (its first request is on its way:
		 * serve it, with Connection: close), and not one whose next
		 * request already sits in the socket: closing over unread
		 * bytes would reset it.
		 */
		if (c->state != CS_HEAD || c->nreq == 0 ||
		    c->req.head_bytes != 0 || c->in_len != 0)
			continue;
		if (recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 1 ||
		    (c->ssl != NULL && sl_tls_pending(c->ssl)))
			continue;
		conn_close(c, SL_CLOSE_DRAIN);
	}
}

void
sl_conn_hup_event(struct sl_worker *w)
{
	struct epoll_event ev[64];
	int n, i;

	n = epoll_wait(w->hup_fd, ev, 64, 0);
	for (i = 0; i < n; i++) {
		struct sl_conn *c = ev[i].data.ptr;

		c->depth++;
		sl_debug("conn %d: client left with input unread", c->fd);
		c->client_gone = 1;
		conn_close(c, SL_CLOSE_CLIENT_GONE);
		conn_unref(c);
	}
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

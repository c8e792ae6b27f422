/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * An HTTP/1.x client connection, beside h2.c: a framing of exchanges
 * (sl_exchange.h). It owns the socket and its options, the TLS handshake
 * (ALPN h2 hands the socket and the TLS state to h2.c), one input block,
 * the write watcher, keep-alive between requests, linger after a refusal
 * and the idle list reaped at max_connections. Each request is an
 * exchange of its own, opened at its first byte; the connection reaches
 * it only through sl_exchange.h, and the exchange reaches the connection
 * only through h1_framing.
 *
 *   HANDSHAKE ──TLS up──▶ IDLE ──a request's first byte──▶ BUSY
 *                          ▲                                 │ done
 *                          └───────── keep-alive ◀───────────┤
 *                                      LINGER ◀── refused ───┘ (or close)
 *
 * Pipelined bytes past the current request wait in the input block, then
 * in the kernel (reading stops, TCP pushes back on the client); a client
 * that leaves meanwhile is seen through EPOLLRDHUP (h1_hup_watch).
 */
#include "config.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <ev.h>

#include "sl_accesslog.h"
#include "sl_buf.h"
#include "sl_config.h"
#include "sl_exchange.h"
#include "sl_h1.h"
#include "sl_h2.h"
#include "sl_log.h"
#include "sl_util.h"
#include "sl_net.h"
#include "sl_reply.h"
#include "sl_shm.h"
#include "sl_tls.h"
#include "sl_worker_state.h"

#define H1_IN_SIZE SL_BLOCK_SIZE   /* input block (heads stream through) */
#define LINGER_SECONDS 2.0

enum h1_state {
	H1_HANDSHAKE,   /* TLS: the handshake is not done */
	H1_IDLE,        /* waiting for the first byte of a request */
	H1_BUSY,        /* an exchange has the connection */
	H1_LINGER       /* answered and closing: reading until EOF */
};

struct sl_h1 {
	TAILQ_ENTRY(sl_h1) entry;      /* w->h1s */
	struct sl_worker *w;
	int fd;
	enum h1_state state;
	ev_io rio, wio;
	ev_timer timer;
	char peer[64];
	void *ssl;                 /* TLS (sl_tls.h); NULL: plain */
	int tls_seen;              /* a byte of the handshake arrived */
	int tls_rwant;             /* a handshake or read waits for the
	                            * socket to take bytes (wio) */
	int handed_over;           /* fd and ssl now belong to HTTP/2 */
	char *in;                  /* input block; NULL while empty */
	size_t in_len;
	int reading;               /* rio active */
	int hup_watched;           /* in w->hup_fd while not reading */
	int feeding;               /* h1_feed is on the stack */
	int client_gone;           /* EOF, reset or a failed write */
	unsigned nreq;             /* responses completed */
	ev_tstamp t_ready;         /* ready for a request: accept, handshake,
	                            * the last response */
	ev_tstamp t_rx;            /* first byte of the next request; 0: none */
	ev_tstamp t_linger;
	struct sl_conn *x;         /* H1_BUSY: its exchange */
	TAILQ_ENTRY(sl_h1) idle_entry;
	int idle_listed;           /* on w->idle: was idle after a response */
	int depth;                 /* entry points on the stack */
	int dead;                  /* closed; freed when depth drops to 0 */
};

static const char *const state_names[] = {
	"handshake", "idle", "busy", "linger"
};

static void h1_close(struct sl_h1 *, enum sl_close);
static void h1_feed(struct sl_h1 *);
static void h1_read_event(struct sl_h1 *);

static void
h1_unref(struct sl_h1 *h)
{
	if (--h->depth > 0 || !h->dead)
		return;
	sl_block_put(&h->w->blocks, h->in);
	free(h);
}

/* ---- timers ----------------------------------------------------------- */

/* The connection's own deadline; a request's are its exchange's. 0: none. */
static ev_tstamp
h1_deadline(const struct sl_h1 *h)
{
	const struct sl_config *cfg = h->w->cfg;

	switch (h->state) {
	case H1_HANDSHAKE:
		return h->t_ready + sl_ms_to_s(cfg->timeouts.client_header_ms);
	case H1_IDLE:
		if (h->nreq == 0)
			return h->t_ready + sl_ms_to_s(cfg->timeouts.client_header_ms);
		if (cfg->timeouts.keepalive_ms == 0)
			return h->t_ready;
		return h->t_ready + sl_ms_to_s(cfg->timeouts.keepalive_ms);
	case H1_BUSY:
		return 0;
	case H1_LINGER:
		return h->t_linger + LINGER_SECONDS;
	}
	return 0;
}

static void
h1_timer_update(struct sl_h1 *h)
{
	ev_tstamp d = h1_deadline(h), now = ev_now(h->w->loop);

	ev_timer_stop(h->w->loop, &h->timer);
	if (d <= 0 || h->dead)
		return;
	ev_timer_set(&h->timer, d > now ? d - now : 0.0, 0.0);
	ev_timer_start(h->w->loop, &h->timer);
}

static void h1_tls_failed(struct sl_h1 *, enum sl_tls_err);

static void
h1_on_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_h1 *h = t->data;
	ev_tstamp d;

	(void)loop;
	(void)revents;
	h->depth++;
	d = h1_deadline(h);
	if (d > ev_now(h->w->loop) + 0.0005) {
		/* Activity moved the deadline since the timer was armed. */
		h1_timer_update(h);
		goto out;
	}
	switch (h->state) {
	case H1_HANDSHAKE:
		if (h->tls_seen) {
			h1_tls_failed(h, SL_TLS_E_TIMEOUT);
			break;
		}
		/* FALLTHROUGH */
	case H1_IDLE:
		if (h->nreq > 0) {
			h1_close(h, SL_CLOSE_KEEPALIVE);
			break;
		}
		/*
		 * Not one byte of a request: a browser's or an SDK's
		 * preconnect, or a port scan. Nobody waits for an answer; a
		 * 408 would only count as an error. Close it silently and
		 * count it apart.
		 */
		sl_shm_stat_add(h->w->shm, h->w->row, SL_STAT_IDLE_CLOSED, 1);
		h1_close(h, SL_CLOSE_IDLE);
		break;
	case H1_LINGER:
		h1_close(h, SL_CLOSE_TIMEOUT);
		break;
	case H1_BUSY:
		break;
	}
out:
	h1_unref(h);
}

/* ---- the transport ---------------------------------------------------- */

/*
 * Reading stopped with input still unread: a FIN behind it would never be
 * read, so ask the kernel for EPOLLRDHUP instead (libev cannot).
 */
static void
h1_hup_watch(struct sl_h1 *h)
{
	struct epoll_event ev;

	if (h->hup_watched || h->w->hup_fd < 0)
		return;
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLRDHUP;
	ev.data.ptr = h;
	if (epoll_ctl(h->w->hup_fd, EPOLL_CTL_ADD, h->fd, &ev) == 0)
		h->hup_watched = 1;
}

static void
h1_hup_unwatch(struct sl_h1 *h)
{
	if (h->hup_watched) {
		epoll_ctl(h->w->hup_fd, EPOLL_CTL_DEL, h->fd, NULL);
		h->hup_watched = 0;
	}
}

/*
 * Plaintext OpenSSL already holds (the rest of a record longer than the
 * input block took) does not make the socket readable again: feed the
 * read watcher once more. Only while it is started: stopping it (or the
 * close) clears the fed event, so it never outlives the connection.
 */
static void
h1_tls_feed(struct sl_h1 *h)
{
	if (h->ssl != NULL && h->reading && h->state != H1_HANDSHAKE &&
	    !h->dead && sl_tls_pending(h->ssl))
		ev_feed_event(h->w->loop, &h->rio, EV_READ);
}

static void
h1_read_start(struct sl_h1 *h)
{
	h1_hup_unwatch(h);
	if (!h->reading) {
		ev_io_start(h->w->loop, &h->rio);
		h->reading = 1;
		h1_tls_feed(h);
	}
}

static void
h1_read_stop(struct sl_h1 *h)
{
	if (h->reading) {
		ev_io_stop(h->w->loop, &h->rio);   /* a fed event too */
		h->reading = 0;
	}
}

/*
 * Plain socket calls, or TLS. Both answer as read(2) and writev(2) do:
 * bytes, 0 at the peer's end (read), or -1 with errno (EAGAIN: try when
 * the socket is ready; anything else: the client is gone). A TLS read that
 * must write first (a handshake message) asks for the write watcher.
 */
static ssize_t
h1_recv(struct sl_h1 *h, void *buf, size_t len)
{
	ssize_t n;

	if (h->ssl == NULL)
		return read(h->fd, buf, len);
	n = sl_tls_read(h->ssl, buf, len);
	if (n >= 0)
		return n;
	switch (n) {
	case SL_TLS_CLOSED:
		return 0;
	case SL_TLS_WANT_WRITE:
		h->tls_rwant = 1;
		ev_io_start(h->w->loop, &h->wio);
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
h1_send(struct sl_h1 *h, const struct iovec *iov, int cnt)
{
	ssize_t n;

	if (h->ssl == NULL)
		return writev(h->fd, iov, cnt);
	n = sl_tls_writev(h->ssl, iov, cnt);
	if (n >= 0)
		return n;
	errno = n == SL_TLS_WANT_WRITE || n == SL_TLS_WANT_READ ? EAGAIN :
	    EPIPE;
	return -1;
}

/* Half-close: TLS says close_notify first. */
static void
h1_shut_wr(struct sl_h1 *h)
{
	if (h->ssl != NULL)
		sl_tls_close_notify(h->ssl);
	shutdown(h->fd, SHUT_WR);
}

/* ---- the framing (sl_exchange.h) --------------------------------------- */

/* Write what the exchange has, as far as the socket takes it. */
static int
fr_send(void *ctx)
{
	struct sl_h1 *h = ctx;
	struct iovec iov[3];
	size_t total;
	ssize_t n;
	int cnt, i;

	for (;;) {
		if ((cnt = sl_exchange_peek(h->x, iov)) == 0)
			break;
		for (total = 0, i = 0; i < cnt; i++)
			total += iov[i].iov_len;
		n = h1_send(h, iov, cnt);
		if (n == -1) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			h->client_gone = 1;
			return -1;
		}
		sl_exchange_drain(h->x, (size_t)n);
		if ((size_t)n < total)
			break;
	}
	if (sl_exchange_waiting(h->x))
		ev_io_start(h->w->loop, &h->wio);
	else if (!h->tls_rwant)
		ev_io_stop(h->w->loop, &h->wio);
	return 0;
}

/* The exchange takes input again: what waits is fed from the loop. */
static void
fr_input(void *ctx)
{
	struct sl_h1 *h = ctx;

	if (h->in_len > 0 && !h->dead && !h->feeding)
		ev_feed_event(h->w->loop, &h->rio, EV_READ);
}

/* A few bytes now or never (100 Continue): they fit any socket buffer. */
static void
fr_interim(void *ctx, const char *p, size_t n)
{
	struct sl_h1 *h = ctx;
	struct iovec v = { (void *)(uintptr_t)p, n };

	(void)h1_send(h, &v, 1);
}

static void
h1_idle_unlist(struct sl_h1 *h)
{
	if (h->idle_listed) {
		TAILQ_REMOVE(&h->w->idle, h, idle_entry);
		h->idle_listed = 0;
	}
}

/*
 * Ready for the next request: one already pipelined begins now; with none,
 * the connection is the newest idle one, the last to be closed for room.
 */
static void
h1_ready(struct sl_h1 *h)
{
	h->t_rx = h->in_len > 0 ? h->t_ready : 0;
	if (h->in_len == 0) {
		h1_idle_unlist(h);
		TAILQ_INSERT_TAIL(&h->w->idle, h, idle_entry);
		h->idle_listed = 1;
	}
}

/* The request answered: the next one, or close (after a linger). */
static void
fr_next(struct sl_h1 *h, struct sl_worker *w, int close, int linger)
{
	if (close) {
		if (linger) {
			/*
			 * The client may still be sending the body we refused:
			 * closing now could reset the connection and destroy
			 * the response in flight. Half-close and read to EOF.
			 */
			h1_shut_wr(h);
			h->in_len = 0;
			h->state = H1_LINGER;
			h->t_linger = ev_now(w->loop);
			h1_timer_update(h);
			h1_read_start(h);
			return;
		}
		h1_close(h, SL_CLOSE_DONE);
		return;
	}
	h->nreq++;
	h->state = H1_IDLE;
	h->t_ready = ev_now(w->loop);
	h1_timer_update(h);
	h1_read_start(h);
	if (h->feeding)
		return;   /* h1_feed goes on once it knows what was taken */
	h1_ready(h);
	if (h->in_len > 0)
		h1_feed(h);
}

/* The exchange's response went out whole and its request was read. */
static void
fr_done(void *ctx, int close, int linger)
{
	struct sl_h1 *h = ctx;
	struct sl_worker *w = h->w;

	h->x = NULL;
	h->depth++;   /* the next request may close it */
	fr_next(h, w, close, linger);
	h1_unref(h);
}

/* The exchange ended before its response did: the connection goes. */
static void
fr_reset(void *ctx, int cut)
{
	struct sl_h1 *h = ctx;

	(void)cut;
	h->x = NULL;
	h1_close(h, SL_CLOSE_DONE);
}

static const struct sl_framing h1_framing = {
	"h1", 1, fr_send, fr_input, fr_interim, fr_done, fr_reset
};

/* ---- the connection ---------------------------------------------------- */

static void
h1_close(struct sl_h1 *h, enum sl_close why)
{
	struct sl_worker *w = h->w;
	struct sl_conn *x;

	if (h->dead)
		return;
	sl_debug("conn %d: close (%s) in state %s", h->fd, sl_close_names[why],
	    state_names[h->state]);
	h->dead = 1;
	h->depth++;
	if ((x = h->x) != NULL) {
		/* The request in progress ends with its connection. */
		h->x = NULL;
		sl_exchange_closed(x, 0);
	}
	h1_read_stop(h);
	ev_io_stop(w->loop, &h->rio);   /* and any event fed to it */
	h1_hup_unwatch(h);
	ev_io_stop(w->loop, &h->wio);
	ev_timer_stop(w->loop, &h->timer);
	if (h->ssl != NULL) {
		if (!h->client_gone && h->state != H1_HANDSHAKE)
			sl_tls_close_notify(h->ssl);
		sl_tls_free(h->ssl);
		h->ssl = NULL;
	}
	if (!h->handed_over)
		close(h->fd);
	h->fd = -1;
	w->nconns--;
	TAILQ_REMOVE(&w->h1s, h, entry);
	h1_idle_unlist(h);
	if (w->draining && w->nconns == 0)
		ev_break(w->loop, EVBREAK_ALL);
	h1_unref(h);
}

/* EOF, a reset or a failed read: the client is gone. */
static void
h1_gone(struct sl_h1 *h)
{
	h->client_gone = 1;
	h1_close(h, SL_CLOSE_CLIENT_GONE);
}

/* No input waits: the input block goes back to the worker's pool. */
static void
h1_in_release(struct sl_h1 *h)
{
	if (h->in != NULL && h->in_len == 0 && !h->dead) {
		sl_block_put(&h->w->blocks, h->in);
		h->in = NULL;
	}
}

/*
 * Offer the input block to the exchange while it takes bytes, opening one
 * at a request's first byte; a response finished meanwhile (a refusal, a
 * pipelined request answered here) lets the next request begin.
 */
static void
h1_feed(struct sl_h1 *h)
{
	struct sl_conn *x;
	size_t k;
	int was = h->feeding;

	h->feeding = 1;
	while (!h->dead && h->in_len > 0 &&
	    (h->state == H1_IDLE || h->state == H1_BUSY)) {
		if (h->x == NULL) {
			/*
			 * The head's time: from the accept (or the handshake)
			 * for a connection's first request, from its first
			 * byte on a kept-alive one (keepalive bounds the wait
			 * before it), as nginx's client_header_timeout.
			 */
			h->x = sl_exchange_open(h->w, &h1_framing, h, h->fd,
			    h->peer, h->nreq > 0 && h->t_rx > 0 ? h->t_rx :
			    h->t_ready, h->t_rx);
			if (h->x == NULL) {
				sl_err("conn %d: out of memory for a request",
				    h->fd);
				h1_close(h, SL_CLOSE_CLIENT_GONE);
				break;
			}
			h->state = H1_BUSY;
			h1_timer_update(h);
		}
		x = h->x;
		sl_exchange_hold(x);
		k = sl_exchange_feed(x, h->in, h->in_len);
		/* (A linger dropped the input; a close needs none.) */
		if (k > 0 && !h->dead && h->state != H1_LINGER) {
			memmove(h->in, h->in + k, h->in_len - k);
			h->in_len -= k;
		}
		sl_exchange_unhold(x);
		if (!h->dead && h->state == H1_IDLE)
			h1_ready(h);   /* its response finished meanwhile */
		if (k == 0)
			break;
	}
	h->feeding = was;
}

/* A handshake that failed (or timed out): counted by why, no request. */
static void
h1_tls_failed(struct sl_h1 *h, enum sl_tls_err why)
{
	char sink[4096];
	size_t n;

	sl_debug("conn %d: TLS handshake failed: %s", h->fd,
	    sl_tls_err_name(why));
	sl_shm_stat_add(h->w->shm, h->w->row, SL_STAT_TLS_ERR_FIRST + why, 1);
	if (why == SL_TLS_E_HTTP) {
		/*
		 * Plain HTTP to the TLS port gets a plain 400 that says so, as
		 * nginx does: the operator's curl http:// then explains itself.
		 * What the client sent is read first, so the close does not
		 * reset the answer away.
		 */
		while (recv(h->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
			;
		n = sl_err_response(sink, sizeof(sink),
		    SL_ERR_PLAIN_HTTP_TO_TLS, NULL, 0);
		(void)!write(h->fd, sink, n);
		shutdown(h->fd, SHUT_WR);
	}
	h->client_gone = 1;
	h1_close(h, SL_CLOSE_TLS);
}

/* Drive the handshake: 1 done, 0 waiting for the socket, -1 closed. */
static int
h1_tls_handshake(struct sl_h1 *h)
{
	enum sl_tls_err why = SL_TLS_E_OTHER;
	int r;
	char b;

	if (!h->tls_seen) {
		/*
		 * A connection closed before its first byte is a preconnect
		 * or a health check that gave up, not a failed handshake.
		 */
		r = (int)recv(h->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
		if (r == 0 || (r == -1 && errno != EAGAIN && errno != EINTR)) {
			h1_gone(h);
			return -1;
		}
		if (r == -1)
			return 0;
		h->tls_seen = 1;
	}
	r = sl_tls_handshake(h->ssl, &why);
	h->tls_rwant = 0;
	switch (r) {
	case 1:
		ev_io_stop(h->w->loop, &h->wio);
		if (sl_tls_alpn(h->ssl) == SL_ALPN_H2) {
			/* HTTP/2 takes the socket and the TLS state over. */
			void *ssl = h->ssl;

			h->ssl = NULL;
			h->handed_over = 1;
			h1_read_stop(h);
			sl_h2_start(h->w, h->fd, ssl, h->peer);
			h1_close(h, SL_CLOSE_H2);
			return -1;
		}
		/* The request head's time begins once the channel is up. */
		h->state = H1_IDLE;
		h->t_ready = ev_now(h->w->loop);
		h1_timer_update(h);
		return 1;
	case SL_TLS_WANT_WRITE:
		h->tls_rwant = 1;
		ev_io_start(h->w->loop, &h->wio);
		return 0;
	case SL_TLS_WANT_READ:
		ev_io_stop(h->w->loop, &h->wio);
		return 0;
	default:
		h1_tls_failed(h, why);
		return -1;
	}
}

static void
h1_read_event(struct sl_h1 *h)
{
	ssize_t n;
	char sink[4096];

	if (h->state == H1_HANDSHAKE && h1_tls_handshake(h) <= 0)
		return;
	if (h->state == H1_LINGER) {
		do
			n = h1_recv(h, sink, sizeof(sink));
		while (n > 0);
		if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
			h1_close(h, SL_CLOSE_DONE);
		return;
	}
	if (h->in_len > 0) {
		/* The exchange may take what it left (it said so: input()). */
		h1_feed(h);
		if (h->dead)
			return;
	}
	if (h->in_len == H1_IN_SIZE) {
		/*
		 * More pipelined bytes than we keep while a response is in
		 * progress: leave the rest in the kernel (TCP pushes back on
		 * the client) until this response is done and the block
		 * drains. Nothing is dropped. A client that leaves meanwhile
		 * is noticed through EPOLLRDHUP (h1_hup_watch).
		 */
		h1_read_stop(h);
		h1_hup_watch(h);
		return;
	}
	if (!h->reading)
		h1_read_start(h);   /* room again after a full block */
	if (h->in == NULL && (h->in = sl_block_get(&h->w->blocks)) == NULL) {
		sl_err("conn %d: out of memory for its input", h->fd);
		h1_close(h, SL_CLOSE_CLIENT_GONE);
		return;
	}
	n = h1_recv(h, h->in + h->in_len, H1_IN_SIZE - h->in_len);
	if (n == 0 || (n == -1 && errno != EAGAIN && errno != EWOULDBLOCK &&
	    errno != EINTR)) {
		h1_gone(h);
		return;
	}
	if (n < 0)
		return;
	if (h->in_len == 0 && h->state == H1_IDLE)
		h->t_rx = ev_now(h->w->loop);   /* a request begins at its first byte */
	h->in_len += (size_t)n;
	h1_feed(h);
}

static void
h1_on_read(struct ev_loop *loop, ev_io *io, int revents)
{
	struct sl_h1 *h = io->data;

	(void)loop;
	(void)revents;
	h->depth++;
	h1_read_event(h);
	h1_tls_feed(h);
	h1_in_release(h);
	h1_unref(h);
}

static void
h1_on_write(struct ev_loop *loop, ev_io *io, int revents)
{
	struct sl_h1 *h = io->data;
	struct sl_conn *x;

	(void)loop;
	(void)revents;
	h->depth++;
	if (h->tls_rwant) {
		/* A handshake or a read waited for room: it goes on first. */
		h->tls_rwant = 0;
		h1_read_event(h);
		h1_tls_feed(h);
		if (h->dead || h->tls_rwant)
			goto out;
	}
	if ((x = h->x) != NULL) {
		sl_exchange_hold(x);
		sl_exchange_writable(x);
		sl_exchange_unhold(x);
	} else
		ev_io_stop(h->w->loop, &h->wio);
out:
	h1_in_release(h);
	h1_unref(h);
}

/* ---- the worker's side (sl_h1.h) --------------------------------------- */

void
sl_h1_refuse(struct sl_worker *w, int fd)
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
sl_h1_new(struct sl_worker *w, int fd)
{
	struct sl_h1 *h;

	if ((h = calloc(1, sizeof(*h))) == NULL) {
		sl_h1_refuse(w, fd);
		return;
	}
	h->state = H1_IDLE;
	if (w->cfg->tls.ctx != NULL) {
		if ((h->ssl = sl_tls_new(w->cfg->tls.ctx, fd)) == NULL) {
			free(h);
			sl_h1_refuse(w, fd);
			return;
		}
		h->state = H1_HANDSHAKE;
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
	sl_net_peer(fd, h->peer, sizeof(h->peer));
	h->w = w;
	h->fd = fd;
	ev_io_init(&h->rio, h1_on_read, fd, EV_READ);
	ev_io_init(&h->wio, h1_on_write, fd, EV_WRITE);
	ev_init(&h->timer, h1_on_timer);
	h->rio.data = h->wio.data = h->timer.data = h;
	h->t_ready = ev_now(w->loop);
	TAILQ_INSERT_TAIL(&w->h1s, h, entry);
	w->nconns++;
	h1_read_start(h);
	h1_timer_update(h);
}

/* Between requests on a kept-alive connection, no byte of the next one. */
static int
h1_is_idle(const struct sl_h1 *h)
{
	return !h->dead && h->state == H1_IDLE && h->nreq > 0 && h->in_len == 0;
}

/*
 * At max_connections: close the connection idle the longest between two
 * requests, as nginx reuses its keep-alive connections, so that a new
 * client is not refused while kept-alive ones only wait. The list holds
 * every connection that was idle after a response, in that order; one
 * that got a request since is dropped from it here. 1 if one was closed.
 */
int
sl_h1_reap_idle(struct sl_worker *w)
{
	struct sl_h1 *h;

	while ((h = TAILQ_FIRST(&w->idle)) != NULL) {
		h1_idle_unlist(h);
		if (h1_is_idle(h)) {
			h->depth++;
			h1_close(h, SL_CLOSE_KEEPALIVE);
			h1_unref(h);
			return 1;
		}
	}
	return 0;
}

void
sl_h1_drain_all(struct sl_worker *w)
{
	struct sl_h1 *h, *next;

	for (h = TAILQ_FIRST(&w->h1s); h != NULL; h = next) {
		char b;

		next = TAILQ_NEXT(h, entry);
		/*
		 * Close keep-alive connections idle between requests. Not a
		 * connection just accepted (its first request is on its way:
		 * serve it, with Connection: close), and not one whose next
		 * request already sits in the socket: closing over unread
		 * bytes would reset it.
		 */
		if (!h1_is_idle(h))
			continue;
		if (recv(h->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 1 ||
		    (h->ssl != NULL && sl_tls_pending(h->ssl)))
			continue;
		h1_close(h, SL_CLOSE_DRAIN);
	}
}

void
sl_h1_close_all(struct sl_worker *w)
{
	struct sl_h1 *h;

	while ((h = TAILQ_FIRST(&w->h1s)) != NULL)
		h1_close(h, SL_CLOSE_DRAINED);
}

void
sl_h1_hup_event(struct sl_worker *w)
{
	struct epoll_event ev[64];
	int n, i;

	n = epoll_wait(w->hup_fd, ev, 64, 0);
	for (i = 0; i < n; i++) {
		struct sl_h1 *h = ev[i].data.ptr;

		h->depth++;
		sl_debug("conn %d: client left with input unread", h->fd);
		h1_gone(h);
		h1_unref(h);
	}
}

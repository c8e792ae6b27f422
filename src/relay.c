/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * One client connection: an explicit state machine.
 *
 *   HEAD ──head parsed──▶ route, auth, admit ──▶ BODY ──body read──▶ UPSTREAM
 *     ▲                        │ refused                                │ head
 *     │                        ▼                                        ▼
 *     └──── keep-alive ◀──── LOCAL (error response) ◀── or ────────── STREAM
 *
 * Callbacks only record facts and move the machine; nothing is freed inside
 * a libcurl callback (they return an error code, and the connection is
 * finished when libcurl reports the transfer done). Every exit path of an
 * admitted request goes through conn_release(), which gives the tenant slot
 * back exactly once.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "sl_accesslog.h"
#include "sl_buf.h"
#include "sl_exchange.h"
#include "sl_http.h"
#include "sl_log.h"
#include "sl_meter.h"
#include "sl_model.h"
#include "sl_net.h"
#include "sl_queue.h"
#include "sl_relay.h"
#include "sl_reply.h"
#include "sl_tls.h"
#include "sl_transfer.h"
#include "sl_upstream.h"
#include "sl_util.h"
#include "sl_json.h"
#include "sl_usage.h"
#include "sl_worker_state.h"

/*
 * A stream whose body reads come less than this apart (seconds) lets its
 * usage scanner keep a template of the last event (a few hundred bytes):
 * the CPU it saves is spent at that pace; a slow stream keeps no copy.
 */
#define SCAN_KEEP_PACE 0.25

#define CONN_IN_SIZE SL_BLOCK_SIZE  /* client input buffer (heads stream through) */
#define CHUNK_FRAMING 32            /* "%zx\r\n" + "\r\n", generously */
/* The stream buffer's cap when not stretched for one oversized write. */
#define BASE_CAP(c) ((c)->w->cfg->stream_buffer + CHUNK_FRAMING)
#define LINGER_SECONDS 2.0
/*
 * An exchange of an HTTP/2 stream gives the client's window back once it
 * buffers less than this of its request: at most about two windows wait.
 */
#define XIN_LOW (64 * 1024)

enum conn_state {
	CS_HEAD,       /* waiting for or reading a request head */
	CS_ADMIT,      /* head read, node slot held, waiting for a cluster lease */
	CS_BODY,       /* admitted, reading the request body */
	CS_UPSTREAM,   /* request sent upstream, waiting for its response head */
	CS_STREAM,     /* relaying the upstream response */
	CS_LOCAL,      /* writing a response made here (errors) */
	CS_LINGER,     /* response sent, reading until EOF before closing */
	CS_QUEUED      /* body read, waiting in the fair queue for a replica */
};

static const char *const state_names[] = {
	"head", "admit", "body", "upstream", "stream", "local", "linger",
	"queued"
};

struct sl_conn {
	TAILQ_ENTRY(sl_conn) entry;
	struct sl_worker *w;
	int fd;
	enum conn_state state;
	ev_io rio, wio;
	ev_timer timer;
	char peer[64];

	/* Request side. */
	struct sl_req req;
	char *in;
	size_t in_len;
	unsigned nreq;             /* responses completed on this connection */
	ev_tstamp t_req;           /* when the connection became ready for it */
	ev_tstamp t_rx;            /* first byte of the current request; 0: none */
	ev_tstamp t_body;          /* when its body began to be read */
	int reading;               /* rio active */
	int hup_watched;           /* in w->hup_fd while not reading */
	void *ssl;                 /* TLS (sl_tls.h); NULL: plain */
	int handed_over;           /* fd and ssl now belong to HTTP/2 */

	/*
	 * An exchange of an HTTP/2 stream (sl_exchange.h): no socket of its
	 * own; request bytes arrive in xin, the response leaves through fr.
	 */
	const struct sl_framing *fr;   /* NULL: HTTP/1.x on fd */
	void *fr_ctx;              /* its stream; NULL once the stream ended */
	char *xin;                 /* request bytes not yet fed */
	size_t xin_len, xin_off, xin_cap;
	size_t xin_raw;            /* flow-controlled bytes not yet given back */
	int x_responded;           /* the head went to the framing */
	int x_eof;                 /* the body's end was pulled */
	int tls_hs;                /* its handshake is not done */
	int tls_seen;              /* a byte of it arrived */
	int tls_rwant;             /* a handshake or read waits for the
	                            * socket to take bytes (wio) */

	/* Admission. */
	int tenant;                /* config index, -1 before auth */
	int slot_held;
	int32_t lease;             /* cluster lease; -1: none */
	size_t up_idx;             /* the request's upstream (conn_route_model) */
	int model;                 /* its model (cfg->models); -1: none */
	char *mname;               /* the model as the client named it, for
	                            * the access log (mname_len bytes); NULL */
	size_t mname_len;
	const char *msent;         /* the model sent upstream (config); NULL */
	size_t mtarget;            /* the target of model it was sent to */
	struct sl_model_span mspan;   /* where the body names its model */
	int mrw_on;                /* the answer's "model" is set back */
	struct sl_mrw mrw;         /* to mlit (its JSON literal, malloc'd) */
	char *mlit;
	size_t fb_k;               /* next entry of its fallback chain */
	int mroute;                /* the model and target it was routed to: */
	size_t troute;             /* its fallback chain's origin */
	int tries_base;            /* tries before its upstream's first */
	int fb_model, fb_target;   /* a busy head's fallback, whose replica
	                            * is retry_next; -1: none */
	struct sl_cl_wait *admit_wait;   /* CS_ADMIT: the lease asked for */

	/* CS_QUEUED: its place in the fair queue (sl_queue.h). */
	uint64_t qhandle;          /* 0: not waiting */
	size_t qpool;              /* the queue's pool index */
	ev_tstamp t_queued;
	ev_tstamp queued_total;    /* seconds this request waited (queued_ms) */
	int q_retry_after;         /* for its 503 queue_timeout */
	uint64_t q_charged;        /* tokens charged to its pool's service
	                            * counter so far (fair queue) */
	TAILQ_ENTRY(sl_conn) qentry;   /* on w->queued */

	/* Response side. */
	struct sl_head rh;         /* response head being written */
	size_t rh_off;             /* how much of it went out */
	struct sl_buf out;         /* body bytes (framed) waiting for the client */
	int chunked;               /* frame the body with chunked encoding */
	int body_allowed;          /* not HEAD, not 1xx/204/304 */
	int head_sent;             /* client head built */
	int close_after;           /* close once the response is written */
	int resp_done;             /* the response is complete in rh/out */

	/* Upstream. */
	struct sl_xfer xf;         /* the try in flight (sl_transfer.h) */
	int status;                /* upstream status */
	struct sl_resp_head uh;    /* upstream response head, filtered */
	int upstream_bad;          /* malformed upstream head */
	int paused;                /* CURL_WRITEFUNC_PAUSE returned */
	size_t pending;            /* size of the refused chunk, framed */
	int client_gone;           /* EOF/RST/EPIPE seen on the client */

	/* The pool: which replica this try went to, and the tries so far. */
	int replica;               /* replica of the current try; -1: none */
	int last_replica;          /* of the last try, for the access log */
	uint64_t tried;            /* replicas tried for this request (bits) */
	int tries;                 /* tries started for this request */
	int reported;              /* the current try's outcome was reported */
	int retry_next;            /* busy head: the replica picked for the
	                            * next try (slot held); -1: none */
	int busy_code;             /* that head's status */
	int affinity;              /* 0: none; 1 + enum sl_aff_outcome */
	ev_tstamp t_upstream;      /* last upstream activity */
	ev_tstamp t_client;        /* last client progress while bytes wait */

	/* Tokens: what the response cost (sl_meter.h). */
	struct sl_meter meter;

	/* Accounting for the current request (metrics, access log). */
	int req_active;            /* a request is being answered */
	enum sl_end end;           /* how it ended, when decided early */
	ev_tstamp t_start;         /* request began (first byte or head) */
	ev_tstamp t_first;         /* first response byte relayed; 0: none */
	ev_tstamp t_content;       /* its first content reached the client's
	                            * buffer (conn_flush); 0: none */
	int resp_sse;              /* the relayed response is an event stream */
	ev_tstamp t_pause;         /* current pause began */
	ev_tstamp paused_total;
	uint64_t bytes_out;        /* bytes written to the client */

	TAILQ_ENTRY(sl_conn) dirty_entry;
	int dirty;                 /* on w->dirty: bytes to flush this turn */
	TAILQ_ENTRY(sl_conn) idle_entry;
	int idle_listed;           /* on w->idle: was idle after a response */

	int depth;                 /* entry points on the stack */
	int dead;                  /* closed; freed when depth drops to 0 */
};

static void conn_on_read(struct ev_loop *, ev_io *, int);
static void conn_on_write(struct ev_loop *, ev_io *, int);
static void conn_on_timer(struct ev_loop *, ev_timer *, int);
static void conn_process(struct sl_conn *);
static void conn_close(struct sl_conn *, enum sl_close why);
static int conn_flush(struct sl_conn *);
static void conn_after_write(struct sl_conn *);
static void conn_timer_update(struct sl_conn *);
static void conn_usage_charge(struct sl_conn *);
static void conn_queue_charge(struct sl_conn *);
static void conn_queue_charge_running(struct sl_conn *);
static void conn_usage_head(struct sl_conn *);
static void conn_usage_reset(struct sl_conn *);
static void conn_unref(struct sl_conn *);
static void conn_mrw_free(struct sl_conn *);
static void conn_mrw_head(struct sl_conn *);
static void conn_tls_failed(struct sl_conn *, enum sl_tls_err);

/* ---- small helpers --------------------------------------------------- */

static void
conn_set_state(struct sl_conn *c, enum conn_state s)
{
	sl_debug("conn %d: %s -> %s", c->fd, state_names[c->state], state_names[s]);
	c->state = s;
	conn_timer_update(c);
	/*
	 * A stream's exchange that can take input again (admitted after a
	 * wait, say) goes on with what its client already sent: no socket
	 * will say so.
	 */
	if (c->fr != NULL && c->reading && c->xin_off < c->xin_len &&
	    (s == CS_HEAD || s == CS_BODY || s == CS_LOCAL))
		ev_feed_event(c->w->loop, &c->rio, EV_READ);
}

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

static void
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

static void
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
static void
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

static void
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
static void
conn_mark_dirty(struct sl_conn *c)
{
	if (!c->dirty) {
		TAILQ_INSERT_TAIL(&c->w->dirty, c, dirty_entry);
		c->dirty = 1;
	}
}

/* Give the tenant slot back; safe to call on every path, acts once. */
static void
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

/* The upstream of the current request: valid once its body is read. */
static size_t
conn_upstream_idx(const struct sl_conn *c)
{
	return c->up_idx;
}

/* "X-Sluice-Model: NAME\r\n" for a request routed by model. */
static int conn_head_model(struct sl_conn *);
static int conn_fallback_find(struct sl_conn *, enum sl_fb_cause, int *,
    int *);

/*
 * The current try ended without a response status of its own (code is
 * SL_CODE_CONNECT, _TIMEOUT or _RESET): count it for its replica, once.
 */
static void
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
static void
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
static void
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

static int
conn_head_model(struct sl_conn *c)
{
	const char *name;

	if (c->model < 0)
		return 0;
	name = c->w->cfg->models[c->model].name;
	if (SL_HEAD_LIT(&c->rh, "X-Sluice-Model: ") == -1 ||
	    sl_head_add(&c->rh, name, strlen(name)) == -1)
		return -1;
	return SL_HEAD_LIT(&c->rh, "\r\n");
}

/* ---- local responses ------------------------------------------------- */

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
static void
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
	blen = sl_err_body(body, sizeof(body), e, message);
	sl_err_headers(extra, sizeof(extra), e, retry_after);
	sl_debug("conn %d: %d %s", c->fd, r->status, r->code);
	conn_local_answer(c, r->status, extra, body, blen,
	    (r->flags & SL_ERR_CLOSE) != 0);
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

/* ---- connection lifecycle -------------------------------------------- */

/*
 * What every exchange starts with, on a socket of its own (HTTP/1.x) or on
 * a stream (fd is its connection's, for the logs; rio is then never
 * started, only fed).
 */
static void
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
	ev_io_init(&c->rio, conn_on_read, fd, EV_READ);
	ev_io_init(&c->wio, conn_on_write, fd, EV_WRITE);
	ev_init(&c->timer, conn_on_timer);
	c->rio.data = c->wio.data = c->timer.data = c;
	TAILQ_INSERT_TAIL(&w->conns, c, entry);
	c->state = CS_HEAD;
	c->t_req = ev_now(w->loop);
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
	r.proto = c->fr != NULL ? "h2" : "h1";
	sl_access_write(w->access_fd, &r);
}

/* The shared model slot the request counts under: 0 ("-") when none. */
static size_t
conn_model_slot(const struct sl_conn *c)
{
	return c->model >= 0 && c->w->model_slot != NULL ?
	    c->w->model_slot[c->model] : 0;
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
static void
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
	/* The real time: a refusal is answered within one loop iteration. */
	now = ev_time();
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
}

static void
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

static void
conn_close(struct sl_conn *c, enum sl_close why)
{
	struct sl_worker *w = c->w;

	if (c->dead)
		return;
	sl_debug("conn %d: close (%s) in state %s", c->fd, sl_close_names[why],
	    state_names[c->state]);
	c->dead = 1;
	/*
	 * Upstream first, then the slot, then the log line: the runner never
	 * sees the next admitted stream before this one's close, and once the
	 * access log says a request ended, its slot is free.
	 */
	conn_abort_upstream(c);
	conn_release(c);
	conn_request_end(c, sl_end_of_close(why));
	conn_read_stop(c);
	ev_io_stop(w->loop, &c->rio);   /* and any event fed to it */
	conn_hup_unwatch(c);
	ev_io_stop(w->loop, &c->wio);
	ev_timer_stop(w->loop, &c->timer);
	if (c->fr != NULL) {
		/* A stream: it is reset if it is still open (cut if the
		 * response was not whole); the connection goes on. */
		if (c->fr_ctx != NULL) {
			if (c->xin_raw > 0)
				c->fr->consume(c->fr_ctx, c->xin_raw);
			c->fr->reset(c->fr_ctx, !c->x_eof);
			c->fr_ctx = NULL;
		}
	} else {
		if (c->ssl != NULL) {
			if (!c->client_gone && !c->tls_hs)
				sl_tls_close_notify(c->ssl);
			sl_tls_free(c->ssl);
			c->ssl = NULL;
		}
		if (!c->handed_over)
			close(c->fd);
		c->fd = -1;
		w->nconns--;
	}
	TAILQ_REMOVE(&w->conns, c, entry);
	if (c->dirty) {
		TAILQ_REMOVE(&w->dirty, c, dirty_entry);
		c->dirty = 0;
	}
	conn_idle_unlist(c);
	if (w->draining && w->nconns == 0)
		ev_break(w->loop, EVBREAK_ALL);
	c->depth++;
	conn_unref(c);
}

/*
 * Leave an entry point. The connection is freed here, never in the middle
 * of a call chain that may still look at it.
 */
static void
conn_unref(struct sl_conn *c)
{
	if (--c->depth > 0 || !c->dead)
		return;
	sl_req_free(&c->req);
	free(c->xin);
	free(c->mname);
	free(c->mlit);
	sl_buf_free(&c->out);
	sl_block_put(&c->w->blocks, c->in);
	sl_meter_free(&c->meter);
	sl_head_free(&c->rh);
	sl_resp_head_free(&c->uh);
	free(c);
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
static void
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
 * A stream's flush: the head, once, to the framing, which pulls the body
 * as the client's window allows (sl_exchange_pull); later, a word that
 * more waits. -1 when the stream is gone.
 */
static int
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
 * Write what is pending (response head, then body). Returns 0, or -1 when
 * the client is gone. Safe inside libcurl callbacks: it never calls libcurl.
 */
static int
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

static void
conn_count_uerr(struct sl_conn *c, enum sl_uerr kind)
{
	if (c->tenant < 0)
		return;
	sl_shm_count_uerr(c->w->shm, c->w->row,
	    c->w->upstream_slot[conn_upstream_idx(c)], kind);
}

/* ---- timers ---------------------------------------------------------- */

static double
ms(uint64_t v)
{
	return (double)v / 1000.0;
}

/* Earliest deadline that applies in the current state, or 0 for none. */
static ev_tstamp
conn_deadline(struct sl_conn *c)
{
	const struct sl_config *cfg = c->w->cfg;
	int waiting = c->rh_off < c->rh.len || sl_buf_len(&c->out) > 0;

	switch (c->state) {
	case CS_HEAD:
		if (c->nreq > 0 && c->req.head_bytes == 0 && c->in_len == 0) {
			if (cfg->timeouts.keepalive_ms == 0)
				return c->t_req;
			return c->t_req + ms(cfg->timeouts.keepalive_ms);
		}
		return c->t_req + ms(cfg->timeouts.client_header_ms);
	case CS_BODY: {
		/* A pause between reads, and the whole body, are both bounded. */
		ev_tstamp idle = c->t_req + ms(cfg->timeouts.client_header_ms);
		ev_tstamp total = c->t_body + ms(cfg->timeouts.client_body_ms);

		return idle < total ? idle : total;
	}
	case CS_ADMIT:
		return 0;   /* the cluster decides within cluster.timeout */
	case CS_UPSTREAM:
		return c->t_upstream + ms(cfg->timeouts.upstream_first_byte_ms);
	case CS_STREAM:
		if (c->paused || (c->xf.easy == NULL && waiting))
			return c->t_client + ms(cfg->timeouts.client_stall_ms);
		if (c->xf.easy != NULL)
			return c->t_upstream + ms(cfg->timeouts.upstream_idle_ms);
		return 0;
	case CS_LOCAL:
		if (waiting)
			return c->t_client + ms(cfg->timeouts.client_stall_ms);
		return c->t_req + ms(cfg->timeouts.client_header_ms);
	case CS_LINGER:
		return c->t_client + LINGER_SECONDS;
	case CS_QUEUED:
		/* The pool's timeout now: a reload's applies to waiters. */
		return c->t_queued +
		    ms((uint64_t)sl_queue_timeout_ms(c->w->queue, c->qpool));
	}
	return 0;
}

static void
conn_timer_update(struct sl_conn *c)
{
	ev_tstamp d = conn_deadline(c), now = ev_now(c->w->loop);

	ev_timer_stop(c->w->loop, &c->timer);
	if (d <= 0)
		return;
	ev_timer_set(&c->timer, d > now ? d - now : 0.0, 0.0);
	ev_timer_start(c->w->loop, &c->timer);
}

static void conn_timer_event(struct sl_conn *);

static void
conn_on_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_conn *c = t->data;

	c->depth++;
	conn_timer_event(c);
	conn_unref(c);
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
	switch (c->state) {
	case CS_HEAD:
		if (c->nreq > 0 && c->req.head_bytes == 0 && c->in_len == 0) {
			conn_close(c, SL_CLOSE_KEEPALIVE);
			return;
		}
		if (c->tls_hs && c->tls_seen) {
			conn_tls_failed(c, SL_TLS_E_TIMEOUT);
			return;
		}
		if (c->req.head_bytes == 0 && c->in_len == 0) {
			/*
			 * Not one byte of a request: a browser's or an SDK's
			 * preconnect, or a port scan. Nobody waits for an
			 * answer; a 408 would only count as an error. Close
			 * it silently and count it apart.
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
			sl_info("conn %d: upstream idle, stream cut", c->fd);
			conn_count_uerr(c, SL_UERR_IDLE);
			if (c->replica >= 0)
				sl_pool_failed(c->w->pools, conn_upstream_idx(c),
				    c->replica);
			conn_close(c, SL_CLOSE_UPSTREAM_IDLE);
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
	case CS_LINGER:
		conn_close(c, SL_CLOSE_TIMEOUT);
		return;
	}
}

/* ---- upstream: libcurl callbacks --------------------------------------- */

/* Build the client's response head from the upstream's. */
static int
conn_build_head(struct sl_conn *c)
{
	int method = c->req.method;

	c->body_allowed = !(method == HTTP_HEAD || c->status < 200 ||
	    c->status == 204 || c->status == 304);
	/* HTTP/2 frames the body itself. */
	c->chunked = c->fr == NULL && c->body_allowed &&
	    c->req.http_major == 1 && c->req.http_minor >= 1;
	if (c->fr == NULL && c->body_allowed && !c->chunked)
		c->close_after = 1;   /* HTTP/1.0: the body ends at close */
	if (!c->req.keep_alive || c->w->draining ||
	    c->w->cfg->timeouts.keepalive_ms == 0)
		c->close_after = 1;
	c->rh.len = c->rh_off = 0;
	if (sl_head_status_line(&c->rh, c->status,
	    c->uh.reason[0] ? c->uh.reason : sl_http_reason(c->status)) == -1 ||
	    sl_head_add(&c->rh, c->uh.block, c->uh.len) == -1)
		return -1;
	if (c->chunked && SL_HEAD_LIT(&c->rh, "Transfer-Encoding: chunked\r\n") == -1)
		return -1;
	if (method == HTTP_HEAD && c->uh.content_length >= 0 && c->status >= 200 &&
	    c->status != 204) {
		/* the length a GET would have (RFC 9110 8.6): kept, nothing follows */
		if (SL_HEAD_LIT(&c->rh, "Content-Length: ") == -1 ||
		    sl_head_add_uint(&c->rh, (unsigned long)c->uh.content_length) == -1 ||
		    SL_HEAD_LIT(&c->rh, "\r\n") == -1)
			return -1;
	}
	if (SL_HEAD_LIT(&c->rh, "X-Accel-Buffering: no\r\n") == -1 ||
	    conn_head_model(c) == -1)
		return -1;
	if (c->uh.is_sse && !c->uh.has_cache_control &&
	    SL_HEAD_LIT(&c->rh, "Cache-Control: no-cache\r\n") == -1)
		return -1;
	if (sl_head_connection(&c->rh, c->close_after) == -1)
		return -1;
	c->head_sent = 1;
	c->t_first = ev_now(c->w->loop);
	return 0;
}

/*
 * The response head is in the client's head: no try follows, so what only
 * a try needed goes. The upstream head's copy, and the request body once
 * libcurl has sent all of it (an upstream may answer before reading the
 * body; libcurl would still be sending from it).
 */
static void
conn_shed_request(struct sl_conn *c)
{
	curl_off_t up = 0;

	sl_resp_head_free(&c->uh);
	if (c->req.body != NULL && c->xf.easy != NULL &&
	    curl_easy_getinfo(c->xf.easy, CURLINFO_SIZE_UPLOAD_T, &up) == CURLE_OK &&
	    (size_t)up == c->req.body_len) {
		free(c->req.body);
		c->req.body = NULL;
		c->req.body_cap = 0;
	}
}

static size_t
upstream_header_cb(char *p, size_t size, size_t nitems, void *arg)
{
	struct sl_conn *c = arg;
	size_t n = size * nitems;

	if (c->client_gone)
		return 0;
	if (c->head_sent) {
		c->t_upstream = ev_now(c->w->loop);
		return n;   /* chunked trailers: not relayed (the body is re-framed) */
	}
	/*
	 * A head line does not restart upstream_first_byte: it bounds the
	 * time to the whole head, so a runner trickling header lines (or 1xx
	 * heads) cannot hold the request past it.
	 */
	switch (sl_resp_head_line(&c->uh, p, n)) {
	case SL_RH_MORE:
		return n;
	case SL_RH_DONE: {
		const struct sl_upstream_conf *up =
		    &c->w->cfg->upstreams[conn_upstream_idx(c)];
		int ra = c->uh.retry_after > 0 ? c->uh.retry_after : 0, r2, wait;

		c->t_upstream = ev_now(c->w->loop);
		c->status = c->uh.status;
		sl_pool_report(c->w->pools, conn_upstream_idx(c), c->replica,
		    c->status, ra);
		c->reported = 1;
		/*
		 * The replica refused the work (429, 502, 503) and nothing has
		 * reached the client: another replica may take it. The next
		 * one is chosen (its slot taken) now, so the head is relayed
		 * after all when none can; the transfer is stopped, and
		 * sl_conn_upstream_done starts the next try.
		 */
		if ((c->status == 429 || c->status == 502 || c->status == 503) &&
		    (up->retry_on & SL_RETRY_BUSY) &&
		    c->tries - c->tries_base <= up->retries &&
		    (r2 = sl_pool_pick(c->w->pools, conn_upstream_idx(c),
		    c->tried, &wait)) >= 0) {
			c->retry_next = r2;
			c->busy_code = c->status;
			return 0;
		}
		/* None in this pool: the next target of the fallback chain. */
		if ((c->status == 429 || c->status == 502 || c->status == 503) &&
		    (r2 = conn_fallback_find(c, SL_FB_BUSY, &c->fb_model,
		    &c->fb_target)) >= 0) {
			c->retry_next = r2;
			c->busy_code = c->status;
			return 0;
		}
		/*
		 * 204 and 304 have no body, whatever the upstream sends after
		 * the head: like HEAD's, their connection is not reused, so no
		 * stray byte becomes another request's response. (libcurl
		 * reads this flag when the transfer ends.)
		 */
		if (c->status == 204 || c->status == 304)
			curl_easy_setopt(c->xf.easy, CURLOPT_FORBID_REUSE, 1L);
		if (conn_build_head(c) == -1)
			break;
		conn_usage_head(c);
		conn_mrw_head(c);
		conn_shed_request(c);
		if (c->state == CS_UPSTREAM)
			conn_set_state(c, CS_STREAM);
		conn_mark_dirty(c);
		return n;
	}
	case SL_RH_BAD:
		break;
	}
	c->upstream_bad = 1;
	return 0;
}

/* ---- tokens: usage read from the response ----------------------------- */

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
	return sl_meter_path(url, ulen) &&
	    sl_json_wide(c->req.body, c->req.body_len);
}

/*
 * Charge the response's tokens (sl_meter_end: once, exact or estimated)
 * to its tenant, its model, the cluster and the fair queue. Called when
 * the response ends, before its last byte is written.
 */
static void
conn_usage_charge(struct sl_conn *c)
{
	uint64_t n[SL_TOKENS_KINDS];

	if (!sl_meter_end(&c->meter, c->status, n))
		return;
	sl_shm_tokens_charge(c->w->shm, c->w->tenant_slot[c->tenant],
	    conn_model_slot(c), sl_mono_sec(), n);
	if (c->w->cluster != NULL)
		sl_cluster_charge(c->w->cluster, c->tenant, n[SL_TOKENS_PROMPT] +
		    n[SL_TOKENS_COMPLETION] + n[SL_TOKENS_ESTIMATED]);
	conn_queue_charge(c);
}

/*
 * The fair queue's service counter of the tenant in the request's pool
 * grows by prompt + 2 x completion tokens, less what its dispatch from
 * the queue charged (the prompt's estimate).
 */
static void
conn_queue_charge(struct sl_conn *c)
{
	size_t u = conn_upstream_idx(c);
	uint64_t cost = c->meter.prompt + 2 * c->meter.completion;

	if (c->w->queue == NULL || !c->w->cfg->upstreams[u].queue.enabled ||
	    cost <= c->q_charged)
		return;
	sl_queue_charge(c->w->queue, c->w->queue_slot[u],
	    c->w->tenant_slot[c->tenant], cost - c->q_charged);
	c->q_charged = cost;   /* a flush after it charges nothing more */
}

/*
 * A running stream's service grows as its tokens are relayed, not only
 * when it ends (VTC charges output as it is produced): at each flush, the
 * prompt's estimate and 2 x the completion estimated from the content
 * relayed so far (sl_usage_estimate), less what was charged. Without it a
 * tenant's running streams did not count until they ended, and a flooder
 * with many of them looked less served than it was (bench/fairness).
 * The response's end charges what the usage says beyond it.
 */
static void
conn_queue_charge_running(struct sl_conn *c)
{
	size_t u;
	uint64_t cost;

	if (c->w->queue == NULL || c->meter.scan == NULL || c->tenant < 0)
		return;
	u = conn_upstream_idx(c);
	if (!c->w->cfg->upstreams[u].queue.enabled)
		return;
	cost = c->meter.prompt_est + 2 * sl_usage_estimate(c->meter.scan->content_bytes);
	if (cost <= c->q_charged)
		return;
	sl_queue_charge(c->w->queue, c->w->queue_slot[u],
	    c->w->tenant_slot[c->tenant], cost - c->q_charged);
	c->q_charged = cost;
}

/* Keep-alive: the next request starts with no accounting (buffer empty). */
static void
conn_usage_reset(struct sl_conn *c)
{
	sl_meter_reset(&c->meter);
	c->affinity = 0;
	c->out.cap = BASE_CAP(c);
}

/*
 * The response head is in, before any body byte: how a counted body is
 * read for its usage (sl_meter_head).
 */
static void
conn_usage_head(struct sl_conn *c)
{
	c->resp_sse = c->uh.is_sse;   /* for the model's latency (conn_flush) */
	sl_meter_head(&c->meter, c->status, c->body_allowed, c->uh.is_sse,
	    c->uh.is_json);
}

/* Append n bytes to the client as one chunk (framed if chunked). */
static int
conn_out_chunk(struct sl_conn *c, const char *p, size_t n)
{
	char hdr[24];
	struct iovec iov[3];

	if (n == 0)
		return 0;
	if (!c->chunked)
		return sl_buf_append(&c->out, p, n);
	iov[0].iov_base = hdr;
	iov[0].iov_len = sl_http_chunk_header(hdr, sizeof(hdr), n);
	iov[1].iov_base = (void *)(uintptr_t)p;
	iov[1].iov_len = n;
	iov[2].iov_base = (void *)(uintptr_t)"\r\n";
	iov[2].iov_len = 2;
	return sl_buf_appendv(&c->out, iov, 3);
}

/*
 * The body ended (or was cut): the scanner gives back what it held, and
 * the tokens are charged before the last bytes go out.
 */
static void
conn_usage_finish(struct sl_conn *c)
{
	struct sl_usage_out o;

	if (c->meter.scan != NULL && c->body_allowed) {
		sl_usage_scan_finish(c->meter.scan, &o);
		if (o.held_len > 0 && sl_buf_space(&c->out) <
		    o.held_len + 2 * CHUNK_FRAMING)
			/* An event held whole, larger than what is left. */
			c->out.cap = sl_buf_len(&c->out) + o.held_len +
			    2 * CHUNK_FRAMING;
		if (o.held_len > 0 && conn_out_chunk(c, o.held, o.held_len) == -1)
			sl_err("conn %d: no room for the stream's last event", c->fd);
	}
	conn_usage_charge(c);
}

/* ---- models: the answer's "model" set back (sl_mrw) ------------------- */

static void
conn_mrw_free(struct sl_conn *c)
{
	c->mrw_on = 0;
	free(c->mlit);
	c->mlit = NULL;
}

/*
 * The response head of a request routed by model is in: when the name
 * sent upstream is not the one the client is to see (the name it sent,
 * or the fallback model's when one answered), a JSON or event-stream
 * body has its "model" set back. An encoded body (the runner ignored
 * the identity asked for) is relayed as it is.
 */
static void
conn_mrw_head(struct sl_conn *c)
{
	const char *shown;
	size_t slen;

	conn_mrw_free(c);
	if (c->model < 0 || c->msent == NULL || !c->body_allowed ||
	    c->uh.encoded || !(c->uh.is_json || c->uh.is_sse))
		return;
	if (c->model == c->mroute && c->mname != NULL) {
		shown = c->mname;
		slen = c->mname_len;
	} else {
		shown = c->w->cfg->models[c->model].name;
		slen = strlen(shown);
	}
	if (strlen(c->msent) == slen && memcmp(c->msent, shown, slen) == 0)
		return;   /* the same name: the bytes pass untouched */
	if ((c->mlit = sl_mrw_literal(shown, slen, &slen)) == NULL) {
		sl_err("conn %d: no memory to set the answer's model back",
		    c->fd);
		return;
	}
	sl_mrw_init(&c->mrw, c->uh.is_sse, c->mlit, slen);
	c->mrw_on = 1;
}

/* A streamed response through the scanner; see upstream_write_cb. */
static size_t
conn_write_scanned(struct sl_conn *c, char *p, size_t n)
{
	struct sl_usage_scan *sc = c->meter.scan;
	struct sl_usage_out o;
	size_t off = 0, k, i, len = 0, need;
	const char *src;
	char *scratch;

	if (!sc->drop)
		return 0;   /* scanned once the bytes are taken (below) */
	/*
	 * What may come out: these bytes and the event held so far. An
	 * event is held only until it is known not to be the usage chunk, so
	 * the stream buffer bounds the rest as always; one event larger than
	 * the whole buffer (at most SL_USAGE_MAX_EVENT) goes through an empty
	 * buffer, stretched for it until it drains.
	 */
	need = n + sc->hold_len;
	if (sl_buf_space(&c->out) < need + 2 * CHUNK_FRAMING) {
		if (sl_buf_len(&c->out) > 0 ||
		    need + 2 * CHUNK_FRAMING <= c->out.cap)
			return need + 2 * CHUNK_FRAMING;
		c->out.cap = need + 2 * CHUNK_FRAMING;
	}
	k = sl_usage_scan_feed(sc, p, n, &o);
	if (k == n && o.held_len == 0 && o.n <= 1) {
		/* the usual read: all taken, one range of it out (or none) */
		src = o.n == 1 ? p + o.range[0].off : p;
		len = o.n == 1 ? o.range[0].len : 0;
	} else {
		if (need > c->w->scan_buf_cap) {
			char *ns = realloc(c->w->scan_buf, need);

			if (ns == NULL)
				return SIZE_MAX;
			c->w->scan_buf = ns;
			c->w->scan_buf_cap = need;
		}
		scratch = c->w->scan_buf;
		for (;;) {
			if (o.held_len > 0) {
				memcpy(scratch + len, o.held, o.held_len);
				len += o.held_len;
			}
			for (i = 0; i < o.n; i++) {
				memcpy(scratch + len, p + off + o.range[i].off,
				    o.range[i].len);
				len += o.range[i].len;
			}
			if ((off += k) == n)
				break;
			k = sl_usage_scan_feed(sc, p + off, n - off, &o);
		}
		src = scratch;
	}
	if (len > 0 && sl_buf_len(&c->out) == 0)
		c->t_client = ev_now(c->w->loop);
	if (conn_out_chunk(c, src, len) == -1)
		return SIZE_MAX;
	if (len > 0)
		conn_mark_dirty(c);
	return 1;
}

static size_t conn_write_body(struct sl_conn *, char *, size_t);

static size_t
upstream_write_cb(char *p, size_t size, size_t nmemb, void *arg)
{
	struct sl_conn *c = arg;
	struct sl_mrw_buf *mb = &c->w->mrw_buf;
	size_t n = size * nmemb, r;
	struct sl_mrw saved;
	int k;

	if (c->client_gone)
		return CURL_WRITEFUNC_ERROR;
	if (!c->mrw_on || !c->head_sent || n == 0)
		return conn_write_body(c, p, n);
	/*
	 * The answer's "model" set back: what the rest of the path sees
	 * (scanner, kept JSON, the client) is the rewritten bytes. A pause
	 * undoes the feed: libcurl hands the same bytes over again.
	 */
	saved = c->mrw;
	if ((k = sl_mrw_feed(&c->mrw, p, n, mb)) == -1) {
		sl_err("conn %d: cannot buffer the response", c->fd);
		c->client_gone = 1;
		return CURL_WRITEFUNC_ERROR;
	}
	if (k == 0)
		r = conn_write_body(c, p, n);
	else if ((r = conn_write_body(c, mb->p, mb->len)) == mb->len)
		r = n;   /* (none at all: only bytes of a replaced value) */
	if (r == CURL_WRITEFUNC_PAUSE)
		c->mrw = saved;
	else if (mb->cap > 65536 && k == 1) {
		free(mb->p);   /* a hostile answer's growth is not kept */
		mb->p = NULL;
		mb->len = mb->cap = 0;
	}
	return r;
}

/* The body bytes to relay (rewritten, if so): n when taken. */
static size_t
conn_write_body(struct sl_conn *c, char *p, size_t n)
{
	size_t hl = 0, total;
	char hdr[24];

	if (c->meter.scan != NULL)
		/* events close together: worth a kept template (sl_usage.h) */
		sl_usage_scan_keep(c->meter.scan,
		    ev_now(c->w->loop) - c->t_upstream < SCAN_KEEP_PACE);
	c->t_upstream = ev_now(c->w->loop);
	if (!c->head_sent) {
		/* Body bytes without a final response head (e.g. after a 101). */
		c->upstream_bad = 1;
		return CURL_WRITEFUNC_ERROR;
	}
	if (!c->body_allowed || n == 0)
		return n;
	if (c->meter.on && c->status / 100 == 2) {
		if (c->meter.scan != NULL) {
			size_t r = conn_write_scanned(c, p, n);

			if (r == SIZE_MAX) {
				sl_err("conn %d: cannot buffer the response", c->fd);
				c->client_gone = 1;
				return CURL_WRITEFUNC_ERROR;
			}
			if (r == 1) {
				/* relayed through the scanner: taken */
				if (c->meter.keep_json)
					sl_meter_keep(&c->meter, p, n);
				return n;
			}
			if (r > 1) {
				/* Full: as below, for what the scanner may emit. */
				c->paused = 1;
				/* An empty buffer always takes it (stretched). */
				c->pending = r > BASE_CAP(c) ? BASE_CAP(c) : r;
				c->t_pause = ev_now(c->w->loop);
				sl_shm_stat_add(c->w->shm, c->w->row, SL_STAT_PAUSES, 1);
				conn_timer_update(c);
				return CURL_WRITEFUNC_PAUSE;
			}
			/* 0: scanned only; relayed as given below. */
		}
	}
	if (c->chunked)
		hl = sl_http_chunk_header(hdr, sizeof(hdr), n);
	total = hl + n + (c->chunked ? 2 : 0);

	if (sl_buf_space(&c->out) < total && sl_buf_len(&c->out) == 0 &&
	    total > c->out.cap)
		/*
		 * One read grown past the whole buffer by the model set back
		 * (a longer name in many small events): an empty buffer takes
		 * it, stretched until it drains, as the scanner's event is.
		 */
		c->out.cap = total;
	if (sl_buf_space(&c->out) < total) {
		/*
		 * Full: take none of it. libcurl keeps the chunk and stops
		 * reading the socket, so TCP pushes back on the upstream.
		 * conn_on_write resumes when it fits. (An empty buffer always
		 * fits one read: cap >= stream_buffer >= CURL_MAX_WRITE_SIZE,
		 * or is stretched for it, above.)
		 */
		c->paused = 1;
		/*
		 * An empty buffer always takes it (stretched, above): wait for
		 * no more room than that, whatever the cap is stretched to now.
		 */
		c->pending = total > BASE_CAP(c) ? BASE_CAP(c) : total;
		c->t_pause = ev_now(c->w->loop);
		sl_shm_stat_add(c->w->shm, c->w->row, SL_STAT_PAUSES, 1);
		conn_timer_update(c);
		return CURL_WRITEFUNC_PAUSE;
	}
	if (c->meter.scan != NULL && !c->meter.scan->drop && c->meter.on &&
	    c->status / 100 == 2) {
		/* Nothing is held or removed: scan what is taken, as given. */
		struct sl_usage_out o;
		size_t off = 0;

		while (off < n)
			off += sl_usage_scan_feed(c->meter.scan, p + off, n - off, &o);
	}
	if (c->meter.keep_json && c->meter.on && c->status / 100 == 2)
		sl_meter_keep(&c->meter, p, n);   /* taken: a paused chunk comes again */
	if (sl_buf_len(&c->out) == 0)
		c->t_client = ev_now(c->w->loop);   /* bytes start waiting now */
	if (sl_buf_append(&c->out, hdr, hl) == -1 ||
	    sl_buf_append(&c->out, p, n) == -1 ||
	    (c->chunked && sl_buf_append(&c->out, "\r\n", 2) == -1)) {
		/* Out of memory (space was checked): fail this stream only. */
		sl_err("conn %d: cannot buffer the response", c->fd);
		c->client_gone = 1;
		return CURL_WRITEFUNC_ERROR;
	}
	conn_mark_dirty(c);
	return n;
}

/* ---- upstream: starting and finishing --------------------------------- */

/*
 * Start a try of the request on replica r of its upstream, whose slot the
 * caller took (sl_pool_pick). Returns 0, or -1 when the transfer could not
 * be started (the slot is given back; the caller answers).
 */
static int
conn_try(struct sl_conn *c, int r)
{
	struct sl_worker *w = c->w;
	const struct sl_xfer_sink sink = { upstream_header_cb, upstream_write_cb,
	    c };

	c->replica = c->last_replica = r;
	c->tried |= 1ULL << r;
	c->tries++;
	c->reported = 0;
	if (sl_xfer_prepare(&c->xf, w->xfers, &sink,
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
 * that target. Returns 0, or -1 when the request was answered here (400,
 * 404 model_not_found; the slot is given back at once).
 */
static int
conn_route_model(struct sl_conn *c)
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
		conn_error(c, SL_ERR_BAD_REQUEST, msg, 0);
		return -1;
	}
	if (sl_model_route(c->w->models, cfg, (size_t)c->tenant, c->req.body,
	    c->req.body_len, ct, ctlen, &r) == -1) {
		conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
		return -1;
	}
	/* For the access log: the name as sent (a 404's too), and as sent on. */
	free(c->mname);
	c->mname = NULL;
	if (r.client_len > 0 && (c->mname = malloc(r.client_len)) != NULL) {
		memcpy(c->mname, r.client, r.client_len);
		c->mname_len = r.client_len;
	}
	c->msent = r.sent;
	if (r.status != 0) {
		conn_error(c, sl_err_find(r.status, r.code, SL_ERR_BAD_REQUEST),
		    r.message, 0);
		return -1;
	}
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
static int
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
 * back, stop it and start one on the fallback chain. Returns 0 when a try
 * started, -1 when the caller answers.
 */
static int
conn_fallback(struct sl_conn *c, enum sl_fb_cause why)
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
		conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
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
 * waiting or answered (503 queue_full); -1 when it may not wait (tenant
 * priority below 0, no queue): the caller answers upstream_unavailable.
 */
static int
conn_enqueue(struct sl_conn *c, int retry_after)
{
	struct sl_worker *w = c->w;
	size_t u = conn_upstream_idx(c), qp = w->queue_slot[u];
	uint64_t h;
	char msg[160];

	switch (sl_queue_enqueue(w->queue, w->row, qp,
	    w->tenant_slot[c->tenant], sl_mono_ms(), c->meter.prompt_est, &h)) {
	case SL_QUEUE_OK:
		break;
	case SL_QUEUE_FULL:
		snprintf(msg, sizeof(msg), "every replica of upstream '%s' is "
		    "full and its queue too", w->cfg->upstreams[u].name);
		conn_error(c, SL_ERR_QUEUE_FULL, msg, retry_after);
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

/* The request is read whole: build its upstream head, choose a replica. */
static void
conn_start_upstream(struct sl_conn *c)
{
	const struct sl_config *cfg = c->w->cfg;
	const struct sl_upstream_conf *up;
	int r, retry_after;

	if (conn_route_model(c) == -1)
		return;
	up = &cfg->upstreams[conn_upstream_idx(c)];
	if (conn_body_wide(c, up)) {
		conn_error(c, SL_ERR_BAD_REQUEST,
		    "request body must be UTF-8 JSON", 0);
		return;
	}
	sl_meter_request(&c->meter, cfg->usage.enabled, cfg->usage.inject,
	    &c->req);
	if (conn_inject_priority(c, up) == -1 ||
	    sl_xfer_headers(&c->xf, c->w->xfers, conn_upstream_idx(c), &c->req,
	    c->peer, c->meter.on || c->model >= 0) == -1) {
		conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
		return;
	}
	/* The upstream head is built: the client's is not needed any more. */
	sl_req_shed_head(&c->req);
	c->tried = 0;
	c->tries = c->tries_base = 0;
	c->q_charged = 0;
	if (conn_queue_in_use(c)) {
		/* Others wait for this pool: no overtaking them. */
		r = -1;
		retry_after = 1;
	} else if (c->req.method == HTTP_POST && up->balance ==
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
	if (r < 0 && c->model >= 0 && conn_fallback(c, SL_FB_NO_REPLICA) == 0)
		return;   /* another model's or target's pool took it */
	if (r < 0 && sl_pool_queueable(c->w->pools, conn_upstream_idx(c)) &&
	    conn_enqueue(c, retry_after) == 0)
		return;   /* waiting, or answered 503 queue_full */
	if (r < 0) {
		char msg[160];

		/* Like a full tenant: answer at once, free the slot at once. */
		snprintf(msg, sizeof(msg), "no replica of upstream '%s' can take "
		    "the request now (down, ejected, busy or at capacity)",
		    up->name);
		conn_error(c, SL_ERR_UPSTREAM_UNAVAILABLE, msg, retry_after);
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
		conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
}

/*
 * Move the request to replica r2 (its slot taken by sl_pool_pick): count
 * why, end the current try, start the next. Answers 502 itself when the
 * next try cannot start.
 */
static void
conn_next_try(struct sl_conn *c, int r2, enum sl_retry_reason why)
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
		conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
}

/*
 * A try failed before any response byte reached the client: report it, and
 * move the request to another replica when the pool's policy allows it
 * (retry_on, retries). Returns 0 when a next try started, -1 when the
 * caller answers the failure.
 */
static int
conn_retry(struct sl_conn *c, enum sl_uerr kind, CURLcode result)
{
	const struct sl_upstream_conf *up =
	    &c->w->cfg->upstreams[conn_upstream_idx(c)];
	enum sl_retry_reason why;
	int r2, wait;

	conn_report_try(c, kind == SL_UERR_CONNECT ? SL_CODE_CONNECT :
	    SL_CODE_RESET);
	if (kind == SL_UERR_CONNECT) {
		if (!(up->retry_on & SL_RETRY_CONNECT))
			return conn_fallback(c, SL_FB_CONNECT);
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
			return conn_fallback(c, SL_FB_STARTED);
		why = SL_RETRY_R_EMPTY;
	} else
		return conn_fallback(c, SL_FB_STARTED);
	/* No replica of this pool may try it again: the fallback chain may. */
	if (c->tries - c->tries_base > up->retries ||
	    (r2 = sl_pool_pick(c->w->pools,
	    conn_upstream_idx(c), c->tried, &wait)) < 0)
		return conn_fallback(c, why == SL_RETRY_R_CONNECT ?
		    SL_FB_CONNECT : SL_FB_STARTED);
	conn_next_try(c, r2, why);
	return 0;
}

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
		int r2 = c->retry_next;

		c->retry_next = -1;
		if (c->fb_model >= 0) {
			/* A busy head and no other replica: a fallback target. */
			int m = c->fb_model, t = c->fb_target;

			c->fb_model = -1;
			conn_stop_transfer(c);
			if (conn_fallback_switch(c, m, t) == -1) {
				sl_pool_release(c->w->pools,
				    c->w->cfg->models[m].targets[t].upstream_idx, r2);
				conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
			} else if (conn_try(c, r2) == -1)
				conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
			goto out;
		}
		conn_next_try(c, r2, SL_RETRY_R_BUSY);
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
		} else if (conn_retry(c, kind, result) == 0) {
			goto out;
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
		/* Mid-stream: deliver what arrived, then close, no last chunk. */
		sl_info("conn %d: upstream cut the stream: %s", c->fd,
		    curl_easy_strerror(result));
		conn_usage_finish(c);
		c->close_after = 1;
		c->resp_done = 1;
		c->chunked = 0;
		if (conn_flush(c) == -1) {
			conn_close(c, SL_CLOSE_CLIENT_GONE);
			goto out;
		}
		if (c->rh_off == c->rh.len && sl_buf_len(&c->out) == 0)
			conn_close(c, SL_CLOSE_UPSTREAM_ERROR);
		else
			conn_timer_update(c);
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

/* ---- request side ---------------------------------------------------- */

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

/* Find the tenant whose key is the bearer token; -1 if none. */
static int
conn_find_tenant(struct sl_conn *c)
{
	const char *v, *tok;
	size_t vlen, tlen;

	if ((v = sl_req_header(&c->req, "authorization", &vlen)) == NULL)
		return -1;
	if ((tok = sl_http_bearer(v, vlen, &tlen)) == NULL)
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

static void conn_admitted(struct sl_conn *);

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
	conn_process(c);   /* bytes read while it waited */
	/* Reading stopped if they filled the input buffer meanwhile. */
	if (!c->dead && c->in_len < CONN_IN_SIZE && c->state != CS_LINGER)
		conn_read_start(c);
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
			conn_send_small(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
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

/* No input waits: the input block goes back to the worker's pool. */
static void
conn_in_release(struct sl_conn *c)
{
	if (c->in != NULL && c->in_len == 0 && !c->dead) {
		sl_block_put(&c->w->blocks, c->in);
		c->in = NULL;
	}
}

static void conn_process_input(struct sl_conn *);

/* Feed buffered input to the parser and act on what it finds. */
static void
conn_process(struct sl_conn *c)
{
	conn_process_input(c);
	conn_in_release(c);
}

static void
conn_process_input(struct sl_conn *c)
{
	size_t n;

	for (;;) {
		if (c->dead)
			return;
		if (c->state != CS_HEAD && c->state != CS_BODY &&
		    !(c->state == CS_LOCAL && c->req.state != SL_REQ_DONE &&
		    c->req.state != SL_REQ_ERROR))
			return;
		n = c->in_len > 0 ? sl_req_feed(&c->req, c->in, c->in_len) : 0;
		if (n > 0) {
			memmove(c->in, c->in + n, c->in_len - n);
			c->in_len -= n;
		}
		switch (c->req.state) {
		case SL_REQ_ERROR:
			if (c->state == CS_LOCAL) {
				/* Discarding a refused body failed: just close. */
				c->close_after = 1;
				conn_after_write(c);
				return;
			}
			conn_req_error(c);
			return;
		case SL_REQ_HEAD_DONE:
			if (c->state == CS_HEAD)
				conn_on_head(c);
			continue;
		case SL_REQ_DONE:
			if (c->state == CS_BODY) {
				conn_start_upstream(c);
				return;
			}
			if (c->state == CS_LOCAL) {
				conn_after_write(c);
				return;
			}
			return;
		default:
			if (n == 0)
				return;   /* need more bytes */
			continue;
		}
	}
}

/* ---- libev callbacks --------------------------------------------------- */

static void conn_read_event(struct sl_conn *);

/*
 * A stream's request bytes into the input buffer, as a socket's reads
 * would put them, while the exchange takes them; then the client's window
 * opens again for what was taken (all of it once little waits).
 */
static void
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

static void
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
static void
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

static void conn_write_event(struct sl_conn *);

static void
conn_on_write(struct ev_loop *loop, ev_io *io, int revents)
{
	struct sl_conn *c = io->data;

	c->depth++;
	conn_write_event(c);
	conn_unref(c);
}

/*
 * After a flush made room: resume a paused transfer once the chunk it
 * refused fits (hysteresis: not at the first free byte). libcurl calls the
 * write callback from inside curl_easy_pause with the kept bytes, which
 * only appends and queues a flush. Never call from a libcurl callback.
 */
static void
conn_maybe_resume(struct sl_conn *c)
{
	if (!c->paused || c->xf.easy == NULL || sl_buf_space(&c->out) < c->pending)
		return;
	c->paused = 0;
	c->paused_total += ev_now(c->w->loop) - c->t_pause;
	conn_timer_update(c);
	curl_easy_pause(c->xf.easy, CURLPAUSE_CONT);
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

/* ---- worker-wide ----------------------------------------------------- */

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

/* A grant for one of w's waiters: its request starts on that replica. */
static void
conn_queue_granted(struct sl_worker *w, const struct sl_queue_grant *g)
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
		return;
	}
	TAILQ_REMOVE(&w->queued, c, qentry);
	c->qhandle = 0;
	c->queued_total += ev_now(w->loop) - c->t_queued;
	c->q_charged = c->meter.prompt_est;   /* sl_queue_enqueue's dispatch cost */
	c->depth++;
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
		conn_error(c, SL_ERR_UPSTREAM_UNAVAILABLE,
		    "the upstream was removed by a reload", 1);
	} else if (conn_try(c, r) == -1)
		conn_error(c, SL_ERR_UPSTREAM_UNREACHABLE, NULL, 0);
	conn_unref(c);
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

void
sl_conn_queue_event(struct sl_worker *w)
{
	struct sl_queue_grant g[32];
	size_t n, i;

	if (w->queue == NULL)
		return;
	do {
		n = sl_queue_collect(w->queue, w->row, g, 32, sl_mono_ms());
		for (i = 0; i < n; i++)
			conn_queue_granted(w, &g[i]);
	} while (n == 32);
	sl_conn_flush_dirty(w);
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

/* ---- exchanges of HTTP/2 streams (sl_exchange.h) ---------------------- */

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

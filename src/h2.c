/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * HTTP/2 framing: nghttp2 over a TLS connection whose ALPN chose h2.
 *
 * The connection owns the socket, the TLS state, the nghttp2 session and a
 * small output buffer; each stream owns one exchange (sl_exchange.h), which
 * does everything a request needs exactly as for HTTP/1.1. What stays here:
 * turning a decoded head into request bytes, pulling response bytes as the
 * stream's window allows, flow control on the request side (a stream's
 * window opens again only as its exchange takes the bytes, so a client
 * cannot make sluice hold more than a window per stream; one answered
 * before its body ended is reset without error, and what it held goes back
 * to the connection's window, so it costs the other streams nothing), the
 * protocol's limits (h2_max_streams, header list size, nghttp2's flood and
 * rapid reset limits set explicitly) and their counters.
 *
 * nghttp2 is driven in memory (mem_recv/mem_send): reads and writes go
 * through sl_tls like the HTTP/1.1 connection's. Nothing calls mem_send
 * from inside an nghttp2 callback: a stream that has something to send
 * feeds the connection's write watcher, which sends once the callbacks of
 * this loop iteration are done.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/sockios.h>

#include <ev.h>
#include <nghttp2/nghttp2.h>

#include "sl_buf.h"
#include "sl_exchange.h"
#include "sl_h2.h"
#include "sl_log.h"
#include "sl_shm.h"
#include "sl_tls.h"
#include "sl_worker_state.h"

#define OUT_BATCH 16384           /* frames gathered before one write */
#define MAX_HEADERS 128           /* response header lines turned into nv */
#define LINGER_SECONDS 2.0        /* a closing connection's look at what the
                                   * client has not taken yet (h2_linger) */
/*
 * A stream gives the client's window back once it holds less than this of
 * its request, not yet taken by its exchange: at most about two windows.
 */
#define XIN_LOW (64 * 1024)

struct h2_stream {
	TAILQ_ENTRY(h2_stream) entry;
	struct sl_h2 *h;
	int32_t id;
	struct sl_conn *x;        /* its exchange; NULL before the head or
	                           * once the exchange ended */
	char *method, *path, *authority;
	char *head;               /* the regular header lines so far */
	size_t hlen, hcap, hsize;
	int has_cl;               /* content-length given */
	int chunked;              /* the body goes to the exchange chunked */
	int head_done;
	int deferred;             /* the data source said DEFERRED */
	int ended;                /* our END_STREAM went out */
	int responded;            /* the exchange's head went out */
	/*
	 * Request bytes the exchange did not take yet; fed from fio (never
	 * started, only fed) as the exchange takes input again.
	 */
	char *xin;
	size_t xin_len, xin_off, xin_cap;
	size_t xin_raw;           /* flow-controlled bytes not yet given back */
	ev_io fio;
};

struct sl_h2 {
	TAILQ_ENTRY(sl_h2) entry;
	struct sl_worker *w;
	int fd;
	void *ssl;
	char peer[64];
	nghttp2_session *s;
	ev_io rio, wio;
	ev_timer timer;
	int send_fed;             /* a send is queued for this iteration */
	int rwant;                /* a read waits for the socket to be writable */
	char *wbuf;               /* frames waiting for the socket */
	size_t wlen, woff, wcap;
	TAILQ_HEAD(, h2_stream) streams;
	size_t nexch;             /* streams with an exchange */
	ev_tstamp t_active;       /* last time a stream ended or began */
	ev_tstamp t_wmove;        /* last time output moved */
	uint64_t resets;          /* RST_STREAM frames the client sent */
	int counted;              /* its end is counted already */
	int goaway;
	int linger;               /* the session is over, the client still
	                           * reads: h2_linger */
	ev_tstamp t_linger;       /* its next look */
	size_t outq;              /* bytes the kernel held for the client then */
	int depth, dead;
};

_Static_assert(SL_H2_E_MAX == SL_STAT_H2_ERRS, "sl_shm.h counts each reason of enum sl_h2_err");

static const char *const err_names[SL_H2_E_MAX] = {
	"protocol", "flow_control", "frame_size", "compression",
	"refused_stream", "stream_closed", "flood", "rapid_reset", "header_size",
	"bad_preface", "settings_timeout", "other"
};

const char *
sl_h2_err_name(enum sl_h2_err e)
{
	return (unsigned)e < SL_H2_E_MAX ? err_names[e] : "other";
}

static void h2_close(struct sl_h2 *);
static void h2_unref(struct sl_h2 *);
static void h2_linger(struct sl_h2 *);
static void h2_want_send(struct sl_h2 *);
static void h2_timer_update(struct sl_h2 *);
static int h2_send(struct sl_h2 *);
static ssize_t h2_read_data(nghttp2_session *, int32_t, uint8_t *, size_t,
    uint32_t *, nghttp2_data_source *, void *);

static void
h2_count(struct sl_h2 *h, enum sl_h2_err e)
{
	sl_debug("h2 %d: protocol error: %s", h->fd, sl_h2_err_name(e));
	sl_shm_stat_add(h->w->shm, h->w->row, SL_STAT_H2_ERR_FIRST + e, 1);
}

/* An error code we (nghttp2, for us) sent, as a counter; -1: not one. */
static int
code_err(uint32_t code)
{
	switch (code) {
	case NGHTTP2_PROTOCOL_ERROR:
		return SL_H2_E_PROTOCOL;
	case NGHTTP2_FLOW_CONTROL_ERROR:
		return SL_H2_E_FLOW_CONTROL;
	case NGHTTP2_FRAME_SIZE_ERROR:
		return SL_H2_E_FRAME_SIZE;
	case NGHTTP2_COMPRESSION_ERROR:
		return SL_H2_E_COMPRESSION;
	case NGHTTP2_REFUSED_STREAM:
		return SL_H2_E_REFUSED_STREAM;
	case NGHTTP2_STREAM_CLOSED:
		return SL_H2_E_STREAM_CLOSED;
	case NGHTTP2_ENHANCE_YOUR_CALM:
		return SL_H2_E_FLOOD;
	case NGHTTP2_SETTINGS_TIMEOUT:
		return SL_H2_E_SETTINGS_TIMEOUT;
	default:
		return -1;
	}
}

/* ---- the exchange's side: sl_framing ---------------------------------- */

/*
 * The exchange's head (HTTP/1.1 text we built) as HTTP/2 fields: names in
 * lower case, the connection's own fields dropped (RFC 9113 8.2.2).
 */
static int
h2_respond(struct h2_stream *st, const char *head, size_t len, int body)
{
	struct sl_h2 *h = st->h;
	nghttp2_nv nv[MAX_HEADERS];
	char status[4], *copy, *p, *end, *line;
	size_t n = 0;
	nghttp2_data_provider prd;
	int rv;

	if (len < 13 || memcmp(head, "HTTP/1.1 ", 9) != 0)
		return -1;
	if ((copy = malloc(len + 1)) == NULL)
		return -1;
	memcpy(copy, head, len);
	copy[len] = '\0';
	memcpy(status, copy + 9, 3);
	status[3] = '\0';
	nv[n++] = (nghttp2_nv){ (uint8_t *)":status", (uint8_t *)status, 7, 3,
	    NGHTTP2_NV_FLAG_NONE };
	p = strstr(copy, "\r\n");
	end = copy + len;
	while (p != NULL && p + 2 < end && n < MAX_HEADERS) {
		char *colon, *v, *q;

		line = p + 2;
		if ((p = strstr(line, "\r\n")) == NULL || p == line)
			break;
		*p = '\0';
		if ((colon = strchr(line, ':')) == NULL)
			continue;
		*colon = '\0';
		for (q = line; *q != '\0'; q++)
			*q = (char)tolower((unsigned char)*q);
		if (strcmp(line, "connection") == 0 ||
		    strcmp(line, "keep-alive") == 0 ||
		    strcmp(line, "proxy-connection") == 0 ||
		    strcmp(line, "transfer-encoding") == 0 ||
		    strcmp(line, "upgrade") == 0)
			continue;
		for (v = colon + 1; *v == ' ' || *v == '\t'; v++)
			;
		nv[n++] = (nghttp2_nv){ (uint8_t *)line, (uint8_t *)v,
		    strlen(line), strlen(v), NGHTTP2_NV_FLAG_NONE };
	}
	prd.source.ptr = st;
	prd.read_callback = h2_read_data;
	rv = nghttp2_submit_response(h->s, st->id, nv, n, body ? &prd : NULL);
	free(copy);   /* nghttp2 copied the fields */
	if (rv != 0)
		return -1;
	h2_want_send(h);
	return 0;
}

/*
 * The exchange has output: its head, once (the body then pulled as the
 * window allows, h2_read_data), later a word that more waits.
 */
static int
fr_send(void *ctx)
{
	struct h2_stream *st = ctx;
	const char *head;
	size_t len;
	int body;

	if (!st->responded) {
		if (!sl_exchange_head(st->x, &head, &len, &body))
			return 0;   /* no head yet */
		if (h2_respond(st, head, len, body) == -1)
			return -1;
		st->responded = 1;
		sl_exchange_head_sent(st->x);
		return 0;
	}
	if (st->deferred) {
		st->deferred = 0;
		nghttp2_session_resume_data(st->h->s, st->id);
	}
	h2_want_send(st->h);
	return 0;
}

/* The exchange takes input again: what the stream holds is fed from fio. */
static void
fr_input(void *ctx)
{
	struct h2_stream *st = ctx;

	if (st->xin_off < st->xin_len)
		ev_feed_event(st->h->w->loop, &st->fio, EV_READ);
}

static void
fr_reset(void *ctx, int cut)
{
	struct h2_stream *st = ctx;
	struct sl_h2 *h = st->h;

	/* What it held goes back to the window: the stream ends here. */
	if (st->xin_raw > 0) {
		nghttp2_session_consume(h->s, st->id, st->xin_raw);
		st->xin_raw = 0;
	}
	if (st->x != NULL) {
		st->x = NULL;
		h->nexch--;
		h->t_active = ev_now(h->w->loop);
	}
	nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id,
	    cut ? NGHTTP2_INTERNAL_ERROR : NGHTTP2_NO_ERROR);
	h2_want_send(h);
	h2_timer_update(h);
}

static const struct sl_framing h2_framing = {
	"h2", 0, fr_send, fr_input, NULL, NULL, fr_reset
};

/*
 * The stream's request bytes to its exchange while it takes them; then the
 * client's window opens again for what was taken (all of it once little
 * waits).
 */
static void
h2_x_drain(struct h2_stream *st)
{
	struct sl_conn *x;
	size_t k;

	while ((x = st->x) != NULL && st->xin_off < st->xin_len) {
		sl_exchange_hold(x);
		k = sl_exchange_feed(x, st->xin + st->xin_off,
		    st->xin_len - st->xin_off);
		sl_exchange_unhold(x);
		if (k == 0)
			break;
		st->xin_off += k;
	}
	if (st->xin_off == st->xin_len)
		st->xin_off = st->xin_len = 0;
	if (st->xin_raw > 0 && st->x != NULL &&
	    st->xin_len - st->xin_off < XIN_LOW) {
		nghttp2_session_consume(st->h->s, st->id, st->xin_raw);
		st->xin_raw = 0;
		h2_want_send(st->h);
	}
}

static void
h2_on_feed(struct ev_loop *loop, ev_io *io, int revents)
{
	struct h2_stream *st = io->data;
	struct sl_h2 *h = st->h;

	(void)loop;
	(void)revents;
	h->depth++;
	h2_x_drain(st);
	h2_unref(h);
}

/*
 * Request bytes for the stream's exchange (the head, body, chunk framing);
 * raw is how many of them the client's flow control counted (body bytes),
 * given back as the exchange takes them. -1: more than the request may
 * have (the exchange answers or has ended).
 */
static int
h2_x_input(struct h2_stream *st, const void *p, size_t n, size_t raw)
{
	size_t keep = st->xin_len - st->xin_off;
	/* A head, about two windows and their chunk framing, with room. */
	size_t max = st->h->w->cfg->limits.max_header_bytes + 4 * XIN_LOW;

	if (st->x == NULL)
		return -1;
	if (keep + n > max) {
		sl_err("h2 %d: stream sent past its window", st->h->fd);
		return -1;
	}
	if (st->xin_off > 0 && st->xin_len + n > st->xin_cap) {
		memmove(st->xin, st->xin + st->xin_off, keep);
		st->xin_off = 0;
		st->xin_len = keep;
	}
	if (sl_bytes_reserve(&st->xin, &st->xin_cap, st->xin_len + n, 1024) == -1)
		return -1;
	memcpy(st->xin + st->xin_len, p, n);
	st->xin_len += n;
	st->xin_raw += raw;
	ev_feed_event(st->h->w->loop, &st->fio, EV_READ);
	return 0;
}


/* The data source of a response body: bytes of the exchange's buffer. */
static ssize_t
h2_read_data(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct h2_stream *st = src->ptr;
	size_t n;
	int eof = 0;

	(void)s;
	(void)id;
	(void)ud;
	if (st->x == NULL)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	n = sl_exchange_pull(st->x, buf, len, &eof);
	if (eof)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	else if (n == 0) {
		st->deferred = 1;
		return NGHTTP2_ERR_DEFERRED;
	}
	return (ssize_t)n;
}

/* ---- nghttp2 callbacks ------------------------------------------------ */

static struct h2_stream *
stream_of(struct sl_h2 *h, int32_t id)
{
	return nghttp2_session_get_stream_user_data(h->s, id);
}

static void
stream_free(struct h2_stream *st)
{
	ev_io_stop(st->h->w->loop, &st->fio);   /* a fed event too */
	free(st->xin);
	free(st->method);
	free(st->path);
	free(st->authority);
	free(st->head);
	free(st);
}

static int
on_begin_headers(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	struct sl_h2 *h = ud;
	struct h2_stream *st;

	(void)s;
	if (f->hd.type != NGHTTP2_HEADERS ||
	    f->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	if ((st = calloc(1, sizeof(*st))) == NULL)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	st->h = h;
	st->id = f->hd.stream_id;
	ev_io_init(&st->fio, h2_on_feed, h->fd, EV_READ);
	st->fio.data = st;
	TAILQ_INSERT_TAIL(&h->streams, st, entry);
	nghttp2_session_set_stream_user_data(h->s, st->id, st);
	h->t_active = ev_now(h->w->loop);
	return 0;
}

static int
head_add(struct h2_stream *st, const char *p, size_t n)
{
	if (sl_bytes_reserve(&st->head, &st->hcap, st->hlen + n, 512) == -1)
		return -1;
	memcpy(st->head + st->hlen, p, n);
	st->hlen += n;
	return 0;
}

static char *
dup_n(const uint8_t *p, size_t n)
{
	char *s = malloc(n + 1);

	if (s != NULL) {
		memcpy(s, p, n);
		s[n] = '\0';
	}
	return s;
}

static int
on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
    size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags, void *ud)
{
	struct sl_h2 *h = ud;
	struct h2_stream *st = stream_of(h, f->hd.stream_id);
	char **pseudo = NULL;

	(void)s;
	(void)flags;
	if (st == NULL || st->head_done)
		return 0;   /* trailers: not passed on */
	/* As HTTP/1.1 counts it: "name: value\r\n" (RFC 9113 6.5.2 + 32). */
	st->hsize += nlen + vlen + 4;
	if (st->hsize > h->w->cfg->limits.max_header_bytes) {
		h2_count(h, SL_H2_E_HEADER_SIZE);
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	}
	if (nlen > 0 && name[0] == ':') {
		if (nlen == 7 && memcmp(name, ":method", 7) == 0)
			pseudo = &st->method;
		else if (nlen == 5 && memcmp(name, ":path", 5) == 0)
			pseudo = &st->path;
		else if (nlen == 10 && memcmp(name, ":authority", 10) == 0)
			pseudo = &st->authority;
		if (pseudo != NULL) {
			free(*pseudo);
			if ((*pseudo = dup_n(value, vlen)) == NULL)
				return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
		}
		return 0;
	}
	if (nlen == 14 && memcmp(name, "content-length", 14) == 0)
		st->has_cl = 1;
	if (nlen == 4 && memcmp(name, "host", 4) == 0 && st->authority != NULL)
		return 0;   /* :authority wins (RFC 9113 8.3.1) */
	if (head_add(st, (const char *)name, nlen) == -1 ||
	    head_add(st, ": ", 2) == -1 ||
	    head_add(st, (const char *)value, vlen) == -1 ||
	    head_add(st, "\r\n", 2) == -1)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	return 0;
}

/* The head is whole: the exchange begins with it as HTTP/1.1 bytes. */
static int
stream_begin(struct sl_h2 *h, struct h2_stream *st, int end_stream)
{
	size_t mlen, plen, alen, total;
	char *req, *p;

	st->head_done = 1;
	if (st->method == NULL || st->path == NULL)
		return -1;   /* nghttp2 let it through only for CONNECT */
	st->chunked = !end_stream && !st->has_cl;
	mlen = strlen(st->method);
	plen = strlen(st->path);
	alen = st->authority != NULL ? strlen(st->authority) : 0;
	total = mlen + plen + alen + st->hlen + 64;
	if ((req = malloc(total)) == NULL)
		return -1;
	p = req;
	memcpy(p, st->method, mlen);
	p += mlen;
	*p++ = ' ';
	memcpy(p, st->path, plen);
	p += plen;
	memcpy(p, " HTTP/1.1\r\n", 11);
	p += 11;
	if (st->authority != NULL) {
		memcpy(p, "Host: ", 6);
		memcpy(p + 6, st->authority, alen);
		memcpy(p + 6 + alen, "\r\n", 2);
		p += alen + 8;
	}
	if (st->hlen > 0)
		memcpy(p, st->head, st->hlen);
	p += st->hlen;
	if (st->chunked) {
		memcpy(p, "Transfer-Encoding: chunked\r\n", 28);
		p += 28;
	}
	memcpy(p, "\r\n", 2);
	p += 2;
	free(st->head);
	st->head = NULL;
	st->hlen = st->hcap = 0;
	st->x = sl_exchange_open(h->w, &h2_framing, st, h->fd, h->peer,
	    ev_now(h->w->loop), 0);
	if (st->x == NULL) {
		free(req);
		return -1;
	}
	h->nexch++;
	h2_timer_update(h);
	h2_x_input(st, req, (size_t)(p - req), 0);
	free(req);
	return 0;
}

static int
on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	struct sl_h2 *h = ud;
	struct h2_stream *st;
	int end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;

	(void)s;
	if (f->hd.type == NGHTTP2_RST_STREAM)
		h->resets++;
	if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA)
		return 0;
	if ((st = stream_of(h, f->hd.stream_id)) == NULL)
		return 0;
	if (f->hd.type == NGHTTP2_HEADERS && !st->head_done) {
		if (stream_begin(h, st, end) == -1) {
			nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id,
			    NGHTTP2_REFUSED_STREAM);
			return 0;
		}
		return 0;
	}
	if (end && st->x != NULL && st->chunked)
		h2_x_input(st, "0\r\n\r\n", 5, 0);
	return 0;
}

static int
on_data_chunk(nghttp2_session *s, uint8_t flags, int32_t id,
    const uint8_t *data, size_t len, void *ud)
{
	struct sl_h2 *h = ud;
	struct h2_stream *st = stream_of(h, id);
	char line[32];
	int n;

	(void)flags;
	if (st == NULL || st->x == NULL) {
		/* Nobody takes it: the connection's window must not shrink. */
		nghttp2_session_consume(s, id, len);
		return 0;
	}
	if (st->chunked) {
		n = snprintf(line, sizeof(line), "%zx\r\n", len);
		if (h2_x_input(st, line, (size_t)n, 0) == -1 ||
		    h2_x_input(st, data, len, len) == -1)
			goto refused;
		h2_x_input(st, "\r\n", 2, 0);
	} else if (h2_x_input(st, data, len, len) == -1)
		goto refused;
	return 0;
refused:
	/*
	 * The exchange took none of it (it will never count it as taken): the
	 * connection's window gets it back now, so that other streams do not
	 * pay for this one; the stream's stays shut, which keeps its bound.
	 */
	nghttp2_session_consume_connection(s, len);
	return 0;
}

static int
on_frame_send(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	struct sl_h2 *h = ud;
	struct h2_stream *st;
	int e;

	switch (f->hd.type) {
	case NGHTTP2_GOAWAY:
		if (h->counted)
			break;
		/*
		 * nghttp2 (1.52 with Debian's CVE-2023-44487 fix) ends a
		 * rapid reset with INTERNAL_ERROR: told apart by the resets.
		 */
		if (f->goaway.error_code == NGHTTP2_INTERNAL_ERROR &&
		    h->resets >= 1000)
			h2_count(h, SL_H2_E_RAPID_RESET);
		else if ((e = code_err(f->goaway.error_code)) >= 0)
			h2_count(h, (enum sl_h2_err)e);
		else if (f->goaway.error_code != NGHTTP2_NO_ERROR)
			h2_count(h, SL_H2_E_OTHER);
		break;
	case NGHTTP2_RST_STREAM:
		if ((e = code_err(f->rst_stream.error_code)) >= 0)
			h2_count(h, (enum sl_h2_err)e);
		break;
	case NGHTTP2_HEADERS:
	case NGHTTP2_DATA:
		if (!(f->hd.flags & NGHTTP2_FLAG_END_STREAM) ||
		    (st = stream_of(h, f->hd.stream_id)) == NULL)
			break;
		st->ended = 1;
		/*
		 * The response is complete and the request is not (an answer
		 * given before its body ended: 413, 400, 401, 429; an exchange
		 * takes a body whole before it asks a runner, so nothing else
		 * ends first). RFC 9113 8.1: ask the client to stop sending,
		 * without error. Until it does, the stream's window stays shut
		 * and what it held is given back to the connection as the stream
		 * closes (on_stream_close), and nghttp2 gives back the
		 * connection's window for DATA on a closed stream itself.
		 */
		if (nghttp2_session_get_stream_remote_close(s, st->id) == 0)
			nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, st->id,
			    NGHTTP2_NO_ERROR);
		break;
	default:
		break;
	}
	return 0;
}

static int
on_stream_close(nghttp2_session *s, int32_t id, uint32_t code, void *ud)
{
	struct sl_h2 *h = ud;
	struct h2_stream *st = stream_of(h, id);
	struct sl_conn *x;

	if (st == NULL)
		return 0;
	nghttp2_session_set_stream_user_data(h->s, id, NULL);
	TAILQ_REMOVE(&h->streams, st, entry);
	if ((x = st->x) != NULL) {
		st->x = NULL;
		h->nexch--;
		sl_exchange_closed(x, code == NGHTTP2_NO_ERROR && st->ended);
	}
	/* Body bytes never taken: no longer the stream's, still the
	 * connection's window. */
	if (st->xin_raw > 0)
		nghttp2_session_consume_connection(s, st->xin_raw);
	h->t_active = ev_now(h->w->loop);
	stream_free(st);
	h2_timer_update(h);
	return 0;
}

/* ---- the connection --------------------------------------------------- */

/*
 * The transport: TLS, or the plain socket when ssl is NULL (only the fuzz
 * target does that: the listener never offers h2c). Results as sl_tls's.
 */
static ssize_t
h2_recv(struct sl_h2 *h, void *buf, size_t len)
{
	ssize_t n;

	if (h->ssl != NULL)
		return sl_tls_read(h->ssl, buf, len);
	n = read(h->fd, buf, len);
	if (n > 0)
		return n;
	if (n == 0)
		return SL_TLS_CLOSED;
	return errno == EAGAIN || errno == EINTR ? SL_TLS_WANT_READ : SL_TLS_ERROR;
}

static ssize_t
h2_write(struct sl_h2 *h, const void *p, size_t len)
{
	struct iovec v = { (void *)p, len };
	ssize_t n;

	if (h->ssl != NULL)
		return sl_tls_writev(h->ssl, &v, 1);
	n = write(h->fd, p, len);
	if (n > 0)
		return n;
	return n == -1 && (errno == EAGAIN || errno == EINTR) ?
	    SL_TLS_WANT_WRITE : SL_TLS_ERROR;
}

static int
h2_pending(struct sl_h2 *h)
{
	return h->ssl != NULL && sl_tls_pending(h->ssl);
}

static void
h2_unref(struct sl_h2 *h)
{
	if (--h->depth > 0 || !h->dead)
		return;
	free(h->wbuf);
	free(h);
}

/* Queue a send for once this iteration's callbacks are done. */
static void
h2_want_send(struct sl_h2 *h)
{
	if (h->dead || h->linger || h->send_fed)
		return;
	h->send_fed = 1;
	ev_feed_event(h->w->loop, &h->wio, EV_WRITE);
}

/*
 * Write what nghttp2 has, in batches; -1 when the connection closed, or
 * its session is over and it lingers.
 */
static int
h2_send(struct sl_h2 *h)
{
	for (;;) {
		if (h->woff < h->wlen) {
			ssize_t n = h2_write(h, h->wbuf + h->woff, h->wlen - h->woff);

			if (n > 0) {
				h->woff += (size_t)n;
				h->t_wmove = ev_now(h->w->loop);
				continue;
			}
			if (n == SL_TLS_WANT_WRITE || n == SL_TLS_WANT_READ) {
				ev_io_start(h->w->loop, &h->wio);
				h2_timer_update(h);
				return 0;
			}
			h2_close(h);
			return -1;
		}
		h->woff = h->wlen = 0;
		while (h->wlen < OUT_BATCH) {
			const uint8_t *d;
			ssize_t k = nghttp2_session_mem_send(h->s, &d);

			if (k < 0) {
				h2_close(h);
				return -1;
			}
			if (k == 0)
				break;
			if (sl_bytes_reserve(&h->wbuf, &h->wcap,
			    h->wlen + (size_t)k, OUT_BATCH) == -1) {
				h2_close(h);
				return -1;
			}
			memcpy(h->wbuf + h->wlen, d, (size_t)k);
			h->wlen += (size_t)k;
		}
		if (h->dead)
			return -1;   /* a callback of mem_send ended it */
		if (h->wlen == 0)
			break;
	}
	if (!h->rwant)
		ev_io_stop(h->w->loop, &h->wio);
	/* A batch buffer kept idle is 16 KiB per connection: give it back. */
	if (h->wcap > OUT_BATCH * 2 || (h->nexch == 0 && h->wbuf != NULL)) {
		free(h->wbuf);
		h->wbuf = NULL;
		h->wcap = 0;
	}
	if (!nghttp2_session_want_read(h->s) && !nghttp2_session_want_write(h->s)) {
		if (TAILQ_EMPTY(&h->streams))
			h2_linger(h);
		else
			h2_close(h);
		return -1;
	}
	if (h->goaway && TAILQ_EMPTY(&h->streams)) {
		h2_linger(h);
		return -1;
	}
	h2_timer_update(h);
	return 0;
}

/*
 * nghttp2 gave up on the connection (not the preface; a flood): counted,
 * a last GOAWAY that says why if the socket takes it, closed.
 */
static void
h2_fatal(struct sl_h2 *h, ssize_t rv)
{
	uint32_t code = NGHTTP2_PROTOCOL_ERROR;

	if (rv == NGHTTP2_ERR_BAD_CLIENT_MAGIC)
		h2_count(h, SL_H2_E_BAD_PREFACE);
	else if (rv == NGHTTP2_ERR_FLOODED ||
	    rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS) {
		h2_count(h, SL_H2_E_FLOOD);
		code = NGHTTP2_ENHANCE_YOUR_CALM;
	} else
		h2_count(h, SL_H2_E_OTHER);
	h->counted = 1;   /* the GOAWAY below is not counted again */
	if (rv != NGHTTP2_ERR_BAD_CLIENT_MAGIC &&
	    nghttp2_session_terminate_session(h->s, code) == 0)
		h2_send(h);
	h2_close(h);
}

static void
h2_read(struct sl_h2 *h)
{
	static uint8_t buf[16384];
	int i;

	for (i = 0; i < 8 && !h->dead; i++) {
		ssize_t n = h2_recv(h, buf, sizeof(buf)), rv;

		if (n > 0) {
			rv = nghttp2_session_mem_recv(h->s, buf, (size_t)n);
			if (rv < 0) {
				h2_fatal(h, rv);
				return;
			}
			if ((size_t)n < sizeof(buf) && !h2_pending(h))
				return;
			continue;
		}
		if (n == SL_TLS_WANT_READ)
			return;
		if (n == SL_TLS_WANT_WRITE) {
			h->rwant = 1;
			ev_io_start(h->w->loop, &h->wio);
			return;
		}
		h2_close(h);   /* the client closed, or TLS failed */
		return;
	}
	if (!h->dead && h2_pending(h))
		ev_feed_event(h->w->loop, &h->rio, EV_READ);   /* its turn again */
}

/* Bytes the kernel still holds for the client (not yet acknowledged). */
static size_t
h2_outq(struct sl_h2 *h)
{
	int q = 0;

	if (ioctl(h->fd, SIOCOUTQ, &q) == -1 || q < 0)
		return 0;
	return (size_t)q;
}

/*
 * The session is over (GOAWAY sent and its last stream ended, or nghttp2
 * wants nothing more) and every byte of it is with the kernel. Closing the
 * socket now would lose what the kernel still holds for a client that
 * reads at its own pace: its frames (WINDOW_UPDATE for the DATA it is still
 * reading) would reach a closed socket, which the kernel answers with a
 * reset, dropping the rest, the last stream's last DATA and END_STREAM.
 * So the connection says it is done (close_notify, then FIN after the
 * last byte) and reads, discarding, until the client closes too,
 * or until a look every LINGER_SECONDS finds that the client has taken
 * every byte, or that what it has not taken did not move for
 * timeouts.client_stall. Until then it counts as open: a draining worker
 * waits for it.
 */
static void
h2_linger(struct sl_h2 *h)
{
	struct ev_loop *loop = h->w->loop;

	sl_debug("h2 %d: session over, lingering", h->fd);
	h->linger = 1;
	h->rwant = 0;
	ev_io_stop(loop, &h->wio);   /* and a send fed to it */
	if (h->ssl != NULL)
		sl_tls_close_notify(h->ssl);
	shutdown(h->fd, SHUT_WR);
	nghttp2_session_del(h->s);
	h->s = NULL;
	free(h->wbuf);
	h->wbuf = NULL;
	h->wlen = h->woff = h->wcap = 0;
	h->outq = h2_outq(h);
	h->t_wmove = ev_now(loop);
	h->t_linger = h->t_wmove + LINGER_SECONDS;
	h2_timer_update(h);
}

/* Lingering: what the client sends is read and dropped, its end awaited. */
static void
h2_linger_read(struct sl_h2 *h)
{
	static uint8_t sink[16384];
	int i;

	for (i = 0; i < 8; i++) {
		ssize_t n = read(h->fd, sink, sizeof(sink));

		if (n > 0)
			continue;
		if (n == -1 && (errno == EAGAIN || errno == EINTR))
			return;
		h2_close(h);   /* the client closed too, or is gone */
		return;
	}
}

/* Lingering, at a look: does the client still take what it was sent? */
static int
h2_linger_more(struct sl_h2 *h)
{
	ev_tstamp now = ev_now(h->w->loop);
	size_t q = h2_outq(h);

	if (q == 0)
		return 0;
	if (q != h->outq) {
		h->outq = q;
		h->t_wmove = now;
	}
	return now < h->t_wmove +
	    (double)h->w->cfg->timeouts.client_stall_ms / 1000.0;
}

static void
h2_on_read(struct ev_loop *loop, ev_io *io, int revents)
{
	struct sl_h2 *h = io->data;

	(void)loop;
	(void)revents;
	h->depth++;
	if (h->linger)
		h2_linger_read(h);
	else {
		h2_read(h);
		if (!h->dead)
			h2_send(h);
	}
	h2_unref(h);
}

static void
h2_on_write(struct ev_loop *loop, ev_io *io, int revents)
{
	struct sl_h2 *h = io->data;

	(void)loop;
	(void)revents;
	h->depth++;
	h->send_fed = 0;
	if (h->linger) {
		h2_unref(h);
		return;
	}
	if (h->rwant) {
		h->rwant = 0;
		h2_read(h);
	}
	if (!h->dead)
		h2_send(h);
	h2_unref(h);
}

/*
 * Without a stream the connection is idle: keepalive bounds it (a head
 * begun and not finished, timeouts.client_header). Output that does not
 * move (the client reads nothing at all) is bounded by client_stall.
 */
static void
h2_timer_update(struct sl_h2 *h)
{
	const struct sl_config *cfg = h->w->cfg;
	ev_tstamp now = ev_now(h->w->loop), d = 0;

	if (h->dead)
		return;
	ev_timer_stop(h->w->loop, &h->timer);
	if (h->linger)
		d = h->t_linger;
	else if (h->woff < h->wlen)
		d = h->t_wmove + (double)cfg->timeouts.client_stall_ms / 1000.0;
	else if (h->nexch == 0)
		d = h->t_active + (double)(TAILQ_EMPTY(&h->streams) ?
		    cfg->timeouts.keepalive_ms : cfg->timeouts.client_header_ms) /
		    1000.0;
	if (d <= 0)
		return;
	ev_timer_set(&h->timer, d > now ? d - now : 0.0, 0.0);
	ev_timer_start(h->w->loop, &h->timer);
}

static void
h2_on_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_h2 *h = t->data;

	(void)loop;
	(void)revents;
	h->depth++;
	if (h->linger) {
		if (h2_linger_more(h)) {
			h->t_linger = ev_now(loop) + LINGER_SECONDS;
			h2_timer_update(h);
		} else
			h2_close(h);
	} else if (h->woff < h->wlen) {
		sl_info("h2 %d: client stalled, connection cut", h->fd);
		h2_close(h);
	} else if (h->nexch == 0) {
		/* Idle: say goodbye properly, then close. */
		nghttp2_submit_goaway(h->s, NGHTTP2_FLAG_NONE,
		    nghttp2_session_get_last_proc_stream_id(h->s),
		    NGHTTP2_NO_ERROR, NULL, 0);
		h->goaway = 1;
		if (h2_send(h) == 0)
			h2_close(h);
	}
	h2_unref(h);
}

static void
h2_close(struct sl_h2 *h)
{
	struct sl_worker *w = h->w;
	struct h2_stream *st;

	if (h->dead)
		return;
	h->dead = 1;
	h->depth++;
	/* Every exchange ends first (the client is gone for them). */
	TAILQ_FOREACH(st, &h->streams, entry)
		if (st->x != NULL) {
			struct sl_conn *x = st->x;

			st->x = NULL;
			h->nexch--;
			sl_exchange_closed(x, 0);
		}
	while ((st = TAILQ_FIRST(&h->streams)) != NULL) {
		TAILQ_REMOVE(&h->streams, st, entry);
		stream_free(st);
	}
	nghttp2_session_del(h->s);
	h->s = NULL;
	ev_io_stop(w->loop, &h->rio);
	ev_io_stop(w->loop, &h->wio);
	ev_timer_stop(w->loop, &h->timer);
	sl_tls_free(h->ssl);
	close(h->fd);
	TAILQ_REMOVE(&w->h2s, h, entry);
	w->nconns--;
	w->nh2--;
	if (w->draining && w->nconns == 0)
		ev_break(w->loop, EVBREAK_ALL);
	h2_unref(h);
}

void
sl_h2_start(struct sl_worker *w, int fd, void *ssl, const char *peer)
{
	const struct sl_config *cfg = w->cfg;
	nghttp2_session_callbacks *cb = NULL;
	nghttp2_option *opt = NULL;
	struct sl_h2 *h;
	nghttp2_settings_entry iv[3];

	if ((h = calloc(1, sizeof(*h))) == NULL)
		goto fail;
	if (nghttp2_session_callbacks_new(&cb) != 0 || nghttp2_option_new(&opt) != 0)
		goto fail;
	nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
	nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
	nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
	nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
	/*
	 * Windows open as exchanges take the bytes, not as they arrive. The
	 * flood limits are nghttp2's defaults, set here so they are ours:
	 * rapid reset (CVE-2023-44487), CONTINUATION (CVE-2024-27316),
	 * SETTINGS and outbound acknowledgements.
	 */
	nghttp2_option_set_no_auto_window_update(opt, 1);
	nghttp2_option_set_stream_reset_rate_limit(opt, 1000, 33);
	nghttp2_option_set_max_continuations(opt, 8);
	nghttp2_option_set_max_settings(opt, 32);
	nghttp2_option_set_max_outbound_ack(opt, 1000);
	if (nghttp2_session_server_new2(&h->s, cb, h, opt) != 0)
		goto fail;
	nghttp2_session_callbacks_del(cb);
	nghttp2_option_del(opt);
	cb = NULL;
	opt = NULL;
	iv[0] = (nghttp2_settings_entry){ NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS,
	    (uint32_t)cfg->limits.h2_max_streams };
	iv[1] = (nghttp2_settings_entry){ NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE,
	    NGHTTP2_INITIAL_WINDOW_SIZE };
	iv[2] = (nghttp2_settings_entry){ NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
	    (uint32_t)cfg->limits.max_header_bytes };
	if (nghttp2_submit_settings(h->s, NGHTTP2_FLAG_NONE, iv, 3) != 0)
		goto fail;
	h->w = w;
	h->fd = fd;
	h->ssl = ssl;
	snprintf(h->peer, sizeof(h->peer), "%s", peer);
	TAILQ_INIT(&h->streams);
	ev_io_init(&h->rio, h2_on_read, fd, EV_READ);
	ev_io_init(&h->wio, h2_on_write, fd, EV_WRITE);
	ev_init(&h->timer, h2_on_timer);
	h->rio.data = h->wio.data = h->timer.data = h;
	h->t_active = h->t_wmove = ev_now(w->loop);
	TAILQ_INSERT_TAIL(&w->h2s, h, entry);
	w->nconns++;
	w->nh2++;
	ev_io_start(w->loop, &h->rio);
	/* The client's preface may already be in OpenSSL's hands. */
	if (h2_pending(h))
		ev_feed_event(w->loop, &h->rio, EV_READ);
	h2_want_send(h);   /* our SETTINGS */
	h2_timer_update(h);
	return;
fail:
	if (cb != NULL)
		nghttp2_session_callbacks_del(cb);
	if (opt != NULL)
		nghttp2_option_del(opt);
	if (h != NULL && h->s != NULL)
		nghttp2_session_del(h->s);
	free(h);
	sl_err("h2: cannot set up a connection");
	sl_tls_free(ssl);
	close(fd);
}

void
sl_h2_drain_all(struct sl_worker *w)
{
	struct sl_h2 *h, *next;

	for (h = TAILQ_FIRST(&w->h2s); h != NULL; h = next) {
		next = TAILQ_NEXT(h, entry);
		if (h->goaway || h->linger)
			continue;
		h->goaway = 1;
		nghttp2_submit_goaway(h->s, NGHTTP2_FLAG_NONE,
		    nghttp2_session_get_last_proc_stream_id(h->s),
		    NGHTTP2_NO_ERROR, NULL, 0);
		h2_want_send(h);
	}
}

void
sl_h2_close_all(struct sl_worker *w)
{
	struct sl_h2 *h;

	while ((h = TAILQ_FIRST(&w->h2s)) != NULL)
		h2_close(h);
}

void
sl_h2_counts(struct sl_worker *w, uint64_t *conns, uint64_t *streams)
{
	struct sl_h2 *h;

	*conns = 0;
	*streams = 0;
	TAILQ_FOREACH(h, &w->h2s, entry) {
		(*conns)++;
		*streams += h->nexch;
	}
}

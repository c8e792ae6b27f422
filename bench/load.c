/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sluice-load: a closed-loop load generator for SSE streams and finite
 * HTTP requests, on one libev loop.
 *
 * It holds N client slots busy against one URL. Each slot owns one
 * connection and runs one request after another on it: a stream that
 * finishes, is refused (429) or fails is replaced at once (a 429 may be
 * told to wait, --on-429). A share of the slots is throttled: a small
 * SO_RCVBUF set before connect and reads paced by a token bucket, so TCP
 * pushes back on whoever sends to them.
 *
 * With the stub's X-Stub-Stamp: 1 each event carries "t":<CLOCK_MONOTONIC
 * ns> of its send time; the added delay of an event is the time its last
 * byte was read here minus that stamp (same clock, same host). Only
 * samples that fall in the measured window count; the warm-up before it
 * does not. Output: a markdown table on stdout, and JSON with --json.
 *
 * Lines "sluice-load: measuring" and "sluice-load: done" go to stderr when
 * the window opens and closes, so a script can sample the gateway's CPU
 * over the same window.
 *
 * Build: cc -std=c11 -D_GNU_SOURCE -O2 load.c -lev -lhttp_parser -lm
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>
#include <http_parser.h>

#define READ_BUF (256 * 1024)
#define CONNECT_BACKOFF 0.05        /* seconds after a failed connect */
#define SWEEP_INTERVAL 0.5          /* timeout and gauge sampling */
#define STALL_NS 1000000000ULL      /* a stream silent this long is "stalled" */
#define MAX_HEADERS 64
#define MAX_KEYS 4096

/* ---- histograms: log-linear, microseconds, < 1.6 % relative error ---- */

#define H_LINEAR 128                /* exact below 128 us */
#define H_SUB 64                    /* sub-buckets per power of two */
#define H_BUCKETS (H_LINEAR + 50 * H_SUB)

struct hist {
	uint64_t n[H_BUCKETS];
	uint64_t count;
	double sum;
	uint64_t max;
};

enum { H_DELAY_ALL, H_DELAY_FAST, H_DELAY_SLOW, H_TTFB, H_LAT, H_REFUSED,
	H_COUNT };
static const char *const hist_names[H_COUNT] = {
	"added_delay_all", "added_delay_fast", "added_delay_throttled",
	"ttfb", "latency", "refused"   /* refused: request sent -> whole 429 */
};

static size_t
hist_index(uint64_t us)
{
	int e;

	if (us < H_LINEAR)
		return (size_t)us;
	e = 63 - __builtin_clzll(us);          /* >= 7 */
	if (e > 55)
		e = 55;
	return H_LINEAR + (size_t)(e - 7) * H_SUB +
	    (size_t)((us >> (e - 6)) & (H_SUB - 1));
}

/* Middle of the bucket, in microseconds. */
static double
hist_value(size_t i)
{
	size_t e, sub;
	double lo, w;

	if (i < H_LINEAR)
		return (double)i;
	e = (i - H_LINEAR) / H_SUB + 7;
	sub = (i - H_LINEAR) % H_SUB;
	w = ldexp(1.0, (int)e - 6);
	lo = ldexp(1.0, (int)e) + (double)sub * w;
	return lo + w / 2.0;
}

static void
hist_add(struct hist *h, uint64_t us)
{
	size_t i = hist_index(us);

	if (i >= H_BUCKETS)
		i = H_BUCKETS - 1;
	h->n[i]++;
	h->count++;
	h->sum += (double)us;
	if (us > h->max)
		h->max = us;
}

/* Quantile q (0..1) in milliseconds; NAN when empty. */
static double
hist_q(const struct hist *h, double q)
{
	uint64_t want, acc = 0;
	size_t i;

	if (h->count == 0)
		return NAN;
	want = (uint64_t)ceil(q * (double)h->count);
	if (want < 1)
		want = 1;
	for (i = 0; i < H_BUCKETS; i++) {
		acc += h->n[i];
		if (acc >= want) {
			double v = hist_value(i);

			if (v > (double)h->max)
				v = (double)h->max;
			return v / 1000.0;
		}
	}
	return (double)h->max / 1000.0;
}

/* ---- options ------------------------------------------------------- */

struct opts {
	char host[256];
	char port[16];
	char path[2048];
	int clients;
	double duration, warmup, ramp, timeout;
	double throttle_share;
	double throttle_rate;           /* bytes/s */
	int throttle_rcvbuf;
	char *keys[MAX_KEYS];
	int nkeys;
	char *headers[MAX_HEADERS];
	int nheaders;
	const char *body;
	const char *method;
	long vary_lo, vary_hi;          /* X-Stub-Events range, lo < 0: off */
	int on429;                      /* -2 now, -1 retry-after, >= 0 ms */
	const char *json;
	const char *label;
	int request_mode;
	int quiet;
	unsigned seed;
};

/* ---- state --------------------------------------------------------- */

enum cstate { C_IDLE, C_CONNECTING, C_SENDING, C_RECEIVING };
enum twhy { T_NONE, T_START, T_PACE };
enum scan { S_HEAD, S_END };

enum err {
	E_CONNECT, E_RESET, E_EOF, E_PARSE, E_TIMEOUT, E_4XX, E_5XX, E_OTHER,
	E_COUNT
};
static const char *const err_names[E_COUNT] = {
	"connect", "reset", "eof", "parse", "timeout", "status_4xx",
	"status_5xx", "status_other"
};

struct conn {
	struct ctx *x;
	int id;
	int fd;
	enum cstate state;
	ev_io io;
	int io_events;
	ev_timer timer;
	enum twhy twhy;
	int throttled;
	int key;

	/* request */
	char *req;
	size_t req_len, req_off, req_cap;
	unsigned nreq;                  /* requests sent on this connection */
	uint64_t t_start;               /* ns: request began (connect or write) */
	uint64_t t_progress;            /* ns: last byte either way */

	/* response */
	http_parser parser;
	int status;
	int done;                       /* message complete */
	int got_body;
	uint64_t resp_bytes;
	int ra_hdr;                     /* in a Retry-After header */
	int retry_after;
	int streaming;                  /* counted in x->streaming */

	/* SSE scanner */
	enum scan scan;
	int pat;
	int in_num;
	uint64_t num, stamp;
	size_t head_len;

	/* throttle */
	double budget;
	uint64_t t_budget;
};

struct ctx {
	struct opts o;
	struct ev_loop *loop;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	struct conn *conns;
	char *prefix;                   /* request line, Host, -H headers */
	size_t prefix_len;
	char *buf;
	double quantum;                 /* throttle read quantum, bytes */
	int measuring;
	int finished;
	uint64_t t_now;                 /* ns, time of the current read */

	ev_timer t_window, t_end, t_sweep;
	ev_signal sig_int, sig_term;

	/* window counters */
	struct hist h[H_COUNT];
	uint64_t completed, n429, responses, events, events_fast, events_slow;
	uint64_t bytes, requests;
	uint64_t errors[E_COUNT];
	uint64_t status_counts[600];
	uint64_t stale_retries;
	uint64_t gauge_sum, gauge_n, stalled_sum;
	int streaming;
	struct rusage ru0, ru1;
	uint64_t t_win0, t_win1;
};

static http_parser_settings settings;

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void
die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("sluice-load: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

static void conn_start(struct conn *c);
static void conn_next(struct conn *c, double delay);
static void conn_drop(struct conn *c, int err, int reconnect);
static void conn_send(struct conn *c);

/* ---- watchers -------------------------------------------------------- */

static void
io_want(struct conn *c, int events)
{
	if (c->io_events == events)
		return;
	if (c->io_events)
		ev_io_stop(c->x->loop, &c->io);
	c->io_events = events;
	if (events) {
		ev_io_set(&c->io, c->fd, events);
		ev_io_start(c->x->loop, &c->io);
	}
}

static void
timer_arm(struct conn *c, enum twhy why, double after)
{
	ev_timer_stop(c->x->loop, &c->timer);
	c->twhy = why;
	ev_timer_set(&c->timer, after > 0 ? after : 0.0, 0.0);
	ev_timer_start(c->x->loop, &c->timer);
}

static void
timer_cancel(struct conn *c)
{
	ev_timer_stop(c->x->loop, &c->timer);
	c->twhy = T_NONE;
}

/* ---- counting -------------------------------------------------------- */

static void
streaming_set(struct conn *c, int on)
{
	if (c->streaming == on)
		return;
	c->streaming = on;
	c->x->streaming += on ? 1 : -1;
}

static void
count_error(struct ctx *x, int err)
{
	if (x->measuring)
		x->errors[err]++;
}

/* One SSE event ended (its newline was read at x->t_now). */
static void
event_end(struct conn *c)
{
	struct ctx *x = c->x;
	uint64_t d;

	if (!x->measuring)
		return;
	d = x->t_now > c->stamp ? (x->t_now - c->stamp) / 1000 : 0;
	hist_add(&x->h[H_DELAY_ALL], d);
	hist_add(&x->h[c->throttled ? H_DELAY_SLOW : H_DELAY_FAST], d);
	x->events++;
	if (c->throttled)
		x->events_slow++;
	else
		x->events_fast++;
}

/*
 * Scan body bytes of a 200 response for stamps. Events are single lines
 * ("data: {...}\n\n"); the stamp is near the start, the padding after it,
 * so after the stamp the rest of the line is skipped with memchr.
 */
static void
sse_feed(struct conn *c, const char *p, size_t n)
{
	static const char pat[] = "\"t\":";
	const char *end = p + n;

	while (p < end) {
		if (c->scan == S_END) {
			const char *q = memchr(p, '\n', (size_t)(end - p));

			if (q == NULL)
				return;
			event_end(c);
			c->scan = S_HEAD;
			c->head_len = 0;
			c->pat = 0;
			p = q + 1;
			continue;
		}
		for (; p < end && c->scan == S_HEAD; p++) {
			char b = *p;

			if (c->in_num) {
				if (b >= '0' && b <= '9') {
					c->num = c->num * 10 + (uint64_t)(b - '0');
					continue;
				}
				c->in_num = 0;
				c->stamp = c->num;
				c->scan = S_END;
				break;  /* the S_END branch looks at this byte */
			}
			if (b == '\n') {
				/* a blank separator, or an event without stamp */
				c->head_len = 0;
				c->pat = 0;
				continue;
			}
			c->head_len++;
			if (b == pat[c->pat]) {
				if (++c->pat == 4) {
					c->in_num = 1;
					c->num = 0;
					c->pat = 0;
				}
			} else
				c->pat = b == '"' ? 1 : 0;
		}
	}
}

/* ---- http_parser callbacks ------------------------------------------- */

static int
on_header_field(http_parser *p, const char *at, size_t len)
{
	struct conn *c = p->data;

	c->ra_hdr = p->status_code == 429 && len == 11 &&
	    strncasecmp(at, "retry-after", 11) == 0;
	return 0;
}

static int
on_header_value(http_parser *p, const char *at, size_t len)
{
	struct conn *c = p->data;
	size_t i;

	if (!c->ra_hdr)
		return 0;
	c->retry_after = 0;
	for (i = 0; i < len && at[i] >= '0' && at[i] <= '9'; i++)
		c->retry_after = c->retry_after * 10 + (at[i] - '0');
	return 0;
}

static int
on_headers_complete(http_parser *p)
{
	struct conn *c = p->data;

	c->status = p->status_code;
	if (c->status == 200)
		streaming_set(c, 1);
	return 0;
}

static int
on_body(http_parser *p, const char *at, size_t len)
{
	struct conn *c = p->data;
	struct ctx *x = c->x;

	if (c->status != 200)
		return 0;
	if (!c->got_body) {
		c->got_body = 1;
		if (x->measuring)
			hist_add(&x->h[H_TTFB], (x->t_now - c->t_start) / 1000);
	}
	if (x->measuring)
		x->bytes += len;
	sse_feed(c, at, len);
	return 0;
}

static int
on_message_complete(http_parser *p)
{
	struct conn *c = p->data;

	c->done = 1;
	return 0;
}

/* ---- the connection's life ------------------------------------------- */

static void
conn_reset_response(struct conn *c)
{
	http_parser_init(&c->parser, HTTP_RESPONSE);
	c->parser.data = c;
	c->status = 0;
	c->done = 0;
	c->got_body = 0;
	c->resp_bytes = 0;
	c->ra_hdr = 0;
	c->retry_after = -1;
	c->scan = S_HEAD;
	c->pat = 0;
	c->in_num = 0;
	c->head_len = 0;
}

static void
conn_build_request(struct conn *c)
{
	struct ctx *x = c->x;
	const struct opts *o = &x->o;
	size_t blen = strlen(o->body), need;
	int n;

	need = x->prefix_len + blen + 512 + (o->nkeys ? strlen(o->keys[c->key]) : 0);
	if (need > c->req_cap) {
		free(c->req);
		if ((c->req = malloc(need)) == NULL)
			die("out of memory");
		c->req_cap = need;
	}
	memcpy(c->req, x->prefix, x->prefix_len);
	c->req_len = x->prefix_len;
	if (o->nkeys) {
		n = snprintf(c->req + c->req_len, c->req_cap - c->req_len,
		    "Authorization: Bearer %s\r\n", o->keys[c->key]);
		c->req_len += (size_t)n;
	}
	if (o->vary_lo >= 0) {
		long ev = o->vary_lo + (o->vary_hi > o->vary_lo ?
		    (long)((unsigned long)rand() % (unsigned long)(o->vary_hi - o->vary_lo + 1)) : 0);

		n = snprintf(c->req + c->req_len, c->req_cap - c->req_len,
		    "X-Stub-Events: %ld\r\n", ev);
		c->req_len += (size_t)n;
	}
	if (blen > 0) {
		n = snprintf(c->req + c->req_len, c->req_cap - c->req_len,
		    "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
		c->req_len += (size_t)n;
	}
	memcpy(c->req + c->req_len, "\r\n", 2);
	c->req_len += 2;
	memcpy(c->req + c->req_len, o->body, blen);
	c->req_len += blen;
	c->req_off = 0;
}

static void
conn_close_fd(struct conn *c)
{
	io_want(c, 0);
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	streaming_set(c, 0);
	c->state = C_IDLE;
	c->nreq = 0;
}

/*
 * Begin a request: on the open connection if there is one, else on a new
 * one. The time counts from here (connect included).
 */
static void
conn_start(struct conn *c)
{
	struct ctx *x = c->x;
	int fd, one = 1;

	if (x->finished)
		return;
	c->t_start = c->t_progress = now_ns();
	conn_build_request(c);
	conn_reset_response(c);
	if (c->fd >= 0) {
		conn_send(c);
		return;
	}
	fd = socket(x->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd == -1) {
		count_error(x, E_CONNECT);
		timer_arm(c, T_START, CONNECT_BACKOFF);
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (c->throttled)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &x->o.throttle_rcvbuf,
		    sizeof(x->o.throttle_rcvbuf));
	c->fd = fd;
	c->nreq = 0;
	if (connect(fd, (struct sockaddr *)&x->addr, x->addrlen) == -1 &&
	    errno != EINPROGRESS) {
		count_error(x, E_CONNECT);
		conn_close_fd(c);
		timer_arm(c, T_START, CONNECT_BACKOFF);
		return;
	}
	c->state = C_CONNECTING;
	io_want(c, EV_WRITE);
}

static void
conn_send(struct conn *c)
{
	ssize_t n;

	c->state = C_SENDING;
	while (c->req_off < c->req_len) {
		n = send(c->fd, c->req + c->req_off, c->req_len - c->req_off,
		    MSG_NOSIGNAL);
		if (n == -1) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				io_want(c, EV_WRITE);
				return;
			}
			conn_drop(c, E_RESET, 1);
			return;
		}
		c->req_off += (size_t)n;
	}
	c->nreq++;
	if (c->x->measuring)
		c->x->requests++;
	c->state = C_RECEIVING;
	c->t_progress = now_ns();
	if (c->throttled) {
		c->t_budget = c->t_progress;
		if (c->budget < 0)
			c->budget = 0;
	}
	io_want(c, EV_READ);
}

/*
 * The connection failed. A reused connection that the server closed
 * before answering (keep-alive race) is retried silently; anything else
 * counts as an error. Either way the slot starts over on a new connection.
 */
static void
conn_drop(struct conn *c, int err, int reconnect)
{
	int stale = c->nreq > 1 && c->resp_bytes == 0 &&
	    (err == E_RESET || err == E_EOF);

	if (stale) {
		if (c->x->measuring)
			c->x->stale_retries++;
	} else
		count_error(c->x, err);
	conn_close_fd(c);
	timer_cancel(c);
	if (reconnect)
		conn_start(c);
}

/* A whole response arrived: account for it and go on. */
static void
conn_response_end(struct conn *c)
{
	struct ctx *x = c->x;
	int keep = c->fd >= 0 && http_should_keep_alive(&c->parser);
	double delay = 0;

	streaming_set(c, 0);
	if (x->measuring) {
		x->responses++;
		if (c->status > 0 && c->status < 600)
			x->status_counts[c->status]++;
		if (c->status == 200) {
			x->completed++;
			hist_add(&x->h[H_LAT], (x->t_now - c->t_start) / 1000);
		} else if (c->status == 429) {
			x->n429++;
			hist_add(&x->h[H_REFUSED], (x->t_now - c->t_start) / 1000);
		}
		else if (c->status >= 500)
			x->errors[E_5XX]++;
		else if (c->status >= 400)
			x->errors[E_4XX]++;
		else
			x->errors[E_OTHER]++;
	}
	if (c->status == 429) {
		if (x->o.on429 == -1)
			delay = c->retry_after > 0 ? c->retry_after : 1;
		else if (x->o.on429 >= 0)
			delay = x->o.on429 / 1000.0;
	}
	if (!keep) {
		if (c->fd >= 0)
			conn_close_fd(c);
	} else {
		c->state = C_IDLE;
		io_want(c, 0);
	}
	conn_next(c, delay);
}

static void
conn_next(struct conn *c, double delay)
{
	if (delay > 0)
		timer_arm(c, T_START, delay);
	else
		conn_start(c);
}

/* Feed n bytes just read (at x->t_now) to the parser. */
static void
conn_feed(struct conn *c, const char *p, size_t n)
{
	size_t used;

	c->resp_bytes += n;
	used = http_parser_execute(&c->parser, &settings, p, n);
	if (c->done) {
		conn_response_end(c);
		return;
	}
	if (used != n || HTTP_PARSER_ERRNO(&c->parser) != HPE_OK)
		conn_drop(c, E_PARSE, 1);
}

static void
conn_eof(struct conn *c)
{
	/* A body delimited by close ends here. */
	if (c->resp_bytes > 0 && c->state == C_RECEIVING) {
		http_parser_execute(&c->parser, &settings, NULL, 0);
		if (c->done) {
			conn_close_fd(c);
			conn_response_end(c);
			return;
		}
	}
	conn_drop(c, E_EOF, 1);
}

/*
 * One read of at most `want` bytes into x->buf, stamping progress. Returns
 * the byte count, or 0 when there is nothing more to do now: EAGAIN, EOF
 * (conn_eof) or an error (the connection is dropped).
 */
static ssize_t
conn_read_some(struct conn *c, size_t want)
{
	struct ctx *x = c->x;
	ssize_t n;

	for (;;) {
		n = read(c->fd, x->buf, want);
		if (n == -1) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				conn_drop(c, E_RESET, 1);
			return 0;
		}
		if (n == 0) {
			conn_eof(c);
			return 0;
		}
		x->t_now = now_ns();
		c->t_progress = x->t_now;
		return n;
	}
}

/* Read what the throttle allows; stop reading until the bucket refills. */
static void
conn_read_throttled(struct conn *c)
{
	struct ctx *x = c->x;
	uint64_t t = now_ns();
	ssize_t n;

	c->budget += (double)(t - c->t_budget) / 1e9 * x->o.throttle_rate;
	if (c->budget > x->quantum)
		c->budget = x->quantum;
	c->t_budget = t;
	while (c->budget >= 1.0 && c->state == C_RECEIVING) {
		size_t want = (size_t)c->budget;

		if (want > READ_BUF)
			want = READ_BUF;
		if ((n = conn_read_some(c, want)) == 0)
			return;
		c->budget -= (double)n;
		conn_feed(c, x->buf, (size_t)n);
	}
	if (c->state == C_RECEIVING && c->budget < 1.0) {
		io_want(c, 0);
		timer_arm(c, T_PACE, (x->quantum - c->budget) / x->o.throttle_rate);
	}
}

static void
conn_read(struct conn *c)
{
	struct ctx *x = c->x;
	ssize_t n;

	if (c->throttled) {
		conn_read_throttled(c);
		return;
	}
	for (;;) {
		if ((n = conn_read_some(c, READ_BUF)) == 0)
			return;
		conn_feed(c, x->buf, (size_t)n);
		if (c->state != C_RECEIVING || n < READ_BUF)
			return;
	}
}

static void
on_io(struct ev_loop *loop, ev_io *w, int revents)
{
	struct conn *c = w->data;
	int err = 0;
	socklen_t len = sizeof(err);

	switch (c->state) {
	case C_CONNECTING:
		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) == -1 ||
		    err != 0) {
			count_error(c->x, E_CONNECT);
			conn_close_fd(c);
			timer_arm(c, T_START, CONNECT_BACKOFF);
			return;
		}
		conn_send(c);
		return;
	case C_SENDING:
		conn_send(c);
		return;
	case C_RECEIVING:
		conn_read(c);
		return;
	case C_IDLE:
		/* Idle keep-alive connection became readable: the server closed it. */
		conn_close_fd(c);
		return;
	}
}

static void
on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct conn *c = w->data;
	enum twhy why = c->twhy;

	c->twhy = T_NONE;
	switch (why) {
	case T_START:
		conn_start(c);
		return;
	case T_PACE:
		if (c->state == C_RECEIVING) {
			io_want(c, EV_READ);
			conn_read_throttled(c);
		}
		return;
	case T_NONE:
		return;
	}
}

/* ---- window, sweep, signals -------------------------------------------- */

static void
on_window(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct ctx *x = w->data;

	x->measuring = 1;
	x->t_win0 = now_ns();
	getrusage(RUSAGE_SELF, &x->ru0);
	if (!x->o.quiet) {
		fputs("sluice-load: measuring\n", stderr);
		fflush(stderr);
	}
}

static void
on_end(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct ctx *x = w->data;

	x->measuring = 0;
	x->finished = 1;
	x->t_win1 = now_ns();
	getrusage(RUSAGE_SELF, &x->ru1);
	if (!x->o.quiet) {
		fputs("sluice-load: done\n", stderr);
		fflush(stderr);
	}
	ev_break(loop, EVBREAK_ALL);
}

static void
on_sweep(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct ctx *x = w->data;
	uint64_t t = now_ns(), lim = (uint64_t)(x->o.timeout * 1e9);
	int i;

	if (x->measuring) {
		x->gauge_sum += (uint64_t)x->streaming;
		x->gauge_n++;
	}
	for (i = 0; i < x->o.clients; i++) {
		struct conn *c = &x->conns[i];

		/* A stream that gets nothing is invisible in the delay samples. */
		if (x->measuring && c->streaming && t - c->t_progress > STALL_NS)
			x->stalled_sum++;

		if (c->state != C_IDLE && t - c->t_progress > lim &&
		    !(c->throttled && c->twhy == T_PACE))
			conn_drop(c, E_TIMEOUT, 1);
	}
}

static void
on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
	struct ctx *x = w->data;

	if (x->measuring)
		on_end(loop, &x->t_end, 0);
	else {
		x->finished = 1;
		ev_break(loop, EVBREAK_ALL);
	}
}

/* ---- report ---------------------------------------------------------- */

static double
tv_s(const struct timeval *tv)
{
	return (double)tv->tv_sec + (double)tv->tv_usec / 1e6;
}

static void
fmt_ms(char *dst, size_t len, double v)
{
	if (isnan(v))
		snprintf(dst, len, "-");
	else if (v >= 1000.0)
		snprintf(dst, len, "%.2f s", v / 1000.0);
	else if (v >= 10.0)
		snprintf(dst, len, "%.1f ms", v);
	else
		snprintf(dst, len, "%.2f ms", v);
}

static void
row3(const char *name, const struct hist *h)
{
	char a[32], b[32], c[32];

	fmt_ms(a, sizeof a, hist_q(h, 0.50));
	fmt_ms(b, sizeof b, hist_q(h, 0.99));
	fmt_ms(c, sizeof c, hist_q(h, 0.999));
	printf("| %s p50 / p99 / p99.9 | %s / %s / %s (%llu samples) |\n",
	    name, a, b, c, (unsigned long long)h->count);
}

static void
json_num(FILE *f, double v)
{
	if (isnan(v) || isinf(v))
		fputs("null", f);
	else
		fprintf(f, "%.6g", v);
}

static void
report(struct ctx *x)
{
	const struct opts *o = &x->o;
	double win = (double)(x->t_win1 - x->t_win0) / 1e9;
	double cpu = tv_s(&x->ru1.ru_utime) + tv_s(&x->ru1.ru_stime) -
	    tv_s(&x->ru0.ru_utime) - tv_s(&x->ru0.ru_stime);
	double share429 = x->responses ? (double)x->n429 / (double)x->responses : 0;
	double gauge = x->gauge_n ? (double)x->gauge_sum / (double)x->gauge_n : 0;
	double stalled = x->gauge_n ? (double)x->stalled_sum / (double)x->gauge_n : 0;
	int nthr = (int)lround(o->clients * o->throttle_share);
	uint64_t errs = 0;
	char a[32], b[32];
	int i, first;

	if (win <= 0)
		win = 1e-9;
	for (i = 0; i < E_COUNT; i++)
		errs += x->errors[i];

	printf("\nsluice-load%s%s: %d clients (%d throttled to %.0f B/s), "
	    "%.1f s measured after %.1f s warm-up, http://%s:%s%s\n\n",
	    o->label ? " " : "", o->label ? o->label : "", o->clients, nthr,
	    o->throttle_rate, win, o->warmup, o->host, o->port, o->path);
	printf("| metric | value |\n|---|---|\n");
	if (o->request_mode) {
		printf("| requests/s (200, complete) | %.0f |\n", (double)x->completed / win);
		fmt_ms(a, sizeof a, hist_q(&x->h[H_LAT], 0.50));
		fmt_ms(b, sizeof b, hist_q(&x->h[H_LAT], 0.99));
		printf("| latency p50 / p99 | %s / %s |\n", a, b);
		fmt_ms(a, sizeof a, hist_q(&x->h[H_LAT], 0.999));
		printf("| latency p99.9 | %s |\n", a);
		fmt_ms(a, sizeof a, hist_q(&x->h[H_TTFB], 0.50));
		fmt_ms(b, sizeof b, hist_q(&x->h[H_TTFB], 0.99));
		printf("| time to first body byte p50 / p99 | %s / %s |\n", a, b);
		printf("| body MB/s | %.1f |\n", (double)x->bytes / win / 1e6);
	} else {
		row3("added delay, all served streams,", &x->h[H_DELAY_ALL]);
		row3("added delay, fast clients,", &x->h[H_DELAY_FAST]);
		row3("added delay, throttled clients,", &x->h[H_DELAY_SLOW]);
		fmt_ms(a, sizeof a, hist_q(&x->h[H_TTFB], 0.50));
		fmt_ms(b, sizeof b, hist_q(&x->h[H_TTFB], 0.99));
		printf("| time to first event p50 / p99 | %s / %s |\n", a, b);
		printf("| 429 share | %.2f%% (%llu of %llu responses) |\n",
		    100.0 * share429, (unsigned long long)x->n429,
		    (unsigned long long)x->responses);
		printf("| completed streams/s | %.1f |\n", (double)x->completed / win);
		printf("| events/s (fast / throttled) | %.0f (%.0f / %.0f) |\n",
		    (double)x->events / win, (double)x->events_fast / win,
		    (double)x->events_slow / win);
		printf("| streams in flight (mean) | %.0f |\n", gauge);
		printf("| streams silent for > 1 s (mean) | %.1f |\n", stalled);
		printf("| body MB/s | %.1f |\n", (double)x->bytes / win / 1e6);
	}
	printf("| errors | ");
	first = 1;
	for (i = 0; i < E_COUNT; i++)
		if (x->errors[i]) {
			printf("%s%s %llu", first ? "" : ", ", err_names[i],
			    (unsigned long long)x->errors[i]);
			first = 0;
		}
	printf("%s |\n", first ? "none" : "");
	printf("| load generator CPU | %.2f s (%.0f%% of one core) |\n",
	    cpu, 100.0 * cpu / win);

	if (o->json != NULL) {
		FILE *f = fopen(o->json, "w");

		if (f == NULL)
			die("%s: %s", o->json, strerror(errno));
		fprintf(f, "{\"label\":\"%s\",\"url\":\"http://%s:%s%s\","
		    "\"mode\":\"%s\",\"clients\":%d,\"throttled\":%d,"
		    "\"throttle_rate\":%.0f,\"warmup_s\":%g,\"window_s\":%.3f,",
		    o->label ? o->label : "", o->host, o->port, o->path,
		    o->request_mode ? "request" : "stream", o->clients, nthr,
		    o->throttle_rate, o->warmup, win);
		for (i = 0; i < H_COUNT; i++) {
			fprintf(f, "\"%s_ms\":{\"p50\":", hist_names[i]);
			json_num(f, hist_q(&x->h[i], 0.50));
			fputs(",\"p99\":", f);
			json_num(f, hist_q(&x->h[i], 0.99));
			fputs(",\"p999\":", f);
			json_num(f, hist_q(&x->h[i], 0.999));
			fputs(",\"mean\":", f);
			json_num(f, x->h[i].count ? x->h[i].sum / (double)x->h[i].count / 1000.0 : NAN);
			fputs(",\"max\":", f);
			json_num(f, x->h[i].count ? (double)x->h[i].max / 1000.0 : NAN);
			fprintf(f, ",\"count\":%llu},", (unsigned long long)x->h[i].count);
		}
		fprintf(f, "\"responses\":%llu,\"completed\":%llu,\"n429\":%llu,"
		    "\"share429\":%.6f,\"requests_sent\":%llu,"
		    "\"completed_per_s\":%.3f,\"events\":%llu,\"events_per_s\":%.3f,"
		    "\"events_fast\":%llu,\"events_throttled\":%llu,"
		    "\"body_bytes\":%llu,\"streams_in_flight_mean\":%.1f,"
		    "\"streams_stalled_mean\":%.1f,"
		    "\"stale_retries\":%llu,\"cpu_s\":%.4f,\"errors\":{",
		    (unsigned long long)x->responses,
		    (unsigned long long)x->completed, (unsigned long long)x->n429,
		    share429, (unsigned long long)x->requests,
		    (double)x->completed / win, (unsigned long long)x->events,
		    (double)x->events / win, (unsigned long long)x->events_fast,
		    (unsigned long long)x->events_slow,
		    (unsigned long long)x->bytes, gauge, stalled,
		    (unsigned long long)x->stale_retries, cpu);
		for (i = 0; i < E_COUNT; i++)
			fprintf(f, "%s\"%s\":%llu", i ? "," : "", err_names[i],
			    (unsigned long long)x->errors[i]);
		fprintf(f, "},\"errors_total\":%llu,\"status\":{", (unsigned long long)errs);
		first = 1;
		for (i = 0; i < 600; i++)
			if (x->status_counts[i]) {
				fprintf(f, "%s\"%d\":%llu", first ? "" : ",", i,
				    (unsigned long long)x->status_counts[i]);
				first = 0;
			}
		fputs("}}\n", f);
		fclose(f);
	}
}

/* ---- setup ----------------------------------------------------------- */

static void
usage(FILE *f)
{
	fputs(
"usage: sluice-load [options] http://HOST:PORT/PATH\n"
"  -c, --clients N          concurrent client slots (default 100)\n"
"  -d, --duration S         measured seconds (default 10)\n"
"  -w, --warmup S           seconds before the window opens (default 2)\n"
"      --ramp S             spread the first connects over S seconds (default 1)\n"
"      --throttle-share F   share of clients throttled, 0..1 (default 0)\n"
"      --throttle-rate B    throttled read rate, bytes/s (default 100000)\n"
"      --throttle-rcvbuf B  SO_RCVBUF of throttled sockets (default 16384)\n"
"      --keys K1,K2,...     API keys; client i sends Authorization: Bearer K[i %% n]\n"
"  -H, --header 'N: V'      extra request header (repeatable)\n"
"      --body STRING        request body (default {\"stream\":true}; \"\" = GET)\n"
"      --method M           request method (default POST, GET without body)\n"
"      --vary-events LO-HI  add X-Stub-Events: uniform in LO..HI to each request\n"
"      --on-429 WHEN        now (default), retry-after, or a delay in ms\n"
"      --timeout S          no progress for S seconds: error, new connection (default 60)\n"
"      --mode stream|request  which summary to print (default stream)\n"
"      --json FILE          also write the results as JSON\n"
"      --label TEXT         a name for this run (in the table and JSON)\n"
"      --seed N             random seed (default 1)\n"
"  -q, --quiet              no progress lines on stderr\n", f);
}

static double
num_arg(const char *name, const char *s, double lo, double hi)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
		die("%s: '%s' is not a number in %g..%g", name, s, lo, hi);
	return v;
}

static void
parse_url(struct opts *o, const char *url)
{
	const char *p, *slash, *colon;
	size_t hl;

	if (strncmp(url, "http://", 7) != 0)
		die("only http:// URLs: %s", url);
	p = url + 7;
	slash = strchr(p, '/');
	if (slash == NULL)
		slash = p + strlen(p);
	colon = memchr(p, ':', (size_t)(slash - p));
	if (colon == NULL)
		die("URL needs host:port: %s", url);
	hl = (size_t)(colon - p);
	if (hl == 0 || hl >= sizeof(o->host) || (size_t)(slash - colon - 1) >= sizeof(o->port))
		die("bad URL: %s", url);
	memcpy(o->host, p, hl);
	o->host[hl] = '\0';
	memcpy(o->port, colon + 1, (size_t)(slash - colon - 1));
	o->port[slash - colon - 1] = '\0';
	snprintf(o->path, sizeof(o->path), "%s", *slash ? slash : "/");
}

static void
split_keys(struct opts *o, char *s)
{
	char *tok, *save = NULL;

	for (tok = strtok_r(s, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
		if (o->nkeys == MAX_KEYS)
			die("at most %d keys", MAX_KEYS);
		o->keys[o->nkeys++] = tok;
	}
}

static void
parse_opts(struct opts *o, int argc, char **argv)
{
	enum { O_RAMP = 256, O_TSHARE, O_TRATE, O_TRCV, O_KEYS, O_BODY, O_METHOD,
	    O_VARY, O_ON429, O_TIMEOUT, O_MODE, O_JSON, O_LABEL, O_SEED };
	static const struct option lo[] = {
		{ "clients", required_argument, NULL, 'c' },
		{ "duration", required_argument, NULL, 'd' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "header", required_argument, NULL, 'H' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "ramp", required_argument, NULL, O_RAMP },
		{ "throttle-share", required_argument, NULL, O_TSHARE },
		{ "throttle-rate", required_argument, NULL, O_TRATE },
		{ "throttle-rcvbuf", required_argument, NULL, O_TRCV },
		{ "keys", required_argument, NULL, O_KEYS },
		{ "body", required_argument, NULL, O_BODY },
		{ "method", required_argument, NULL, O_METHOD },
		{ "vary-events", required_argument, NULL, O_VARY },
		{ "on-429", required_argument, NULL, O_ON429 },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "mode", required_argument, NULL, O_MODE },
		{ "json", required_argument, NULL, O_JSON },
		{ "label", required_argument, NULL, O_LABEL },
		{ "seed", required_argument, NULL, O_SEED },
		{ NULL, 0, NULL, 0 }
	};
	int ch;

	memset(o, 0, sizeof(*o));
	o->clients = 100;
	o->duration = 10;
	o->warmup = 2;
	o->ramp = 1;
	o->timeout = 60;
	o->throttle_rate = 100000;
	o->throttle_rcvbuf = 16384;
	o->body = "{\"stream\":true}";
	o->vary_lo = o->vary_hi = -1;
	o->on429 = -2;
	o->seed = 1;
	while ((ch = getopt_long(argc, argv, "c:d:w:H:qh", lo, NULL)) != -1) {
		switch (ch) {
		case 'c':
			o->clients = (int)num_arg("--clients", optarg, 1, 1000000);
			break;
		case 'd':
			o->duration = num_arg("--duration", optarg, 0.1, 86400);
			break;
		case 'w':
			o->warmup = num_arg("--warmup", optarg, 0, 86400);
			break;
		case 'H':
			if (o->nheaders == MAX_HEADERS)
				die("at most %d headers", MAX_HEADERS);
			if (strchr(optarg, ':') == NULL || strpbrk(optarg, "\r\n"))
				die("-H wants 'Name: value': %s", optarg);
			o->headers[o->nheaders++] = optarg;
			break;
		case 'q':
			o->quiet = 1;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case O_RAMP:
			o->ramp = num_arg("--ramp", optarg, 0, 3600);
			break;
		case O_TSHARE:
			o->throttle_share = num_arg("--throttle-share", optarg, 0, 1);
			break;
		case O_TRATE:
			o->throttle_rate = num_arg("--throttle-rate", optarg, 100, 1e10);
			break;
		case O_TRCV:
			o->throttle_rcvbuf = (int)num_arg("--throttle-rcvbuf", optarg, 1024, 1 << 26);
			break;
		case O_KEYS:
			split_keys(o, optarg);
			break;
		case O_BODY:
			o->body = optarg;
			break;
		case O_METHOD:
			o->method = optarg;
			break;
		case O_VARY: {
			char *dash = strchr(optarg, '-');

			if (dash == NULL) {
				o->vary_lo = o->vary_hi = (long)num_arg("--vary-events", optarg, 0, 1e8);
			} else {
				*dash = '\0';
				o->vary_lo = (long)num_arg("--vary-events", optarg, 0, 1e8);
				o->vary_hi = (long)num_arg("--vary-events", dash + 1, 0, 1e8);
				if (o->vary_hi < o->vary_lo)
					die("--vary-events: LO-HI with LO <= HI");
			}
			break;
		}
		case O_ON429:
			if (strcmp(optarg, "now") == 0)
				o->on429 = -2;
			else if (strcmp(optarg, "retry-after") == 0)
				o->on429 = -1;
			else
				o->on429 = (int)num_arg("--on-429", optarg, 0, 3600000);
			break;
		case O_TIMEOUT:
			o->timeout = num_arg("--timeout", optarg, 0.01, 86400);
			break;
		case O_MODE:
			if (strcmp(optarg, "stream") == 0)
				o->request_mode = 0;
			else if (strcmp(optarg, "request") == 0)
				o->request_mode = 1;
			else
				die("--mode stream|request");
			break;
		case O_JSON:
			o->json = optarg;
			break;
		case O_LABEL:
			o->label = optarg;
			break;
		case O_SEED:
			o->seed = (unsigned)num_arg("--seed", optarg, 0, 4294967295.0);
			break;
		default:
			usage(stderr);
			exit(2);
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		exit(2);
	}
	parse_url(o, argv[optind]);
	if (o->method == NULL)
		o->method = o->body[0] ? "POST" : "GET";
}

static void
build_prefix(struct ctx *x)
{
	const struct opts *o = &x->o;
	size_t cap = 4096 + strlen(o->path), len;
	int i, n;

	for (i = 0; i < o->nheaders; i++)
		cap += strlen(o->headers[i]) + 2;
	if ((x->prefix = malloc(cap)) == NULL)
		die("out of memory");
	n = snprintf(x->prefix, cap, "%s %s HTTP/1.1\r\nHost: %s:%s\r\n",
	    o->method, o->path, o->host, o->port);
	len = (size_t)n;
	for (i = 0; i < o->nheaders; i++) {
		n = snprintf(x->prefix + len, cap - len, "%s\r\n", o->headers[i]);
		len += (size_t)n;
	}
	x->prefix_len = len;
}

static void
resolve(struct ctx *x)
{
	struct addrinfo hints, *res;
	int rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(x->o.host, x->o.port, &hints, &res);
	if (rc != 0)
		die("%s:%s: %s", x->o.host, x->o.port, gai_strerror(rc));
	memcpy(&x->addr, res->ai_addr, res->ai_addrlen);
	x->addrlen = res->ai_addrlen;
	freeaddrinfo(res);
}

int
main(int argc, char **argv)
{
	static struct ctx x;
	struct rlimit rl;
	int i, nthr;

	parse_opts(&x.o, argc, argv);
	srand(x.o.seed);
	resolve(&x);
	build_prefix(&x);
	signal(SIGPIPE, SIG_IGN);

	/* Each client holds one descriptor; ask for what it needs. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
	    rl.rlim_cur < (rlim_t)x.o.clients + 64) {
		rl.rlim_cur = rl.rlim_max;
		if (rl.rlim_cur < (rlim_t)x.o.clients + 64) {
			rl.rlim_cur = rl.rlim_max = (rlim_t)x.o.clients + 64;
		}
		if (setrlimit(RLIMIT_NOFILE, &rl) == -1)
			die("ulimit -n is too low for %d clients", x.o.clients);
	}

	settings.on_header_field = on_header_field;
	settings.on_header_value = on_header_value;
	settings.on_headers_complete = on_headers_complete;
	settings.on_body = on_body;
	settings.on_message_complete = on_message_complete;

	x.loop = ev_default_loop(EVBACKEND_EPOLL);
	if (x.loop == NULL)
		die("cannot start libev");
	if ((x.buf = malloc(READ_BUF)) == NULL ||
	    (x.conns = calloc((size_t)x.o.clients, sizeof(*x.conns))) == NULL)
		die("out of memory");
	x.quantum = x.o.throttle_rate / 50.0;     /* 20 ms of reading */
	if (x.quantum < 512)
		x.quantum = 512;

	/* Throttled clients are spread evenly over the slots (and the keys). */
	nthr = (int)lround(x.o.clients * x.o.throttle_share);
	for (i = 0; i < x.o.clients; i++) {
		struct conn *c = &x.conns[i];

		c->x = &x;
		c->id = i;
		c->fd = -1;
		c->key = x.o.nkeys ? i % x.o.nkeys : 0;
		c->throttled = nthr > 0 &&
		    (int)((long long)(i + 1) * nthr / x.o.clients) !=
		    (int)((long long)i * nthr / x.o.clients);
		c->budget = x.quantum;
		ev_init(&c->io, on_io);
		c->io.data = c;
		ev_init(&c->timer, on_timer);
		c->timer.data = c;
		timer_arm(c, T_START, x.o.ramp * i / x.o.clients);
	}

	ev_timer_init(&x.t_window, on_window, x.o.warmup, 0);
	x.t_window.data = &x;
	ev_timer_start(x.loop, &x.t_window);
	ev_timer_init(&x.t_end, on_end, x.o.warmup + x.o.duration, 0);
	x.t_end.data = &x;
	ev_timer_start(x.loop, &x.t_end);
	ev_timer_init(&x.t_sweep, on_sweep, SWEEP_INTERVAL, SWEEP_INTERVAL);
	x.t_sweep.data = &x;
	ev_timer_start(x.loop, &x.t_sweep);
	ev_signal_init(&x.sig_int, on_signal, SIGINT);
	x.sig_int.data = &x;
	ev_signal_start(x.loop, &x.sig_int);
	ev_signal_init(&x.sig_term, on_signal, SIGTERM);
	x.sig_term.data = &x;
	ev_signal_start(x.loop, &x.sig_term);

	ev_run(x.loop, 0);

	if (x.t_win1 == 0)
		die("interrupted before the window opened");
	report(&x);
	/* The kernel closes the sockets; no per-connection teardown needed. */
	return 0;
}

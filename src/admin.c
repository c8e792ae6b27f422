/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The admin listener. It runs in the master, which must stay responsive to
 * signals and child exits, and it must answer a /healthz probe however many
 * idle or slow connections others hold:
 *  - every socket is non-blocking, and nothing here waits;
 *  - a connection gets ADMIN_REQUEST_S to send its whole request and
 *    ADMIN_DEADLINE_S (from accept) to read the answer, then it is closed;
 *  - at most ADMIN_MAX_CONNS are open; the listen queue is always drained:
 *    a new connection at the cap evicts the oldest one still waiting for
 *    its request (one that has a request is answered first), and when
 *    every open one is being answered, the new one is closed at once.
 * The figures are in sluice.8, ADMIN ENDPOINTS.
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sl_admin.h"
#include "sl_http.h"
#include "sl_net.h"

#define ADMIN_MAX_CONNS (SL_ADMIN_POLLFDS - 1)
#define ADMIN_REQ_MAX 4096
#define ADMIN_REQUEST_S 2.0          /* from accept to a complete request */
#define ADMIN_DEADLINE_S 5.0         /* from accept to the answer written */
#define ADMIN_BACKLOG 512
#define ADMIN_ACCEPT_BATCH 64        /* accepts per wake-up */
#define ADMIN_ACCEPT_PAUSE_S 0.1     /* out of descriptors: poll again then */

struct admin_conn {
	int fd;                      /* -1: free */
	double accepted;
	double deadline;
	char req[ADMIN_REQ_MAX];
	size_t req_len;
	char *out;                   /* response, once built */
	size_t out_len, out_off;
};

struct sl_admin {
	int listen_fd;
	double accept_paused_until;  /* 0: accepting */
	struct admin_conn conns[ADMIN_MAX_CONNS];
};

void
sl_str_append(struct sl_str *s, const char *p, size_t n)
{
	if (s->cap - s->len <= n) {
		size_t ncap = s->cap ? s->cap * 2 : 4096;
		char *np;

		while (ncap <= s->len + n)
			ncap *= 2;
		if ((np = realloc(s->p, ncap)) == NULL)
			return;
		s->p = np;
		s->cap = ncap;
	}
	memcpy(s->p + s->len, p, n);
	s->len += n;
	s->p[s->len] = '\0';
}

void
sl_str_printf(struct sl_str *s, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		size_t room = s->cap - s->len;

		va_start(ap, fmt);
		n = vsnprintf(s->p ? s->p + s->len : NULL, s->p ? room : 0, fmt, ap);
		va_end(ap);
		if (n < 0)
			return;
		if (s->p != NULL && (size_t)n < room) {
			s->len += (size_t)n;
			return;
		}
		{
			size_t ncap = s->cap ? s->cap * 2 : 4096;
			char *np;

			while (ncap < s->len + (size_t)n + 1)
				ncap *= 2;
			if ((np = realloc(s->p, ncap)) == NULL)
				return;
			s->p = np;
			s->cap = ncap;
		}
	}
}

void
sl_str_free(struct sl_str *s)
{
	free(s->p);
	s->p = NULL;
	s->len = s->cap = 0;
}

struct sl_admin *
sl_admin_open(const char *addr, char *err, size_t errlen)
{
	struct sl_admin *a;
	int i;

	a = calloc(1, sizeof(*a));
	if (a == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	a->listen_fd = sl_net_listen(addr, 0, ADMIN_BACKLOG, err, errlen);
	if (a->listen_fd == -1) {
		free(a);
		return NULL;
	}
	for (i = 0; i < ADMIN_MAX_CONNS; i++)
		a->conns[i].fd = -1;
	return a;
}

static void
conn_free(struct admin_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	free(c->out);
	c->out = NULL;
	c->req_len = c->out_len = c->out_off = 0;
}

void
sl_admin_close(struct sl_admin *a)
{
	int i;

	if (a == NULL)
		return;
	for (i = 0; i < ADMIN_MAX_CONNS; i++)
		conn_free(&a->conns[i]);
	close(a->listen_fd);
	free(a);
}

int
sl_admin_pollfds(struct sl_admin *a, struct pollfd *p, int max, double now)
{
	int i, n = 0;

	if (a->accept_paused_until != 0 && now >= a->accept_paused_until)
		a->accept_paused_until = 0;
	/* The listen socket first: it is polled even at the cap. */
	if (n < max && a->accept_paused_until == 0) {
		p[n].fd = a->listen_fd;
		p[n].events = POLLIN;
		p[n].revents = 0;
		n++;
	}
	for (i = 0; i < ADMIN_MAX_CONNS && n < max; i++) {
		struct admin_conn *c = &a->conns[i];

		if (c->fd < 0)
			continue;
		p[n].fd = c->fd;
		p[n].events = c->out != NULL ? POLLOUT : POLLIN;
		p[n].revents = 0;
		n++;
	}
	return n;
}

double
sl_admin_timeout(const struct sl_admin *a, double now)
{
	double t = -1;
	int i;

	if (a->accept_paused_until != 0)
		t = a->accept_paused_until - now > 0 ? a->accept_paused_until - now : 0;
	for (i = 0; i < ADMIN_MAX_CONNS; i++) {
		const struct admin_conn *c = &a->conns[i];

		if (c->fd >= 0 && (t < 0 || c->deadline - now < t))
			t = c->deadline - now > 0 ? c->deadline - now : 0;
	}
	return t;
}

static void
build_response(struct admin_conn *c, sl_admin_handler h, void *arg)
{
	char method[16] = "", path[256];
	struct sl_admin_resp r;
	struct sl_str out = { NULL, 0, 0 };
	char *q;

	memset(&r, 0, sizeof(r));
	if (sscanf(c->req, "%15s %255s", method, path) != 2) {
		r.status = 400;
		sl_str_printf(&r.body, "bad request\n");
	} else {
		if ((q = strchr(path, '?')) != NULL)
			*q = '\0';
		h(arg, method, path, &r);
		if (r.status == 0) {
			r.status = 404;
			sl_str_printf(&r.body, "not found: try /, /status.json, "
			    "/metrics or /healthz\n");
		}
	}
	/*
	 * Every answer, the console's page first: this origin only (no
	 * inline script or style, nothing from elsewhere), never framed,
	 * never cached, never sniffed into another type.
	 */
	sl_str_printf(&out,
	    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
	    "Cache-Control: no-store\r\n"
	    "Content-Security-Policy: default-src 'self'\r\n"
	    "X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n"
	    "Referrer-Policy: no-referrer\r\n%sConnection: close\r\n\r\n",
	    r.status, sl_http_reason(r.status),
	    r.content_type ? r.content_type : "text/plain; charset=utf-8",
	    r.body.len,
	    /* RFC 9110 15.5.6: a 405 says what is allowed. */
	    r.status == 405 ? "Allow: GET, HEAD\r\n" : "");
	if (strcmp(method, "HEAD") != 0 && r.body.len > 0)
		sl_str_append(&out, r.body.p, r.body.len);
	sl_str_free(&r.body);
	c->out = out.p;
	c->out_len = out.len;
	c->out_off = 0;
}

/* Close the oldest connection still waiting for its request; NULL: none. */
static struct admin_conn *
evict_oldest_silent(struct sl_admin *a)
{
	struct admin_conn *oldest = NULL;
	int i;

	for (i = 0; i < ADMIN_MAX_CONNS; i++) {
		struct admin_conn *c = &a->conns[i];

		if (c->fd >= 0 && c->out == NULL &&
		    (oldest == NULL || c->accepted < oldest->accepted))
			oldest = c;
	}
	if (oldest != NULL)
		conn_free(oldest);
	return oldest;
}

/*
 * A place for a new connection: a free entry, else the oldest one still
 * waiting for its request (closed now), else NULL (all are being answered).
 */
static struct admin_conn *
conn_slot(struct sl_admin *a)
{
	int i;

	for (i = 0; i < ADMIN_MAX_CONNS; i++)
		if (a->conns[i].fd < 0)
			return &a->conns[i];
	return evict_oldest_silent(a);
}

/* Drain the listen queue (a batch per wake-up): never leave it unserved. */
static void
accept_some(struct sl_admin *a, double now)
{
	int k;

	for (k = 0; k < ADMIN_ACCEPT_BATCH; k++) {
		struct admin_conn *c;
		int fd;

		fd = accept4(a->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd == -1) {
			if (errno != EMFILE && errno != ENFILE &&
			    errno != ENOBUFS && errno != ENOMEM)
				return;         /* EAGAIN: drained; or the peer left */
			/*
			 * Out of descriptors: a silent connection makes room;
			 * without one, stop polling the listener for a moment
			 * rather than spin on it.
			 */
			if (errno == EMFILE && evict_oldest_silent(a) != NULL)
				continue;
			a->accept_paused_until = now + ADMIN_ACCEPT_PAUSE_S;
			return;
		}
		if ((c = conn_slot(a)) == NULL) {
			close(fd);
			continue;
		}
		c->fd = fd;
		c->accepted = now;
		c->deadline = now + ADMIN_REQUEST_S;
	}
}

static struct admin_conn *
find_conn(struct sl_admin *a, int fd)
{
	int i;

	for (i = 0; i < ADMIN_MAX_CONNS; i++)
		if (a->conns[i].fd == fd)
			return &a->conns[i];
	return NULL;
}

void
sl_admin_service(struct sl_admin *a, const struct pollfd *p, int n,
    double now, sl_admin_handler h, void *arg)
{
	int i, k;

	for (i = 0; i < n; i++) {
		struct admin_conn *c;
		ssize_t r;

		if (p[i].revents == 0)
			continue;
		if (p[i].fd == a->listen_fd)
			continue;       /* after the others: see below */
		if ((c = find_conn(a, p[i].fd)) == NULL)
			continue;
		if (c->out == NULL) {
			r = read(c->fd, c->req + c->req_len,
			    ADMIN_REQ_MAX - 1 - c->req_len);
			if (r <= 0) {
				if (r == -1 && (errno == EAGAIN || errno == EINTR))
					continue;
				conn_free(c);
				continue;
			}
			c->req_len += (size_t)r;
			c->req[c->req_len] = '\0';
			if (strstr(c->req, "\r\n\r\n") == NULL &&
			    strstr(c->req, "\n\n") == NULL) {
				if (c->req_len == ADMIN_REQ_MAX - 1)
					conn_free(c);
				continue;
			}
			build_response(c, h, arg);
			c->deadline = c->accepted + ADMIN_DEADLINE_S;
		}
		r = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
		if (r == -1 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (r <= 0) {
			conn_free(c);
			continue;
		}
		c->out_off += (size_t)r;
		if (c->out_off == c->out_len)
			conn_free(c);
	}
	for (k = 0; k < ADMIN_MAX_CONNS; k++)
		if (a->conns[k].fd >= 0 && now >= a->conns[k].deadline)
			conn_free(&a->conns[k]);
	/*
	 * Accept last: the requests that arrived were read first, so a new
	 * connection evicts only one that is still silent.
	 */
	for (i = 0; i < n; i++)
		if (p[i].fd == a->listen_fd && p[i].revents != 0)
			accept_some(a, now);
}

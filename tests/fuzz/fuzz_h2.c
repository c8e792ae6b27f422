/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * fuzz_h2: HTTP/2 frames after the handshake, into h2.c's connection.
 *
 * Input: byte 0 bit 0 clear: the client preface and an empty SETTINGS go
 * first (so most inputs get past the preface check); the rest is what the
 * client sends, then it closes its side. The connection runs on a
 * socketpair in plain text (h2.c's transport without TLS, the fuzz target's
 * alone), on its own libev loop, with h2.c's real nghttp2 options and
 * callbacks; the exchanges are stand-ins defined here (sl_exchange.h), so
 * what reaches an exchange is checked:
 *
 * - the first bytes an exchange gets are one HTTP/1.1 head: a request line
 *   "METHOD SP TARGET SP HTTP/1.1", then header lines "name: value" with no
 *   CR, LF or NUL inside, a blank line;
 * - a body announced chunked arrives as well-formed chunks;
 * - every exchange opened is closed exactly once, by the end of the input,
 *   and the connection leaves nothing open (w.nconns back to 0);
 * - ASan/LSan: no invalid access, no leak.
 *
 * A stand-in answers each head at once (a head with a Connection field the
 * framing must drop, and a short body), so responses, window updates and
 * resets are exercised too.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ev.h>

#include "sl_config.h"
#include "sl_exchange.h"
#include "sl_h2.h"
#include "sl_shm.h"
#include "sl_worker.h"
#include "fuzz.h"

static const char PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
static const char CONFIG[] =
    "listen: \"127.0.0.1:1\"\n"
    "limits: { h2_max_streams: 8, max_header_bytes: 4KiB }\n"
    "upstreams: { main: { url: \"http://127.0.0.1:9\" } }\n"
    "tenants: { a: { keys: [k], max_streams: 1 } }\n";

/* A stand-in exchange. */
struct sl_conn {
	const struct sl_framing *fr;
	void *ctx;
	struct fz_buf in;
	int head_done;
	int chunked;
	size_t body_at;           /* where the body begins in in */
	int head_given;           /* sl_exchange_head said it */
	int head_taken;           /* sl_exchange_head_sent */
	int body_sent;
};

static const char HEAD[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    "Connection: keep-alive\r\nX-A: b\r\n\r\n";

static struct sl_worker w;
static int nopen;

static void
check_head(const unsigned char *p, size_t n)
{
	size_t i = 0, line = 0;

	while (i < n) {
		size_t e = i;

		while (e + 1 < n && !(p[e] == '\r' && p[e + 1] == '\n'))
			e++;
		fz_check(e + 1 < n, "head-crlf", "a head line without CRLF");
		if (e == i)
			break;   /* the blank line */
		if (line == 0) {
			size_t sp1 = i, sp2;

			while (sp1 < e && p[sp1] != ' ')
				sp1++;
			sp2 = sp1 + 1;
			while (sp2 < e && p[sp2] != ' ')
				sp2++;
			fz_check(sp1 > i && sp1 < e && sp2 < e && e - sp2 == 9 &&
			    memcmp(p + sp2, " HTTP/1.1", 9) == 0, "request-line",
			    "'%.*s'", (int)(e - i), p + i);
		} else {
			size_t c = i;

			while (c < e && p[c] != ':')
				c++;
			fz_check(c > i && c + 1 < e + 1 && (c + 1 == e || p[c + 1] == ' '),
			    "header-line", "'%.*s'", (int)(e - i), p + i);
		}
		for (size_t k = i; k < e; k++)
			fz_check(p[k] != '\r' && p[k] != '\n' && p[k] != '\0',
			    "header-bytes", "CR, LF or NUL inside a head line");
		line++;
		i = e + 2;
	}
}

struct sl_conn *
sl_exchange_open(struct sl_worker *wk, const struct sl_framing *fr, void *ctx,
    int fd, const char *peer, ev_tstamp t_ready, ev_tstamp t_rx)
{
	struct sl_conn *x = calloc(1, sizeof(*x));

	(void)wk;
	(void)fd;
	(void)peer;
	(void)t_ready;
	(void)t_rx;
	if (x == NULL)
		return NULL;
	x->fr = fr;
	x->ctx = ctx;
	nopen++;
	return x;
}

/* Takes every byte as it arrives (the framing gives the window back). */
size_t
sl_exchange_feed(struct sl_conn *x, const char *p, size_t n)
{
	unsigned char *end;

	fz_add(&x->in, p, n);
	if (!x->head_done && x->in.len >= 4 &&
	    (end = memmem(x->in.p, x->in.len, "\r\n\r\n", 4)) != NULL) {
		x->head_done = 1;
		x->body_at = (size_t)(end - x->in.p) + 4;
		check_head(x->in.p, x->body_at);
		x->chunked = memmem(x->in.p, x->body_at,
		    "\r\nTransfer-Encoding: chunked\r\n", 30) != NULL;
		if (x->ctx != NULL)
			x->fr->send(x->ctx);
	}
	return n;
}

int
sl_exchange_head(const struct sl_conn *x, const char **head, size_t *len,
    int *body)
{
	struct sl_conn *m = (struct sl_conn *)(uintptr_t)x;

	if (!x->head_done || x->head_taken)
		return 0;
	m->head_given = 1;
	*head = HEAD;
	*len = sizeof(HEAD) - 1;
	*body = 1;
	return 1;
}

void
sl_exchange_head_sent(struct sl_conn *x)
{
	fz_check(x->head_given && !x->head_taken, "head-sent",
	    "a head taken that was not given, or twice");
	x->head_taken = 1;
}

void
sl_exchange_hold(struct sl_conn *x)
{
	(void)x;
}

void
sl_exchange_unhold(struct sl_conn *x)
{
	(void)x;
}

size_t
sl_exchange_pull(struct sl_conn *x, uint8_t *buf, size_t len, int *eof)
{
	*eof = 1;
	if (x->body_sent || len < 5)
		return 0;
	x->body_sent = 1;
	memcpy(buf, "hello", 5);
	return 5;
}

/* The body, as the exchange got it, is well-formed chunks when chunked. */
static void
check_body(const struct sl_conn *x)
{
	size_t i = x->body_at;

	if (!x->chunked || !x->head_done)
		return;
	while (i < x->in.len) {
		size_t sz = 0, d = 0;

		while (i < x->in.len && x->in.p[i] != '\r') {
			int c = x->in.p[i];

			fz_check((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'),
			    "chunk-size", "byte %#x in a chunk size", c);
			sz = sz * 16 + (size_t)(c <= '9' ? c - '0' : c - 'a' + 10);
			i++;
			d++;
		}
		if (i >= x->in.len)
			return;   /* cut by a reset: nothing more to say */
		fz_check(d > 0 && i + 1 < x->in.len && x->in.p[i + 1] == '\n',
		    "chunk-line", "chunk size line");
		i += 2;
		if (sz == 0) {
			fz_check(i + 2 == x->in.len && x->in.p[i] == '\r',
			    "chunk-end", "bytes after the last chunk");
			return;
		}
		if (i + sz + 2 > x->in.len)
			return;
		i += sz;
		fz_check(x->in.p[i] == '\r' && x->in.p[i + 1] == '\n', "chunk-crlf",
		    "chunk data not followed by CRLF");
		i += 2;
	}
}

void
sl_exchange_closed(struct sl_conn *x, int done)
{
	(void)done;
	check_body(x);
	fz_check(nopen > 0, "closed-twice", "an exchange closed more than opened");
	nopen--;
	free(x->in.p);
	free(x);
}

static void
setup(void)
{
	static int done;
	struct sl_config *cfg = NULL;
	struct sl_errors errs = { NULL, 0 };

	if (done)
		return;
	done = 1;
	if (sl_config_load_buffer("fuzz.yaml", CONFIG, sizeof(CONFIG) - 1, &cfg,
	    &errs) == -1) {
		sl_errors_print(&errs, stderr);
		abort();
	}
	w.cfg = cfg;
	w.loop = ev_loop_new(EVFLAG_AUTO);
	w.shm = sl_shm_create(4, 4, 2, 2);
	w.row = 1;
	if (w.loop == NULL || w.shm == NULL)
		abort();
	TAILQ_INIT(&w.conns);
	TAILQ_INIT(&w.h1s);
	TAILQ_INIT(&w.h2s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2], i;
	char sink[65536];
	size_t off = 0;

	setup();
	if (size < 1)
		return 0;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == -1)
		return 0;
	sl_h2_start(&w, sv[0], NULL, "fuzz");
	fz_check(w.nconns == 1, "start", "sl_h2_start did not take the socket");
	if (!(data[0] & 1))
		(void)!write(sv[1], PREFACE, sizeof(PREFACE) - 1);
	data++;
	size--;
	for (i = 0; i < 1000 && w.nconns > 0; i++) {
		if (off < size) {
			ssize_t n = write(sv[1], data + off, size - off);

			if (n > 0)
				off += (size_t)n;
			if (off == size)
				shutdown(sv[1], SHUT_WR);
		} else if (size == 0 && i == 0)
			shutdown(sv[1], SHUT_WR);
		while (read(sv[1], sink, sizeof(sink)) > 0)
			;
		ev_run(w.loop, EVRUN_NOWAIT);
	}
	sl_h2_close_all(&w);
	fz_check(w.nconns == 0 && w.nh2 == 0, "closed", "%zu connection(s) left",
	    w.nconns);
	fz_check(nopen == 0, "exchanges-closed", "%d exchange(s) never closed", nopen);
	close(sv[1]);
	return 0;
}

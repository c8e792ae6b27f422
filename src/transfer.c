/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * One upstream try of a request, on libcurl (sl_transfer.h): its header
 * list, its easy handle, the start, the stop.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "sl_http.h"
#include "sl_transfer.h"
#include "sl_upstream.h"

/*
 * The upstream request's header list: the client's lines that are passed
 * on, and X-Forwarded-For, as list nodes and text in one block
 * (hdr_block, one malloc and one free per request, no printf), linked
 * in front of the upstream's fixed tail (sl_transfers_header_tail), which
 * is formatted once per config. libcurl only reads the list.
 */
struct hdr_build {
	struct curl_slist *node;   /* next free node of the block */
	char *p;                   /* next free byte of its text */
	struct curl_slist **link;  /* where the next node is linked */
};

#define IOV(p, n) { (void *)(uintptr_t)(p), (n) }

static void
hdr_line(struct hdr_build *b, const struct iovec *v, int nv)
{
	struct curl_slist *n = b->node++;
	int i;

	n->data = b->p;
	for (i = 0; i < nv; i++) {
		memcpy(b->p, v[i].iov_base, v[i].iov_len);
		b->p += v[i].iov_len;
	}
	*b->p++ = '\0';
	*b->link = n;
	b->link = &n->next;
}

static void
hdr_header(struct hdr_build *b, const char *name, size_t nlen,
    const char *value, size_t vlen)
{
	const struct iovec v[] = { IOV(name, nlen), IOV(": ", 2),
	    IOV(value, vlen) };
	/* To libcurl "Name:" removes a header; "Name;" sends it empty. */
	const struct iovec empty[] = { IOV(name, nlen), IOV(";", 1) };

	if (vlen == 0)
		hdr_line(b, empty, 2);
	else
		hdr_line(b, v, 3);
}

#define IDENTITY "Accept-Encoding: identity"

int
sl_xfer_headers(struct sl_xfer *x, struct sl_transfers *xfers, size_t up,
    const struct sl_req *r, const char *peer, int identity)
{
	const char *name, *value;
	size_t nlen, vlen, i, nodes = 1, text, plen = strlen(peer);
	int have_ct = 0, have_accept = 0, nxff = 0;
	struct iovec xff[2 * SL_REQ_MAX_HEADERS + 2];
	struct hdr_build b;
	struct curl_slist *head = NULL;

	/*
	 * At most one node per client line and one for X-Forwarded-For;
	 * a line takes at most name + ": " + value + NUL, and ours
	 * "X-Forwarded-For: " + ", " + peer + NUL on top.
	 */
	text = 17 + 2 + plen + 1;
	if (identity) {
		nodes++;
		text += sizeof(IDENTITY);
	}
	for (i = 0; sl_req_header_at(r, i, &name, &nlen, &value, &vlen) == 0;
	    i++) {
		nodes++;
		text += nlen + vlen + 3;
	}
	free(x->hdr_block);
	if ((x->hdr_block = malloc(nodes * sizeof(struct curl_slist) +
	    text)) == NULL)
		return -1;
	b.node = x->hdr_block;
	b.p = (char *)(b.node + nodes);
	b.link = &head;

	for (i = 0; sl_req_header_at(r, i, &name, &nlen, &value, &vlen) == 0;
	    i++) {
		if (memchr(value, '\0', vlen) != NULL || memchr(name, '\0', nlen))
			return -1;
		if (sl_req_header_dropped_upstream(r, name, nlen))
			continue;
		if (sl_http_name_is(name, nlen, "x-forwarded-for")) {
			/*
			 * Repeated lines are one list (RFC 9110 5.3): every
			 * hop is kept, in order, then ours is appended.
			 */
			if (vlen == 0)
				continue;
			xff[2 * nxff].iov_base = (void *)(uintptr_t)(nxff ?
			    ", " : "X-Forwarded-For: ");
			xff[2 * nxff].iov_len = nxff ? 2 : 17;
			xff[2 * nxff + 1].iov_base = (void *)(uintptr_t)value;
			xff[2 * nxff + 1].iov_len = vlen;
			nxff++;
			continue;
		}
		/*
		 * A counted response is read for its usage, and one routed by
		 * model may have its "model" set back: the runner must not
		 * compress it (without the header any coding would be
		 * acceptable, RFC 9110 12.5.3, so identity is asked for).
		 */
		if (identity && sl_http_name_is(name, nlen, "accept-encoding"))
			continue;
		if (sl_http_name_is(name, nlen, "content-type"))
			have_ct = 1;
		if (sl_http_name_is(name, nlen, "accept"))
			have_accept = 1;
		hdr_header(&b, name, nlen, value, vlen);
	}
	if (identity)
		hdr_header(&b, IDENTITY, 15, &IDENTITY[17], sizeof(IDENTITY) - 18);
	if (nxff > 0) {
		xff[2 * nxff].iov_base = (void *)(uintptr_t)", ";
		xff[2 * nxff].iov_len = 2;
		xff[2 * nxff + 1].iov_base = (void *)(uintptr_t)peer;
		xff[2 * nxff + 1].iov_len = plen;
		hdr_line(&b, xff, 2 * nxff + 2);
	} else if (peer[0] != '\0')
		hdr_header(&b, "X-Forwarded-For", 15, peer, plen);
	*b.link = sl_transfers_header_tail(xfers, up, have_ct, have_accept);
	x->hdrs = head;
	/* A fallback to another upstream hangs that one's tail here. */
	x->hdr_link = b.link == &head ? NULL : b.link;
	x->hdr_ct = have_ct;
	x->hdr_accept = have_accept;
	return 0;
}

void
sl_xfer_retail(struct sl_xfer *x, struct sl_transfers *xfers, size_t up)
{
	struct curl_slist *tail;

	tail = sl_transfers_header_tail(xfers, up, x->hdr_ct, x->hdr_accept);
	if (x->hdr_link != NULL)
		*x->hdr_link = tail;
	else
		x->hdrs = tail;
}

/*
 * CURLOPT_PREREQFUNCTION: libcurl is about to send the request on a
 * connection. A second call for the same transfer is libcurl retrying on
 * a new connection because the reused one closed without a response, and
 * the runner may already have read the request and started generating:
 * never send a prompt twice (twice the GPU time, maybe twice the bill).
 * GET and HEAD are idempotent and carry no prompt; they may go again.
 */
static int
upstream_prereq_cb(void *arg, char *pip, char *lip, int pport, int lport)
{
	struct sl_xfer *x = arg;

	(void)pip; (void)lip; (void)pport; (void)lport;
	if (x->sends++ == 0 || x->idempotent)
		return CURL_PREREQFUNC_OK;
	x->resend_refused = 1;
	return CURL_PREREQFUNC_ABORT;
}

/*
 * CURLOPT_OPENSOCKETFUNCTION: the upstream socket, made here to tell "out
 * of descriptors" (our problem: 503) from "cannot connect" (the
 * upstream's: 502 and an upstream error).
 */
static curl_socket_t
upstream_socket_cb(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
	struct sl_xfer *x = arg;
	int fd;

	(void)purpose;
	fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
	if (fd == -1 && (errno == EMFILE || errno == ENFILE))
		x->no_fds = 1;
	return fd == -1 ? CURL_SOCKET_BAD : fd;
}

int
sl_xfer_prepare(struct sl_xfer *x, struct sl_transfers *xfers,
    const struct sl_xfer_sink *sink, long connect_ms, const char *base,
    const struct sl_req *req)
{
	const char *target, *method = sl_req_method(req);
	size_t tlen, ulen;
	CURL *e;
	int fresh;

	target = sl_req_url(req, &tlen);
	ulen = strlen(base);
	free(x->url);
	if ((x->url = malloc(ulen + tlen + 1)) == NULL)
		return -1;
	memcpy(x->url, base, ulen);
	memcpy(x->url + ulen, target, tlen);
	x->url[ulen + tlen] = '\0';
	if ((e = sl_transfers_easy(xfers, &fresh)) == NULL)
		return -1;
	x->easy = e;
	if (fresh) {
		/* What every transfer shares, set once per easy handle. */
		curl_easy_setopt(e, CURLOPT_HTTP_VERSION,
		    (long)CURL_HTTP_VERSION_1_1);
		curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
		curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
		curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
		curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
		curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
		curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, sink->head);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink->body);
		curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, upstream_prereq_cb);
		curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION,
		    upstream_socket_cb);
		/*
		 * Upstreams are reached directly, as by nginx and HAProxy:
		 * no proxy from http_proxy & co. It also spares libcurl up to
		 * five getenv() walks of the environment per request.
		 */
		curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
	}
	/*
	 * What may differ from the handle's last transfer: every one of
	 * these is set on every try (a reused handle is not reset).
	 */
	curl_easy_setopt(e, CURLOPT_URL, x->url);
	curl_easy_setopt(e, CURLOPT_PRIVATE, sink->arg);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, sink->arg);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, sink->arg);
	curl_easy_setopt(e, CURLOPT_PREREQDATA, x);
	curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, x);
	curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 0L);
	curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, NULL);
	if ((req->method == HTTP_GET && req->body_len == 0) ||
	    req->method == HTTP_HEAD) {
		/* No body: no pointer left to an earlier request's. */
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, NULL);
	}
	if (req->method == HTTP_GET && req->body_len == 0) {
		curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);   /* also NOBODY 0 */
	} else if (req->method == HTTP_HEAD) {
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
		/*
		 * A HEAD response has no body, but an upstream may send one
		 * anyway: bytes left on a cached connection would be read as
		 * the start of the next request's response (any tenant's).
		 * HEAD is rare; its connection is not kept.
		 */
		curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
	} else {
		curl_easy_setopt(e, CURLOPT_NOBODY, 0L);  /* before POSTFIELDS */
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
		    (curl_off_t)req->body_len);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS,
		    req->body != NULL ? req->body : "");
		if (req->method != HTTP_POST)
			curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	}
	x->idempotent = req->method == HTTP_GET || req->method == HTTP_HEAD;
	x->sends = x->resend_refused = x->no_fds = 0;
	return 0;
}

int
sl_xfer_launch(struct sl_xfer *x, struct sl_transfers *xfers)
{
	return (x->shard = sl_transfers_start(xfers, x->easy)) == NULL ? -1 : 0;
}

void
sl_xfer_stop(struct sl_xfer *x, struct sl_transfers *xfers)
{
	if (x->easy == NULL)
		return;
	if (x->sends > 1 || x->resend_refused)
		/*
		 * libcurl sent again on a fresh connection: it counted that
		 * retry in the handle (at 5, it fails the next one instead),
		 * and only curl_easy_reset clears the count. Rare: a new
		 * handle for the next transfer.
		 */
		sl_transfers_discard(xfers, x->shard, x->easy);
	else
		sl_transfers_stop(xfers, x->shard, x->easy);
	x->shard = NULL;
	x->easy = NULL;
}

void
sl_xfer_clear(struct sl_xfer *x)
{
	free(x->hdr_block);
	x->hdr_block = NULL;
	x->hdrs = NULL;
	free(x->url);
	x->url = NULL;
}

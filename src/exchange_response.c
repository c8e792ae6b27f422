/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The runner's answer on its way to the client: its head made the
 * client's (framing, X-Sluice-Model, Connection), a busy head turned into
 * a next try, body bytes through the model name set back (sl_mrw) and
 * the usage scanner into the bounded stream buffer; a full buffer pauses
 * the transfer, a drained one resumes it. The tokens it cost are charged
 * when it ends.
 */
#include "config.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "sl_json.h"
#include "sl_log.h"
#include "sl_usage.h"
#include "exchange_int.h"

static void conn_queue_charge(struct sl_conn *c);
static void conn_usage_head(struct sl_conn *c);
static void conn_mrw_head(struct sl_conn *c);
static size_t conn_write_body(struct sl_conn *c, char *p, size_t n);
static void conn_stored_head(struct sl_conn *c);

/* "X-Sluice-Model: NAME\r\n" for a request routed by model. */
int
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

/* The tenant's tokens_per_minute, when it has one and is known; else 0. */
static int32_t
conn_token_budget(const struct sl_conn *c)
{
	if (c->tenant < 0)
		return 0;
	return sl_shm_token_budget(c->w->shm, c->w->tenant_slot[c->tenant]);
}

/* OpenAI's duration form: "0s", "12s", "1m5s". */
static int
head_add_duration(struct sl_head *h, int s)
{
	if (s >= 60) {
		if (sl_head_add_uint(h, (unsigned long)(s / 60)) == -1 ||
		    SL_HEAD_LIT(h, "m") == -1)
			return -1;
		s %= 60;
	}
	if (sl_head_add_uint(h, (unsigned long)s) == -1)
		return -1;
	return SL_HEAD_LIT(h, "s");
}

/*
 * For a tenant with tokens_per_minute, its budget as OpenAI and Anthropic
 * state theirs: the limit, what the window leaves of it as the head goes
 * out (never below 0) and when the window is empty again. The window is
 * this node's (in a cluster whose Redis keeps the window, the node's own
 * share of it).
 */
int
conn_head_ratelimit(struct sl_conn *c)
{
	struct sl_worker *w = c->w;
	int32_t budget = conn_token_budget(c);
	uint64_t now, used, left;
	int reset;
	struct sl_head *h = &c->rh;

	if (budget <= 0)
		return 0;
	now = sl_mono_sec();
	used = sl_shm_tokens_window(w->shm, w->tenant_slot[c->tenant], now, 0,
	    NULL);
	left = used >= (uint64_t)budget ? 0 : (uint64_t)budget - used;
	reset = sl_shm_tokens_clear_in(w->shm, w->tenant_slot[c->tenant], now);
	if (SL_HEAD_LIT(h, "x-ratelimit-limit-tokens: ") == -1 ||
	    sl_head_add_uint(h, (unsigned long)budget) == -1 ||
	    SL_HEAD_LIT(h, "\r\nx-ratelimit-remaining-tokens: ") == -1 ||
	    sl_head_add_uint(h, (unsigned long)left) == -1 ||
	    SL_HEAD_LIT(h, "\r\nx-ratelimit-reset-tokens: ") == -1 ||
	    head_add_duration(h, reset) == -1 || SL_HEAD_LIT(h, "\r\n") == -1)
		return -1;
	if (c->api == SL_API_MESSAGES) {
		char ts[32];
		time_t at = time(NULL) + reset;
		struct tm tm;

		gmtime_r(&at, &tm);
		strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
		if (SL_HEAD_LIT(h, "anthropic-ratelimit-tokens-limit: ") == -1 ||
		    sl_head_add_uint(h, (unsigned long)budget) == -1 ||
		    SL_HEAD_LIT(h, "\r\nanthropic-ratelimit-tokens-remaining: ") ==
		    -1 || sl_head_add_uint(h, (unsigned long)left) == -1 ||
		    SL_HEAD_LIT(h, "\r\nanthropic-ratelimit-tokens-reset: ") == -1 ||
		    sl_head_add(h, ts, strlen(ts)) == -1 ||
		    SL_HEAD_LIT(h, "\r\n") == -1)
			return -1;
	}
	return 0;
}

/* A header line sluice states itself for a tenant with a budget. */
static int
is_ratelimit_line(const char *p, size_t n)
{
	static const char *const names[] = {
		"x-ratelimit-limit-tokens:", "x-ratelimit-remaining-tokens:",
		"x-ratelimit-reset-tokens:", "anthropic-ratelimit-tokens-limit:",
		"anthropic-ratelimit-tokens-remaining:",
		"anthropic-ratelimit-tokens-reset:", NULL
	};
	size_t i, k;

	for (i = 0; names[i] != NULL; i++) {
		k = strlen(names[i]);
		if (n >= k && strncasecmp(p, names[i], k) == 0)
			return 1;
	}
	return 0;
}

/*
 * The upstream's header lines: all of them, but for a tenant with a
 * budget those sluice states itself (a runner's or a provider's own would
 * contradict the tenant's).
 */
static int
conn_head_upstream_lines(struct sl_conn *c)
{
	const char *p = c->uh.block, *end = p + c->uh.len, *nl;

	if (conn_token_budget(c) <= 0)
		return sl_head_add(&c->rh, p, c->uh.len);
	for (; p < end; p = nl + 1) {
		if ((nl = memchr(p, '\n', (size_t)(end - p))) == NULL)
			nl = end - 1;
		if (!is_ratelimit_line(p, (size_t)(nl - p)) &&
		    sl_head_add(&c->rh, p, (size_t)(nl + 1 - p)) == -1)
			return -1;
	}
	return 0;
}

/* Build the client's response head from the upstream's. */
static int
conn_build_head(struct sl_conn *c)
{
	int method = c->req.method;

	c->body_allowed = !(method == HTTP_HEAD || c->status < 200 ||
	    c->status == 204 || c->status == 304);
	/* HTTP/2 frames the body itself. */
	c->chunked = c->fr->http1 && c->body_allowed &&
	    c->req.http_major == 1 && c->req.http_minor >= 1;
	if (c->fr->http1 && c->body_allowed && !c->chunked)
		c->close_after = 1;   /* HTTP/1.0: the body ends at close */
	if (!c->req.keep_alive || c->w->draining ||
	    c->w->cfg->timeouts.keepalive_ms == 0)
		c->close_after = 1;
	c->rh.len = c->rh_off = 0;
	if (sl_head_status_line(&c->rh, c->status,
	    c->uh.reason[0] ? c->uh.reason : sl_http_reason(c->status)) == -1 ||
	    conn_head_upstream_lines(c) == -1)
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
	    conn_head_model(c) == -1 || conn_head_ratelimit(c) == -1)
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

size_t
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
		    !c->pinned && (up->retry_on & SL_RETRY_BUSY) &&
		    c->tries - c->tries_base <= up->retries &&
		    (r2 = sl_pool_pick(c->w->pools, conn_upstream_idx(c),
		    c->tried, &wait)) >= 0) {
			c->retry_next = r2;
			c->busy_code = c->status;
			return 0;
		}
		/*
		 * None in this pool: the next target of the fallback chain.
		 * A request pinned to the replica holding its stored response
		 * goes nowhere else (another runner would answer 404): the
		 * busy answer is relayed.
		 */
		if ((c->status == 429 || c->status == 502 || c->status == 503) &&
		    !c->pinned && (r2 = conn_fallback_find(c, SL_FB_BUSY, &c->fb_model,
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
		conn_stored_head(c);
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

/*
 * Charge the response's tokens (sl_meter_end: once, exact or estimated)
 * to its tenant, its model, the cluster and the fair queue. Called when
 * the response ends, before its last byte is written.
 */
void
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
void
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
void
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

/*
 * Body bytes given the client: their last four, so that a failure told
 * later knows whether the stream stands between two events; and for the
 * Responses API the events counted (each one's sequence_number is the
 * count before it), so the terminal event carries the next number.
 */
static void
conn_note_out(struct sl_conn *c, const char *p, size_t n)
{
	size_t i = n > 4 ? n - 4 : 0;

	if (c->api == SL_API_RESPONSES && c->resp_sse) {
		const char *q = p, *end = p + n;
		uint32_t t = c->tail;

		/* A blank line ends an event: "\n\n" (or "\n\r\n"). */
		while ((q = memchr(q, '\n', (size_t)(end - q))) != NULL) {
			char b1 = q - p >= 1 ? q[-1] : (char)(t & 0xff);
			char b2 = q - p >= 2 ? q[-2] : q - p == 1 ?
			    (char)(t & 0xff) : (char)(t >> 8 & 0xff);

			if (b1 == '\n' || (b1 == '\r' && b2 == '\n'))
				c->sse_events++;
			q++;
		}
	}
	for (; i < n; i++)
		c->tail = c->tail << 8 | (unsigned char)p[i];
	c->tail_n = c->tail_n + n > 4 ? 4 : (uint8_t)(c->tail_n + n);
}

/* Append n bytes to the client as one chunk (framed if chunked). */
static int
conn_out_chunk(struct sl_conn *c, const char *p, size_t n)
{
	char hdr[24];
	struct iovec iov[3];

	if (n == 0)
		return 0;
	conn_note_out(c, p, n);
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
void
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

/* Between two events: nothing given yet, or the last ended by a blank line. */
static int
conn_at_event_boundary(const struct sl_conn *c)
{
	uint32_t t = c->tail;

	if (c->tail_n == 0)
		return 1;
	return (c->tail_n >= 2 && ((t & 0xffff) == 0x0a0a ||
	    (t & 0xffff) == 0x0d0d)) ||
	    (c->tail_n >= 4 && t == 0x0d0a0d0a);
}

/*
 * The runner failed after the 200 head of an event stream went out (a
 * reset, upstream_idle, a body cut short): one terminal event in the
 * stream's protocol, so the client's SDK raises its API error instead of
 * a bare network one ("terminated"). Chat and completions get vLLM's own
 * mid-stream shape (no [DONE] after it), Messages Anthropic's error
 * event, Responses its error event with the next sequence_number. Only
 * between two events: appended to half an event it would make both
 * unreadable. The response still ends cut (the caller's).
 */
void
conn_tell_failure(struct sl_conn *c, const char *why)
{
	char msg[256], ev[512];
	int n;

	if (!c->head_sent || !c->body_allowed || !c->resp_sse ||
	    c->status / 100 != 2 || !conn_at_event_boundary(c))
		return;
	sl_json_escape(msg, sizeof(msg), why, strlen(why));
	switch (c->api) {
	case SL_API_CHAT:
	case SL_API_COMPLETIONS:
		n = snprintf(ev, sizeof(ev), "data: {\"error\":{\"message\":"
		    "\"the model runner failed mid-stream: %s\",\"type\":"
		    "\"server_error\",\"code\":\"upstream_failed\"}}\n\n", msg);
		break;
	case SL_API_MESSAGES:
		n = snprintf(ev, sizeof(ev), "event: error\ndata: {\"type\":"
		    "\"error\",\"error\":{\"type\":\"api_error\",\"message\":"
		    "\"the model runner failed mid-stream: %s\"}}\n\n", msg);
		break;
	case SL_API_RESPONSES:
		n = snprintf(ev, sizeof(ev), "event: error\ndata: {\"type\":"
		    "\"error\",\"code\":\"upstream_failed\",\"message\":"
		    "\"the model runner failed mid-stream: %s\","
		    "\"sequence_number\":%" PRIu32 "}\n\n", msg, c->sse_events);
		break;
	default:
		return;   /* an event stream of an API sluice does not know */
	}
	if (n < 0 || (size_t)n >= sizeof(ev))
		return;
	if (sl_buf_space(&c->out) < (size_t)n + CHUNK_FRAMING)
		/* Stretched for one small event, as for the scanner's last. */
		c->out.cap = sl_buf_len(&c->out) + (size_t)n + CHUNK_FRAMING;
	if (conn_out_chunk(c, ev, (size_t)n) == -1)
		sl_err("conn %d: no room for the failure event", c->fd);
}

/*
 * The head of a 2xx answer to POST /v1/responses, JSON or an event
 * stream, is in: its id is read as the bytes pass (sl_stored_scan,
 * bounded), until found.
 */
static void
conn_stored_head(struct sl_conn *c)
{
	free(c->idscan);
	c->idscan = NULL;
	if (!c->learn || c->status / 100 != 2 || !c->body_allowed ||
	    c->uh.encoded || !(c->uh.is_json || c->uh.is_sse) ||
	    (c->idscan = malloc(sizeof(*c->idscan))) == NULL)
		return;
	sl_stored_scan_init(c->idscan, c->uh.is_sse);
}

/*
 * Body bytes of such an answer, taken: read on; the id found is learnt
 * with the replica of this try, and the rest of the body pays nothing.
 */
static void
conn_stored_body(struct sl_conn *c, const char *p, size_t n)
{
	size_t u = conn_upstream_idx(c);

	if (sl_stored_scan_feed(c->idscan, p, n) && c->replica >= 0)
		sl_stored_put(c->w->stored, c->w->upstream_slot[u],
		    c->idscan->id, c->idscan->idlen,
		    sl_pool_rid(c->w->pools, u, c->replica), sl_mono_ms());
	if (c->idscan->done) {
		free(c->idscan);
		c->idscan = NULL;
	}
}

void
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

size_t
upstream_write_cb(char *p, size_t size, size_t nmemb, void *arg)
{
	struct sl_conn *c = arg;
	struct sl_mrw_buf *mb = &c->w->mrw_buf;
	size_t n = size * nmemb, r;
	struct sl_mrw saved;
	int k;

	if (c->client_gone)
		return CURL_WRITEFUNC_ERROR;
	if (!c->mrw_on || !c->head_sent || n == 0) {
		r = conn_write_body(c, p, n);
		if (c->idscan != NULL && r == n && n > 0)
			conn_stored_body(c, p, n);
		return r;
	}
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
	if (r == n && c->idscan != NULL)
		conn_stored_body(c, p, n);   /* the runner's bytes: its id */
	if (r == CURL_WRITEFUNC_PAUSE)
		c->mrw = saved;
	else if (mb->cap > 65536 && k == 1) {
		free(mb->p);   /* a hostile answer's growth is not kept */
		mb->p = NULL;
		mb->len = mb->cap = 0;
	}
	return r;
}

/*
 * The client's buffer cannot take a read of `need` bytes: take none of it.
 * libcurl keeps the chunk and stops reading the socket, so TCP pushes back
 * on the upstream; conn_on_write resumes when it fits. An empty buffer
 * always takes it (stretched for it), so wait for no more room than the
 * buffer's own, whatever the cap is stretched to now.
 */
static size_t
conn_pause_body(struct sl_conn *c, size_t need)
{
	c->paused = 1;
	c->pending = need > BASE_CAP(c) ? BASE_CAP(c) : need;
	c->t_pause = ev_now(c->w->loop);
	sl_shm_stat_add(c->w->shm, c->w->row, SL_STAT_PAUSES, 1);
	conn_timer_update(c);
	return CURL_WRITEFUNC_PAUSE;
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
			if (r > 1)
				/* Full, for what the scanner may emit. */
				return conn_pause_body(c, r);
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
	if (sl_buf_space(&c->out) < total)
		/* Full. (An empty buffer always fits one read: cap >=
		 * stream_buffer >= CURL_MAX_WRITE_SIZE, or is stretched for it,
		 * above.) */
		return conn_pause_body(c, total);
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
	if (conn_out_chunk(c, p, n) == -1) {
		/* Out of memory (space was checked): fail this stream only. */
		sl_err("conn %d: cannot buffer the response", c->fd);
		c->client_gone = 1;
		return CURL_WRITEFUNC_ERROR;
	}
	conn_mark_dirty(c);
	return n;
}

/*
 * After a flush made room: resume a paused transfer once the chunk it
 * refused fits (hysteresis: not at the first free byte). libcurl calls the
 * write callback from inside curl_easy_pause with the kept bytes, which
 * only appends and queues a flush. Never call from a libcurl callback.
 */
void
conn_maybe_resume(struct sl_conn *c)
{
	if (!c->paused || c->xf.easy == NULL || sl_buf_space(&c->out) < c->pending)
		return;
	c->paused = 0;
	c->paused_total += ev_now(c->w->loop) - c->t_pause;
	conn_timer_update(c);
	curl_easy_pause(c->xf.easy, CURLPAUSE_CONT);
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The access log: one JSON line per request, from a record
 * (sl_accesslog.h), and the vocabulary of how requests end and why
 * connections close.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "sl_accesslog.h"
#include "sl_json.h"

const char *const sl_end_names[SL_END_COUNT] = {
	[SL_END_NONE] = "-",
	[SL_END_DONE] = "done",
	[SL_END_CLIENT_GONE] = "client_gone",
	[SL_END_STALL] = "stall",
	[SL_END_DRAINED] = "drained",
	[SL_END_UPSTREAM_ERROR] = "upstream_error",
	[SL_END_TIMEOUT] = "timeout",
	[SL_END_REJECTED] = "rejected",
};

const char *const sl_close_names[SL_CLOSE_COUNT] = {
	[SL_CLOSE_DONE] = "done",
	[SL_CLOSE_CLIENT_GONE] = "client_gone",
	[SL_CLOSE_KEEPALIVE] = "keepalive",
	[SL_CLOSE_IDLE] = "idle",
	[SL_CLOSE_STALL] = "stall",
	[SL_CLOSE_UPSTREAM_IDLE] = "upstream_idle",
	[SL_CLOSE_TIMEOUT] = "timeout",
	[SL_CLOSE_UPSTREAM_ERROR] = "upstream_error",
	[SL_CLOSE_BUG] = "bug",
	[SL_CLOSE_TLS] = "tls",
	[SL_CLOSE_H2] = "h2",
	[SL_CLOSE_DRAIN] = "drain",
	[SL_CLOSE_DRAINED] = "drained",
};

enum sl_end
sl_end_of_close(enum sl_close why)
{
	switch (why) {
	case SL_CLOSE_DONE:
		return SL_END_DONE;
	case SL_CLOSE_STALL:
		return SL_END_STALL;
	case SL_CLOSE_DRAINED:
		return SL_END_DRAINED;
	case SL_CLOSE_UPSTREAM_ERROR:
	case SL_CLOSE_BUG:
		return SL_END_UPSTREAM_ERROR;
	case SL_CLOSE_UPSTREAM_IDLE:
	case SL_CLOSE_TIMEOUT:
		return SL_END_TIMEOUT;
	default:
		return SL_END_CLIENT_GONE;
	}
}

/* s escaped into dst, or "-" (dflt) when s is NULL. */
static void
field(char *dst, size_t dlen, const char *s, size_t len, const char *dflt)
{
	if (s == NULL)
		snprintf(dst, dlen, "%s", dflt);
	else
		sl_json_escape(dst, dlen, s, len);
}

void
sl_access_write(int fd, const struct sl_access_rec *r)
{
	char line[3200], path[768], method[32], ts[40], tenant[256];
	char replica[512], model[300], umodel[300];
	const char *q;
	size_t ulen = r->url_len;
	struct timeval tv;
	struct tm tm;
	int n;

	if (fd < 0)
		return;
	/* The query string may carry secrets: log the path only. */
	if (ulen > 0 && (q = memchr(r->url, '?', ulen)) != NULL)
		ulen = (size_t)(q - r->url);
	sl_json_escape(path, sizeof(path), ulen > 0 ? r->url : "", ulen);
	field(tenant, sizeof(tenant), r->tenant,
	    r->tenant ? strlen(r->tenant) : 0, "-");
	field(replica, sizeof(replica), r->replica,
	    r->replica ? strlen(r->replica) : 0, "-");
	sl_json_escape(method, sizeof(method), r->method, strlen(r->method));
	field(model, sizeof(model), r->model, r->model_len, "-");
	field(umodel, sizeof(umodel), r->upstream_model,
	    r->upstream_model ? strlen(r->upstream_model) : 0, "-");
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	n = snprintf(line, sizeof(line),
	    "{\"time\":\"%s.%03dZ\",\"worker\":%d,\"peer\":\"%s\","
	    "\"tenant\":\"%s\",\"method\":\"%s\",\"path\":\"%s\","
	    "\"status\":%d,\"bytes_out\":%" PRIu64 ",\"ttfb_ms\":%.3f,"
	    "\"duration_ms\":%.3f,\"paused_ms\":%.3f,\"queued_ms\":%.3f,"
	    "\"end\":\"%s\","
	    "\"replica\":\"%s\",\"tries\":%d,\"prompt_tokens\":%" PRIu64
	    ",\"completion_tokens\":%" PRIu64 ",\"usage\":\"%s\","
	    "\"affinity\":\"%s\",\"model\":\"%s\",\"upstream_model\":\"%s\","
	    "\"proto\":\"%s\",\"api\":\"%s\"}\n",
	    ts, (int)(tv.tv_usec / 1000), r->worker, r->peer,
	    tenant, method, path, r->status, r->bytes_out, r->ttfb_ms,
	    r->duration_ms, r->paused_ms, r->queued_ms, sl_end_names[r->end],
	    replica, r->tries, r->prompt_tokens, r->completion_tokens,
	    r->usage != NULL ? r->usage : "none", r->affinity, model, umodel,
	    r->proto, r->api != NULL ? r->api : "other");
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line))
		n = (int)sizeof(line) - 1;
	/* One write per line: O_APPEND keeps lines of all workers whole. */
	(void)!write(fd, line, (size_t)n);
}

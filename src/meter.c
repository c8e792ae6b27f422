/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The tokens of one response (sl_meter.h): whether it is counted, how its
 * body is read for the usage, and what it cost.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "sl_api.h"
#include "sl_http.h"
#include "sl_meter.h"
#include "sl_shm.h"
#include "sl_usage.h"

void
sl_meter_request(struct sl_meter *m, int enabled, int inject,
    struct sl_req *req)
{
	struct sl_usage_req r;
	const char *url;
	size_t ulen;

	m->kind = "none";
	if (!enabled)
		return;
	url = sl_req_url(req, &ulen);
	if (!sl_api_metered(req->method, url, ulen))
		return;
	m->api = sl_api_of(url, ulen, NULL);
	if ((m->api == SL_API_CHAT || m->api == SL_API_COMPLETIONS ?
	    sl_usage_request(req->body != NULL ? req->body : "", req->body_len,
	    inject, &r) : sl_usage_request_api(m->api, req->body != NULL ?
	    req->body : "", req->body_len, &r)) == -1 || !r.counted) {
		sl_usage_req_free(&r);
		m->api = SL_API_OTHER;
		return;
	}
	if (r.stream) {
		if ((m->scan = malloc(sizeof(*m->scan))) == NULL) {
			sl_usage_req_free(&r);
			m->api = SL_API_OTHER;
			return;   /* not counted rather than wrong */
		}
		if (r.injected)
			sl_usage_scan_init(m->scan, 1);
		else
			sl_usage_scan_init_api(m->scan, m->api);
	}
	if (r.injected) {
		free(req->body);
		req->body = r.body;
		req->body_len = req->body_cap = r.body_len;
		r.body = NULL;
	}
	m->on = 1;
	m->prompt_est = r.prompt_est;
	sl_usage_req_free(&r);
}

/*
 * A runner streams whenever it takes "stream" for true (vLLM's pydantic
 * also takes "true", 1, "yes"), so an event stream goes through the
 * scanner whatever the request said (removing nothing unless the option
 * was injected); it may answer a streamed request with one JSON body, so
 * a JSON answer is also kept whole (the scanner, if any, stays: a runner
 * that streams under a JSON type still has its usage chunk removed). The
 * usage is taken from whichever of the two has it.
 */
void
sl_meter_head(struct sl_meter *m, int status, int body_allowed, int is_sse,
    int is_json)
{
	if (!m->on || status / 100 != 2 || !body_allowed)
		return;
	if (is_sse && m->scan == NULL &&
	    (m->scan = malloc(sizeof(*m->scan))) != NULL)
		sl_usage_scan_init_api(m->scan, m->api);
	m->keep_json = m->scan == NULL || is_json;
}

/*
 * Call only with bytes taken into the stream buffer: libcurl hands a
 * paused chunk over again.
 */
void
sl_meter_keep(struct sl_meter *m, const char *p, size_t n)
{
	size_t want = m->body_len + n;

	m->body_total += n;
	if (m->body_len > SL_USAGE_MAX_JSON)
		return;
	if (want > SL_USAGE_MAX_JSON) {
		m->body_len = SL_USAGE_MAX_JSON + 1;   /* too big */
		return;
	}
	if (want > m->body_cap) {
		size_t nc = m->body_cap ? m->body_cap : 4096;
		char *nb;

		while (nc < want)
			nc *= 2;
		if ((nb = realloc(m->body, nc)) == NULL) {
			m->body_len = SL_USAGE_MAX_JSON + 1;
			return;
		}
		m->body = nb;
		m->body_cap = nc;
	}
	memcpy(m->body + m->body_len, p, n);
	m->body_len = want;
}

/*
 * Exact when the usage arrived (and is believable: sl_usage_sane), else
 * estimated: the prompt from the request body, the completion from the
 * content relayed. A budget so bounds prefill as well as decode whatever
 * became of the usage (a runner that ignores the option, a stream cut or
 * left by its client).
 */
int
sl_meter_end(struct sl_meter *m, int status, uint64_t n[3])
{
	uint64_t bytes = 0;
	struct sl_usage u;

	if (!m->on || m->done)
		return 0;
	m->done = 1;
	if (status / 100 != 2) {
		m->kind = "none";
		return 0;
	}
	n[SL_TOKENS_PROMPT] = n[SL_TOKENS_COMPLETION] = 0;
	n[SL_TOKENS_ESTIMATED] = 0;
	memset(&u, 0, sizeof(u));
	if (m->scan != NULL)
		sl_usage_scan_result(m->scan, &u, &bytes);
	if (!sl_usage_sane(&u) && m->keep_json) {
		/* One JSON body, or what a JSON answer turned out to be. */
		struct sl_usage j;
		uint64_t jb = 0;

		if (m->body_len > SL_USAGE_MAX_JSON)
			jb = m->body_total;   /* not parsed: all may be content */
		else if (m->body != NULL &&
		    sl_usage_from_json_api(m->api, m->body, m->body_len, &j) == 0 &&
		    sl_usage_sane(&j))
			u = j;
		else
			jb = sl_usage_json_content_api(m->api, m->body, m->body_len);
		if (jb > bytes)
			bytes = jb;
	}
	if (sl_usage_sane(&u)) {
		m->kind = "exact";
		m->prompt = n[SL_TOKENS_PROMPT] = u.prompt_tokens;
		m->completion = n[SL_TOKENS_COMPLETION] = u.completion_tokens;
	} else {
		m->kind = "estimated";
		m->prompt = m->prompt_est;
		m->completion = sl_usage_estimate(bytes);
		n[SL_TOKENS_ESTIMATED] = m->prompt + m->completion;
	}
	return 1;
}

void
sl_meter_free(struct sl_meter *m)
{
	if (m->scan != NULL) {
		sl_usage_scan_free(m->scan);
		free(m->scan);
		m->scan = NULL;
	}
	free(m->body);
	m->body = NULL;
	m->body_len = m->body_cap = 0;
	m->body_total = 0;
	m->keep_json = 0;
}

void
sl_meter_reset(struct sl_meter *m)
{
	sl_meter_free(m);
	m->on = m->done = 0;
	m->api = SL_API_OTHER;
	m->kind = NULL;
	m->prompt = m->completion = m->prompt_est = 0;
}

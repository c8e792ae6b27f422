/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The console's /status.json (sl_status_json.h), and the samples behind
 * its "last minute" numbers.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sl_console.h"
#include "sl_status_json.h"
#include "sl_util.h"
#include "sl_upstream.h"

/*
 * The console (sluice.8, ADMIN ENDPOINTS): /status.json is read from the
 * shared region like /metrics, by the same readers, and costs O(tenants
 * + replicas) (a tenant's waiters: once per pool with a queue, at most
 * SL_SHM_MAX_UPSTREAMS). Its "last minute" numbers are the counters now
 * minus the oldest sample of them taken within the last minute: the loop
 * samples them every SL_STATUS_SAMPLE_S (5 s) into a window of
 * SL_STATUS_SAMPLES, 32 bits a counter (sl_console.h), so a tenant's two
 * counters cost 104 bytes of samples. Two windows: `window` samples
 * SL_INDEX_VALUES per shared index handed out (tenants and replicas),
 * `mwindow` SL_MODEL_VALUES per model slot handed out.
 */

/* A status slot that is a replica's failure: 5xx, or no status at all. */
static int
code_is_error(int slot)
{
	const char *l = sl_shm_code_label(slot);

	return l[0] == '5' || l[0] < '0' || l[0] > '9';
}

/*
 * The counters of shared index j: a tenant's refusals by admission (429
 * at max_streams or tokens_per_minute); a replica's tries and its failed
 * ones (code_is_error).
 */
static void
index_counters(const struct sl_slots *s, size_t j,
    uint64_t v[SL_INDEX_VALUES])
{
	int c;

	v[0] = v[1] = 0;
	if (!s->shm_replica[j]) {
		for (c = 0; c < SL_REJECT_MAX; c++)
			v[0] += sl_shm_rejected_sum(s->shm, j,
			    (enum sl_reject_reason)c);
		return;
	}
	for (c = 0; c < SL_NCODES; c++) {
		uint64_t n = sl_shm_requests_sum(s->shm, j, c);

		v[0] += n;
		if (code_is_error(c))
			v[1] += n;
	}
}

/* Requests answered under model slot `slot`, then its TTFT buckets. */
static void
model_counters(const struct sl_slots *s, size_t slot,
    uint64_t v[SL_MODEL_VALUES])
{
	int c, i, n;

	memset(v, 0, SL_MODEL_VALUES * sizeof(*v));
	sl_shm_mhist_bounds(SL_MHIST_TTFT, &n);
	for (c = 0; c < SL_NCODES; c++)
		v[0] += sl_shm_model_requests_sum(s->shm, slot, c);
	for (i = 0; i <= n; i++)
		v[1 + i] = sl_shm_model_hist_bucket(s->shm, slot, SL_MHIST_TTFT,
		    i);
}

/* The console's sample of now (sl_status_json.h). */
void
sl_status_sample(struct sl_status_windows *w, const struct sl_slots *s,
    double now)
{
	size_t n = s->shm_ntenants * SL_INDEX_VALUES, j;

	if (s->models.hwm * SL_MODEL_VALUES > n)
		n = s->models.hwm * SL_MODEL_VALUES;
	if (n > w->sample_cap) {
		uint64_t *ns = realloc(w->sample, n * sizeof(*ns));

		if (ns == NULL)
			return;         /* the next second tries again */
		w->sample = ns;
		w->sample_cap = n;
	}
	n = s->models.hwm * SL_MODEL_VALUES;
	memset(w->sample, 0, n * sizeof(*w->sample));
	for (j = 1; j < s->models.hwm; j++)
		if (s->models.names[j] != NULL)
			model_counters(s, j, w->sample + j * SL_MODEL_VALUES);
	sl_window_push(w->mwindow, now, w->sample, n);
	n = s->shm_ntenants * SL_INDEX_VALUES;
	memset(w->sample, 0, n * sizeof(*w->sample));
	for (j = 0; j < s->shm_ntenants; j++)
		if (s->shm_names[j] != NULL)
			index_counters(s, j,
			    w->sample + j * SL_INDEX_VALUES);
	sl_window_push(w->window, now, w->sample, n);
}

struct since {                   /* the sample a minute ago */
	const uint32_t *v;
	size_t n;
};

static uint64_t
last_minute(const struct since *b, size_t i, uint64_t cur)
{
	return sl_window_delta(b->v, b->n, i, cur);
}

static void
status_tenants(const struct sl_page_in *p, struct sl_str *o,
    const struct since *b)
{
	const struct sl_config *cfg = p->cur->cfg;
	uint64_t now = sl_mono_sec();
	size_t t, u;

	sl_str_printf(o, "\"tenants\":[");
	for (t = 0; t < cfg->ntenants; t++) {
		const struct sl_tenant_conf *tc = &cfg->tenants[t];
		size_t j = p->cur->tenant_slot[t];
		uint64_t v[SL_INDEX_VALUES];
		long waiting = 0;

		index_counters(p->slots, j, v);
		for (u = 0; u < cfg->nupstreams; u++)
			if (cfg->upstreams[u].queue.enabled)
				waiting += sl_queue_waiting_tenant(p->queue,
				    p->cur->queue_slot[u], j);
		sl_str_printf(o, "%s{\"name\":", t > 0 ? "," : "");
		sl_console_json_str(o, tc->name);
		sl_str_printf(o, ",\"streams\":%d,\"max_streams\":%d,"
		    "\"waiting\":%ld,\"tokens_last_minute\":%llu,"
		    "\"tokens_per_minute\":",
		    (int)sl_shm_inflight(p->slots->shm, j),
		    (int)sl_shm_limit(p->slots->shm, j), waiting,
		    (unsigned long long)sl_shm_tokens_window(p->slots->shm, j,
		    now, 0, NULL));
		if (tc->tokens_per_minute > 0)
			sl_str_printf(o, "%d", (int)tc->tokens_per_minute);
		else
			sl_str_printf(o, "null");
		sl_str_printf(o, ",\"rejected_last_minute\":%llu}",
		    (unsigned long long)last_minute(b,
		    j * SL_INDEX_VALUES, v[0]));
	}
	sl_str_printf(o, "]");
}

static void
status_replica(const struct sl_page_in *p, struct sl_str *o,
    const struct since *b, size_t u, size_t r, int64_t now)
{
	const struct sl_upstream_conf *up = &p->cur->cfg->upstreams[u];
	size_t j = p->cur->replica_slot[u][r];
	uint64_t v[SL_INDEX_VALUES];
	int32_t waiting = -1, kv = -1;

	index_counters(p->slots, j, v);
	sl_prom_replica_load(p->slots->shm, up, j, now, &waiting, &kv);
	sl_str_printf(o, "%s{\"url\":", r > 0 ? "," : "");
	sl_console_json_str(o, up->replicas[r].url);
	sl_str_printf(o, ",\"up\":%s,\"ejected\":%s,\"busy\":%s,\"streams\":%ld,"
	    "\"max_streams\":",
	    sl_prom_value_up(p->slots->shm, j, now) ? "true" : "false",
	    sl_prom_value_ejected(p->slots->shm, j, now) ? "true" : "false",
	    sl_prom_value_busy(p->slots->shm, j, now) ? "true" : "false",
	    sl_prom_value_streams(p->slots->shm, j, now));
	if (up->replicas[r].max_streams > 0)
		sl_str_printf(o, "%d", (int)up->replicas[r].max_streams);
	else
		sl_str_printf(o, "null");
	if (waiting >= 0)
		sl_str_printf(o, ",\"queue\":%d", (int)waiting);
	else
		sl_str_printf(o, ",\"queue\":null");
	if (kv >= 0)
		sl_str_printf(o, ",\"kv_cache\":%d.%03d", (int)kv / 1000,
		    (int)kv % 1000);
	else
		sl_str_printf(o, ",\"kv_cache\":null");
	sl_str_printf(o, ",\"requests_last_minute\":%llu,"
	    "\"errors_last_minute\":%llu}",
	    (unsigned long long)last_minute(b, j * SL_INDEX_VALUES, v[0]),
	    (unsigned long long)last_minute(b, j * SL_INDEX_VALUES + 1,
	    v[1]));
}

static void
status_upstreams(const struct sl_page_in *p, struct sl_str *o,
    const struct since *b)
{
	const struct sl_config *cfg = p->cur->cfg;
	int64_t now = sl_mono_ms();
	size_t u, r;

	sl_str_printf(o, "\"upstreams\":[");
	for (u = 0; u < cfg->nupstreams; u++) {
		sl_str_printf(o, "%s{\"name\":", u > 0 ? "," : "");
		sl_console_json_str(o, cfg->upstreams[u].name);
		sl_str_printf(o, ",\"replicas\":[");
		for (r = 0; r < cfg->upstreams[u].nreplicas; r++)
			status_replica(p, o, b, u, r, now);
		sl_str_printf(o, "],\"waiting\":%d}",
		    cfg->upstreams[u].queue.enabled ? (int)sl_queue_waiting(
		    p->queue, p->cur->queue_slot[u]) : 0);
	}
	sl_str_printf(o, "]");
}

/* A latency in ms, or null for none (sl_console_quantile: -1). */
static void
json_ms(struct sl_str *o, double seconds)
{
	if (seconds < 0)
		sl_str_printf(o, "null");
	else
		sl_str_printf(o, "%.1f", seconds * 1000.0);
}

static void
status_models(const struct sl_page_in *p, struct sl_str *o,
    const struct since *b)
{
	const struct sl_config *cfg = p->cur->cfg;
	const double *bounds;
	size_t i;
	int k, n;

	bounds = sl_shm_mhist_bounds(SL_MHIST_TTFT, &n);
	sl_str_printf(o, ",\"models\":[");
	for (i = 0; i < cfg->nmodels; i++) {
		size_t slot = p->cur->model_slot[i], off = slot * SL_MODEL_VALUES;
		uint64_t v[SL_MODEL_VALUES], d[SL_MODEL_VALUES];

		model_counters(p->slots, slot, v);
		for (k = 0; k < SL_MODEL_VALUES; k++)
			d[k] = last_minute(b, off + (size_t)k, v[k]);
		sl_str_printf(o, "%s{\"name\":", i > 0 ? "," : "");
		sl_console_json_str(o, cfg->models[i].name);
		sl_str_printf(o, ",\"ttft_p50_ms\":");
		json_ms(o, sl_console_quantile(bounds, n, d + 1, 0.5));
		sl_str_printf(o, ",\"ttft_p99_ms\":");
		json_ms(o, sl_console_quantile(bounds, n, d + 1, 0.99));
		sl_str_printf(o, ",\"requests_last_minute\":%llu}",
		    (unsigned long long)d[0]);
	}
	sl_str_printf(o, "]");
}

void
sl_status_render(const struct sl_page_in *p,
    const struct sl_status_windows *w, double now, struct sl_str *o)
{
	const struct sl_config *cfg = p->cur->cfg;
	struct since b;
	char host[256];

	b.v = sl_window_since(w->window, now - SL_STATUS_SPAN_S, &b.n);
	if (cfg->cluster.enabled && cfg->cluster.node != NULL)
		snprintf(host, sizeof(host), "%s", cfg->cluster.node);
	else if (gethostname(host, sizeof(host) - 1) == -1)
		snprintf(host, sizeof(host), "-");
	host[sizeof(host) - 1] = '\0';
	sl_str_printf(o, "{\"node\":");
	sl_console_json_str(o, host);
	sl_str_printf(o, ",\"version\":");
	sl_console_json_str(o, PACKAGE_VERSION);
	sl_str_printf(o, ",\"uptime_seconds\":%lld,\"generation\":%u,"
	    "\"workers\":%d,", (long long)(now - p->started), p->cur->id,
	    p->workers);
	status_tenants(p, o, &b);
	sl_str_printf(o, ",");
	status_upstreams(p, o, &b);
	if (cfg->models != NULL) {
		struct since mb;

		mb.v = sl_window_since(w->mwindow, now - SL_STATUS_SPAN_S, &mb.n);
		status_models(p, o, &mb);
	}
	sl_str_printf(o, ",\"cluster\":");
	if (p->cluster == NULL)
		sl_str_printf(o, "null");
	else {
		sl_str_printf(o, "{\"mode\":");
		sl_console_json_str(o, sl_cluster_mode(p->cluster));
		sl_str_printf(o, ",\"nodes\":%d,\"leases\":%llu,\"master\":",
		    sl_cluster_nodes(p->cluster),
		    (unsigned long long)sl_cluster_leases(p->cluster));
		sl_console_json_str(o, sl_cluster_master_addr(p->cluster));
		sl_str_printf(o, ",\"failovers\":%llu}",
		    (unsigned long long)sl_cluster_failovers(p->cluster));
	}
	sl_str_printf(o, "}\n");
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The /metrics page (sl_prom.h): every family read from the shared
 * region and the master's slot names, in the documented order.
 */
#include "config.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sl_h2.h"
#include "sl_prom.h"
#include "sl_util.h"
#include "sl_tls.h"
#include "sl_upstream.h"

/* Index t is a tenant's (not a replica's, not given back). */
static int
index_is_tenant(const struct sl_page_in *p, size_t t)
{
	return !p->slots->shm_replica[t] && p->slots->shm_names[t] != NULL;
}

/* Prometheus label value: escape backslash, quote and newline. */
static void
label(struct sl_str *o, const char *v)
{
	size_t n;

	/* Runs of plain bytes at once: 100,000 tenants' series are many. */
	for (;;) {
		n = strcspn(v, "\\\"\n");
		sl_str_append(o, v, n);
		v += n;
		if (*v == '\0')
			return;
		sl_str_append(o, *v == '\n' ? "\\n" : *v == '"' ? "\\\"" :
		    "\\\\", 2);
		v++;
	}
}

static void
render_hist(struct sl_str *o, struct sl_shm *shm, enum sl_hist h,
    const char *name, const char *help)
{
	const double *b = sl_shm_hist_bounds();
	int i;

	sl_str_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (i = 0; i < SL_HIST_BUCKETS; i++)
		sl_str_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, b[i],
		    (unsigned long long)sl_shm_hist_bucket(shm, h, i));
	sl_str_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name,
	    (unsigned long long)sl_shm_hist_bucket(shm, h, SL_HIST_BUCKETS));
	sl_str_printf(o, "%s_sum %.6f\n%s_count %llu\n", name,
	    sl_shm_hist_sum(shm, h), name,
	    (unsigned long long)sl_shm_hist_bucket(shm, h, SL_HIST_BUCKETS));
}

/*
 * One labelled series of a histogram: NAME_bucket{LABEL="V",le=...} for
 * the n bounds b and +Inf (cum: n + 1 cumulative counts), then NAME_sum
 * (printed with prec decimals) and NAME_count.
 */
#define SERIES_BUCKETS_MAX 16
_Static_assert(SL_HIST_BUCKETS <= SERIES_BUCKETS_MAX &&
    SL_MHIST_BOUNDS_MAX <= SERIES_BUCKETS_MAX, "a series' buckets fit");

static void
render_hist_series(struct sl_str *o, const char *name, const char *lname,
    const char *lvalue, const double *b, int n, const uint64_t *cum,
    double sum, int prec)
{
	int i;

	for (i = 0; i <= n; i++) {
		sl_str_printf(o, "%s_bucket{%s=\"", name, lname);
		label(o, lvalue);
		if (i < n)
			sl_str_printf(o, "\",le=\"%g\"} ", b[i]);
		else
			sl_str_printf(o, "\",le=\"+Inf\"} ");
		sl_str_printf(o, "%llu\n", (unsigned long long)cum[i]);
	}
	sl_str_printf(o, "%s_sum{%s=\"", name, lname);
	label(o, lvalue);
	sl_str_printf(o, "\"} %.*f\n%s_count{%s=\"", prec, sum, name, lname);
	label(o, lvalue);
	sl_str_printf(o, "\"} %llu\n", (unsigned long long)cum[n]);
}

/* {upstream="U",replica="URL" */
static void
replica_labels(struct sl_str *o, const char *metric, const char *up,
    const char *url)
{
	sl_str_printf(o, "%s{upstream=\"", metric);
	label(o, up);
	sl_str_printf(o, "\",replica=\"");
	label(o, url);
	sl_str_printf(o, "\"");
}

long
sl_prom_value_streams(struct sl_shm *shm, size_t slot, int64_t now)
{
	(void)now;
	return sl_shm_inflight(shm, slot);
}

long
sl_prom_value_up(struct sl_shm *shm, size_t slot, int64_t now)
{
	struct sl_shm_replica *h = sl_shm_replica(shm, slot);

	(void)now;
	return h != NULL && h->down == 0;
}

long
sl_prom_value_busy(struct sl_shm *shm, size_t slot, int64_t now)
{
	struct sl_shm_replica *h = sl_shm_replica(shm, slot);

	return h != NULL && h->busy_until_ms > now;
}

long
sl_prom_value_ejected(struct sl_shm *shm, size_t slot, int64_t now)
{
	struct sl_shm_replica *h = sl_shm_replica(shm, slot);

	return h != NULL && h->ejected_until_ms > now;
}

/*
 * The runner's own load as load_metrics last scraped it: 1 and the
 * replica's queue and KV-cache use (per mille; each -1 when its page
 * lacks it) when the upstream scrapes and the sample is fresh (4
 * intervals), else 0.
 */
int
sl_prom_replica_load(struct sl_shm *shm, const struct sl_upstream_conf *up,
    size_t slot, int64_t now, int32_t *waiting, int32_t *kv)
{
	struct sl_shm_replica *h = sl_shm_replica(shm, slot);
	int64_t at;

	if (!up->load_metrics.enabled || h == NULL)
		return 0;
	at = atomic_load(&h->lm_at_ms);
	if (at == 0 || now - at > 4 * (int64_t)up->load_metrics.interval_ms)
		return 0;
	*waiting = atomic_load(&h->lm_waiting);
	*kv = atomic_load(&h->lm_kv);
	return 1;
}

/* The runner's own load, for replicas with a fresh sample (replica_load). */
static void
replica_load_gauges(const struct sl_page_in *p, struct sl_str *o,
    int64_t now)
{
	const struct sl_config *cfg = p->cur->cfg;
	size_t u, r;
	int g;

	for (g = 0; g < 2; g++) {
		const char *name = g == 0 ? "sluice_replica_queue" :
		    "sluice_replica_kv_cache";

		sl_str_printf(o, "# HELP %s %s\n# TYPE %s gauge\n", name,
		    g == 0 ? "Requests waiting in the replica's own queue, as "
		    "its metrics page said (load_metrics)." :
		    "KV-cache use of the replica, 0 to 1, as its metrics page "
		    "said (load_metrics).", name);
		for (u = 0; u < cfg->nupstreams; u++) {
			const struct sl_upstream_conf *up = &cfg->upstreams[u];

			if (!up->load_metrics.enabled)
				continue;
			for (r = 0; r < up->nreplicas; r++) {
				int32_t waiting, kv, v;

				if (!sl_prom_replica_load(p->slots->shm, up,
				    p->cur->replica_slot[u][r], now, &waiting, &kv))
					continue;
				v = g == 0 ? waiting : kv;
				if (v < 0)
					continue;
				replica_labels(o, name, up->name,
				    up->replicas[r].url);
				if (g == 0)
					sl_str_printf(o, "} %d\n", (int)v);
				else
					sl_str_printf(o, "} %d.%03d\n",
					    (int)v / 1000, (int)v % 1000);
			}
		}
	}
}

/* One gauge per replica of the current pools. */
static void
replica_gauge(const struct sl_page_in *p, struct sl_str *o,
    const char *name, const char *help,
    long (*value)(struct sl_shm *, size_t, int64_t), int64_t now)
{
	const struct sl_config *cfg = p->cur->cfg;
	size_t u, r;

	sl_str_printf(o, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
	for (u = 0; u < cfg->nupstreams; u++)
		for (r = 0; r < cfg->upstreams[u].nreplicas; r++) {
			replica_labels(o, name, cfg->upstreams[u].name,
			    cfg->upstreams[u].replicas[r].url);
			sl_str_printf(o, "} %ld\n", value(p->slots->shm,
			    p->cur->replica_slot[u][r], now));
		}
}

/*
 * Replicas a reload removed that still have streams in flight: their
 * series stays, under the URL they had, until those end (their tenants'
 * sluice_tenant_streams counts the same streams). The index is reserved
 * meanwhile (slots.c, reuse_retired).
 */
static void
retired_streams(const struct sl_page_in *p, struct sl_str *o)
{
	const struct sl_config *cfg = p->cur->cfg;
	unsigned char *cur;
	size_t u, r, j;

	if ((cur = sl_slots_reserve(sl_shm_max_tenants(p->slots->shm))) == NULL)
		return;
	for (u = 0; u < cfg->nupstreams; u++)
		for (r = 0; r < cfg->upstreams[u].nreplicas; r++)
			cur[p->cur->replica_slot[u][r]] = 1;
	for (j = 0; j < p->slots->shm_ntenants; j++) {
		const char *name = p->slots->shm_names[j], *url;
		int32_t n;
		char *up;

		if (!p->slots->shm_replica[j] || cur[j] || name == NULL ||
		    (n = sl_shm_inflight(p->slots->shm, j)) <= 0 ||
		    (url = strchr(name + 1, '\x01')) == NULL)
			continue;
		/* name is "\x01UPSTREAM\x01URL" (slots.c, replica_key). */
		if ((up = strndup(name + 1, (size_t)(url - name - 1))) == NULL)
			continue;
		replica_labels(o, "sluice_replica_streams", up, url + 1);
		sl_str_printf(o, "} %d\n", (int)n);
		free(up);
	}
	sl_slots_unreserve(cur, sl_shm_max_tenants(p->slots->shm));
}

/* The pools of the current generation, replica by replica. */
static void
render_replicas(const struct sl_page_in *p, struct sl_str *o)
{
	const struct sl_config *cfg = p->cur->cfg;
	int64_t now = sl_mono_ms();
	size_t u, r, k;
	int c;

	replica_gauge(p, o, "sluice_replica_streams", "Streams in flight to "
	    "the replica, across all workers.", sl_prom_value_streams, now);
	retired_streams(p, o);
	replica_gauge(p, o, "sluice_replica_up", "1 when the replica takes "
	    "traffic by its health probes, 0 down or loading.", sl_prom_value_up, now);
	replica_gauge(p, o, "sluice_replica_ejected", "1 while the replica is "
	    "ejected after failures on traffic.", sl_prom_value_ejected, now);
	replica_gauge(p, o, "sluice_replica_busy", "1 while the replica is "
	    "marked busy by its Retry-After (at most busy_max).", sl_prom_value_busy,
	    now);
	replica_load_gauges(p, o, now);
	sl_str_printf(o, "# HELP sluice_replica_requests_total Tries sent to "
	    "the replica, by response status (connect, timeout, reset: none).\n"
	    "# TYPE sluice_replica_requests_total counter\n");
	for (u = 0; u < cfg->nupstreams; u++)
		for (r = 0; r < cfg->upstreams[u].nreplicas; r++)
			for (c = 0; c < SL_NCODES; c++) {
				uint64_t v = sl_shm_requests_sum(p->slots->shm,
				    p->cur->replica_slot[u][r], c);

				if (v == 0)
					continue;
				replica_labels(o, "sluice_replica_requests_total",
				    cfg->upstreams[u].name,
				    cfg->upstreams[u].replicas[r].url);
				sl_str_printf(o, ",code=\"%s\"} %llu\n",
				    sl_shm_code_label(c), (unsigned long long)v);
			}
	sl_str_printf(o, "# HELP sluice_upstream_retries_total Requests moved "
	    "to another replica, by reason.\n"
	    "# TYPE sluice_upstream_retries_total counter\n");
	for (k = 1; k < p->slots->ups.hwm; k++)
		for (c = 0; c < SL_RETRY_R_MAX && p->slots->ups.names[k] != NULL; c++) {
			sl_str_printf(o, "sluice_upstream_retries_total{upstream=\"");
			label(o, p->slots->ups.names[k]);
			sl_str_printf(o, "\",reason=\"%s\"} %llu\n",
			    sl_shm_retry_label((enum sl_retry_reason)c),
			    (unsigned long long)sl_shm_retry_sum(p->slots->shm, k,
			    (enum sl_retry_reason)c));
		}
	for (c = 0; c < SL_AFF_MAX; c++) {
		static const char *const an[SL_AFF_MAX] = {
			"sluice_affinity_hits_total", "sluice_affinity_misses_total",
			"sluice_affinity_spills_total"
		};
		static const char *const ah[SL_AFF_MAX] = {
			"sent to the replica holding their longest known prompt "
			"prefix",
			"whose prompt prefix no replica was known to hold",
			"not sent to the replica holding their prefix: it was "
			"overloaded (max_imbalance), down or full"
		};
		size_t j;

		sl_str_printf(o, "# HELP %s Requests of prefix_affinity "
		    "upstreams %s.\n# TYPE %s counter\n", an[c], ah[c], an[c]);
		for (j = 0; j < cfg->nupstreams; j++) {
			if (cfg->upstreams[j].balance != SL_BALANCE_PREFIX_AFFINITY)
				continue;
			k = p->cur->upstream_slot[j];   /* map_upstreams() */
			sl_str_printf(o, "%s{upstream=\"", an[c]);
			label(o, p->slots->ups.names[k]);
			sl_str_printf(o, "\"} %llu\n", (unsigned long long)
			    sl_shm_affinity_sum(p->slots->shm, k, (enum sl_aff_outcome)c));
		}
	}
	sl_str_printf(o, "# HELP sluice_response_affinity_total Requests "
	    "naming a stored response (previous_response_id, "
	    "/v1/responses/{id}), by what sluice knew of it: owner (sent to "
	    "the replica that made it), owner_down (that replica down or "
	    "gone: balanced), unknown (balanced).\n"
	    "# TYPE sluice_response_affinity_total counter\n");
	for (u = 0; u < cfg->nupstreams; u++) {
		if (cfg->upstreams[u].response_affinity.max <= 0)
			continue;
		k = p->cur->upstream_slot[u];
		for (c = 0; c < SL_STORED_R_MAX; c++) {
			sl_str_printf(o, "sluice_response_affinity_total{upstream=\"");
			label(o, p->slots->ups.names[k]);
			sl_str_printf(o, "\",result=\"%s\"} %llu\n",
			    sl_shm_stored_label((enum sl_stored_result)c),
			    (unsigned long long)sl_shm_stored_sum(p->slots->shm, k,
			    (enum sl_stored_result)c));
		}
	}
}

/* A model slot's label value: its name, "-" for slot 0. */
static const char *
model_label(const struct sl_page_in *p, size_t slot)
{
	return slot == 0 || p->slots->models.names[slot] == NULL ? "-" :
	    p->slots->models.names[slot];
}

/* A tenant x model pair of the token table, for sorting. */
struct tok_pair {
	size_t tenant, model;
	uint64_t n[SL_TOKENS_KINDS];
};

static int
tok_pair_cmp(const void *a, const void *b)
{
	const struct tok_pair *x = a, *y = b;

	if (x->tenant != y->tenant)
		return x->tenant < y->tenant ? -1 : 1;
	return x->model < y->model ? -1 : x->model > y->model;
}

/* The table's pairs, sorted by tenant and model (caller frees); *n. */
static struct tok_pair *
tok_pairs(struct sl_shm *shm, size_t *n)
{
	struct tok_pair *v = NULL, *nv;
	size_t pos = 0, cap = 0;
	struct tok_pair p;

	*n = 0;
	while (sl_shm_tokens_next(shm, &pos, &p.tenant, &p.model, p.n)) {
		if (*n == cap) {
			cap = cap ? 2 * cap : 64;
			if ((nv = realloc(v, cap * sizeof(*v))) == NULL)
				break;   /* what fits is shown */
			v = nv;
		}
		v[(*n)++] = p;
	}
	if (*n > 1)
		qsort(v, *n, sizeof(*v), tok_pair_cmp);
	return v;
}

/*
 * The fair queue of each pool that has one (sl_queue.h): waiters per
 * tenant, outcomes, and the tenants' service counters, in tokens.
 */
static void
render_queue(const struct sl_page_in *p, struct sl_str *o)
{
	const struct sl_config *cfg = p->cur->cfg;
	size_t u, t, k;

	sl_str_printf(o, "# HELP sluice_queue_waiting Requests waiting in the "
	    "pool's fair queue, per tenant, all workers.\n"
	    "# TYPE sluice_queue_waiting gauge\n");
	for (u = 0; u < cfg->nupstreams; u++) {
		if (!cfg->upstreams[u].queue.enabled)
			continue;
		for (t = 0; t < cfg->ntenants; t++) {
			sl_str_printf(o, "sluice_queue_waiting{upstream=\"");
			label(o, cfg->upstreams[u].name);
			sl_str_printf(o, "\",tenant=\"");
			label(o, cfg->tenants[t].name);
			sl_str_printf(o, "\"} %d\n", (int)sl_queue_waiting_tenant(
			    p->queue, p->cur->queue_slot[u], p->cur->tenant_slot[t]));
		}
	}
	sl_str_printf(o, "# HELP sluice_queue_total Requests that met a full "
	    "pool with a queue, by outcome.\n"
	    "# TYPE sluice_queue_total counter\n");
	for (u = 0; u < cfg->nupstreams; u++) {
		if (!cfg->upstreams[u].queue.enabled)
			continue;
		for (k = 0; k < SL_QUEUE_O_MAX; k++) {
			sl_str_printf(o, "sluice_queue_total{upstream=\"");
			label(o, cfg->upstreams[u].name);
			sl_str_printf(o, "\",outcome=\"%s\"} %llu\n",
			    sl_queue_outcome_label((enum sl_queue_outcome)k),
			    (unsigned long long)sl_queue_outcomes(p->queue,
			    p->cur->queue_slot[u], (enum sl_queue_outcome)k));
		}
	}
	sl_str_printf(o, "# HELP sluice_queue_wait_seconds Time a request "
	    "dispatched from the pool's queue waited there.\n"
	    "# TYPE sluice_queue_wait_seconds histogram\n");
	for (u = 0; u < cfg->nupstreams; u++) {
		size_t qp = p->cur->queue_slot[u];
		uint64_t cum[SERIES_BUCKETS_MAX + 1];
		int i;

		if (!cfg->upstreams[u].queue.enabled)
			continue;
		for (i = 0; i <= SL_HIST_BUCKETS; i++)
			cum[i] = sl_queue_wait_bucket(p->queue, qp, i);
		render_hist_series(o, "sluice_queue_wait_seconds", "upstream",
		    cfg->upstreams[u].name, sl_shm_hist_bounds(), SL_HIST_BUCKETS,
		    cum, (double)sl_queue_wait_ms_sum(p->queue, qp) / 1000.0, 3);
	}
	sl_str_printf(o, "# HELP sluice_tenant_service The tenant's service "
	    "counter in the pool's queue: (prompt + 2 x completion tokens) / "
	    "weight.\n"
	    "# TYPE sluice_tenant_service counter\n");
	for (u = 0; u < cfg->nupstreams; u++) {
		if (!cfg->upstreams[u].queue.enabled)
			continue;
		for (t = 0; t < cfg->ntenants; t++) {
			uint64_t v = sl_queue_service(p->queue,
			    p->cur->queue_slot[u], p->cur->tenant_slot[t]);

			sl_str_printf(o, "sluice_tenant_service{upstream=\"");
			label(o, cfg->upstreams[u].name);
			sl_str_printf(o, "\",tenant=\"");
			label(o, cfg->tenants[t].name);
			sl_str_printf(o, "\"} %llu.%03u\n",
			    (unsigned long long)(v / 1000), (unsigned)(v % 1000));
		}
	}
}

static void
tok_line(const struct sl_page_in *p, struct sl_str *o, size_t t,
    size_t model, int kind, uint64_t v)
{
	static const char *const kinds[SL_TOKENS_KINDS] = {
		"prompt", "completion", "estimated"
	};

	sl_str_printf(o, "sluice_tenant_tokens_total{tenant=\"");
	label(o, p->slots->shm_names[t]);
	sl_str_printf(o, "\",model=\"");
	label(o, model_label(p, model));
	sl_str_printf(o, "\",kind=\"%s\"} %llu\n", kinds[kind],
	    (unsigned long long)v);
}

/* Tokens per tenant and model, read from responses (usage). */
static void
render_tokens(const struct sl_page_in *p, struct sl_str *o)
{
	uint64_t now = sl_mono_sec();
	struct tok_pair *pairs;
	size_t t, np, i = 0;
	int k;

	pairs = tok_pairs(p->slots->shm, &np);
	sl_str_printf(o, "# HELP sluice_tenant_tokens_total Tokens used per "
	    "tenant and model (\"-\": not routed by model): prompt and "
	    "completion as reported by the runner, estimated where no usage "
	    "arrived.\n"
	    "# TYPE sluice_tenant_tokens_total counter\n");
	for (t = 0; t < p->slots->shm_ntenants; t++) {
		if (!index_is_tenant(p, t))
			continue;
		for (k = 0; k < SL_TOKENS_KINDS; k++)
			tok_line(p, o, t, 0, k, sl_shm_tokens_model(p->slots->shm, t, 0, k));
		for (; i < np && pairs[i].tenant < t; i++)
			;
		for (; i < np && pairs[i].tenant == t; i++)
			for (k = 0; k < SL_TOKENS_KINDS; k++)
				tok_line(p, o, t, pairs[i].model, k, pairs[i].n[k]);
	}
	free(pairs);
	sl_str_printf(o, "# HELP sluice_tenant_tokens_window Tokens charged to "
	    "the tenant in the last 60 s (what tokens_per_minute bounds).\n"
	    "# TYPE sluice_tenant_tokens_window gauge\n");
	for (t = 0; t < p->slots->shm_ntenants; t++) {
		if (!index_is_tenant(p, t))
			continue;
		sl_str_printf(o, "sluice_tenant_tokens_window{tenant=\"");
		label(o, p->slots->shm_names[t]);
		sl_str_printf(o, "\"} %llu\n", (unsigned long long)
		    sl_shm_tokens_window(p->slots->shm, t, now, 0, NULL));
	}
}

/* Slots worth showing: "-" and every slot that has had a name. */
static int
model_shown(const struct sl_page_in *p, size_t slot)
{
	return slot == 0 || (slot < p->slots->models.hwm &&
	    p->slots->models.names[slot] != NULL);
}

#define OTHER_MODELS "_other"

static void
render_model_hist(const struct sl_page_in *p, struct sl_str *o,
    enum sl_mhist h, const char *name, const char *help)
{
	uint64_t cum[SERIES_BUCKETS_MAX + 1];
	const double *b;
	size_t j;
	int i, n;

	uint64_t rest[SERIES_BUCKETS_MAX + 1];
	double rest_sum;
	size_t k;

	b = sl_shm_mhist_bounds(h, &n);
	sl_str_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	/*
	 * "-" and the first SL_MODEL_HIST_SERIES slots under their own model's
	 * label; the others summed under OTHER_MODELS, with what the slots
	 * given to other names had counted (other_hist), so that the sum
	 * never goes back.
	 */
	for (k = 0; k <= (size_t)n; k++)
		rest[k] = p->slots->other_hist[h][k];
	rest_sum = (double)p->slots->other_hist_us[h] / 1e6;
	for (j = 0; j < p->slots->models.hwm; j++) {
		if (!model_shown(p, j))
			continue;
		for (i = 0; i <= n; i++)
			cum[i] = sl_shm_model_hist_bucket(p->slots->shm, j, h, i);
		if (j > SL_MODEL_HIST_SERIES) {
			for (k = 0; k <= (size_t)n; k++)
				rest[k] += cum[k];
			rest_sum += sl_shm_model_hist_sum(p->slots->shm, j, h);
			continue;
		}
		render_hist_series(o, name, "model", model_label(p, j), b, n, cum,
		    sl_shm_model_hist_sum(p->slots->shm, j, h), 6);
	}
	if (p->slots->models.hwm > SL_MODEL_HIST_SERIES + 1)
		render_hist_series(o, name, "model", OTHER_MODELS, b, n, rest,
		    rest_sum, 6);
}

/* Per model: requests, fallbacks, latencies. */
static void
render_models(const struct sl_page_in *p, struct sl_str *o)
{
	size_t j, k, pos;
	uint64_t v;
	int c;

	sl_str_printf(o, "# HELP sluice_model_requests_total Requests answered, "
	    "by the model that answered (\"-\": none named, an unknown one, or "
	    "no models:) and status.\n"
	    "# TYPE sluice_model_requests_total counter\n");
	for (j = 0; j < p->slots->models.hwm; j++) {
		if (!model_shown(p, j))
			continue;
		for (c = 0; c < SL_NCODES; c++) {
			if ((v = sl_shm_model_requests_sum(p->slots->shm, j, c)) == 0)
				continue;
			sl_str_printf(o, "sluice_model_requests_total{model=\"");
			label(o, model_label(p, j));
			sl_str_printf(o, "\",code=\"%s\"} %llu\n",
			    sl_shm_code_label(c), (unsigned long long)v);
		}
	}
	sl_str_printf(o, "# HELP sluice_model_fallbacks_total Requests moved "
	    "from one model to a fallback model (to the same model: to another "
	    "of its targets).\n"
	    "# TYPE sluice_model_fallbacks_total counter\n");
	for (pos = 0; sl_shm_fallbacks_next(p->slots->shm, &pos, &j, &k, &v);) {
		if (!model_shown(p, j) || !model_shown(p, k))
			continue;
		sl_str_printf(o, "sluice_model_fallbacks_total{model=\"");
		label(o, model_label(p, j));
		sl_str_printf(o, "\",to=\"");
		label(o, model_label(p, k));
		sl_str_printf(o, "\"} %llu\n", (unsigned long long)v);
	}
	render_model_hist(p, o, SL_MHIST_TTFT,
	    "sluice_time_to_first_token_seconds", "Time from request head to "
	    "the first relayed content: an event carrying content, or the "
	    "first body byte (successful responses).");
	render_model_hist(p, o, SL_MHIST_TPOT,
	    "sluice_time_per_output_token_seconds", "(duration - time to first "
	    "token) / (completion tokens - 1), for successful event streams of "
	    "2 completion tokens or more.");
	render_model_hist(p, o, SL_MHIST_DURATION,
	    "sluice_request_duration_seconds", "Time from request head to the "
	    "end of the relayed response.");
}

static const char *
tls_reason(int k)
{
	return sl_tls_err_name((enum sl_tls_err)k);
}

static const char *
h2_reason(int k)
{
	return sl_h2_err_name((enum sl_h2_err)k);
}

/* A counter family by reason: n per-worker stats from first, summed. */
static void
render_reasons(struct sl_str *o, struct sl_shm *shm, const char *name,
    const char *help, int first, int n, const char *(*reason)(int))
{
	int k;

	sl_str_printf(o, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
	for (k = 0; k < n; k++)
		sl_str_printf(o, "%s{reason=\"%s\"} %llu\n", name, reason(k),
		    (unsigned long long)sl_shm_stat_sum(shm,
		    (enum sl_stat)(first + k)));
}

/* The tenant families: streams, limits, requests by status, refusals. */
static void
render_tenants(const struct sl_page_in *p, struct sl_str *o)
{
	struct sl_shm *shm = p->slots->shm;
	size_t t;
	int c;

	sl_str_printf(o, "# HELP sluice_tenant_streams Requests in flight per "
	    "tenant, across all workers.\n# TYPE sluice_tenant_streams gauge\n");
	for (t = 0; t < p->slots->shm_ntenants; t++) {
		if (!index_is_tenant(p, t))
			continue;
		sl_str_printf(o, "sluice_tenant_streams{tenant=\"");
		label(o, p->slots->shm_names[t]);
		sl_str_printf(o, "\"} %d\n", (int)sl_shm_inflight(shm, t));
	}
	sl_str_printf(o, "# HELP sluice_tenant_max_streams Configured limit per "
	    "tenant (0: retired).\n# TYPE sluice_tenant_max_streams gauge\n");
	for (t = 0; t < p->slots->shm_ntenants; t++) {
		if (!index_is_tenant(p, t))
			continue;
		sl_str_printf(o, "sluice_tenant_max_streams{tenant=\"");
		label(o, p->slots->shm_names[t]);
		sl_str_printf(o, "\"} %d\n", (int)sl_shm_limit(shm, t));
	}
	sl_str_printf(o, "# HELP sluice_requests_total Requests answered, by "
	    "tenant and status.\n# TYPE sluice_requests_total counter\n");
	for (t = 0; t <= p->slots->shm_ntenants; t++) {
		size_t ti = t < p->slots->shm_ntenants ? t : SL_TENANT_NONE(shm);

		if (t < p->slots->shm_ntenants && !index_is_tenant(p, t))
			continue;

		for (c = 0; c < SL_NCODES; c++) {
			uint64_t v = sl_shm_requests_sum(shm, ti, c);

			if (v == 0)
				continue;
			sl_str_printf(o, "sluice_requests_total{tenant=\"");
			label(o, t < p->slots->shm_ntenants ?
			    p->slots->shm_names[t] : "-");
			sl_str_printf(o, "\",code=\"%s\"} %llu\n",
			    sl_shm_code_label(c), (unsigned long long)v);
		}
	}
	sl_str_printf(o, "# HELP sluice_rejected_total Requests refused by "
	    "admission.\n# TYPE sluice_rejected_total counter\n");
	for (t = 0; t < p->slots->shm_ntenants; t++) {
		if (!index_is_tenant(p, t))
			continue;
		sl_str_printf(o, "sluice_rejected_total{tenant=\"");
		label(o, p->slots->shm_names[t]);
		sl_str_printf(o, "\",reason=\"max_streams\"} %llu\n",
		    (unsigned long long)sl_shm_rejected_sum(shm, t,
		    SL_REJECT_MAX_STREAMS));
		sl_str_printf(o, "sluice_rejected_total{tenant=\"");
		label(o, p->slots->shm_names[t]);
		sl_str_printf(o, "\",reason=\"token_budget\"} %llu\n",
		    (unsigned long long)sl_shm_rejected_sum(shm, t,
		    SL_REJECT_TOKEN_BUDGET));
	}
}

void
sl_prom_render(const struct sl_page_in *p, struct sl_str *o)
{
	struct sl_shm *shm = p->slots->shm;
	size_t u;
	int k;

	render_tenants(p, o);
	sl_str_printf(o, "# HELP sluice_upstream_errors_total Upstream failures "
	    "by kind.\n# TYPE sluice_upstream_errors_total counter\n");
	for (u = 1; u < p->slots->ups.hwm; u++)
		for (k = 0; k < SL_UERR_MAX && p->slots->ups.names[u] != NULL; k++) {
			sl_str_printf(o, "sluice_upstream_errors_total{upstream=\"");
			label(o, p->slots->ups.names[u]);
			sl_str_printf(o, "\",kind=\"%s\"} %llu\n",
			    sl_shm_uerr_label((enum sl_uerr)k),
			    (unsigned long long)sl_shm_uerr_sum(shm, u,
			    (enum sl_uerr)k));
		}
	sl_str_printf(o,
	    "# HELP sluice_upstream_paused_streams Streams whose upstream is "
	    "paused because the client is slow.\n"
	    "# TYPE sluice_upstream_paused_streams gauge\n"
	    "sluice_upstream_paused_streams %llu\n"
	    "# HELP sluice_stream_buffer_bytes Response bytes waiting for "
	    "clients in stream buffers.\n"
	    "# TYPE sluice_stream_buffer_bytes gauge\n"
	    "sluice_stream_buffer_bytes %llu\n"
	    "# HELP sluice_connections Open client connections by protocol.\n"
	    "# TYPE sluice_connections gauge\n"
	    "sluice_connections{proto=\"h1\"} %llu\n"
	    "sluice_connections{proto=\"h2\"} %llu\n"
	    "# HELP sluice_h2_streams Open HTTP/2 streams with a request.\n"
	    "# TYPE sluice_h2_streams gauge\nsluice_h2_streams %llu\n"
	    "# HELP sluice_upstream_streams Upstream transfers in progress.\n"
	    "# TYPE sluice_upstream_streams gauge\nsluice_upstream_streams %llu\n"
	    "# HELP sluice_admitted_total Requests admitted.\n"
	    "# TYPE sluice_admitted_total counter\nsluice_admitted_total %llu\n"
	    "# HELP sluice_upstream_pauses_total Times a stream's upstream was "
	    "paused.\n# TYPE sluice_upstream_pauses_total counter\n"
	    "sluice_upstream_pauses_total %llu\n"
	    "# HELP sluice_idle_connections_closed_total Connections closed "
	    "after sending no request byte within timeouts.client_header "
	    "(preconnects); not requests.\n"
	    "# TYPE sluice_idle_connections_closed_total counter\n"
	    "sluice_idle_connections_closed_total %llu\n"
	    "# HELP sluice_bytes_out_total Bytes written to clients.\n"
	    "# TYPE sluice_bytes_out_total counter\nsluice_bytes_out_total %llu\n"
	    "# HELP sluice_workers Worker processes of the current generation.\n"
	    "# TYPE sluice_workers gauge\nsluice_workers %d\n"
	    "# HELP sluice_reloads_total Configuration reloads by result.\n"
	    "# TYPE sluice_reloads_total counter\n"
	    "sluice_reloads_total{result=\"ok\"} %u\n"
	    "sluice_reloads_total{result=\"failed\"} %u\n",
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_PAUSED_STREAMS),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_BUFFERED_BYTES),
	    (unsigned long long)(sl_shm_stat_sum(shm, SL_STAT_CONNECTIONS) -
	    sl_shm_stat_sum(shm, SL_STAT_H2_CONNECTIONS)),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_H2_CONNECTIONS),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_H2_STREAMS),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_STREAMS),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_ADMITTED),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_PAUSES),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_IDLE_CLOSED),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_BYTES_OUT),
	    p->workers, p->reloads_ok, p->reloads_failed);
	render_reasons(o, shm, "sluice_tls_handshake_errors_total", "TLS "
	    "handshakes that failed, by reason; no request was read.",
	    SL_STAT_TLS_ERR_FIRST, SL_TLS_E_MAX, tls_reason);
	render_reasons(o, shm, "sluice_h2_protocol_errors_total", "HTTP/2 "
	    "connections or streams ended by the protocol's rules, by reason.",
	    SL_STAT_H2_ERR_FIRST, SL_H2_E_MAX, h2_reason);
	render_tokens(p, o);
	render_models(p, o);
	render_queue(p, o);
	render_replicas(p, o);
	render_hist(o, shm, SL_HIST_TTFB, "sluice_ttfb_seconds",
	    "Time from request head to the upstream's response head.");
	render_hist(o, shm, SL_HIST_DURATION, "sluice_stream_duration_seconds",
	    "Time from request head to the end of the relayed response.");
	if (p->cluster != NULL)
		sl_cluster_render(p->cluster, o);
}

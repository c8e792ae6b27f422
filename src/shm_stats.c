/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The shared region's counters and histograms (sl_shm.h): per worker row
 * (written only by that row's worker, a load and a store), per tenant,
 * per upstream slot and per model slot (shared, one relaxed atomic add
 * each), the fallback table of model slot pairs, and what the master
 * zeroes or folds when a slot is reused or a worker dies.
 */
#include "config.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "sl_shm.h"
#include "shm_int.h"

static struct shm_mstats *
mcell(const struct sl_shm *s, size_t model)
{
	return &s->mstats[model];
}

size_t
sl_shm_model_slots(const struct sl_shm *s)
{
	return s->model_slots;
}

size_t
sl_shm_upstream_slots(const struct sl_shm *s)
{
	return s->upstream_slots;
}

void
sl_shm_upstream_reset(struct sl_shm *s, size_t upstream)
{
	if (upstream < s->upstream_slots)
		memset((void *)&s->ustats[upstream], 0, sizeof(s->ustats[upstream]));
}

void
sl_shm_stat_add(struct sl_shm *s, size_t row, enum sl_stat st, uint64_t n)
{
	if (row >= s->max_rows || st >= SL_STAT_MAX)
		return;
	cell_add(&s->stats[row].v[st], n);
}

void
sl_shm_stat_set(struct sl_shm *s, size_t row, enum sl_stat st, uint64_t v)
{
	if (row >= s->max_rows || st >= SL_STAT_MAX)
		return;
	atomic_store_explicit(&s->stats[row].v[st], v, memory_order_relaxed);
}

uint64_t
sl_shm_stat_sum(const struct sl_shm *s, enum sl_stat st)
{
	size_t r;
	uint64_t sum = 0;

	if (st >= SL_STAT_MAX)
		return 0;
	for (r = 0; r < rows_used(s); r++)
		sum += cell_get(&s->stats[r].v[st]);
	return sum;
}

static const int codes[SL_NCODES] = {
	200, 201, 204, 400, 401, 403, 404, 408, 409, 413, 422, 429, 431, 499,
	500, 501, 502, 503, 504, SL_CODE_CONNECT, SL_CODE_TIMEOUT, SL_CODE_RESET,
	1, 2, 3, 4, 5
};

int
sl_shm_code_slot(int status)
{
	int i;

	for (i = 0; i < SL_NCODES - 5; i++)
		if (codes[i] == status)
			return i;
	if (status >= 100 && status < 600)
		return SL_NCODES - 6 + status / 100;
	return SL_NCODES - 1;
}

const char *
sl_shm_code_label(int slot)
{
	static char labels[SL_NCODES][8];
	static int init;
	int i;

	if (!init) {
		for (i = 0; i < SL_NCODES; i++) {
			if (codes[i] == SL_CODE_CONNECT)
				snprintf(labels[i], sizeof(labels[i]), "connect");
			else if (codes[i] == SL_CODE_TIMEOUT)
				snprintf(labels[i], sizeof(labels[i]), "timeout");
			else if (codes[i] == SL_CODE_RESET)
				snprintf(labels[i], sizeof(labels[i]), "reset");
			else if (i < SL_NCODES - 5)
				snprintf(labels[i], sizeof(labels[i]), "%d", codes[i]);
			else
				snprintf(labels[i], sizeof(labels[i]), "%dxx", codes[i]);
		}
		init = 1;
	}
	return slot >= 0 && slot < SL_NCODES ? labels[slot] : "other";
}

/*
 * A tenant's requests and refusals: shared counters, one relaxed atomic
 * add per request on the tenant's own struct (tenant == max_tenants:
 * requests of no tenant). row is the counting worker's, unused since the
 * counters moved out of the rows; kept so a caller says who counts.
 */
void
sl_shm_count_request(struct sl_shm *s, size_t row, size_t tenant, int status)
{
	if (row >= s->max_rows || tenant > s->max_tenants)
		return;
	atomic_fetch_add_explicit(&s->tenants[tenant].req[sl_shm_code_slot(status)],
	    1, memory_order_relaxed);
}

void
sl_shm_count_rejected(struct sl_shm *s, size_t row, size_t tenant,
    enum sl_reject_reason why)
{
	if (row >= s->max_rows || tenant > s->max_tenants || why >= SL_REJECT_MAX)
		return;
	atomic_fetch_add_explicit(&s->tenants[tenant].rejected[why], 1,
	    memory_order_relaxed);
}

uint64_t
sl_shm_requests_sum(const struct sl_shm *s, size_t tenant, int slot)
{
	if (tenant > s->max_tenants || slot < 0 || slot >= SL_NCODES)
		return 0;
	return cell_get(&s->tenants[tenant].req[slot]);
}

uint64_t
sl_shm_rejected_sum(const struct sl_shm *s, size_t tenant,
    enum sl_reject_reason why)
{
	if (tenant > s->max_tenants || why >= SL_REJECT_MAX)
		return 0;
	return cell_get(&s->tenants[tenant].rejected[why]);
}

const char *
sl_shm_uerr_label(enum sl_uerr k)
{
	static const char *const names[SL_UERR_MAX] = {
		"connect", "timeout", "reset", "bad_response", "idle"
	};

	return k < SL_UERR_MAX ? names[k] : "other";
}

void
sl_shm_count_uerr(struct sl_shm *s, size_t row, size_t upstream,
    enum sl_uerr k)
{
	(void)row;
	if (upstream >= s->upstream_slots || k >= SL_UERR_MAX)
		return;
	atomic_fetch_add_explicit(&s->ustats[upstream].err[k], 1,
	    memory_order_relaxed);
}

const char *
sl_shm_retry_label(enum sl_retry_reason k)
{
	static const char *const names[SL_RETRY_R_MAX] = {
		"connect", "busy", "empty"
	};

	return k < SL_RETRY_R_MAX ? names[k] : "other";
}

void
sl_shm_count_retry(struct sl_shm *s, size_t row, size_t upstream,
    enum sl_retry_reason k)
{
	(void)row;
	if (upstream >= s->upstream_slots || k >= SL_RETRY_R_MAX)
		return;
	atomic_fetch_add_explicit(&s->ustats[upstream].retry[k], 1,
	    memory_order_relaxed);
}

uint64_t
sl_shm_retry_sum(const struct sl_shm *s, size_t upstream,
    enum sl_retry_reason k)
{
	if (upstream >= s->upstream_slots || k >= SL_RETRY_R_MAX)
		return 0;
	return cell_get(&s->ustats[upstream].retry[k]);
}

void
sl_shm_count_affinity(struct sl_shm *s, size_t row, size_t upstream,
    enum sl_aff_outcome k)
{
	(void)row;
	if (upstream >= s->upstream_slots || k >= SL_AFF_MAX)
		return;
	atomic_fetch_add_explicit(&s->ustats[upstream].aff[k], 1,
	    memory_order_relaxed);
}

uint64_t
sl_shm_affinity_sum(const struct sl_shm *s, size_t upstream,
    enum sl_aff_outcome k)
{
	if (upstream >= s->upstream_slots || k >= SL_AFF_MAX)
		return 0;
	return cell_get(&s->ustats[upstream].aff[k]);
}

const char *
sl_shm_stored_label(enum sl_stored_result k)
{
	static const char *const names[SL_STORED_R_MAX] = {
		"owner", "owner_down", "unknown"
	};

	return k < SL_STORED_R_MAX ? names[k] : "other";
}

void
sl_shm_count_stored(struct sl_shm *s, size_t row, size_t upstream,
    enum sl_stored_result k)
{
	(void)row;
	if (upstream >= s->upstream_slots || k >= SL_STORED_R_MAX)
		return;
	atomic_fetch_add_explicit(&s->ustats[upstream].stored[k], 1,
	    memory_order_relaxed);
}

uint64_t
sl_shm_stored_sum(const struct sl_shm *s, size_t upstream,
    enum sl_stored_result k)
{
	if (upstream >= s->upstream_slots || k >= SL_STORED_R_MAX)
		return 0;
	return cell_get(&s->ustats[upstream].stored[k]);
}

uint64_t
sl_shm_uerr_sum(const struct sl_shm *s, size_t upstream, enum sl_uerr k)
{
	if (upstream >= s->upstream_slots || k >= SL_UERR_MAX)
		return 0;
	return cell_get(&s->ustats[upstream].err[k]);
}

static const double bounds[SL_HIST_BUCKETS] = {
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
	300, 600
};

const double *
sl_shm_hist_bounds(void)
{
	return bounds;
}

void
sl_shm_observe(struct sl_shm *s, size_t row, enum sl_hist h, double seconds)
{
	int b;

	if (row >= s->max_rows || h >= SL_HIST_MAX)
		return;
	if (seconds < 0)
		seconds = 0;
	for (b = 0; b < SL_HIST_BUCKETS && seconds > bounds[b]; b++)
		;
	cell_add(&s->stats[row].hist[h][b], 1);
	cell_add(&s->stats[row].hist_sum_us[h], (uint64_t)(seconds * 1e6));
}

uint64_t
sl_shm_hist_bucket(const struct sl_shm *s, enum sl_hist h, int b)
{
	size_t r;
	int i;
	uint64_t sum = 0;

	if (h >= SL_HIST_MAX || b < 0 || b > SL_HIST_BUCKETS)
		return 0;
	for (r = 0; r < rows_used(s); r++)
		for (i = 0; i <= b; i++)
			sum += cell_get(&s->stats[r].hist[h][i]);
	return sum;
}

double
sl_shm_hist_sum(const struct sl_shm *s, enum sl_hist h)
{
	size_t r;
	uint64_t sum = 0;

	if (h >= SL_HIST_MAX)
		return 0;
	for (r = 0; r < rows_used(s); r++)
		sum += cell_get(&s->stats[r].hist_sum_us[h]);
	return (double)sum / 1e6;
}

/* ---- models ------------------------------------------------------------ */

/* The OpenTelemetry GenAI semantic conventions' ExplicitBucketBoundaries. */
static const double ttft_bounds[] = {
	0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
	2.5, 5.0, 7.5, 10.0
};
static const double tpot_bounds[] = {
	0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5
};
static const double duration_bounds[] = {
	0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
	20.48, 40.96, 81.92
};
#define NBOUNDS(a) ((int)(sizeof(a) / sizeof((a)[0])))
_Static_assert(NBOUNDS(ttft_bounds) <= SL_MHIST_BOUNDS_MAX, "bounds");
_Static_assert(NBOUNDS(tpot_bounds) <= SL_MHIST_BOUNDS_MAX, "bounds");
_Static_assert(NBOUNDS(duration_bounds) <= SL_MHIST_BOUNDS_MAX, "bounds");

const double *
sl_shm_mhist_bounds(enum sl_mhist h, int *n)
{
	switch (h) {
	case SL_MHIST_TTFT:
		*n = NBOUNDS(ttft_bounds);
		return ttft_bounds;
	case SL_MHIST_TPOT:
		*n = NBOUNDS(tpot_bounds);
		return tpot_bounds;
	case SL_MHIST_DURATION:
		*n = NBOUNDS(duration_bounds);
		return duration_bounds;
	default:
		*n = 0;
		return NULL;
	}
}

void
sl_shm_count_model_request(struct sl_shm *s, size_t row, size_t model,
    int status)
{
	(void)row;
	if (model >= s->model_slots)
		return;
	atomic_fetch_add_explicit(&mcell(s, model)->req[sl_shm_code_slot(status)],
	    1, memory_order_relaxed);
}

uint64_t
sl_shm_model_requests_sum(const struct sl_shm *s, size_t model, int slot)
{
	if (model >= s->model_slots || slot < 0 || slot >= SL_NCODES)
		return 0;
	return cell_get(&mcell(s, model)->req[slot]);
}

/*
 * The cell of (from, to) in the fallback table; with take, an empty cell
 * on its probe becomes it (its page marked written first). NULL: not
 * there, or no room.
 */
static struct shm_fallback *
fb_find(const struct sl_shm *s, size_t from, size_t to, int take)
{
	uint64_t key = FB_KEY(from, to), k, bit;
	size_t start = pair_hash(key) & (FB_CELLS - 1), at;
	_Atomic uint64_t *page;
	struct shm_fallback *f;
	int i;

	for (i = 0; i < FB_PROBES; i++) {
		at = (start + (size_t)i) & (FB_CELLS - 1);
		bit = UINT64_C(1) << (at / FB_PER_PAGE % 64);
		page = &((struct sl_shm *)s)->fb_pages[at / FB_PER_PAGE / 64];
		if (!(atomic_load(page) & bit)) {
			if (!take)
				return NULL;   /* never written: empty */
			atomic_fetch_or(page, bit);
		}
		f = &s->fallbacks[at];
		k = atomic_load_explicit(&f->key, memory_order_relaxed);
		if (k == key)
			return f;
		if (k != 0)
			continue;
		if (!take)
			return NULL;
		if (atomic_compare_exchange_strong_explicit(&f->key, &k, key,
		    memory_order_relaxed, memory_order_relaxed) || k == key)
			return f;
	}
	return NULL;
}

void
sl_shm_count_fallback(struct sl_shm *s, size_t from, size_t to)
{
	struct shm_fallback *f;

	if (from >= s->model_slots || to >= s->model_slots)
		return;
	if ((f = fb_find(s, from, to, 1)) == NULL &&
	    (f = fb_find(s, from, 0, 1)) == NULL)
		return;
	atomic_fetch_add_explicit(&f->n, 1, memory_order_relaxed);
}

uint64_t
sl_shm_fallbacks(const struct sl_shm *s, size_t from, size_t to)
{
	const struct shm_fallback *f;

	if (from >= s->model_slots || to >= s->model_slots ||
	    (f = fb_find(s, from, to, 0)) == NULL)
		return 0;
	return cell_get(&f->n);
}

/* The first written cell at or after pos (FB_CELLS: none). */
static size_t
fb_walk(const struct sl_shm *s, size_t pos)
{
	size_t at;

	for (; pos < FB_CELLS; pos += FB_PER_PAGE - pos % FB_PER_PAGE) {
		at = pos / FB_PER_PAGE;
		if ((atomic_load(&s->fb_pages[at / 64]) >> (at % 64)) & 1)
			return pos;
	}
	return FB_CELLS;
}

int
sl_shm_fallbacks_next(const struct sl_shm *s, size_t *pos, size_t *from,
    size_t *to, uint64_t *n)
{
	uint64_t key;

	for (*pos = fb_walk(s, *pos); *pos < FB_CELLS;
	    *pos = fb_walk(s, *pos + 1)) {
		key = cell_get(&s->fallbacks[*pos].key);
		*n = cell_get(&s->fallbacks[*pos].n);
		if (key == 0 || *n == 0)
			continue;
		*from = (size_t)(key >> 32) - 1;
		*to = (size_t)(key & UINT32_MAX);
		(*pos)++;
		return 1;
	}
	return 0;
}

void
sl_shm_model_observe(struct sl_shm *s, size_t row, size_t model,
    enum sl_mhist h, double seconds)
{
	const double *b;
	int i, n;

	(void)row;
	if (model >= s->model_slots ||
	    (b = sl_shm_mhist_bounds(h, &n)) == NULL)
		return;
	if (!(seconds >= 0))
		seconds = 0;   /* negative, or NaN */
	for (i = 0; i < n && seconds > b[i]; i++)
		;
	atomic_fetch_add_explicit(&mcell(s, model)->hist[h][i], 1,
	    memory_order_relaxed);
	atomic_fetch_add_explicit(&mcell(s, model)->hist_sum_us[h],
	    seconds > 1e12 ? (uint64_t)1e18 : (uint64_t)(seconds * 1e6),
	    memory_order_relaxed);
}

uint64_t
sl_shm_model_hist_bucket(const struct sl_shm *s, size_t model,
    enum sl_mhist h, int b)
{
	int i, n;
	uint64_t sum = 0;

	if (model >= s->model_slots || sl_shm_mhist_bounds(h, &n) == NULL ||
	    b < 0 || b > n)
		return 0;
	for (i = 0; i <= b; i++)
		sum += cell_get(&mcell(s, model)->hist[h][i]);
	return sum;
}

double
sl_shm_model_hist_sum(const struct sl_shm *s, size_t model, enum sl_mhist h)
{
	if (model >= s->model_slots || h >= SL_MHIST_MAX)
		return 0;
	return (double)cell_get(&mcell(s, model)->hist_sum_us[h]) / 1e6;
}

void
sl_shm_models_reset(struct sl_shm *s, const unsigned char *drop)
{
	size_t i, m, from, to;
	uint64_t key;
	int k, any = 0;

	for (m = 0; m < s->model_slots; m++)
		if (drop[m]) {
			memset((void *)mcell(s, m), 0, sizeof(struct shm_mstats));
			any = 1;
		}
	if (!any)
		return;
	for (i = fb_walk(s, 0); i < FB_CELLS; i = fb_walk(s, i + 1)) {
		key = atomic_load(&s->fallbacks[i].key);
		if (key == 0)
			continue;
		from = (size_t)(key >> 32) - 1;
		to = (size_t)(key & UINT32_MAX);
		if ((from < s->model_slots && drop[from]) ||
		    (to < s->model_slots && drop[to]))
			atomic_store(&s->fallbacks[i].n, 0);
	}
	/* Its pairs are dropped, not reused: a probe must not stop there. */
	for (i = shm_pair_walk(s, 0); i < s->npairs + PAIR_SPILL;
	    i = shm_pair_walk(s, i + 1)) {
		key = atomic_load(&s->pairs[i].key);
		if (key != 0 && key != PAIR_DEAD &&
		    PAIR_MODEL(key) < s->model_slots && drop[PAIR_MODEL(key)]) {
			atomic_store(&s->pairs[i].key, PAIR_DEAD);
			for (k = 0; k < SL_TOKENS_KINDS; k++)
				atomic_store(&s->pairs[i].n[k], 0);
		}
	}
}

void
sl_shm_retire_stats(struct sl_shm *s, size_t row)
{
	struct shm_stats *from, *to;
	int i, h;

	if (row == 0 || row >= s->max_rows)
		return;
	from = &s->stats[row];
	to = &s->stats[0];
	for (i = 0; i < SL_STAT_G_FIRST; i++) {
		cell_add(&to->v[i], cell_get(&from->v[i]));
		atomic_store_explicit(&from->v[i], 0, memory_order_relaxed);
	}
	for (i = SL_STAT_G_FIRST; i < SL_STAT_MAX; i++)
		atomic_store_explicit(&from->v[i], 0, memory_order_relaxed);
	for (h = 0; h < SL_HIST_MAX; h++) {
		for (i = 0; i <= SL_HIST_BUCKETS; i++) {
			cell_add(&to->hist[h][i], cell_get(&from->hist[h][i]));
			atomic_store_explicit(&from->hist[h][i], 0,
			    memory_order_relaxed);
		}
		cell_add(&to->hist_sum_us[h], cell_get(&from->hist_sum_us[h]));
		atomic_store_explicit(&from->hist_sum_us[h], 0, memory_order_relaxed);
	}
}

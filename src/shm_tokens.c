/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The shared region's tokens (sl_shm.h): a tenant's totals by kind, its
 * sliding window of the last minute and its budget, and the table of
 * tenant x model pairs (a home neighbourhood per index, a hashed spill
 * behind it, a walk over the pages written).
 */
#include "config.h"

#include <stdatomic.h>
#include <string.h>

#include "sl_shm.h"
#include "shm_int.h"

/* The pairs a walk must see: those of the indices handed out, and probes. */
static size_t
pairs_used(const struct sl_shm *s)
{
	size_t n = 2 * indices_used(s) + PAIR_PROBES;

	return n < s->npairs ? n : s->npairs;
}

/*
 * The first position at or after pos a walk of the pairs must read: the
 * table's part for the indices in use, then the spill's written pages;
 * npairs + PAIR_SPILL at the end.
 */
size_t
shm_pair_walk(const struct sl_shm *s, size_t pos)
{
	size_t at;

	if (pos < pairs_used(s))
		return pos;
	if (pos < s->npairs)
		pos = s->npairs;
	for (; pos < s->npairs + PAIR_SPILL; pos += PAIRS_PER_PAGE -
	    (pos - s->npairs) % PAIRS_PER_PAGE) {
		at = (pos - s->npairs) / PAIRS_PER_PAGE;
		if ((atomic_load(&s->spill_pages[at / 64]) >> (at % 64)) & 1)
			return pos;
	}
	return s->npairs + PAIR_SPILL;
}

static uint64_t
tok_age(uint64_t w, uint64_t now)
{
	return (now - (w >> TOK_SHIFT)) & SEC_MASK;
}

/* Counters saturate: a counter that wraps goes backwards. */
static void
sat_add(_Atomic uint64_t *c, uint64_t n)
{
	uint64_t o, v;

	if (n == 0)
		return;
	o = atomic_load_explicit(c, memory_order_relaxed);
	do
		v = o > UINT64_MAX - n ? UINT64_MAX : o + n;
	while (!atomic_compare_exchange_weak_explicit(c, &o, v,
	    memory_order_relaxed, memory_order_relaxed));
}

/*
 * One cell of a probe for key: 1 it is (or, with take, has just become)
 * the key's; 0 another key's, probe on; -1 empty and not taken, the key
 * is not in the table.
 */
static int
pair_cell(struct shm_pair *p, uint64_t key, int take)
{
	uint64_t k = atomic_load_explicit(&p->key, memory_order_relaxed);

	if (k == key)
		return 1;
	if (k != 0)
		return 0;
	if (!take)
		return -1;
	return atomic_compare_exchange_strong_explicit(&p->key, &k, key,
	    memory_order_relaxed, memory_order_relaxed) || k == key ? 1 : 0;
}

/*
 * The pair of (tenant, model) in the table; with take, an empty cell on
 * its probe becomes it. NULL when it is not there (or no room). A model
 * starts at the tenant's home or one past it (its low bit), so two models
 * of a tenant do not both probe from one cell.
 */
static struct shm_pair *
pair_find(const struct sl_shm *s, size_t tenant, size_t model, int take)
{
	uint64_t key = PAIR_KEY(tenant, model), bit;
	size_t home = 2 * tenant + (model & 1), at;
	size_t spill = pair_hash(key) & (PAIR_SPILL - 1);
	_Atomic uint64_t *page;
	struct shm_pair *p;
	int i, r;

	for (i = 0; i < PAIR_PROBES && home + (size_t)i < s->npairs; i++) {
		p = &s->pairs[home + (size_t)i];
		if ((r = pair_cell(p, key, take)) != 0)
			return r > 0 ? p : NULL;
	}
	/* The neighbourhood is full: the spill. */
	for (i = 0; i < PAIR_PROBES; i++) {
		at = (spill + (size_t)i) & (PAIR_SPILL - 1);
		bit = UINT64_C(1) << (at / PAIRS_PER_PAGE % 64);
		page = &((struct sl_shm *)s)->spill_pages[at / PAIRS_PER_PAGE / 64];
		if (!(atomic_load(page) & bit)) {
			if (!take)
				return NULL;   /* never written: empty */
			atomic_fetch_or(page, bit);
		}
		p = &s->pairs[s->npairs + at];
		if ((r = pair_cell(p, key, take)) != 0)
			return r > 0 ? p : NULL;
	}
	return NULL;
}

void
sl_shm_tokens_charge(struct sl_shm *s, size_t tenant, size_t model,
    uint64_t now_sec, const uint64_t n[SL_TOKENS_KINDS])
{
	struct shm_tenant *t;
	struct shm_pair *p = NULL;
	_Atomic uint64_t *b;
	uint64_t add = 0, w, nw, sec = (now_sec / TOK_SPAN) & SEC_MASK;
	int k;

	if (tenant >= s->max_tenants)
		return;
	t = &s->tenants[tenant];
	for (k = 0; k < SL_TOKENS_KINDS; k++)
		add = add > UINT64_MAX - n[k] ? UINT64_MAX : add + n[k];
	if (add == 0)
		return;
	if (model > 0 && model < s->model_slots)
		p = pair_find(s, tenant, model, 1);
	for (k = 0; k < SL_TOKENS_KINDS; k++) {
		sat_add(&t->total[k], n[k]);
		sat_add(p != NULL ? &p->n[k] : &t->unrouted[k], n[k]);
	}
	if (add > TOK_MASK)
		add = TOK_MASK;
	b = &t->bucket[(now_sec / TOK_SPAN) % TOK_BUCKETS];
	w = atomic_load_explicit(b, memory_order_relaxed);
	do {
		if ((w >> TOK_SHIFT) == sec) {
			nw = (w & TOK_MASK) + add;
			nw = (sec << TOK_SHIFT) | (nw > TOK_MASK ? TOK_MASK : nw);
		} else
			nw = (sec << TOK_SHIFT) | add;
	} while (!atomic_compare_exchange_weak_explicit(b, &w, nw,
	    memory_order_relaxed, memory_order_relaxed));
}

uint64_t
sl_shm_tokens_window(const struct sl_shm *s, size_t tenant, uint64_t now_sec,
    uint64_t budget, int *retry_after)
{
	uint64_t per_age[TOK_BUCKETS], sum = 0, w, a;
	uint64_t now = (now_sec / TOK_SPAN) & SEC_MASK;
	const struct shm_tenant *t;
	int i;

	if (retry_after != NULL)
		*retry_after = 0;
	if (tenant >= s->max_tenants)
		return 0;
	t = &s->tenants[tenant];
	memset(per_age, 0, sizeof(per_age));
	for (i = 0; i < TOK_BUCKETS; i++) {
		w = atomic_load_explicit(&((struct shm_tenant *)t)->bucket[i],
		    memory_order_relaxed);
		if (w == 0 || (a = tok_age(w, now)) >= TOK_BUCKETS)
			continue;
		per_age[a] += w & TOK_MASK;
		sum += w & TOK_MASK;
	}
	if (retry_after != NULL && budget > 0 && sum >= budget) {
		/*
		 * A bucket of age a (in spans) leaves the window when its age
		 * is TOK_BUCKETS: at second TOK_SPAN * (span now - a +
		 * TOK_BUCKETS).
		 */
		uint64_t left = sum;

		for (i = TOK_BUCKETS - 1; i >= 0; i--) {
			left -= per_age[i];
			if (left < budget) {
				*retry_after = (int)(TOK_SPAN * (now_sec / TOK_SPAN +
				    (uint64_t)(TOK_BUCKETS - i)) - now_sec);
				break;
			}
		}
	}
	return sum;
}

int
sl_shm_tokens_clear_in(const struct sl_shm *s, size_t tenant,
    uint64_t now_sec)
{
	uint64_t now = (now_sec / TOK_SPAN) & SEC_MASK, w, a, young = TOK_BUCKETS;
	const struct shm_tenant *t;
	int i;

	if (tenant >= s->max_tenants)
		return 0;
	t = &s->tenants[tenant];
	for (i = 0; i < TOK_BUCKETS; i++) {
		w = atomic_load_explicit(&((struct shm_tenant *)t)->bucket[i],
		    memory_order_relaxed);
		if (w == 0 || (w & TOK_MASK) == 0 ||
		    (a = tok_age(w, now)) >= TOK_BUCKETS)
			continue;
		if (a < young)
			young = a;
	}
	if (young == TOK_BUCKETS)
		return 0;
	/* As in sl_shm_tokens_window: age TOK_BUCKETS is out of it. */
	return (int)(TOK_SPAN * (now_sec / TOK_SPAN + TOK_BUCKETS - young) -
	    now_sec);
}

void
sl_shm_set_token_budget(struct sl_shm *s, size_t tenant, int32_t budget)
{
	if (tenant < s->max_tenants)
		atomic_store_explicit(&s->tenants[tenant].budget, budget,
		    memory_order_relaxed);
}

int32_t
sl_shm_token_budget(const struct sl_shm *s, size_t tenant)
{
	if (tenant >= s->max_tenants)
		return 0;
	return atomic_load_explicit(
	    &((struct shm_tenant *)&s->tenants[tenant])->budget,
	    memory_order_relaxed);
}

uint64_t
sl_shm_tokens_total(const struct sl_shm *s, size_t tenant, int kind)
{
	if (tenant >= s->max_tenants || kind < 0 || kind >= SL_TOKENS_KINDS)
		return 0;
	return atomic_load_explicit(&((struct shm_tenant *)&s->tenants[tenant])->total[kind],
	    memory_order_relaxed);
}

uint64_t
sl_shm_tokens_model(const struct sl_shm *s, size_t tenant, size_t model,
    int kind)
{
	const struct shm_pair *p;

	if (tenant >= s->max_tenants || kind < 0 || kind >= SL_TOKENS_KINDS ||
	    model >= s->model_slots)
		return 0;
	if (model == 0)
		return cell_get(&s->tenants[tenant].unrouted[kind]);
	p = pair_find(s, tenant, model, 0);
	return p != NULL ? cell_get(&p->n[kind]) : 0;
}

int
sl_shm_tokens_next(const struct sl_shm *s, size_t *pos, size_t *tenant,
    size_t *model, uint64_t n[SL_TOKENS_KINDS])
{
	uint64_t key;
	int k;

	for (*pos = shm_pair_walk(s, *pos); *pos < s->npairs + PAIR_SPILL;
	    *pos = shm_pair_walk(s, *pos + 1)) {
		key = cell_get(&s->pairs[*pos].key);
		if (key == 0 || key == PAIR_DEAD)
			continue;
		*tenant = PAIR_TENANT(key);
		*model = PAIR_MODEL(key);
		for (k = 0; k < SL_TOKENS_KINDS; k++)
			n[k] = cell_get(&s->pairs[*pos].n[k]);
		(*pos)++;
		return 1;
	}
	return 0;
}

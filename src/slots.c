/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The shared region's name maps (sl_slots.h): tenants and replicas to
 * shared indices, models, upstreams and queue pools to their slots, kept
 * across reloads and given to other names only once nothing counts under
 * the old one.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sl_log.h"
#include "sl_slots.h"
#include "sl_stored.h"
#include "sl_util.h"

/*
 * Zeroed memory for an array sized by the region's room (limits.max_tenants):
 * its own mapping, so that its pages cost nothing until an index in use
 * writes them. calloc could hand out the heap's free top (a big
 * configuration's parse leaves one) and zero all of it.
 */
void *
sl_slots_reserve(size_t n)
{
	void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE,
	    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

void
sl_slots_unreserve(void *p, size_t n)
{
	if (p != NULL)
		munmap(p, n ? n : 1);
}

static int
slot_table_init(struct sl_slot_table *st, size_t n)
{
	st->n = n;
	st->hwm = 1;               /* slot 0 is never named */
	st->names = sl_slots_reserve(n * sizeof(*st->names));
	st->gen = sl_slots_reserve(n * sizeof(*st->gen));
	return st->names != NULL && st->gen != NULL ? 0 : -1;
}

static void
slot_table_free(struct sl_slot_table *st)
{
	size_t j;

	for (j = 0; st->names != NULL && j < st->hwm; j++)
		free(st->names[j]);
	sl_slots_unreserve(st->names, st->n * sizeof(*st->names));
	sl_slots_unreserve(st->gen, st->n * sizeof(*st->gen));
}

static size_t
name_hash(const char *s)
{
	return (size_t)sl_fnv1a(SL_FNV_OFFSET, s, strlen(s));
}

/*
 * Slot of name in the name table: its entry, or the empty slot where it
 * goes. The table is kept at most half full (name_table_grow) and names
 * are removed only by rebuilding it (name_table_rebuild), so a probe
 * ends. It grows with the names, not with the region's room: a table
 * sized for a million names, written at random, would cost its whole size
 * at ten thousand.
 */
static size_t *
name_slot(struct sl_slots *s, const char *name)
{
	size_t i = name_hash(name) & s->name_ht_mask;

	while (s->name_ht[i] != 0 &&
	    strcmp(s->shm_names[s->name_ht[i] - 1], name) != 0)
		i = (i + 1) & s->name_ht_mask;
	return &s->name_ht[i];
}

/* Every name again, after some were freed (open addressing: no holes). */
static void
name_table_rebuild(struct sl_slots *s)
{
	size_t j;

	memset(s->name_ht, 0, (s->name_ht_mask + 1) * sizeof(*s->name_ht));
	s->name_ht_n = 0;
	for (j = 0; j < s->shm_ntenants; j++)
		if (s->shm_names[j] != NULL) {
			*name_slot(s, s->shm_names[j]) = j + 1;
			s->name_ht_n++;
		}
}

/* Room for one more name: double the table past half full. -1: no memory. */
static int
name_table_grow(struct sl_slots *s)
{
	size_t size = s->name_ht_mask + 1, *ht;

	if (s->name_ht != NULL && 2 * (s->name_ht_n + 1) <= size)
		return 0;
	if (s->name_ht != NULL)
		size *= 2;
	if ((ht = calloc(size, sizeof(*ht))) == NULL)
		return -1;
	free(s->name_ht);
	s->name_ht = ht;
	s->name_ht_mask = size - 1;
	name_table_rebuild(s);
	return 0;
}

/*
 * Give back the indices of tenants and replicas that reloads removed,
 * once nothing can touch them any more: not mapped by the current
 * generation (nor a newer one that failed to start), retired (limit 0:
 * nothing admitted), nothing in flight and no worker row holding a slot
 * (a dead worker's row is reclaimed at its reaping). Their counters,
 * health and affinity hints are zeroed and their epoch bumped: a
 * draining worker that still maps one (a removed tenant's key, a replica
 * it may retry onto) sees the new epoch and leaves it alone (sl_shm.h).
 * Until then a retired index stays reserved, and its streams are shown
 * under its old name. Returns the indices given back.
 */
static size_t
reuse_retired(struct sl_slots *s, const struct sl_slots_ctx *c)
{
	unsigned char *drop;
	size_t j, n = 0;

	if ((drop = sl_slots_reserve(sl_shm_max_tenants(s->shm))) == NULL)
		return 0;
	for (j = 0; j < s->shm_ntenants; j++)
		if (!s->shm_free[j] && s->shm_gen[j] < c->cur &&
		    sl_shm_limit(s->shm, j) == 0 &&
		    sl_shm_index_quiet(s->shm, j)) {
			drop[j] = 1;
			n++;
		}
	if (n > 0) {
		sl_shm_hint_drop_slots(s->shm, drop);
		for (j = 0; j < s->shm_ntenants; j++)
			if (drop[j]) {
				sl_shm_index_reset(s->shm, j);
				sl_queue_forget_tenant(c->queue, SL_QUEUE_ROW, j);
				if (c->window != NULL)
					sl_window_forget(c->window,
					    j * SL_INDEX_VALUES, SL_INDEX_VALUES);
				s->shm_epoch[j] = sl_shm_epoch(s->shm, j);
				free(s->shm_names[j]);
				s->shm_names[j] = NULL;
				s->shm_free[j] = 1;
				s->free_stack[s->shm_nfree++] = j;
				if (!s->shm_replica[j])
					s->shm_tenants_live--;
			}
		name_table_rebuild(s);
		sl_debug("%zu index(es) of removed tenants or replicas free "
		    "again", n);
	}
	sl_slots_unreserve(drop, sl_shm_max_tenants(s->shm));
	return n;
}

/*
 * The stable shm index of name (same name, same index across reloads),
 * handed out on first sight; (size_t)-1 when the region is full. A new
 * replica takes the index of a removed one when there is one free.
 */
static size_t
shm_index(struct sl_slots *s, const char *name, int replica)
{
	/* A hash lookup: 100k tenants must not cost 10^10 compares. */
	size_t *slot, j;

	if (name_table_grow(s) == -1)
		return (size_t)-1;
	slot = name_slot(s, name);
	if (*slot != 0)
		return *slot - 1;
	if (!replica && s->shm_tenants_live >= 2 * s->max_tenants) {
		sl_err("no room for tenant '%s': %zu tenants are mapped, removed "
		    "ones among them until their streams end (limits.max_tenants "
		    "%zu at start); reload again once they have ended", name,
		    s->shm_tenants_live, s->max_tenants);
		return (size_t)-1;
	}
	j = s->shm_nfree > 0 ? s->free_stack[s->shm_nfree - 1] :
	    s->shm_ntenants;
	if (j == sl_shm_max_tenants(s->shm)) {
		sl_err("no room for %s: the %zu shared indices (2 x "
		    "limits.max_tenants + 2 x %zu replicas) are in use; restart "
		    "to grow them", replica ? "a replica" : "a tenant",
		    sl_shm_max_tenants(s->shm), s->replica_room);
		return (size_t)-1;
	}
	if ((s->shm_names[j] = strdup(name)) == NULL)
		return (size_t)-1;
	s->shm_replica[j] = (unsigned char)replica;
	*slot = j + 1;
	s->name_ht_n++;
	if (!replica)
		s->shm_tenants_live++;
	if (s->shm_nfree > 0 && j == s->free_stack[s->shm_nfree - 1]) {
		s->shm_free[j] = 0;
		s->shm_nfree--;
	} else {
		s->shm_ntenants++;
		sl_shm_set_indices_used(s->shm, s->shm_ntenants);
	}
	return j;
}

/*
 * Indices of one kind (tenants, or replicas) that the new mapping did not
 * keep get limit 0: nothing new is admitted, what is in flight finishes.
 */
static void
retire_unkept(struct sl_slots *s, const unsigned char *keep, int replica)
{
	size_t j;

	for (j = 0; j < s->shm_ntenants; j++)
		if (!keep[j] && s->shm_replica[j] == replica)
			sl_shm_set_limit(s->shm, j, 0);
}

static char *
replica_key(const char *upstream, const char *url)
{
	size_t a = strlen(upstream), b = strlen(url);
	char *k = malloc(a + b + 3);

	if (k != NULL) {
		k[0] = '\x01';
		memcpy(k + 1, upstream, a);
		k[a + 1] = '\x01';
		memcpy(k + a + 2, url, b + 1);
	}
	return k;
}

void
sl_slots_free_replica_map(size_t **rmap, size_t n)
{
	size_t u;

	if (rmap == NULL)
		return;
	for (u = 0; u < n; u++)
		free(rmap[u]);
	free(rmap);
}

/*
 * Map every replica of every pool to a stable shm index, keyed by upstream
 * name and URL (a reload keeps the counts and health of replicas that
 * stay), and publish caps: max_streams, or no cap. A replica a reload
 * removed gets cap 0: it takes no new stream, and those in flight finish.
 * gen: the generation the mapping is for. Returns the mapping (caller
 * owns; free_replica_map) or NULL.
 */
size_t **
sl_slots_map_replicas(struct sl_slots *s, const struct sl_slots_ctx *c,
    const struct sl_config *cfg, unsigned gen)
{
	size_t **map, u, r, j;
	unsigned char *keep;

	reuse_retired(s, c);
	map = calloc(cfg->nupstreams ? cfg->nupstreams : 1, sizeof(*map));
	keep = sl_slots_reserve(sl_shm_max_tenants(s->shm));
	if (map == NULL || keep == NULL)
		goto fail;
	for (u = 0; u < cfg->nupstreams; u++) {
		const struct sl_upstream_conf *up = &cfg->upstreams[u];

		map[u] = calloc(up->nreplicas ? up->nreplicas : 1, sizeof(size_t));
		if (map[u] == NULL)
			goto fail;
		for (r = 0; r < up->nreplicas; r++) {
			char *k = replica_key(up->name, up->replicas[r].url);

			j = k != NULL ? shm_index(s, k, 1) : (size_t)-1;
			free(k);
			if (j == (size_t)-1)
				goto fail;
			map[u][r] = j;
			keep[j] = 1;
			/* The newest generation that may map it. */
			if (s->shm_gen[j] < gen)
				s->shm_gen[j] = gen;
		}
	}
	for (u = 0; u < cfg->nupstreams; u++)
		for (r = 0; r < cfg->upstreams[u].nreplicas; r++) {
			int32_t cap = cfg->upstreams[u].replicas[r].max_streams;
			struct sl_shm_replica *h = sl_shm_replica(s->shm,
			    map[u][r]);

			sl_shm_set_limit(s->shm, map[u][r], cap > 0 ? cap : INT32_MAX);
			/*
			 * A reload clears busy marks: the operator's way to
			 * put a replica back at once (sluice.yaml.5).
			 */
			if (h != NULL)
				atomic_store(&h->busy_until_ms, 0);
		}
	retire_unkept(s, keep, 1);
	sl_slots_unreserve(keep, sl_shm_max_tenants(s->shm));
	return map;
fail:
	sl_slots_free_replica_map(map, cfg->nupstreams);
	sl_slots_unreserve(keep, sl_shm_max_tenants(s->shm));
	return NULL;
}

/*
 * Map every tenant of cfg to a stable shm index (same name, same index
 * across reloads) and publish limits. Tenants that disappeared are retired
 * (limit 0): their in-flight streams still release. Returns the mapping
 * (caller owns) or NULL when the region is full.
 */
size_t *
sl_slots_map_tenants(struct sl_slots *s, const struct sl_slots_ctx *c,
    const struct sl_config *cfg, unsigned gen)
{
	size_t *map, i, j;
	unsigned char *keep;

	reuse_retired(s, c);
	map = calloc(cfg->ntenants ? cfg->ntenants : 1, sizeof(*map));
	keep = sl_slots_reserve(sl_shm_max_tenants(s->shm));
	if (map == NULL || keep == NULL)
		goto fail;
	for (i = 0; i < cfg->ntenants; i++) {
		if ((j = shm_index(s, cfg->tenants[i].name, 0)) == (size_t)-1)
			goto fail;
		map[i] = j;
		keep[j] = 1;
		/* The newest generation that may map it. */
		if (s->shm_gen[j] < gen)
			s->shm_gen[j] = gen;
	}
	/* Publish only once the whole mapping exists. */
	for (i = 0; i < cfg->ntenants; i++) {
		sl_shm_set_limit(s->shm, map[i], cfg->tenants[i].max_streams);
		sl_shm_set_token_budget(s->shm, map[i],
		    cfg->tenants[i].tokens_per_minute);
	}
	retire_unkept(s, keep, 0);
	sl_slots_unreserve(keep, sl_shm_max_tenants(s->shm));
	return map;
fail:
	free(map);
	sl_slots_unreserve(keep, sl_shm_max_tenants(s->shm));
	return NULL;
}

_Static_assert(2 * SL_MAX_MODELS + 1 <= SL_SHM_MAX_MODEL_SLOTS,
    "slot 0 is \"-\"");

/*
 * A slot summed under "_other" goes to another name: what it counted
 * stays in the sum.
 */
static void
keep_other_hist(struct sl_slots *s, size_t slot)
{
	int h, b, n;

	for (h = 0; h < SL_MHIST_MAX; h++) {
		sl_shm_mhist_bounds((enum sl_mhist)h, &n);
		for (b = 0; b <= n; b++)   /* cumulative, as rendered */
			s->other_hist[h][b] += sl_shm_model_hist_bucket(s->shm,
			    slot, (enum sl_mhist)h, b);
		s->other_hist_us[h] += (uint64_t)(sl_shm_model_hist_sum(s->shm,
		    slot, (enum sl_mhist)h) * 1e6);
	}
}

/*
 * Give each of the count names of want (NULL: no slot wanted) a slot of
 * st for generation gen, into map[] (0: none): the slot it had (a name a
 * reload keeps keeps its counters), else a slot never used, else the slot
 * of a removed name that no live worker can count under any more. drop[]
 * (st->n bytes, zeroed) gets the slots that changed name: the caller
 * zeroes their counters before a worker of gen starts. There are twice
 * the names a configuration may hold, so a reload may replace them all
 * while as many removed ones drain. O(slots + names). Returns the names
 * left without a slot (only when reloads replaced names faster than
 * workers drained), or -1 without memory.
 */
static long
map_slots(struct sl_slots *s, const struct sl_slots_ctx *c,
    struct sl_slot_table *st, const char *const *want, size_t count,
    unsigned gen, size_t *map, unsigned char *drop)
{
	size_t *ht, mask, i, j, h, nfree = 0, *freel = NULL;
	unsigned char *keep;
	long left = 0;

	for (mask = 1; mask < 2 * (st->hwm + 1); mask <<= 1)
		;
	ht = calloc(mask, sizeof(*ht));
	mask--;
	keep = calloc(st->n, 1);
	if (ht == NULL || keep == NULL)
		goto fail;
	for (j = 1; j < st->hwm; j++)
		if (st->names[j] != NULL) {
			for (h = name_hash(st->names[j]) & mask; ht[h] != 0;
			    h = (h + 1) & mask)
				;
			ht[h] = j;
		}
	for (i = 0; i < count; i++) {
		map[i] = 0;
		if (want[i] == NULL)
			continue;
		for (h = name_hash(want[i]) & mask; ht[h] != 0; h = (h + 1) & mask)
			if (strcmp(st->names[ht[h]], want[i]) == 0) {
				map[i] = ht[h];
				keep[ht[h]] = 1;
				break;
			}
	}
	for (i = 0; i < count; i++) {
		if (map[i] != 0 || want[i] == NULL)
			continue;
		if (st->hwm < st->n) {
			j = st->hwm++;
		} else {
			if (freel == NULL) {
				/* Once: the slots of removed names nobody counts under. */
				if ((freel = calloc(st->n, sizeof(*freel))) == NULL)
					goto fail;
				for (j = st->n - 1; j >= 1; j--)
					if (!keep[j] && st->gen[j] < c->cur &&
					    c->oldest_live > st->gen[j])
						freel[nfree++] = j;
			}
			if (nfree == 0) {
				left++;
				continue;
			}
			j = freel[--nfree];
		}
		if (st->names[j] != NULL) {
			drop[j] = 1;
			free(st->names[j]);
			st->names[j] = NULL;
		}
		if ((st->names[j] = strdup(want[i])) == NULL)
			goto fail;
		map[i] = j;
		keep[j] = 1;
	}
	for (j = 1; j < st->hwm; j++)
		if (keep[j])
			st->gen[j] = gen;
	free(ht);
	free(keep);
	free(freel);
	return left;
fail:
	free(ht);
	free(keep);
	free(freel);
	return -1;
}

/*
 * Map every model of cfg to a model slot of the region for generation
 * gen (map_slots). A model with no slot left counts under "-" for this
 * generation, and a warning says so. Returns the mapping (caller owns),
 * or NULL without memory.
 */
size_t *
sl_slots_map_models(struct sl_slots *s, const struct sl_slots_ctx *c,
    const struct sl_config *cfg, unsigned gen)
{
	size_t *map, i, j;
	const char **want;
	unsigned char *drop;
	long left;
	int reset = 0;

	map = calloc(cfg->nmodels ? cfg->nmodels : 1, sizeof(*map));
	want = calloc(cfg->nmodels ? cfg->nmodels : 1, sizeof(*want));
	drop = calloc(s->models.n, 1);
	if (map == NULL || want == NULL || drop == NULL) {
		free(map);
		map = NULL;
		goto out;
	}
	for (i = 0; i < cfg->nmodels; i++)
		want[i] = cfg->models[i].name;
	left = map_slots(s, c, &s->models, want, cfg->nmodels, gen, map, drop);
	for (j = 1; j < s->models.n; j++)
		if (drop[j]) {
			sl_debug("model slot %zu goes to another model", j);
			if (j > SL_MODEL_HIST_SERIES)
				keep_other_hist(s, j);
			if (c->mwindow != NULL)
				sl_window_forget(c->mwindow, j * SL_MODEL_VALUES,
				    SL_MODEL_VALUES);
			reset = 1;
		}
	if (reset)
		sl_shm_models_reset(s->shm, drop);
	if (left < 0) {
		free(map);
		map = NULL;
		goto out;
	}
	for (i = 0; left > 0 && i < cfg->nmodels; i++)
		if (map[i] == 0)
			sl_warn("model '%s': all %zu model metric slots are held by "
			    "models that workers still draining may count; its "
			    "metrics go under model \"-\" until a later reload",
			    cfg->models[i].name, s->models.n - 1);
out:
	free(want);
	free(drop);
	return map;
}

/*
 * The fair queue follows cfg (start and reload): each pool's queue, each
 * tenant's weight and priority, at once for the requests waiting, before
 * the workers that use them start; with close_removed (once the reload
 * cannot fail any more), a pool the reload removed answers its waiters
 * 503 upstream_unavailable.
 */
void
sl_slots_publish_queue(struct sl_slots *s, const struct sl_slots_ctx *c,
    const struct sl_config *cfg, const size_t *tmap, const size_t *qmap,
    int close_removed)
{
	unsigned char kept[SL_QUEUE_POOLS];
	size_t i;
	int wake = 1;

	memset(kept, 0, sizeof(kept));
	for (i = 0; i < cfg->nupstreams; i++)
		if (cfg->upstreams[i].queue.enabled &&
		    sl_queue_enable_wake(c->queue) == -1) {
			sl_err("cannot make the fair queue's eventfds: %s; "
			    "requests to a full pool get 503 at once",
			    strerror(errno));
			wake = 0;
			break;
		}
	for (i = 0; i < cfg->nupstreams; i++) {
		const struct sl_upstream_conf *u = &cfg->upstreams[i];

		if (qmap[i] == 0)
			continue;       /* no queue: pool 0, never set */
		kept[qmap[i]] = 1;
		sl_queue_set_pool(c->queue, qmap[i],
		    u->queue.enabled && wake ? u->queue.max : 0,
		    (int32_t)u->queue.timeout_ms,
		    u->queue.fairness == SL_FAIRNESS_FIFO ? SL_QUEUE_FIFO :
		    SL_QUEUE_TOKENS);
	}
	for (i = 1; close_removed && i < s->queues.hwm; i++)
		if (!kept[i] && s->queues.names[i] != NULL)
			sl_queue_close_pool(c->queue, SL_QUEUE_ROW, i);
	for (i = 0; i < cfg->ntenants; i++)
		sl_queue_set_tenant(c->queue, tmap[i], cfg->tenants[i].weight,
		    cfg->tenants[i].priority);
}

/*
 * Upstream slots for the error counters, and queue pools for the
 * upstreams with a queue (*qmapp), both by name for generation gen
 * (map_slots): 0, or -1 (said why) when a reload replaced upstreams
 * faster than workers drained, or without memory.
 */
int
sl_slots_map_upstreams(struct sl_slots *s, const struct sl_slots_ctx *c,
    const struct sl_config *cfg, unsigned gen,
    size_t **umapp, size_t **qmapp)
{
	size_t n = cfg->nupstreams ? cfg->nupstreams : 1, i, j;
	size_t *umap = calloc(n, sizeof(*umap)), *qmap = calloc(n, sizeof(*qmap));
	const char **want = calloc(n, sizeof(*want));
	unsigned char *udrop = calloc(s->ups.n, 1), *qdrop = calloc(SL_QUEUE_POOLS, 1);
	long left = -1, qleft = -1;

	*umapp = *qmapp = NULL;
	if (umap == NULL || qmap == NULL || want == NULL || udrop == NULL ||
	    qdrop == NULL)
		goto out;
	for (i = 0; i < cfg->nupstreams; i++)
		want[i] = cfg->upstreams[i].name;
	left = map_slots(s, c, &s->ups, want, cfg->nupstreams, gen, umap, udrop);
	for (i = 0; i < cfg->nupstreams; i++)
		want[i] = cfg->upstreams[i].queue.enabled ?
		    cfg->upstreams[i].name : NULL;
	qleft = map_slots(s, c, &s->queues, want, cfg->nupstreams, gen, qmap, qdrop);
	for (j = 1; j < s->ups.n; j++)
		if (udrop[j]) {
			sl_shm_upstream_reset(s->shm, j);
			sl_stored_reset_pool(c->stored, j);
		}
	for (j = 1; c->queue != NULL && j < SL_QUEUE_POOLS; j++)
		if (qdrop[j])
			sl_queue_reset_pool(c->queue, j);
	for (i = 0; left > 0 && i < cfg->nupstreams; i++)
		if (umap[i] == 0)
			sl_err("no room for upstream '%s': all %zu upstream slots "
			    "are held by upstreams that workers still draining "
			    "may use (limits.max_upstreams %zu at start); reload "
			    "again once they have ended", cfg->upstreams[i].name,
			    s->ups.n - 1, s->max_upstreams);
	for (i = 0; qleft > 0 && i < cfg->nupstreams; i++)
		if (qmap[i] == 0 && cfg->upstreams[i].queue.enabled)
			sl_err("no room for the queue of upstream '%s': all %d "
			    "queues are held by upstreams that workers still "
			    "draining may use; reload again once they have ended",
			    cfg->upstreams[i].name, SL_QUEUE_POOLS - 1);
out:
	free(want);
	free(udrop);
	free(qdrop);
	if (left != 0 || qleft != 0) {
		free(umap);
		free(qmap);
		return -1;
	}
	*umapp = umap;
	*qmapp = qmap;
	return 0;
}

int
sl_slots_init_tables(struct sl_slots *s, size_t max_models,
    size_t max_upstreams)
{
	s->max_models = max_models;
	s->max_upstreams = max_upstreams;
	if (slot_table_init(&s->models, 2 * max_models + 1) == -1 ||
	    slot_table_init(&s->ups, 2 * max_upstreams + 1) == -1 ||
	    slot_table_init(&s->queues, SL_QUEUE_POOLS) == -1)
		return -1;
	return 0;
}

int
sl_slots_init_index(struct sl_slots *s, struct sl_shm *shm, size_t cap)
{
	s->shm = shm;
	s->shm_names = sl_slots_reserve(cap * sizeof(char *));
	s->shm_replica = sl_slots_reserve(cap);
	s->shm_gen = sl_slots_reserve(cap * sizeof(*s->shm_gen));
	s->shm_epoch = sl_slots_reserve(cap * sizeof(*s->shm_epoch));
	s->shm_free = sl_slots_reserve(cap);
	s->free_stack = sl_slots_reserve(cap * sizeof(*s->free_stack));
	if (s->shm == NULL || s->shm_names == NULL || name_table_grow(s) == -1 ||
	    s->shm_replica == NULL || s->shm_gen == NULL || s->shm_free == NULL ||
	    s->shm_epoch == NULL || s->free_stack == NULL)
		return -1;
	return 0;
}

void
sl_slots_free(struct sl_slots *s)
{
	size_t j, cap;

	for (j = 0; j < s->shm_ntenants; j++)
		free(s->shm_names[j]);
	cap = sl_shm_max_tenants(s->shm);
	sl_slots_unreserve(s->shm_names, cap * sizeof(char *));
	free(s->name_ht);
	sl_slots_unreserve(s->shm_replica, cap);
	sl_slots_unreserve(s->shm_gen, cap * sizeof(*s->shm_gen));
	sl_slots_unreserve(s->shm_epoch, cap * sizeof(*s->shm_epoch));
	sl_slots_unreserve(s->shm_free, cap);
	sl_slots_unreserve(s->free_stack, cap * sizeof(*s->free_stack));
	slot_table_free(&s->ups);
	slot_table_free(&s->queues);
	slot_table_free(&s->models);
}

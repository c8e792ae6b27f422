/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The shared region: its layout mapped, tenant and replica admission, the
 * per-worker held counts and their reclaim, an index's reuse, replica
 * health cells and affinity hints. See sl_shm.h for the layout rules and
 * shm_int.h for what the region's files share. Relaxed atomics suffice:
 * the counters guard no other data, and the master reads a dead worker's
 * row only after waitpid(), which orders it after everything the worker
 * wrote.
 */
#include "config.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sl_shm.h"
#include "shm_int.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "shared counters need lock-free int");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "shared stats need lock-free long long");

/*
 * An affinity hint word: the hash's top HINT_TAG_BITS bits, the "ended"
 * bit, then slot + 1 in the low HINT_SLOT_BITS bits (0: empty). The index
 * is the hash's low bits, the tag its high ones: independent parts of a
 * well-mixed hash.
 */
#define HINT_SLOT_BITS 21               /* slot + 1 < 2^21 (SL_SHM_MAX_INDICES) */
#define HINT_ENDED (UINT64_C(1) << HINT_SLOT_BITS)
#define HINT_TAG_SHIFT (HINT_SLOT_BITS + 1)
#define HINT_SLOT_MASK ((UINT64_C(1) << HINT_SLOT_BITS) - 1)
#define HINT_TAG(h) ((h) >> HINT_TAG_SHIFT << HINT_TAG_SHIFT)

static size_t
round_up(size_t n, size_t a)
{
	return (n + a - 1) / a * a;
}

struct sl_shm *
sl_shm_create(size_t max_tenants, size_t max_rows, size_t model_slots,
    size_t upstream_slots)
{
	size_t off_tenants, off_held, off_pages, off_stats, off_ustats, off_sync;
	size_t off_replicas, off_hints, off_mstats, off_fallbacks, off_pairs;
	size_t stride, words, npairs, len;
	char *base;
	struct sl_shm *s;

	if (max_tenants == 0 || max_rows == 0 ||
	    max_tenants > SL_SHM_MAX_INDICES || max_rows > 4096 ||
	    model_slots == 0 || model_slots > SL_SHM_MAX_MODEL_SLOTS ||
	    upstream_slots == 0 || upstream_slots > SL_SHM_MAX_UPSTREAM_SLOTS) {
		errno = EINVAL;
		return NULL;
	}
	stride = round_up(max_tenants, HELD_PER_PAGE);
	words = (stride / HELD_PER_PAGE + 63) / 64;
	npairs = (max_tenants < 512 ? 1024 : SL_SHM_PAIRS_PER_TENANT *
	    max_tenants) + PAIR_PROBES;
	off_tenants = round_up(sizeof(struct sl_shm), SL_CACHELINE);
	off_held = round_up(off_tenants +
	    (max_tenants + 1) * sizeof(struct shm_tenant), 4096);
	off_pages = off_held + max_rows * stride * sizeof(int32_t);
	off_stats = round_up(off_pages + max_rows * words * sizeof(uint64_t),
	    SL_CACHELINE);
	off_ustats = round_up(off_stats + max_rows * sizeof(struct shm_stats),
	    SL_CACHELINE);
	off_sync = round_up(off_ustats + upstream_slots *
	    sizeof(struct shm_ustats), SL_CACHELINE);
	off_replicas = round_up(off_sync + max_rows * sizeof(struct shm_sync),
	    SL_CACHELINE);
	off_hints = round_up(off_replicas +
	    max_tenants * sizeof(struct shm_replica), SL_CACHELINE);
	off_mstats = round_up(off_hints + SL_SHM_HINTS * sizeof(uint64_t),
	    SL_CACHELINE);
	off_fallbacks = round_up(off_mstats +
	    model_slots * sizeof(struct shm_mstats), 4096);
	off_pairs = round_up(off_fallbacks +
	    FB_CELLS * sizeof(struct shm_fallback), SL_CACHELINE);
	len = off_pairs + (npairs + PAIR_SPILL) * sizeof(struct shm_pair);

	/*
	 * Room for the whole capacity, reserved, not committed: a page costs
	 * memory once written (or read), and nothing here touches a page an
	 * index in use does not need.
	 */
	base = mmap(NULL, len, PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		return NULL;
	/* Anonymous mappings are zero-filled: every counter starts at 0. */
	s = (struct sl_shm *)(void *)base;
	s->max_tenants = max_tenants;
	s->max_rows = max_rows;
	s->map_len = len;
	s->tenants = (struct shm_tenant *)(void *)(base + off_tenants);
	s->held = (_Atomic int32_t *)(void *)(base + off_held);
	s->held_stride = stride;
	s->held_pages = (_Atomic uint64_t *)(void *)(base + off_pages);
	s->held_words = words;
	s->stats = (struct shm_stats *)(void *)(base + off_stats);
	s->ustats = (struct shm_ustats *)(void *)(base + off_ustats);
	s->sync = (struct shm_sync *)(void *)(base + off_sync);
	s->replicas = (struct shm_replica *)(void *)(base + off_replicas);
	s->hints = (_Atomic uint64_t *)(void *)(base + off_hints);
	s->mstats = (struct shm_mstats *)(void *)(base + off_mstats);
	s->model_slots = model_slots;
	s->upstream_slots = upstream_slots;
	s->fallbacks = (struct shm_fallback *)(void *)(base + off_fallbacks);
	s->pairs = (struct shm_pair *)(void *)(base + off_pairs);
	s->npairs = npairs;
	return s;
}

void
sl_shm_destroy(struct sl_shm *s)
{
	if (s != NULL)
		munmap(s, s->map_len);
}

size_t
sl_shm_max_tenants(const struct sl_shm *s)
{
	return s->max_tenants;
}

size_t
sl_shm_size(const struct sl_shm *s)
{
	return s->map_len;
}

void
sl_shm_set_rows_used(struct sl_shm *s, size_t n)
{
	hwm_set(&s->rows_used, n, s->max_rows);
}

size_t
sl_shm_max_rows(const struct sl_shm *s)
{
	return s->max_rows;
}

void
sl_shm_set_limit(struct sl_shm *s, size_t tenant, int32_t limit)
{
	/* Release: a worker that admits under it sees an epoch bumped before. */
	if (tenant < s->max_tenants)
		atomic_store_explicit(&s->tenants[tenant].limit, limit,
		    memory_order_release);
}

int32_t
sl_shm_limit(const struct sl_shm *s, size_t tenant)
{
	if (tenant >= s->max_tenants)
		return 0;
	return atomic_load_explicit(&s->tenants[tenant].limit,
	    memory_order_relaxed);
}

int32_t
sl_shm_inflight(const struct sl_shm *s, size_t tenant)
{
	if (tenant >= s->max_tenants)
		return 0;
	return atomic_load_explicit(&s->tenants[tenant].inflight,
	    memory_order_relaxed);
}

static _Atomic int32_t *
held_cell(const struct sl_shm *s, size_t row, size_t tenant)
{
	return &s->held[row * s->held_stride + tenant];
}

static _Atomic uint64_t *
held_page_word(const struct sl_shm *s, size_t row, size_t tenant,
    uint64_t *bit)
{
	size_t page = tenant / HELD_PER_PAGE;

	*bit = UINT64_C(1) << (page % 64);
	return &s->held_pages[row * s->held_words + page / 64];
}

/* The held cell of (row, tenant), its page marked written: for a writer. */
static _Atomic int32_t *
held_touch(struct sl_shm *s, size_t row, size_t tenant)
{
	uint64_t bit;
	_Atomic uint64_t *w = held_page_word(s, row, tenant, &bit);

	if (!(atomic_load_explicit(w, memory_order_relaxed) & bit))
		atomic_fetch_or(w, bit);
	return held_cell(s, row, tenant);
}

/* Whether row ever wrote the page of tenant's held cell. */
static int
held_written(const struct sl_shm *s, size_t row, size_t tenant)
{
	uint64_t bit;

	return (atomic_load(held_page_word(s, row, tenant, &bit)) & bit) != 0;
}

/* A held count, 0 without reading a page the row never wrote. */
static int32_t
held_get(const struct sl_shm *s, size_t row, size_t tenant)
{
	return held_written(s, row, tenant) ?
	    atomic_load(held_cell(s, row, tenant)) : 0;
}

void
sl_shm_set_indices_used(struct sl_shm *s, size_t n)
{
	hwm_set(&s->indices_used, n, s->max_tenants);
}

/* Enter / leave the row's admission window (single writer per row). */
static uint32_t
window_enter(struct sl_shm *s, size_t row, size_t tenant)
{
	struct shm_sync *sy = &s->sync[row];
	uint32_t seq = atomic_load_explicit(&sy->seq, memory_order_relaxed);

	atomic_store(&sy->intent, (int32_t)tenant);
	atomic_store(&sy->seq, seq + 1);
	return seq + 2;
}

static void
window_leave(struct sl_shm *s, size_t row, uint32_t seq)
{
	atomic_store(&s->sync[row].seq, seq);
}

enum sl_admit
sl_shm_try_acquire(struct sl_shm *s, size_t row, size_t tenant)
{
	struct shm_tenant *t;
	int32_t cur, limit;
	_Atomic int32_t *h;
	uint32_t seq;

	if (tenant >= s->max_tenants || row >= s->max_rows)
		return SL_ADMIT_INVALID;
	t = &s->tenants[tenant];
	seq = window_enter(s, row, tenant);
	cur = atomic_load(&t->inflight);
	do {
		limit = atomic_load_explicit(&t->limit, memory_order_acquire);
		if (cur >= limit) {
			window_leave(s, row, seq);
			return SL_ADMIT_FULL;
		}
	} while (!atomic_compare_exchange_weak(&t->inflight, &cur, cur + 1));
	h = held_touch(s, row, tenant);
	atomic_store(h, atomic_load_explicit(h, memory_order_relaxed) + 1);
	window_leave(s, row, seq);
	return SL_ADMIT_OK;
}

void
sl_shm_release(struct sl_shm *s, size_t row, size_t tenant)
{
	_Atomic int32_t *h;
	uint32_t seq;

	if (tenant >= s->max_tenants || row >= s->max_rows)
		return;
	seq = window_enter(s, row, tenant);
	h = held_touch(s, row, tenant);
	atomic_store(h, atomic_load_explicit(h, memory_order_relaxed) - 1);
	atomic_fetch_sub(&s->tenants[tenant].inflight, 1);
	window_leave(s, row, seq);
}

/*
 * A slot changes holder without being given back: to's held count first,
 * then from's, inside win's window, so that a worker killed between the
 * two leaves its row in the window and the master reconciles the index
 * (the live rows, the queue's row among them, say who holds it). The
 * caller is the only writer of from's and to's cells (its own row, or the
 * queue's row under the queue's lock).
 */
void
sl_shm_move(struct sl_shm *s, size_t win, size_t from, size_t to, size_t idx)
{
	_Atomic int32_t *h;
	uint32_t seq;

	if (idx >= s->max_tenants || win >= s->max_rows ||
	    from >= s->max_rows || to >= s->max_rows || from == to)
		return;
	seq = window_enter(s, win, idx);
	h = held_touch(s, to, idx);
	atomic_store(h, atomic_load_explicit(h, memory_order_relaxed) + 1);
	h = held_touch(s, from, idx);
	atomic_store(h, atomic_load_explicit(h, memory_order_relaxed) - 1);
	window_leave(s, win, seq);
}

void
sl_shm_release_as(struct sl_shm *s, size_t win, size_t row, size_t idx)
{
	_Atomic int32_t *h;
	uint32_t seq;

	if (idx >= s->max_tenants || win >= s->max_rows || row >= s->max_rows)
		return;
	seq = window_enter(s, win, idx);
	h = held_touch(s, row, idx);
	atomic_store(h, atomic_load_explicit(h, memory_order_relaxed) - 1);
	atomic_fetch_sub(&s->tenants[idx].inflight, 1);
	window_leave(s, win, seq);
}

int32_t
sl_shm_held(const struct sl_shm *s, size_t row, size_t tenant)
{
	if (tenant >= s->max_tenants || row >= s->max_rows)
		return 0;
	return held_get(s, row, tenant);
}

/*
 * Bring tenant's in-flight count back to what the live rows hold, for a
 * tenant whose slot a dead worker may have taken without recording it.
 * Reads a consistent snapshot: no live row may be inside its window
 * between the first and the second look at every row's seq (all seq_cst,
 * so the loads of in-flight and held sit in one total order with the
 * workers' steps). Returns the slots given back, or -1 if no quiet moment
 * was found (a live worker stuck in its window, e.g. stopped by a debugger).
 */
static int64_t
reconcile(struct sl_shm *s, size_t tenant, const unsigned char *dead)
{
	size_t r, nrows = rows_used(s);
	uint32_t *seq1;
	int attempt;
	int64_t delta = -1;

	seq1 = calloc(nrows ? nrows : 1, sizeof(*seq1));
	if (seq1 == NULL)
		return -1;
	for (attempt = 0; attempt < 2000 && delta < 0; attempt++) {
		int32_t inf;
		int64_t held = 0;
		int busy = 0;

		if (attempt > 0)
			usleep(50);
		for (r = 0; r < nrows && !busy; r++) {
			if (dead[r])
				continue;
			seq1[r] = atomic_load(&s->sync[r].seq);
			busy = seq1[r] & 1;
		}
		if (busy)
			continue;
		inf = atomic_load(&s->tenants[tenant].inflight);
		for (r = 0; r < nrows; r++)
			if (!dead[r])
				held += held_get(s, r, tenant);
		for (r = 0; r < nrows && !busy; r++)
			if (!dead[r] && atomic_load(&s->sync[r].seq) != seq1[r])
				busy = 1;
		if (busy)
			continue;
		delta = (int64_t)inf - held;
		if (delta < 0)
			delta = 0;   /* cannot happen; never raise in-flight */
		else if (delta > 0)
			atomic_fetch_sub(&s->tenants[tenant].inflight, (int32_t)delta);
	}
	free(seq1);
	return delta;
}

int64_t
sl_shm_reclaim_rows(struct sl_shm *s, const size_t *rows, size_t n)
{
	unsigned char *dead;
	size_t i, t, nrows = rows_used(s);
	int64_t total = 0, d;
	int32_t h;

	dead = calloc(s->max_rows, 1);
	if (dead == NULL)
		return -1;
	for (i = 0; i < n; i++)
		if (rows[i] < s->max_rows)
			dead[rows[i]] = 1;
	(void)nrows;
	for (i = 0; i < n; i++) {
		size_t row = rows[i];
		int in_window;
		int32_t intent;

		if (row >= s->max_rows)
			continue;
		in_window = atomic_load(&s->sync[row].seq) & 1;
		intent = atomic_load(&s->sync[row].intent);
		for (t = 0; t < s->max_tenants; t++) {
			if (t % HELD_PER_PAGE == 0 && !held_written(s, row, t)) {
				t += HELD_PER_PAGE - 1;   /* never written: zeros */
				continue;
			}
			h = atomic_exchange(held_cell(s, row, t), 0);
			/*
			 * Outside its window a row's held count is exact. For
			 * the window's tenant it is not: reconcile it below.
			 */
			if (h > 0 && !(in_window && (int32_t)t == intent)) {
				atomic_fetch_sub(&s->tenants[t].inflight, h);
				total += h;
			}
		}
		if (in_window && intent >= 0 && (size_t)intent < s->max_tenants) {
			d = reconcile(s, (size_t)intent, dead);
			if (d > 0)
				total += d;
		}
		atomic_store(&s->sync[row].seq, 0);
		atomic_store(&s->sync[row].intent, -1);
	}
	free(dead);
	return total;
}

int64_t
sl_shm_reclaim_row(struct sl_shm *s, size_t row)
{
	return sl_shm_reclaim_rows(s, &row, 1);
}

void
sl_shm_hint_put(struct sl_shm *s, uint64_t hash, size_t slot, int ended)
{
	_Atomic uint64_t *w = &s->hints[hash & (SL_SHM_HINTS - 1)];
	uint64_t old, v;

	if (slot >= s->max_tenants)
		return;
	v = HINT_TAG(hash) | ((uint64_t)slot + 1);
	old = atomic_load_explicit(w, memory_order_relaxed);
	/* "Ended" stays for the same hash (a race may lose it: a hint). */
	if (ended || (HINT_TAG(old) == HINT_TAG(hash) && (old & HINT_ENDED)))
		v |= HINT_ENDED;
	if (v != old)
		atomic_store_explicit(w, v, memory_order_relaxed);
}

int
sl_shm_hint_get(const struct sl_shm *s, uint64_t hash, size_t *slot, int *ended)
{
	uint64_t v = atomic_load_explicit(&s->hints[hash & (SL_SHM_HINTS - 1)],
	    memory_order_relaxed);

	if ((v & HINT_SLOT_MASK) == 0 || HINT_TAG(v) != HINT_TAG(hash))
		return -1;
	*slot = (size_t)(v & HINT_SLOT_MASK) - 1;
	*ended = (v & HINT_ENDED) != 0;
	return 0;
}

void
sl_shm_hint_drop_slot(struct sl_shm *s, size_t slot)
{
	size_t i;
	uint64_t v;

	for (i = 0; i < SL_SHM_HINTS; i++) {
		v = atomic_load_explicit(&s->hints[i], memory_order_relaxed);
		if ((v & HINT_SLOT_MASK) == (uint64_t)slot + 1)
			/* Lost if another worker wrote meanwhile: that one is newer. */
			atomic_compare_exchange_strong_explicit(&s->hints[i], &v, 0,
			    memory_order_relaxed, memory_order_relaxed);
	}
}

uint32_t
sl_shm_epoch(const struct sl_shm *s, size_t idx)
{
	if (idx >= s->max_tenants)
		return 0;
	return atomic_load(&s->tenants[idx].epoch);
}

int
sl_shm_index_quiet(const struct sl_shm *s, size_t idx)
{
	size_t r;

	if (idx >= s->max_tenants)
		return 0;
	if (atomic_load(&s->tenants[idx].inflight) != 0)
		return 0;
	for (r = 0; r < rows_used(s); r++)
		if (held_get(s, r, idx) != 0)
			return 0;
	return 1;
}

void
sl_shm_index_reset(struct sl_shm *s, size_t idx)
{
	size_t r;

	if (idx >= s->max_tenants)
		return;
	uint32_t epoch = atomic_load(&s->tenants[idx].epoch);
	size_t i, home = 2 * idx;
	int k;

	atomic_store(&s->tenants[idx].limit, 0);
	atomic_store(&s->tenants[idx].inflight, 0);
	atomic_store(&s->tenants[idx].epoch, epoch + 1);
	memset((void *)&s->tenants[idx].budget, 0, sizeof(struct shm_tenant) -
	    offsetof(struct shm_tenant, budget));
	for (r = 0; r < rows_used(s); r++)
		if (held_written(s, r, idx))
			atomic_store(held_cell(s, r, idx), 0);
	memset((void *)&s->replicas[idx], 0, sizeof(s->replicas[idx]));
	/*
	 * Its tokens by model go too, dropped (a probe must not stop there),
	 * never handed on: they are where the index's pairs were put.
	 */
	for (i = shm_pair_walk(s, home); i < s->npairs + PAIR_SPILL &&
	    (i >= s->npairs || i < home + PAIR_PROBES + 1);
	    i = shm_pair_walk(s, i + 1)) {
		uint64_t key = atomic_load(&s->pairs[i].key);

		if (key != 0 && key != PAIR_DEAD && PAIR_TENANT(key) == idx) {
			atomic_store(&s->pairs[i].key, PAIR_DEAD);
			for (k = 0; k < SL_TOKENS_KINDS; k++)
				atomic_store(&s->pairs[i].n[k], 0);
		}
	}
}

void
sl_shm_hint_drop_slots(struct sl_shm *s, const unsigned char *drop)
{
	size_t i, slot;
	uint64_t v;

	for (i = 0; i < SL_SHM_HINTS; i++) {
		v = atomic_load_explicit(&s->hints[i], memory_order_relaxed);
		if ((v & HINT_SLOT_MASK) == 0)
			continue;
		slot = (size_t)(v & HINT_SLOT_MASK) - 1;
		if (slot < s->max_tenants && drop[slot])
			atomic_compare_exchange_strong_explicit(&s->hints[i], &v, 0,
			    memory_order_relaxed, memory_order_relaxed);
	}
}

struct sl_shm_replica *
sl_shm_replica(struct sl_shm *s, size_t idx)
{
	return idx < s->max_tenants ? &s->replicas[idx].r : NULL;
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The shared region: tenant counters, per-worker held counts and stat rows.
 * See sl_shm.h for the layout rules. Relaxed atomics suffice: the counters
 * guard no other data, and the master reads a dead worker's row only after
 * waitpid(), which orders it after everything the worker wrote.
 */
#include "config.h"

#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sl_shm.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "shared counters need lock-free int");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "shared stats need lock-free long long");

#define SL_CACHELINE 64

/*
 * Tokens: a sliding window of 30 buckets of 2 seconds, each one word:
 * (span & SEC_MASK) << 44 | tokens, span = second / TOK_SPAN, taken over by
 * the first charge of a new span (compare-exchange), so charges from
 * every worker add up exactly. The window sums the 30 newest spans: a
 * token stays in it 58 to 60 seconds (one-second buckets kept it 59 to
 * 60), and a Retry-After is at most 60. 30 words, not 60 of one second:
 * a tenant costs 240 bytes less. Seconds are CLOCK_MONOTONIC, the same
 * clock in every process.
 */
#define TOK_SPAN 2
#define TOK_BUCKETS 30
#define TOK_SHIFT 44
#define TOK_MASK ((UINT64_C(1) << TOK_SHIFT) - 1)
#define SEC_MASK ((UINT64_C(1) << (64 - TOK_SHIFT)) - 1)

/*
 * Everything of one shared index (a tenant's, or a pool replica's count
 * and cap) in one place, 536 bytes: what a tenant costs in the region
 * besides a held count per worker row that served it. Its counters are
 * shared by the workers (one atomic add each, once per request, as
 * nginx's limit_conn does), not kept per worker row: a row per tenant
 * would cost 232 bytes per row. limit and inflight lead, so the
 * admission compare-exchange touches the struct's first line.
 */
struct shm_tenant {
	_Atomic int32_t limit;
	_Atomic int32_t inflight;
	_Atomic uint32_t epoch;       /* bumped when the index is reused */
	_Atomic int32_t budget;       /* tokens_per_minute; 0: none */
	_Atomic uint64_t rejected[SL_REJECT_MAX];
	_Atomic uint64_t total[SL_TOKENS_KINDS];
	_Atomic uint64_t unrouted[SL_TOKENS_KINDS];   /* tokens of model "-" */
	_Atomic uint64_t req[SL_NCODES];
	_Atomic uint64_t bucket[TOK_BUCKETS];
};

/*
 * A worker row's admission window marker. seq is odd while the worker is
 * between the two steps of an acquire or release (the tenant CAS and its
 * own held count), and intent names the tenant. A worker killed inside the
 * window leaves seq odd, which tells the master exactly which tenant needs
 * reconciling (see sl_shm_reclaim_rows).
 */
struct shm_sync {
	alignas(SL_CACHELINE) _Atomic uint32_t seq;
	_Atomic int32_t intent;
};

/* A worker row's stats, on its own cache line(s). */
struct shm_stats {
	alignas(SL_CACHELINE) _Atomic uint64_t v[SL_STAT_MAX];
	_Atomic uint64_t hist[SL_HIST_MAX][SL_HIST_BUCKETS + 1];
	_Atomic uint64_t hist_sum_us[SL_HIST_MAX];
};

struct shm_ustats {
	_Atomic uint64_t err[SL_UERR_MAX];
	_Atomic uint64_t retry[SL_RETRY_R_MAX];
	_Atomic uint64_t aff[SL_AFF_MAX];
};

struct shm_replica {
	alignas(SL_CACHELINE) struct sl_shm_replica r;
};

/*
 * Per model slot, shared by the workers (one atomic add each, as a
 * tenant's counters): what sluice_model_* and the histograms count, 648
 * bytes. A row per worker would cost 648 bytes a row.
 */
struct shm_mstats {
	_Atomic uint64_t req[SL_NCODES];
	_Atomic uint64_t hist[SL_MHIST_MAX][SL_MHIST_BOUNDS_MAX + 1];
	_Atomic uint64_t hist_sum_us[SL_MHIST_MAX];
};

/*
 * A tenant x model pair of the token table: key 0 empty, PAIR_DEAD a pair
 * whose model slot went to another name (skipped, never taken again: a
 * probe must not stop at it), else PAIR_KEY(tenant, model).
 */
struct shm_pair {
	_Atomic uint64_t key;
	_Atomic uint64_t n[SL_TOKENS_KINDS];
};
#define PAIR_DEAD UINT64_MAX
#define PAIR_MODEL_BITS 24
#define PAIR_KEY(t, m) (((uint64_t)(t) + 1) << PAIR_MODEL_BITS | (uint64_t)(m))
#define PAIR_MODEL(k) ((size_t)((k) & ((UINT64_C(1) << PAIR_MODEL_BITS) - 1)))
#define PAIR_TENANT(k) ((size_t)((k) >> PAIR_MODEL_BITS) - 1)
#define PAIR_PROBES 64
#define PAIR_SPILL 65536              /* 2 MiB, written as used */
#define PAIRS_PER_PAGE (4096 / 32)
_Static_assert(SL_SHM_MAX_MODEL_SLOTS <= (1 << PAIR_MODEL_BITS),
    "a pair key's model");

/*
 * Fallbacks by (from, to) model slots: a hashed table of FB_CELLS, key
 * (from + 1) << 32 | to, written as used (fb_pages). A pair whose slot
 * went to another name keeps its cell, zeroed: the new name's moves count
 * from 0 there. A pair that finds no room counts under (from, "-").
 */
struct shm_fallback {
	_Atomic uint64_t key;
	_Atomic uint64_t n;
};
#define FB_CELLS 65536                /* 1 MiB, written as used */
#define FB_PROBES 64
#define FB_PER_PAGE (4096 / sizeof(struct shm_fallback))
#define FB_KEY(from, to) (((uint64_t)(from) + 1) << 32 | (uint64_t)(to))

/*
 * Pages of the region that were never written are never read either: a
 * read of an untouched MAP_SHARED page allocates it, and a scan over the
 * region's whole capacity would cost what the capacity costs. The held
 * counts of each row keep a bit per page written (set by the row's
 * writer before it writes there); scans skip the pages whose bit is
 * clear, which hold only zeros.
 */
_Static_assert(sizeof(struct shm_tenant) == 536, "a tenant's bytes, as documented");
#define HELD_PER_PAGE 1024            /* int32 cells per 4 KiB page */

struct sl_shm {
	size_t max_tenants;
	size_t max_rows;
	size_t map_len;
	_Atomic size_t rows_used;     /* rows that ever held a worker */
	_Atomic size_t indices_used;  /* indices handed out (0: all) */
	struct shm_tenant *tenants;   /* [max_tenants + 1]: the last, "none" */
	_Atomic int32_t *held;        /* [max_rows][held_stride] */
	size_t held_stride;           /* max_tenants rounded up to a page */
	_Atomic uint64_t *held_pages; /* [max_rows][held_words]: pages written */
	size_t held_words;
	struct shm_stats *stats;      /* [max_rows] */
	struct shm_sync *sync;        /* [max_rows] */
	size_t upstream_slots;
	struct shm_ustats *ustats;    /* [upstream_slots], shared */
	struct shm_replica *replicas; /* [max_tenants] */
	_Atomic uint64_t *hints;      /* [SL_SHM_HINTS] affinity hints */
	size_t model_slots;           /* slot 0 is "-" */
	struct shm_mstats *mstats;    /* [model_slots] */
	struct shm_fallback *fallbacks;   /* [FB_CELLS] */
	_Atomic uint64_t fb_pages[FB_CELLS / FB_PER_PAGE / 64];
	/*
	 * Tenant x model tokens: index t's pairs start at 2t (its home) and
	 * probe on, so the pages written follow the indices in use.
	 */
	struct shm_pair *pairs;       /* [npairs + PAIR_SPILL] */
	size_t npairs;
	/*
	 * A tenant whose neighbourhood is full (more models than its
	 * neighbours leave room for) puts its pairs in the spill, hashed,
	 * after the table; spill_pages marks its pages written.
	 */
	_Atomic uint64_t spill_pages[PAIR_SPILL / PAIRS_PER_PAGE / 64];
};

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

static uint64_t pair_hash(uint64_t);

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

/*
 * A high-water mark the master sets (rows, indices in use) and walks stop
 * at; 0, never set (unit tests, tools), means all of them.
 */
static void
hwm_set(_Atomic size_t *hwm, size_t n, size_t max)
{
	atomic_store_explicit(hwm, n < max ? n : max, memory_order_relaxed);
}

static size_t
hwm_get(const _Atomic size_t *hwm, size_t max)
{
	size_t n = atomic_load_explicit(hwm, memory_order_relaxed);

	return n == 0 ? max : n;
}

void
sl_shm_set_rows_used(struct sl_shm *s, size_t n)
{
	hwm_set(&s->rows_used, n, s->max_rows);
}

static size_t
rows_used(const struct sl_shm *s)
{
	return hwm_get(&s->rows_used, s->max_rows);
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

static size_t
indices_used(const struct sl_shm *s)
{
	return hwm_get(&s->indices_used, s->max_tenants);
}

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
static size_t
pair_walk(const struct sl_shm *s, size_t pos)
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

/* Single writer per cell: a load and a store, no locked instruction. */
static void
cell_add(_Atomic uint64_t *v, uint64_t n)
{
	atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + n,
	    memory_order_relaxed);
}

static uint64_t
cell_get(const _Atomic uint64_t *v)
{
	return atomic_load_explicit(v, memory_order_relaxed);
}

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
	for (i = pair_walk(s, home); i < s->npairs + PAIR_SPILL &&
	    (i >= s->npairs || i < home + PAIR_PROBES + 1); i = pair_walk(s, i + 1)) {
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
	for (i = pair_walk(s, 0); i < s->npairs + PAIR_SPILL;
	    i = pair_walk(s, i + 1)) {
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

/* ---- tokens ------------------------------------------------------------ */

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

static uint64_t
pair_hash(uint64_t key)
{
	/* splitmix64's finalizer: pairs spread over the spill */
	key ^= key >> 30;
	key *= UINT64_C(0xbf58476d1ce4e5b9);
	key ^= key >> 27;
	key *= UINT64_C(0x94d049bb133111eb);
	return key ^ (key >> 31);
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

	for (*pos = pair_walk(s, *pos); *pos < s->npairs + PAIR_SPILL;
	    *pos = pair_walk(s, *pos + 1)) {
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

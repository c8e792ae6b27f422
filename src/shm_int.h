/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Inside the shared region: what its files promise one another; sl_shm.h
 * is what they promise the rest of sluice.
 *
 *   shm.c         the region: its layout mapped (sl_shm_create), an
 *                 index's admission (try-acquire, release, a slot moved
 *                 between rows, the admission window), a dead worker's
 *                 rows reclaimed, an index reused (epoch, quiet, reset),
 *                 replica health cells and affinity hints.
 *   shm_stats.c   counters and histograms: per worker row (stats, latency
 *                 histograms, a dead row folded into row 0), per tenant
 *                 (requests by status, refusals), per upstream slot
 *                 (errors, retries, affinity), per model slot (requests,
 *                 histograms, the fallback table, a slot's reset).
 *   shm_tokens.c  tokens: a tenant's totals, its sliding window and
 *                 budget, the tenant x model pair table (probe, spill,
 *                 walk).
 *
 * The layout below is the one every file reads and writes; only
 * sl_shm_create places it. What a request calls (the admission
 * compare-exchange, a release, a counter or histogram add, a token
 * charge, a hint) stays static in its own file or static inline here:
 * the one function that crosses files, shm_pair_walk, runs when the
 * master resets an index or model slots and on a scrape, never per
 * request.
 */
#ifndef SL_SHM_INT_H
#define SL_SHM_INT_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "sl_shm.h"

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
	_Atomic uint64_t stored[SL_STORED_R_MAX];
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
 * A high-water mark the master sets (rows, indices in use) and walks stop
 * at; 0, never set (unit tests, tools), means all of them.
 */
static inline void
hwm_set(_Atomic size_t *hwm, size_t n, size_t max)
{
	atomic_store_explicit(hwm, n < max ? n : max, memory_order_relaxed);
}

static inline size_t
hwm_get(const _Atomic size_t *hwm, size_t max)
{
	size_t n = atomic_load_explicit(hwm, memory_order_relaxed);

	return n == 0 ? max : n;
}

static inline size_t
rows_used(const struct sl_shm *s)
{
	return hwm_get(&s->rows_used, s->max_rows);
}

static inline size_t
indices_used(const struct sl_shm *s)
{
	return hwm_get(&s->indices_used, s->max_tenants);
}

/* Single writer per cell: a load and a store, no locked instruction. */
static inline void
cell_add(_Atomic uint64_t *v, uint64_t n)
{
	atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + n,
	    memory_order_relaxed);
}

static inline uint64_t
cell_get(const _Atomic uint64_t *v)
{
	return atomic_load_explicit(v, memory_order_relaxed);
}

/* The hash of a pair in the spill and of a fallback cell. */
static inline uint64_t
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
 * The first position at or after pos a walk of the pairs must read: the
 * table's part for the indices in use, then the spill's written pages;
 * npairs + PAIR_SPILL at the end (shm_tokens.c).
 */
size_t shm_pair_walk(const struct sl_shm *, size_t pos);

#endif

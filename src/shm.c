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
#include <string.h>
#include <sys/mman.h>

#include "sl_shm.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "shared counters need lock-free int");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "shared stats need lock-free long long");

#define SL_CACHELINE 64

/* One tenant on its own cache line: workers CAS here, nothing else does. */
struct shm_tenant {
	alignas(SL_CACHELINE) _Atomic int32_t limit;
	_Atomic int32_t inflight;
};

/* A worker row's stats, on its own cache line(s). */
struct shm_stats {
	alignas(SL_CACHELINE) _Atomic uint64_t v[SL_STAT_MAX];
};

struct sl_shm {
	size_t max_tenants;
	size_t max_rows;
	size_t map_len;
	struct shm_tenant *tenants;   /* [max_tenants] */
	_Atomic int32_t *held;        /* [max_rows * max_tenants] */
	struct shm_stats *stats;      /* [max_rows] */
};

static size_t
round_up(size_t n, size_t a)
{
	return (n + a - 1) / a * a;
}

struct sl_shm *
sl_shm_create(size_t max_tenants, size_t max_rows)
{
	size_t off_tenants, off_held, off_stats, len;
	char *base;
	struct sl_shm *s;

	if (max_tenants == 0 || max_rows == 0 ||
	    max_tenants > (1u << 20) || max_rows > 4096) {
		errno = EINVAL;
		return NULL;
	}
	off_tenants = round_up(sizeof(struct sl_shm), SL_CACHELINE);
	off_held = off_tenants + max_tenants * sizeof(struct shm_tenant);
	off_stats = round_up(off_held + max_rows * max_tenants * sizeof(int32_t),
	    SL_CACHELINE);
	len = off_stats + max_rows * sizeof(struct shm_stats);

	base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
	    -1, 0);
	if (base == MAP_FAILED)
		return NULL;
	/* Anonymous mappings are zero-filled: every counter starts at 0. */
	s = (struct sl_shm *)(void *)base;
	s->max_tenants = max_tenants;
	s->max_rows = max_rows;
	s->map_len = len;
	s->tenants = (struct shm_tenant *)(void *)(base + off_tenants);
	s->held = (_Atomic int32_t *)(void *)(base + off_held);
	s->stats = (struct shm_stats *)(void *)(base + off_stats);
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
sl_shm_max_rows(const struct sl_shm *s)
{
	return s->max_rows;
}

void
sl_shm_set_limit(struct sl_shm *s, size_t tenant, int32_t limit)
{
	if (tenant < s->max_tenants)
		atomic_store_explicit(&s->tenants[tenant].limit, limit,
		    memory_order_relaxed);
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
	return &s->held[row * s->max_tenants + tenant];
}

enum sl_admit
sl_shm_try_acquire(struct sl_shm *s, size_t row, size_t tenant)
{
	struct shm_tenant *t;
	int32_t cur, limit;
	_Atomic int32_t *h;

	if (tenant >= s->max_tenants || row >= s->max_rows)
		return SL_ADMIT_INVALID;
	t = &s->tenants[tenant];
	cur = atomic_load_explicit(&t->inflight, memory_order_relaxed);
	do {
		limit = atomic_load_explicit(&t->limit, memory_order_relaxed);
		if (cur >= limit)
			return SL_ADMIT_FULL;
	} while (!atomic_compare_exchange_weak_explicit(&t->inflight, &cur,
	    cur + 1, memory_order_relaxed, memory_order_relaxed));
	/*
	 * In-flight first, held second: a crash between the two leaves one
	 * slot counted that no row owns (under-admission), never the reverse.
	 */
	h = held_cell(s, row, tenant);
	atomic_store_explicit(h,
	    atomic_load_explicit(h, memory_order_relaxed) + 1,
	    memory_order_relaxed);
	return SL_ADMIT_OK;
}

void
sl_shm_release(struct sl_shm *s, size_t row, size_t tenant)
{
	_Atomic int32_t *h;

	if (tenant >= s->max_tenants || row >= s->max_rows)
		return;
	/* Held first, in-flight second: same crash argument as acquire. */
	h = held_cell(s, row, tenant);
	atomic_store_explicit(h,
	    atomic_load_explicit(h, memory_order_relaxed) - 1,
	    memory_order_relaxed);
	atomic_fetch_sub_explicit(&s->tenants[tenant].inflight, 1,
	    memory_order_relaxed);
}

int32_t
sl_shm_held(const struct sl_shm *s, size_t row, size_t tenant)
{
	if (tenant >= s->max_tenants || row >= s->max_rows)
		return 0;
	return atomic_load_explicit(held_cell(s, row, tenant),
	    memory_order_relaxed);
}

int64_t
sl_shm_reclaim_row(struct sl_shm *s, size_t row)
{
	size_t t;
	int32_t h;
	int64_t total = 0;

	if (row >= s->max_rows)
		return 0;
	for (t = 0; t < s->max_tenants; t++) {
		h = atomic_exchange_explicit(held_cell(s, row, t), 0,
		    memory_order_relaxed);
		if (h > 0) {
			atomic_fetch_sub_explicit(&s->tenants[t].inflight, h,
			    memory_order_relaxed);
			total += h;
		}
	}
	return total;
}

void
sl_shm_stat_add(struct sl_shm *s, size_t row, enum sl_stat st, uint64_t n)
{
	_Atomic uint64_t *v;

	if (row >= s->max_rows || st >= SL_STAT_MAX)
		return;
	/* Single writer per row: a load and a store, no locked instruction. */
	v = &s->stats[row].v[st];
	atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + n,
	    memory_order_relaxed);
}

uint64_t
sl_shm_stat_sum(const struct sl_shm *s, enum sl_stat st)
{
	size_t r;
	uint64_t sum = 0;

	if (st >= SL_STAT_MAX)
		return 0;
	for (r = 0; r < s->max_rows; r++)
		sum += atomic_load_explicit(&s->stats[r].v[st], memory_order_relaxed);
	return sum;
}

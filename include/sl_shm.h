/*
 * sl_shm: the region shared by the master and all workers.
 *
 * Created once by the master before forking, MAP_SHARED|MAP_ANONYMOUS; its
 * size is fixed for the master's life (tenant and worker-row capacity), so a
 * reload never remaps. Per tenant: limit and in-flight counters, each on its
 * own cache line. Per worker row and tenant: the number of slots that worker
 * holds (written only by that worker), which the master subtracts when the
 * worker dies. Per worker row: stat counters written only by that worker.
 *
 * Only lock-free C11 atomics live here; no locks, no pointers.
 */
#ifndef SL_SHM_H
#define SL_SHM_H

#include <stddef.h>
#include <stdint.h>

struct sl_shm;

enum sl_admit {
	SL_ADMIT_OK = 0,
	SL_ADMIT_FULL,         /* tenant at its limit: answer 429 */
	SL_ADMIT_INVALID       /* bad tenant or row index: a bug */
};

/*
 * Map a new zeroed region for max_tenants tenants and max_rows worker rows.
 * Returns NULL (errno set) on failure. Call before fork(); children inherit
 * the mapping.
 */
struct sl_shm *sl_shm_create(size_t max_tenants, size_t max_rows);
void sl_shm_destroy(struct sl_shm *);

size_t sl_shm_max_tenants(const struct sl_shm *);
size_t sl_shm_max_rows(const struct sl_shm *);

/* Publish a tenant's limit (master, on start and reload). 0 retires it. */
void sl_shm_set_limit(struct sl_shm *, size_t tenant, int32_t limit);
int32_t sl_shm_limit(const struct sl_shm *, size_t tenant);
int32_t sl_shm_inflight(const struct sl_shm *, size_t tenant);

/*
 * Take one slot of tenant for worker row `row`: one compare-exchange that
 * refuses when in-flight >= limit. Lock-free, exact across processes.
 */
enum sl_admit sl_shm_try_acquire(struct sl_shm *, size_t row, size_t tenant);

/* Give back a slot taken by sl_shm_try_acquire on the same row. */
void sl_shm_release(struct sl_shm *, size_t row, size_t tenant);

/* Slots row currently holds for tenant (master: after the worker died). */
int32_t sl_shm_held(const struct sl_shm *, size_t row, size_t tenant);

/*
 * Master only, after waitpid() reported the worker on `row` dead: give its
 * held slots back to their tenants and zero the row. Returns the number of
 * slots reclaimed.
 */
int64_t sl_shm_reclaim_row(struct sl_shm *, size_t row);

/* Per-row statistics, written only by the owning worker, summed on scrape. */
enum sl_stat {
	SL_STAT_ADMITTED = 0,
	SL_STAT_REJECTED,
	SL_STAT_BYTES_OUT,
	SL_STAT_PAUSES,
	SL_STAT_MAX
};
void sl_shm_stat_add(struct sl_shm *, size_t row, enum sl_stat, uint64_t n);
uint64_t sl_shm_stat_sum(const struct sl_shm *, enum sl_stat);

#endif

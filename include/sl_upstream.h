/*
 * sl_upstream: upstream pools as a worker sees them. Which replica a try
 * goes to (least_loaded, round_robin, random), its cap, and what a try's
 * outcome means for the replica (passive ejection, busy marks).
 *
 * Everything shared lives in the shared region (sl_shm.h): a replica's
 * in-flight count and cap are a slot in the tenants' index space, exact
 * across workers and reclaimed when a worker dies; its health is a
 * struct sl_shm_replica. What is here per worker is only the round-robin
 * state and the map from (upstream, replica) to shared index.
 *
 * No libcurl and no event loop: the relay asks for a replica, runs the
 * transfer, and reports back.
 */
#ifndef SL_UPSTREAM_H
#define SL_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "sl_config.h"
#include "sl_shm.h"

struct sl_pools;

/*
 * The pools of cfg for worker row `row`. replica_slot[u][r] is the shared
 * index of replica r of upstream u (the master's mapping; borrowed).
 * Returns NULL when out of memory.
 */
struct sl_pools *sl_pools_new(const struct sl_config *cfg, struct sl_shm *shm,
    size_t row, const size_t *const *replica_slot);
void sl_pools_free(struct sl_pools *);

/*
 * Choose a replica of upstream u for a try, skipping the replicas whose bit
 * is set in `tried`, those down by probe, ejected, marked busy or at their
 * cap, and take its slot (release with sl_pool_release). Returns the
 * replica's index in the pool, or -1 when none can take the try now; then
 * *retry_after receives the seconds until one may (at least 1).
 */
int sl_pool_pick(struct sl_pools *, size_t u, uint64_t tried, int *retry_after);

/* Give back the slot taken by sl_pool_pick. */
void sl_pool_release(struct sl_pools *, size_t u, int r);

/* Base URL of replica r of upstream u ("http://host:port", no '/'). */
const char *sl_pool_url(const struct sl_pools *, size_t u, int r);

/* Shared index of replica r of upstream u (for sl_shm_count_request). */
size_t sl_pool_slot(const struct sl_pools *, size_t u, int r);

/*
 * What a try of replica r ended with: an HTTP status (its response head),
 * or SL_CODE_CONNECT, SL_CODE_TIMEOUT, SL_CODE_RESET when there was none
 * or the response was cut. Counts it in the replica's requests. A
 * connection failure, a reset, a timeout or a 5xx head counts toward
 * passive ejection; anything else clears the count. A 429 or 503 with
 * retry_after_s > 0 marks the replica busy for that long. Returns 1 if this
 * report ejected the replica (the caller logs nothing: it is logged here).
 */
int sl_pool_report(struct sl_pools *, size_t u, int r, int code,
    int retry_after_s);

/*
 * A try already reported by its head failed afterwards (cut mid-stream,
 * silent too long): counts toward passive ejection, not as a request.
 */
void sl_pool_failed(struct sl_pools *, size_t u, int r);

/* Milliseconds on CLOCK_MONOTONIC: the clock of every time in the region. */
int64_t sl_mono_ms(void);

#endif

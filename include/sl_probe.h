/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_probe: active health probes of pool replicas, run by the master.
 *
 * For every replica of an upstream with `health:`, a GET of its
 * health.path every health.interval, bounded by health.timeout. A 2xx is a
 * success; anything else (no connection, a timeout, another status) a
 * failure. `fall` failures in a row mark the replica down in the shared
 * region (workers stop choosing it), `rise` successes in a row mark it up
 * again. A replica that answers 503 is loading (llama.cpp while it loads a
 * model): down all the same, but logged at info, not as an error.
 *
 * The master polls: sl_probe_pollfds() adds the probes' sockets to its
 * ppoll() set, sl_probe_timeout() bounds its sleep, sl_probe_service()
 * runs after every wake. libcurl's multi interface does the HTTP, so a
 * probe never blocks the master.
 */
#ifndef SL_PROBE_H
#define SL_PROBE_H

#include <poll.h>
#include <stddef.h>

#include "sl_config.h"
#include "sl_shm.h"

struct sl_prober;

/*
 * Probes for the pools of cfg; replica_slot[u][r] is the shared index of
 * replica r of upstream u. Replicas of upstreams without `health:` are
 * marked up. Returns NULL when out of memory. Call again after a reload
 * (free the old one first): a replica's state in the region carries over.
 */
struct sl_prober *sl_probe_new(const struct sl_config *cfg, struct sl_shm *,
    size_t *const *replica_slot);
void sl_probe_free(struct sl_prober *);

/*
 * In a worker, right after fork: close the probes' sockets (inherited
 * copies would keep the master's probe connections open). The worker never
 * uses the prober otherwise, nor frees it.
 */
void sl_probe_close_in_child(struct sl_prober *);

/* The probes' sockets, at most max; returns how many were filled. */
#define SL_PROBE_POLLFDS 256
int sl_probe_pollfds(struct sl_prober *, struct pollfd *, int max);

/* Seconds until the prober needs to run, or -1 for never. */
double sl_probe_timeout(struct sl_prober *, double now);

/* Start due probes, move running ones on, count finished ones. */
void sl_probe_service(struct sl_prober *, double now);

#endif

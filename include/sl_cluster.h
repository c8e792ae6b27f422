/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_cluster: one per-tenant limit across several sluice nodes, through
 * Redis leases (`cluster:` in the config; sluice.8, CLUSTER).
 *
 * A lease is a member of the sorted set sluice:{TENANT}:leases, named
 * "NODE:EPOCH:ROW.CELL.GEN" and scored with its expiry (Redis TIME, ms).
 * One script prunes expired members, refuses at max_streams, else adds:
 * atomic and idempotent. The node's shared-memory slot stays the local
 * fast path and cap; a lease is taken only after it.
 *
 * Every admitted stream of a node owns a cell in the region below, in its
 * worker's row, whatever admitted it (Redis or on_redis_down): the master
 * renews the cells' leases every heartbeat (ZADD XX: a lease released a
 * moment ago is never brought back), removes a dead worker's at once, and
 * after Redis was lost re-adds every cell's lease (ZADD without XX), then
 * registers the node; it admits through Redis again once as many nodes
 * are registered as were live before the loss (or lease_ttl later), so
 * that no admission is counted against sets missing the leases of nodes
 * that have not rejoined. The acquire script refuses (-1) a node that
 * sluice:nodes does not hold: Redis lost its state with the connections
 * up. Workers check the master's fence deadline on every admission.
 *
 * Workers: one async hiredis connection each (libev adapter), opened after
 * fork, with a deadline per admission and reconnect with backoff (hiredis
 * 0.14 has neither). Master: one async connection driven from its ppoll()
 * loop, the heartbeat, self-fencing and the metrics.
 */
#ifndef SL_CLUSTER_H
#define SL_CLUSTER_H

#include <ev.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "sl_admin.h"
#include "sl_config.h"
#include "sl_shm.h"

struct sl_cluster_shm;
struct sl_cluster_w;
struct sl_cluster_m;
struct sl_cl_wait;

/* Cells per worker row: leases a worker can hold at once. */
#define SL_CLUSTER_MAX_CELLS 65536

/*
 * Master, before fork: map the region for `rows` worker rows of `cells`
 * cells each (pages are only touched as cells are used). NULL on failure.
 */
struct sl_cluster_shm *sl_cluster_shm_create(size_t rows, size_t cells);
void sl_cluster_shm_destroy(struct sl_cluster_shm *);

/* ---- worker ---------------------------------------------------------- */

enum sl_cl_verdict {
	SL_CL_ADMIT = 0,     /* admitted (Redis, or on_redis_down allowed it) */
	SL_CL_FULL,          /* the tenant is at max_streams: 429 */
	SL_CL_CLOSED,        /* Redis unusable, on_redis_down: closed: 503 */
	SL_CL_PENDING,       /* asked Redis; the callback will tell */
	SL_CL_TOKENS         /* the tenant's token window is at its budget */
};

/* retry_after: seconds, for SL_CL_TOKENS (0 otherwise). */
typedef void sl_cl_cb(void *arg, enum sl_cl_verdict, int retry_after);

/*
 * After fork: connect to cfg->cluster.redis. tenant_slot maps config
 * tenant indices to shared tenant indices (for the node's in-flight count,
 * which on_redis_down: local_share compares with its share).
 */
struct sl_cluster_w *sl_cluster_worker_new(struct ev_loop *,
    const struct sl_config *cfg, struct sl_shm *shm,
    struct sl_cluster_shm *cshm, size_t row, const size_t *tenant_slot);
void sl_cluster_worker_free(struct sl_cluster_w *);

/*
 * A worker the master just started (a reload, a respawn) while the node
 * admits through Redis waits for its own Redis connection before it
 * accepts: until then it would admit by on_redis_down (503 with closed,
 * local admissions past the cluster's limit with local_share), and the
 * node's /healthz would say so, for the moment a connection takes.
 * Returns 1 when the worker may accept now; else 0, and cb(arg) is called
 * once, from the loop, when its connection first answers. cb NULL cancels.
 * The caller bounds the wait (cluster.timeout) and then calls
 * sl_cluster_worker_await_end, after which the worker admits as any worker
 * without a connection does.
 */
int sl_cluster_worker_await(struct sl_cluster_w *, void (*cb)(void *),
    void *arg);
void sl_cluster_worker_await_end(struct sl_cluster_w *);

/*
 * Admit a request of config tenant `tenant` whose node slot is already
 * held. Returns a verdict at once, or SL_CL_PENDING: then cb(arg, verdict)
 * is called exactly once, from the loop (a reply or a timer), unless
 * sl_cluster_cancel(*wait) comes first. On ADMIT (at once or through cb)
 * *lease names the stream's lease: give it back with sl_cluster_release.
 * On FULL or CLOSED there is no lease (*lease is -1).
 */
enum sl_cl_verdict sl_cluster_acquire(struct sl_cluster_w *, int tenant,
    sl_cl_cb *cb, void *arg, int32_t *lease, struct sl_cl_wait **wait);

/* The request went away while it waited: no callback; its lease is freed. */
void sl_cluster_cancel(struct sl_cluster_w *, struct sl_cl_wait *);

/* The stream ended: remove its lease in Redis (sent at once) and its cell. */
void sl_cluster_release(struct sl_cluster_w *, int32_t lease);

/*
 * The tokens_per_minute budget the worker checks against its own
 * (node-wide) window for config tenant `tenant`: -1 when Redis decides
 * (the node admits through Redis: the acquire script checks the cluster's
 * window, sluice:{TENANT}:tokens); else the budget on_redis_down leaves
 * this node (local_share: ceil(budget / live nodes); local_full and
 * closed: the whole budget); 0 for a tenant without one.
 */
int64_t sl_cluster_token_budget(struct sl_cluster_w *, int tenant);

/*
 * 1 when Redis refused config tenant `tenant` for its token window a moment
 * ago and the window cannot have room yet (charges only add to it): the
 * caller refuses at once, with *retry_after, without a node slot or a
 * round trip. Only while Redis decides (sl_cluster_token_budget() == -1)
 * and the budget is the one Redis refused against.
 */
int sl_cluster_tokens_full(struct sl_cluster_w *, int tenant,
    int *retry_after);

/* Charge tokens to the tenant's window in Redis (tenants with a budget). */
void sl_cluster_charge(struct sl_cluster_w *, int tenant, uint64_t tokens);

/* ---- master ---------------------------------------------------------- */

/* Shared tenant index -> tenant name (NULL: none). */
typedef const char *sl_cl_name_fn(void *arg, size_t tslot);

struct sl_cluster_m *sl_cluster_master_new(const struct sl_config *cfg,
    struct sl_cluster_shm *, sl_cl_name_fn *, void *arg);
void sl_cluster_master_free(struct sl_cluster_m *);

/* A reload: new lease_ttl, heartbeat, timeout, on_redis_down. */
void sl_cluster_master_reconf(struct sl_cluster_m *, const struct sl_config *);

/*
 * Before the node listens: register it in Redis (blocking, bounded by
 * cluster.timeout). On success the node admits through Redis at once;
 * otherwise it starts in its on_redis_down mode.
 */
void sl_cluster_master_start(struct sl_cluster_m *);

/* The ppoll() loop: at most one fd, the time to wake, the work on wake. */
int sl_cluster_master_pollfds(struct sl_cluster_m *, struct pollfd *, int max);
double sl_cluster_master_timeout(struct sl_cluster_m *, double now);
void sl_cluster_master_service(struct sl_cluster_m *, const struct pollfd *,
    int n, double now);

/*
 * Before forking the worker that gets `row` (started 1; 0 if the fork
 * failed): until it has connected to Redis the node does not say it
 * admits through Redis (sluice_cluster_up 0).
 */
void sl_cluster_master_row_started(struct sl_cluster_m *, size_t row,
    int started);

/* The worker on `row` is dead: remove its leases, free its cells. */
void sl_cluster_master_reclaim_row(struct sl_cluster_m *, size_t row);

/* In a worker after fork: close the master's Redis socket. */
void sl_cluster_master_close_in_child(struct sl_cluster_m *);

/* Metrics (sluice_cluster_*) and the /healthz line. */
void sl_cluster_render(struct sl_cluster_m *, struct sl_str *);
const char *sl_cluster_mode(const struct sl_cluster_m *);
/* Live nodes last seen in Redis; leases this node holds (O(streams)). */
int sl_cluster_nodes(const struct sl_cluster_m *);
uint64_t sl_cluster_leases(const struct sl_cluster_m *);
/*
 * The Redis master's address in use ("" while the sentinels name none);
 * with cluster.sentinels, how many times it switched (failovers).
 */
const char *sl_cluster_master_addr(const struct sl_cluster_m *);
uint64_t sl_cluster_failovers(const struct sl_cluster_m *);

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_upstream: the upstream side of a worker. Two parts:
 *
 * Pools: which replica a try goes to (least_loaded, round_robin, random),
 * its cap, and what a try's outcome means for the replica (passive
 * ejection, busy marks).
 *
 * Transfers: the libcurl multi handles ("shards") on the worker's libev
 * loop, and the pool of reusable easy handles. The relay sets up an easy
 * handle, starts it here and hears back through the hooks it was given:
 * a transfer finished, or libcurl handed data over (flush it now). The
 * worker owns the loop, not libcurl; nothing here calls up into the relay
 * except through those hooks.
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

#include <curl/curl.h>
#include <ev.h>
#include <stddef.h>
#include <stdint.h>

#include "sl_config.h"
#include "sl_shm.h"
#include "sl_util.h"

struct sl_pools;

/*
 * The pools of cfg for worker row `row`. replica_slot[u][r] is the shared
 * index of replica r of upstream u (the master's mapping; borrowed), and
 * epoch[i] the epoch of shared index i when the mapping was made (NULL:
 * the region's now). An index whose epoch moved since was reused for
 * another replica: this worker never takes a slot of it again.
 * Returns NULL when out of memory.
 */
struct sl_pools *sl_pools_new(const struct sl_config *cfg, struct sl_shm *shm,
    size_t row, const size_t *const *replica_slot, const uint32_t *epoch);
void sl_pools_free(struct sl_pools *);

/*
 * Choose a replica of upstream u for a try, skipping the replicas whose bit
 * is set in `tried`, those down by probe, ejected, marked busy or at their
 * cap, and take its slot (release with sl_pool_release). Returns the
 * replica's index in the pool, or -1 when none can take the try now; then
 * *retry_after receives the seconds until one may (at least 1, at most
 * the upstream's busy_max).
 */
int sl_pool_pick(struct sl_pools *, size_t u, uint64_t tried, int *retry_after);

/*
 * The first try of a request: as sl_pool_pick, and for an upstream with
 * balance prefix_affinity, by the prompt of the request body (JSON of a
 * chat/completions or completions request; anything else is chosen as
 * least_loaded). *outcome: -1 when affinity played no part, else an
 * enum sl_aff_outcome (hit, miss, spill); the caller counts it.
 */
int sl_pool_pick_prompt(struct sl_pools *, size_t u, const char *body,
    size_t len, int *retry_after, int *outcome);

/* A worker's affinity memory, entries (LRU), and the blocks hashed per prompt. */
#define SL_POOL_AFFINITY_ENTRIES 65536
#define SL_POOL_MAX_BLOCKS 4096

/*
 * Give back the slot taken by sl_pool_pick (or collected from the fair
 * queue). With waiters in u's queue the slot is handed to the next of
 * them instead, anywhere (sl_queue.h), when its replica may still take a
 * stream.
 */
void sl_pool_release(struct sl_pools *, size_t u, int r);

/*
 * The fair queue (sl_queue.h): q and, per upstream of the config, its
 * pool index in q (the master's stable upstream index). Borrowed. Without
 * it, or for an upstream without `queue:`, nothing waits.
 */
struct sl_queue;
void sl_pools_set_queue(struct sl_pools *, struct sl_queue *q,
    const size_t *pool_index);

/*
 * May a request for u wait (sl_pool_pick found nothing)? 1 when u has a
 * queue and a replica up and not ejected: it is full (or busy) now and
 * will free. 0: answer 503 upstream_unavailable at once.
 */
int sl_pool_queueable(struct sl_pools *, size_t u);

/*
 * While u's queue has waiters, hand each slot free now to the next of
 * them. After enqueueing (the slot a releaser gave back just before must
 * not stay idle) and once a second (a replica back up, a cap raised).
 */
void sl_pool_pump(struct sl_pools *, size_t u);

/*
 * Stored responses (sl_stored.h) name their replica by the identity of
 * its URL (sl_affinity_id): sl_pool_rid gives replica r's. sl_pool_owner:
 * the replica of u with identity rid, or -1 when u has none (removed by a
 * reload, or another pool's); *up: 1 when it is up (not down by probe,
 * not ejected), whether or not it is full or busy now.
 */
uint64_t sl_pool_rid(const struct sl_pools *, size_t u, int r);
int sl_pool_owner(const struct sl_pools *, size_t u, uint64_t rid, int *up);
/*
 * sl_pool_pick, of replica r only (a stored response's): r, its slot
 * taken, or -1 (down, ejected, busy or at its cap) and *retry_after.
 */
int sl_pool_pick_one(struct sl_pools *, size_t u, int r, int *retry_after);
/*
 * May a request for replica r of u only wait for it (sl_pool_pick_one
 * found it full)? 1 when u has a queue and r is up and not ejected.
 */
int sl_pool_queueable_one(struct sl_pools *, size_t u, int r);

/* Replica of u whose shared index is slot (a granted slot), or -1. */
int sl_pool_replica_of(const struct sl_pools *, size_t u, size_t slot);

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
 * retry_after_s > 0 marks the replica busy for that long, at most the
 * upstream's busy_max (SL_BUSY_MAX_DEFAULT_MS when 0). Returns 1 if this
 * report ejected the replica (the caller logs nothing: it is logged here).
 */
#define SL_BUSY_MAX_DEFAULT_MS 30000
int sl_pool_report(struct sl_pools *, size_t u, int r, int code,
    int retry_after_s);

/*
 * A try already reported by its head failed afterwards (cut mid-stream,
 * silent too long): counts toward passive ejection, not as a request.
 */
void sl_pool_failed(struct sl_pools *, size_t u, int r);

/* ---- transfers ---------------------------------------------------------- */

struct sl_shard;             /* one libcurl multi handle (opaque) */
struct sl_transfers;         /* a worker's shards and easy-handle pool */

struct sl_transfer_hooks {
	/*
	 * A transfer of shard sh finished (CURLMSG_DONE). The owner ends it
	 * with sl_transfers_stop(), or sl_transfers_discard() for a handle it
	 * no longer knows. Called from inside the shard's socket action.
	 */
	void (*done)(void *arg, struct sl_shard *sh, CURL *easy,
	    CURLcode result);
	/* After each socket action: what libcurl handed over may go out. */
	void (*flush)(void *arg);
	void *arg;
};

/* Shards for cfg on loop; NULL when out of memory. */
struct sl_transfers *sl_transfers_new(struct ev_loop *,
    const struct sl_config *, const struct sl_transfer_hooks *);
void sl_transfers_free(struct sl_transfers *);

/*
 * An easy handle for a transfer. A new one (*fresh set to 1) has the
 * worker-wide options set (receive buffer size, upstream SO_RCVBUF) and
 * nothing else: the caller sets the options every transfer shares, once.
 * A reused one (*fresh 0) keeps every option of its last transfer (it is
 * not reset, so that nothing is freed and set again per request): the
 * caller sets again each option that may differ between transfers.
 */
CURL *sl_transfers_easy(struct sl_transfers *, int *fresh);

/*
 * The fixed end of every request's header list to upstream u, formatted
 * once per config: the upstream's Authorization (api_key), and the empty
 * lines that stop libcurl adding Expect, and Content-Type / Accept unless
 * the request has its own (have_ct, have_accept). The caller links its
 * own nodes in front of it; it belongs to xf, never freed or changed by
 * the caller, valid until sl_transfers_free. NULL for an unknown u.
 */
struct curl_slist *sl_transfers_header_tail(struct sl_transfers *, size_t u,
    int have_ct, int have_accept);

/* Start a transfer; its shard, or NULL when it could not be started. */
struct sl_shard *sl_transfers_start(struct sl_transfers *, CURL *);

/*
 * End a transfer: out of its shard (sh may be NULL: never started), the
 * handle kept, options and all, for the next. Never from a libcurl
 * callback.
 */
void sl_transfers_stop(struct sl_transfers *, struct sl_shard *, CURL *);

/*
 * End a transfer for good: out of its shard (sh may be NULL), the handle
 * freed. For a handle nobody owns any more, or one not to be reused.
 */
void sl_transfers_discard(struct sl_transfers *, struct sl_shard *, CURL *);

/* Close shards (not the first) idle for a while; call once a second. */
void sl_transfers_reap(struct sl_transfers *);

#endif

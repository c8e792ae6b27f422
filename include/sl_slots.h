/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_slots: the master's maps from names to slots of the shared region.
 *
 * Tenants and pool replicas share the region's index space; models,
 * upstreams and the fair queue's pools each have a slot table of their
 * own. The same name keeps the same slot across reloads (its counters
 * and health go on), a removed name keeps its slot until no live worker
 * can count under it, and only then is the slot given to another name,
 * zeroed. Mapping a configuration also publishes what its slots need
 * before a worker of it starts: tenant limits and budgets, replica caps,
 * the fair queue's pools and weights.
 *
 * Used by the master process only, from one thread. The module never
 * reads the master's own state: what it needs of it (the serving
 * generation, the oldest live one, the fair queue, the console's
 * windows) comes in a struct sl_slots_ctx.
 */
#ifndef SL_SLOTS_H
#define SL_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include "sl_auth.h"
#include "sl_config.h"
#include "sl_console.h"
#include "sl_queue.h"
#include "sl_shm.h"

/*
 * The fair queue's pools: one per upstream with a queue (pool 0 is "no
 * queue"), removed ones included until the workers that knew them are
 * gone. Not twice over like the other slots: the queue's cells are
 * reserved for every pool x shared index (sl_queue.h), so each pool of
 * room costs 32 bytes of address space per index.
 */
#define SL_QUEUE_POOLS (SL_MAX_QUEUED_UPSTREAMS + 1)
/*
 * The console's windows (sl_console.h) sample SL_INDEX_VALUES counters
 * per shared index and SL_MODEL_VALUES per model slot: an index given to
 * another name is forgotten there.
 */
#define SL_MODEL_VALUES (2 + SL_MHIST_BOUNDS_MAX)  /* requests, TTFT buckets */
#define SL_INDEX_VALUES 2
/*
 * Per-model histograms (three, 15 to 18 series each) under a model's own
 * label for the models of slots 1..SL_MODEL_HIST_SERIES (the first models
 * of the configuration at start, and those that took their slots); the
 * others are summed under model="_other" (sluice.8, METRICS).
 */
#define SL_MODEL_HIST_SERIES 100

/*
 * Named slots of a shared table (models, upstreams, queue pools): the
 * name of each (slot 0 is never named; NULL: free or never used) and the
 * newest generation that maps it; slots below hwm were handed out. Arrays
 * reserved like the index arrays: a slot costs once used.
 */
struct sl_slot_table {
	char **names;
	unsigned *gen;
	size_t n;
	size_t hwm;
};

/* A generation: one config and the mappings its workers use. */
struct sl_gen {
	struct sl_config *cfg;
	size_t *tenant_slot;
	size_t *upstream_slot;
	size_t *queue_slot;          /* config upstream -> queue pool; 0: none */
	size_t **replica_slot;       /* [upstream][replica] -> shm index */
	size_t *model_slot;          /* config model -> shm model slot */
	/*
	 * API key -> tenant, built here once per generation and shared by
	 * its workers (copy-on-write pages never written): one index, not one
	 * per worker.
	 */
	struct sl_keyidx *keys;
	unsigned id;
};

struct sl_slots {
	struct sl_shm *shm;          /* borrowed */
	/*
	 * Tenants and pool replicas share the region's index space (a
	 * replica's cap and count are a tenant slot's); a replica's name is
	 * "\x01UPSTREAM\x01URL", so it never meets a tenant's.
	 */
	char **shm_names;            /* shm index -> name (or NULL) */
	unsigned char *shm_replica;  /* shm index -> 1 for a replica */
	/*
	 * A replica's index is reused once a reload removed it and its
	 * streams ended (reuse_retired): shm_gen is the newest generation
	 * that may map the index, shm_epoch its epoch as this process (and so
	 * a worker forked now) knows it, shm_free marks an index given back
	 * (name freed, region zeroed).
	 */
	unsigned *shm_gen;
	uint32_t *shm_epoch;         /* the region's epochs, as forked workers see */
	unsigned char *shm_free;
	size_t *free_stack;          /* the indices given back, [shm_nfree] */
	size_t shm_nfree;
	size_t shm_ntenants;         /* indices handed out so far */
	size_t shm_tenants_live;     /* tenant indices not free */
	size_t max_tenants;          /* limits.max_tenants at start */
	size_t *name_ht;             /* open addressing: shm index + 1, 0 empty */
	size_t name_ht_mask;         /* capacity - 1, a power of two */
	size_t name_ht_n;            /* names in it */
	/*
	 * Model slots of the region (sl_shm.h, 2 x limits.max_models + 1),
	 * upstream slots (2 x limits.max_upstreams + 1) and the fair queue's
	 * pools (SL_QUEUE_POOLS; 0 is "no queue"): map_slots.
	 */
	struct sl_slot_table models;
	struct sl_slot_table ups;
	struct sl_slot_table queues;
	size_t max_models;           /* limits.max_models at start */
	size_t max_upstreams;        /* limits.max_upstreams at start */
	size_t replica_room;         /* sl_config_replica_room at start */
	/* What slots past SL_MODEL_HIST_SERIES counted before they were reused. */
	uint64_t other_hist[SL_MHIST_MAX][SL_MHIST_BOUNDS_MAX + 1];
	uint64_t other_hist_us[SL_MHIST_MAX];
};

/* What a mapping needs of the master's state, passed in. */
struct sl_slots_ctx {
	unsigned cur;                /* the serving generation's id */
	/* The oldest generation with a worker alive; UINT_MAX: none. */
	unsigned oldest_live;
	struct sl_queue *queue;      /* NULL until the queue is mapped */
	struct sl_stored *stored;    /* stored responses' table; NULL: none */
	struct sl_window *window;    /* the console's; NULL without one */
	struct sl_window *mwindow;
};

/*
 * Zeroed memory of n bytes in a mapping of its own, whose pages cost
 * nothing until written; NULL without memory. Give back with
 * sl_slots_unreserve(p, n).
 */
void *sl_slots_reserve(size_t n);
void sl_slots_unreserve(void *p, size_t n);

/*
 * Reserve the slot tables: models and upstreams twice the start limits
 * (+ slot 0), SL_QUEUE_POOLS pools. 0, or -1 (errno set).
 */
int sl_slots_init_tables(struct sl_slots *, size_t max_models,
    size_t max_upstreams);
/*
 * The index arrays for cap shared indices of shm (which may be NULL: then
 * -1). 0, or -1 (errno set).
 */
int sl_slots_init_index(struct sl_slots *, struct sl_shm *shm, size_t cap);
/* Everything init made; shm must still be mapped. */
void sl_slots_free(struct sl_slots *);

/*
 * Map every tenant of cfg to a stable shm index for generation gen and
 * publish limits; tenants that disappeared are retired (limit 0).
 * Returns the mapping (caller owns) or NULL when the region is full.
 */
size_t *sl_slots_map_tenants(struct sl_slots *, const struct sl_slots_ctx *,
    const struct sl_config *cfg, unsigned gen);
/*
 * Map every replica of every pool to a stable shm index and publish
 * caps; removed replicas get cap 0. Returns the mapping (caller owns;
 * sl_slots_free_replica_map) or NULL.
 */
size_t **sl_slots_map_replicas(struct sl_slots *, const struct sl_slots_ctx *,
    const struct sl_config *cfg, unsigned gen);
void sl_slots_free_replica_map(size_t **rmap, size_t n);
/*
 * Map every model of cfg to a model slot for generation gen; a model with
 * no slot left counts under "-" (warned). The mapping (caller owns), or
 * NULL without memory.
 */
size_t *sl_slots_map_models(struct sl_slots *, const struct sl_slots_ctx *,
    const struct sl_config *cfg, unsigned gen);
/*
 * Upstream slots (*umapp) and queue pools (*qmapp) for generation gen:
 * 0, or -1 (said why) without room or memory.
 */
int sl_slots_map_upstreams(struct sl_slots *, const struct sl_slots_ctx *,
    const struct sl_config *cfg, unsigned gen, size_t **umapp,
    size_t **qmapp);
/*
 * The fair queue follows cfg: each pool's queue, each tenant's weight and
 * priority; with close_removed, a pool the mapping removed answers its
 * waiters 503.
 */
void sl_slots_publish_queue(struct sl_slots *, const struct sl_slots_ctx *,
    const struct sl_config *cfg, const size_t *tmap, const size_t *qmap,
    int close_removed);

#endif

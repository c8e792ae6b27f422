/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_shm: the region shared by the master and all workers.
 *
 * Created once by the master before forking, MAP_SHARED|MAP_ANONYMOUS; its
 * size is fixed for the master's life (index and worker-row capacity), so a
 * reload never remaps. The capacity is reserved, not committed
 * (MAP_NORESERVE): a page costs memory once written, and nothing writes or
 * reads a page that no index in use needs, so a capacity of a million
 * indices costs what the indices in use cost.
 *
 * Per index (a tenant, or a pool replica): limit, in-flight count, epoch,
 * token budget and window, and its request counters, shared by the
 * workers (536 bytes). Per worker row and index: the number of slots that
 * worker holds (written only by that worker, 4 bytes, on a page written
 * only when the row served the index), which the master subtracts when
 * the worker dies. Per worker row: stat counters written only by that
 * worker.
 *
 * Only lock-free C11 atomics live here; no locks, no pointers.
 */
#ifndef SL_SHM_H
#define SL_SHM_H

#include <stddef.h>
#include <stdint.h>

struct sl_shm;

/*
 * Room for the reasons counted apart, one counter each: enum sl_tls_err
 * (sl_tls.h) and enum sl_h2_err (sl_h2.h) fit theirs, as tls.c and h2.c
 * assert.
 */
#define SL_STAT_TLS_ERRS 9
#define SL_STAT_H2_ERRS 12

enum sl_admit {
	SL_ADMIT_OK = 0,
	SL_ADMIT_FULL,         /* tenant at its limit: answer 429 */
	SL_ADMIT_INVALID       /* bad tenant or row index: a bug */
};

/*
 * Map a new zeroed region for max_tenants indices (tenants and replicas,
 * at most SL_SHM_MAX_INDICES), max_rows worker rows and model_slots model
 * slots (slot 0 "-" included, at most SL_SHM_MAX_MODEL_SLOTS). Returns
 * NULL (errno set) on failure. Call before fork(); children inherit the
 * mapping.
 */
#define SL_SHM_MAX_INDICES ((1u << 21) - 1)
#define SL_SHM_MAX_MODEL_SLOTS (1u << 20)
#define SL_SHM_MAX_UPSTREAM_SLOTS (1u << 20)
struct sl_shm *sl_shm_create(size_t max_tenants, size_t max_rows,
    size_t model_slots, size_t upstream_slots);
void sl_shm_destroy(struct sl_shm *);

size_t sl_shm_max_tenants(const struct sl_shm *);
/* Bytes mapped (the region's size, fixed at creation). */
size_t sl_shm_size(const struct sl_shm *);

/* Master: rows below n may hold data; sums skip the rest. */
void sl_shm_set_rows_used(struct sl_shm *, size_t n);
/* Master: indices below n were handed out; walks skip the rest. */
void sl_shm_set_indices_used(struct sl_shm *, size_t n);
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

/*
 * For the fair queue (sl_queue.h), whose granted slots are held by a row
 * of their own, written only under the queue's lock: move one slot of
 * index idx from row `from` to row `to` (in-flight unchanged), or give
 * back one held by `row`, inside the admission window of row `win`, the
 * caller's own row: a worker killed inside leaves its window open and the
 * master reconciles idx against the live rows (the queue's row is one).
 */
void sl_shm_move(struct sl_shm *, size_t win, size_t from, size_t to,
    size_t idx);
void sl_shm_release_as(struct sl_shm *, size_t win, size_t row, size_t idx);

/* Slots row currently holds for tenant (master: after the worker died). */
int32_t sl_shm_held(const struct sl_shm *, size_t row, size_t tenant);

/*
 * Master only, after waitpid() reported the worker on `row` dead: give its
 * held slots back to their tenants and zero the row. Returns the number of
 * slots reclaimed.
 */
int64_t sl_shm_reclaim_row(struct sl_shm *, size_t row);

/*
 * Same for several rows that died together. Exact even for a worker killed
 * between the two steps of an acquire or release: that tenant's in-flight
 * count is reconciled against the live rows. Returns slots given back.
 */
int64_t sl_shm_reclaim_rows(struct sl_shm *, const size_t *rows, size_t n);

/*
 * Per-row statistics, written only by the owning worker (a load and a
 * store, no locked instruction), summed by the master on scrape. Nothing
 * here is written per chunk: counters move once per request, gauges once
 * per second. Row 0 is the master's: when a worker dies its counters are
 * folded into row 0 (sl_shm_retire_stats) so totals never go backwards.
 */
enum sl_stat {
	/* counters */
	SL_STAT_ADMITTED = 0,
	SL_STAT_REJECTED,
	SL_STAT_BYTES_OUT,
	SL_STAT_PAUSES,
	SL_STAT_IDLE_CLOSED,   /* connections closed with no request byte */
	SL_STAT_TLS_ERR_FIRST, /* failed handshakes, by enum sl_tls_err */
	SL_STAT_TLS_ERR_LAST = SL_STAT_TLS_ERR_FIRST + SL_STAT_TLS_ERRS - 1,
	SL_STAT_H2_ERR_FIRST,  /* HTTP/2 protocol errors, by enum sl_h2_err */
	SL_STAT_H2_ERR_LAST = SL_STAT_H2_ERR_FIRST + SL_STAT_H2_ERRS - 1,
	/* gauges (dropped when a worker dies) */
	SL_STAT_G_FIRST,
	SL_STAT_PAUSED_STREAMS = SL_STAT_G_FIRST,
	SL_STAT_BUFFERED_BYTES,
	SL_STAT_CONNECTIONS,
	SL_STAT_STREAMS,
	SL_STAT_H2_CONNECTIONS,
	SL_STAT_H2_STREAMS,
	SL_STAT_MAX
};
void sl_shm_stat_add(struct sl_shm *, size_t row, enum sl_stat, uint64_t n);
void sl_shm_stat_set(struct sl_shm *, size_t row, enum sl_stat, uint64_t v);
uint64_t sl_shm_stat_sum(const struct sl_shm *, enum sl_stat);

/*
 * Status codes counted per tenant; others fall into their class (2xx...).
 * Three pseudo statuses count replica tries that got no status at all.
 */
#define SL_NCODES 27
#define SL_CODE_CONNECT (-1)       /* label "connect" */
#define SL_CODE_TIMEOUT (-2)       /* label "timeout" */
#define SL_CODE_RESET (-3)         /* label "reset" */
int sl_shm_code_slot(int status);
const char *sl_shm_code_label(int slot);

/* Tenant index for requests with no tenant (bad key, 404, 400...). */
#define SL_TENANT_NONE(shm) sl_shm_max_tenants(shm)

void sl_shm_count_request(struct sl_shm *, size_t row, size_t tenant, int status);
/* Why admission refused a request (sluice_rejected_total's reason). */
enum sl_reject_reason {
	SL_REJECT_MAX_STREAMS = 0, SL_REJECT_TOKEN_BUDGET, SL_REJECT_MAX
};
void sl_shm_count_rejected(struct sl_shm *, size_t row, size_t tenant,
    enum sl_reject_reason);
uint64_t sl_shm_requests_sum(const struct sl_shm *, size_t tenant, int slot);
uint64_t sl_shm_rejected_sum(const struct sl_shm *, size_t tenant,
    enum sl_reject_reason);

/*
 * Upstreams: sl_shm_upstream_slots slots, fixed at creation (the master
 * makes 2 x limits.max_upstreams + 1), handed out and reused like model
 * slots. Their error, retry and affinity counters are shared by the
 * workers, one atomic add each (112 bytes a slot).
 */
size_t sl_shm_upstream_slots(const struct sl_shm *);
/* Master only: zero upstream slot u's counters before it is reused. */
void sl_shm_upstream_reset(struct sl_shm *, size_t upstream);
enum sl_uerr {
	SL_UERR_CONNECT = 0, SL_UERR_TIMEOUT, SL_UERR_RESET, SL_UERR_BAD_RESPONSE,
	SL_UERR_IDLE, SL_UERR_MAX
};
const char *sl_shm_uerr_label(enum sl_uerr);

/* What prefix affinity did for a request (sluice_affinity_*_total). */
enum sl_aff_outcome {
	SL_AFF_HIT = 0, SL_AFF_MISS, SL_AFF_SPILL, SL_AFF_MAX
};
void sl_shm_count_affinity(struct sl_shm *, size_t row, size_t upstream,
    enum sl_aff_outcome);
uint64_t sl_shm_affinity_sum(const struct sl_shm *, size_t upstream,
    enum sl_aff_outcome);

/*
 * What a request naming a stored response found (sl_stored.h,
 * sluice_response_affinity_total): its replica, up; its replica down or
 * not in the pool any more; no replica known for it.
 */
enum sl_stored_result {
	SL_STORED_OWNER = 0, SL_STORED_OWNER_DOWN, SL_STORED_UNKNOWN,
	SL_STORED_R_MAX
};
const char *sl_shm_stored_label(enum sl_stored_result);
void sl_shm_count_stored(struct sl_shm *, size_t row, size_t upstream,
    enum sl_stored_result);
uint64_t sl_shm_stored_sum(const struct sl_shm *, size_t upstream,
    enum sl_stored_result);

/* Why a request moved to another replica (sluice_upstream_retries_total). */
enum sl_retry_reason {
	SL_RETRY_R_CONNECT = 0, SL_RETRY_R_BUSY, SL_RETRY_R_EMPTY, SL_RETRY_R_MAX
};
const char *sl_shm_retry_label(enum sl_retry_reason);
void sl_shm_count_retry(struct sl_shm *, size_t row, size_t upstream,
    enum sl_retry_reason);
uint64_t sl_shm_retry_sum(const struct sl_shm *, size_t upstream,
    enum sl_retry_reason);

/*
 * Replicas of upstream pools share the tenants' index space: a replica's
 * in-flight count, cap (its limit; INT32_MAX for none, 0 once removed by a
 * reload), per-worker held counts and crash reclaim are exactly a
 * tenant's (sl_shm_try_acquire / sl_shm_release), and its requests are
 * counted with sl_shm_count_request; a removed replica's index goes to
 * another replica once it is quiet (sl_shm_index_reset, below, bumps its
 * epoch). What only a replica has is its
 * health, below: written by the master's prober (down) and by any worker
 * (passive failures, ejection, busy marks); read by every worker choosing
 * a replica. Times are CLOCK_MONOTONIC milliseconds, the same clock in
 * every process.
 */
struct sl_shm_replica {
	_Atomic int32_t down;              /* 0 up; SL_REPLICA_DOWN / _LOADING */
	_Atomic int32_t fails;             /* consecutive failures seen on traffic */
	_Atomic int32_t ejections;         /* consecutive ejections (backoff) */
	_Atomic int64_t ejected_until_ms;  /* 0: not ejected */
	_Atomic int64_t busy_until_ms;     /* a 429/503 with Retry-After */
	/*
	 * The runner's own load, scraped by the master (load_metrics); each
	 * field -1 when its page lacks the metric. lm_at_ms is stored last
	 * (release) and read first (acquire): a reader that sees a fresh
	 * time sees that sample's values or a newer one's.
	 */
	_Atomic int32_t lm_waiting;        /* requests queued in the runner */
	_Atomic int32_t lm_running;        /* requests it is decoding */
	_Atomic int32_t lm_kv;             /* KV-cache use, per mille */
	_Atomic int64_t lm_at_ms;          /* when sampled; 0: never */
};
#define SL_REPLICA_DOWN 1
#define SL_REPLICA_LOADING 2

/*
 * Reusing the index of a replica a reload removed (master only). Quiet:
 * nothing in flight and no worker row holds a slot of it. Reset: every
 * count, held slot, request counter, token and health field of idx back
 * to zero, limit 0, and its epoch bumped; call it only for a quiet index
 * whose limit is 0 (retired), so that nothing is admitted meanwhile. A
 * worker of an older generation still maps the index to the removed
 * replica: it compares the epoch it was forked with to sl_shm_epoch after
 * each admission and gives a reused index's slot straight back. Drop
 * slots: forget every affinity hint to an index whose drop[idx] is set,
 * in one pass.
 */
uint32_t sl_shm_epoch(const struct sl_shm *, size_t idx);
int sl_shm_index_quiet(const struct sl_shm *, size_t idx);
void sl_shm_index_reset(struct sl_shm *, size_t idx);
void sl_shm_hint_drop_slots(struct sl_shm *, const unsigned char *drop);

/* The health cell of index idx (a replica's), or NULL if out of range. */
struct sl_shm_replica *sl_shm_replica(struct sl_shm *, size_t idx);

/*
 * Affinity hints (balance: prefix_affinity), shared by every worker so that
 * a conversation's next turn finds the replica of its last one whichever
 * worker routed that: a direct-mapped, lossy table of SL_SHM_HINTS words,
 * prompt block hash -> replica slot (the index of sl_shm_replica) and
 * whether that block ended a routed prompt. Relaxed loads and stores, no
 * lock: a collision overwrites (the older hint is lost), a reader checks
 * the hash's 42-bit tag, so a wrong answer needs a tag collision (2^-42 a
 * probe) and costs a cache miss, nothing else. Written by workers after
 * they route; each worker's own exact LRU (sl_affinity) is consulted too.
 * Not cleared on reload: a slot stands for one (upstream, URL) until a
 * reload removed that replica and its streams ended (then the slot may be
 * reused, and its hints are dropped first), and a hint naming a slot that
 * is not a replica of the pool being chosen for is skipped.
 */
#define SL_SHM_HINTS (1u << 18)        /* 2 MiB */
void sl_shm_hint_put(struct sl_shm *, uint64_t hash, size_t slot, int ended);
/* 0 and *slot, *ended when hash has a hint; -1 when not. */
int sl_shm_hint_get(const struct sl_shm *, uint64_t hash, size_t *slot, int *ended);
/* Forget every hint to slot (its replica went down). O(SL_SHM_HINTS). */
void sl_shm_hint_drop_slot(struct sl_shm *, size_t slot);
void sl_shm_count_uerr(struct sl_shm *, size_t row, size_t upstream, enum sl_uerr);
uint64_t sl_shm_uerr_sum(const struct sl_shm *, size_t upstream, enum sl_uerr);

/* Latency histograms, in seconds; bucket bounds from sl_shm_hist_bounds. */
enum sl_hist { SL_HIST_TTFB = 0, SL_HIST_DURATION, SL_HIST_MAX };
#define SL_HIST_BUCKETS 16
const double *sl_shm_hist_bounds(void);
void sl_shm_observe(struct sl_shm *, size_t row, enum sl_hist, double seconds);
/* Cumulative count for bucket b (b == SL_HIST_BUCKETS: +Inf), sum, count. */
uint64_t sl_shm_hist_bucket(const struct sl_shm *, enum sl_hist, int b);
double sl_shm_hist_sum(const struct sl_shm *, enum sl_hist);

/*
 * Models: sl_shm_model_slots slots, fixed at creation
 * (the master makes 2 x limits.max_models + 1). Slot 0 is "-": a request
 * that named no model or an unknown one, or any request without
 * `models:`. The master gives slots 1.. to model names on start and
 * reload (a model a reload keeps keeps its slot, and so its counters); a
 * worker is handed the slot of each model of its configuration. A slot
 * goes to another name only once no live worker may count under it,
 * zeroed first (sl_shm_models_reset).
 *
 * Requests by status and the latency histograms of each model are shared
 * by the workers, one atomic add each, once per request: 648 bytes a
 * slot, a page written only once a slot is used. Fallbacks sit in a
 * hashed table of (from, to) pairs, 65,536 of them; a pair that finds no
 * room counts under (from, "-").
 */
size_t sl_shm_model_slots(const struct sl_shm *);
void sl_shm_count_model_request(struct sl_shm *, size_t row, size_t model,
    int status);
uint64_t sl_shm_model_requests_sum(const struct sl_shm *, size_t model,
    int slot);
/* A request moved from model `from` to model `to` (to == from: a target). */
void sl_shm_count_fallback(struct sl_shm *, size_t from, size_t to);
uint64_t sl_shm_fallbacks(const struct sl_shm *, size_t from, size_t to);
/*
 * Walk the fallback pairs counted (n > 0): start with *pos 0; 1 and the
 * pair, or 0 at the end.
 */
int sl_shm_fallbacks_next(const struct sl_shm *, size_t *pos, size_t *from,
    size_t *to, uint64_t *n);

/*
 * Per-model histograms, in seconds, with the explicit bucket boundaries of
 * the OpenTelemetry GenAI semantic conventions (gen_ai.server.*): time to
 * first token, time per output token, request duration.
 */
enum sl_mhist { SL_MHIST_TTFT = 0, SL_MHIST_TPOT, SL_MHIST_DURATION,
	SL_MHIST_MAX };
#define SL_MHIST_BOUNDS_MAX 16
/* The bounds of h, *n of them (at most SL_MHIST_BOUNDS_MAX). */
const double *sl_shm_mhist_bounds(enum sl_mhist h, int *n);
void sl_shm_model_observe(struct sl_shm *, size_t row, size_t model,
    enum sl_mhist, double seconds);
/* Cumulative count of bucket b (b == the number of bounds: +Inf). */
uint64_t sl_shm_model_hist_bucket(const struct sl_shm *, size_t model,
    enum sl_mhist, int b);
double sl_shm_model_hist_sum(const struct sl_shm *, size_t model,
    enum sl_mhist);
/*
 * Master only: zero every counter of each model slot m with drop[m] set
 * (drop: sl_shm_model_slots bytes): requests, histograms, fallbacks from
 * and to it, its tenants' tokens, in one pass, before the slots go to
 * other names. No live worker may count under them.
 */
void sl_shm_models_reset(struct sl_shm *, const unsigned char *drop);

/*
 * Tokens per tenant (usage read from responses): totals by kind, and a
 * sliding window of the last 60 seconds (now_sec: CLOCK_MONOTONIC seconds)
 * for tokens_per_minute. Charged once per response, exact across workers.
 * The totals are also kept per tenant and model slot: model 0 ("-") in a
 * cell of the tenant's own, the others in one table shared by all tenants
 * (SL_SHM_PAIRS_PER_TENANT pairs per tenant of the region's capacity, not
 * a tenant x model matrix); a pair that finds no room in the table (a
 * bounded probe) is counted under "-", so the sum over models is always
 * the tenant's total.
 */
enum sl_tokens_kind {
	SL_TOKENS_PROMPT = 0, SL_TOKENS_COMPLETION, SL_TOKENS_ESTIMATED,
	SL_TOKENS_KINDS
};
#define SL_SHM_PAIRS_PER_TENANT 2
void sl_shm_tokens_charge(struct sl_shm *, size_t tenant, size_t model,
    uint64_t now_sec, const uint64_t n[SL_TOKENS_KINDS]);
/* The tenant's tokens of kind under model slot model (0: "-"). */
uint64_t sl_shm_tokens_model(const struct sl_shm *, size_t tenant,
    size_t model, int kind);
/*
 * Walk the tenant x model pairs of the table (model >= 1): start with
 * *pos = 0; each call fills *tenant, *model and n and returns 1, or
 * returns 0 at the end. Order: the table's, not sorted.
 */
int sl_shm_tokens_next(const struct sl_shm *, size_t *pos, size_t *tenant,
    size_t *model, uint64_t n[SL_TOKENS_KINDS]);
/*
 * Tokens charged in the last 58 to 60 s (2-second buckets, shm_tokens.c).
 * With budget > 0 and the window at or over it, *retry_after (if not
 * NULL) gets the seconds until it is under (1..60); else 0.
 */
uint64_t sl_shm_tokens_window(const struct sl_shm *, size_t tenant,
    uint64_t now_sec, uint64_t budget, int *retry_after);
/*
 * Seconds until every token now in the tenant's window has left it (its
 * newest bucket ages out): 0 when the window is empty.
 */
int sl_shm_tokens_clear_in(const struct sl_shm *, size_t tenant,
    uint64_t now_sec);
uint64_t sl_shm_tokens_total(const struct sl_shm *, size_t tenant, int kind);
/*
 * The tenant's tokens_per_minute (0: none), published by the master on
 * start and reload like a limit, and read at admission by every worker,
 * retired ones included: a reload's budget applies to the next admission.
 */
void sl_shm_set_token_budget(struct sl_shm *, size_t tenant, int32_t budget);
int32_t sl_shm_token_budget(const struct sl_shm *, size_t tenant);

/* Master: fold a dead worker's counters into row 0 and zero its row. */
void sl_shm_retire_stats(struct sl_shm *, size_t row);

#endif

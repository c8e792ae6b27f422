/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_queue: the fair queue of the upstream pools, shared by the master
 * and every worker.
 *
 * What it guarantees:
 *   - A request whose pool has replicas up, every one at its
 *     max_streams, waits here instead of getting 503
 *     upstream_unavailable, and a slot that frees while waiters exist is
 *     always offered to one: the queue is work-conserving.
 *   - Who goes next is chosen once, by the process that frees the slot,
 *     never by whichever worker wakes first: the highest priority band
 *     (the tenant's `priority`) with a waiter; within it, with `fairness:
 *     tokens`, the tenant whose service counter is lowest (of equal ones,
 *     the one with fewer waiters, then the one whose oldest waiter is
 *     oldest), with `fifo` the tenant whose oldest waiter is oldest;
 *     within a tenant, its oldest waiter. A counter grows by cost * 1000
 *     / weight (milli-tokens) as the tenant's tokens are charged
 *     (sl_queue_charge); a tenant that starts waiting is lifted to the
 *     lowest counter among the pool's waiting tenants, or, when nobody
 *     waits, to the last dispatched tenant's: no banked credit.
 *   - No slot is lost or counted twice. A granted slot is never
 *     released: sl_shm_move carries it from the offering row to
 *     SL_QUEUE_ROW (the master's row, which never serves and never dies)
 *     and on to the waiter's row when collected, inside the mover's
 *     admission window, so in-flight never changes and a worker killed
 *     halfway is reconciled like any acquire or release. Under the lock,
 *     held(SL_QUEUE_ROW, idx) == the GRANTED entries whose slot is idx.
 *   - No lost wake-up: an enqueuer counts itself among the pool's
 *     waiters (seq_cst) and then tries the pool once more; a releaser
 *     gives back (seq_cst) and then reads that count. At least one sees
 *     the other. A slot a reload or a recovered replica adds is found by
 *     the worker's once-a-second pump (pick and offer while waiters).
 *   - Nothing a crash leaves blocks the queue or leaks a slot: a dead
 *     worker's waiters are dropped and the slots granted to them go on
 *     (sl_queue_reclaim_rows); a process killed holding the lock leaves
 *     it owner-dead, and the next to lock rebuilds every list from the
 *     entries and the queue row's held cells from the grants.
 *
 * Cost: a pool with no waiter costs one seq_cst load of its waiter count
 * before the lock-free pick and one after a release. The lock is taken
 * only to wait, offer, collect, cancel and sweep.
 *
 * Limits: one lock for every pool (a lock per pool would split it). The
 * entries are sized at creation (the sum of queue.max, 1024..65536): a
 * reload that raises max past that gets queue_full early.
 * sl_queue_expire and the repair scan every entry. While a waiter of a
 * pool wants one replica (sl_queue_enqueue_for), choosing for a slot
 * walks each waiting tenant's FIFO to its first waiter that takes it. A request moved to
 * another replica after its dispatch (a busy head, a connect failure) is
 * retried by sl_pool_pick, never queued again. The tokens of a stream
 * whose client left are charged after its slot went on (the connection
 * releases before it charges). A worker of an older generation whose
 * config has no queue for a pool gives its slots back instead of handing
 * them over (the pump passes them on within a second).
 *
 * Use: the master creates the queue before forking (sl_queue_create;
 * sl_queue_enable_wake for a config with a queue), publishes pool and
 * tenant settings on start and reload, and reclaims dead rows after
 * sl_shm_reclaim_rows. A worker reads sl_queue_waiting before its pick;
 * when the pool is full it enqueues, picks once more and offers what it
 * gets; it offers a slot it would release while the pool has waiters;
 * it watches its row's eventfd (sl_queue_wake_fd) and collects grants,
 * cancels a waiter whose client left, and expires its own waiters every
 * 100 ms or so. What each caller does is written at each function.
 */
#ifndef SL_QUEUE_H
#define SL_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "sl_shm.h"

struct sl_queue;

/* The row that holds granted slots: the master's (never a worker's). */
#define SL_QUEUE_ROW 0

enum sl_queue_fairness {
	SL_QUEUE_TOKENS = 0,     /* weighted least-served first */
	SL_QUEUE_FIFO            /* oldest first across tenants */
};

enum sl_queue_res {
	SL_QUEUE_OK = 0,         /* waiting; *handle set */
	SL_QUEUE_NONE,           /* the pool has no queue: 503 upstream_unavailable */
	SL_QUEUE_FULL,           /* queue.max waiters: 503 queue_full */
	SL_QUEUE_SHED            /* tenant priority below 0: 503, never queued */
};

/* sluice_queue_total{outcome}, in this order. */
enum sl_queue_outcome {
	SL_QUEUE_O_DISPATCHED = 0, SL_QUEUE_O_TIMEOUT, SL_QUEUE_O_FULL,
	SL_QUEUE_O_GONE, SL_QUEUE_O_SHED, SL_QUEUE_O_MAX
};
const char *sl_queue_outcome_label(enum sl_queue_outcome);

/* A grant a worker collects: slot is the replica's shared index. */
#define SL_QUEUE_CLOSED SIZE_MAX  /* slot of a waiter whose pool was removed */
struct sl_queue_grant {
	uint64_t handle;
	size_t pool;
	size_t slot;             /* SL_QUEUE_CLOSED: answer 503 upstream_unavailable */
	int64_t waited_ms;
};

/*
 * Master, before fork: a zeroed queue for npools pools (indices the
 * master keeps stable across reloads), ntenants tenant indices (sl_shm's
 * index space), nentries waiters at most across all pools, and nrows
 * worker rows (sl_shm's). Every pool starts without a queue. NULL
 * (errno) on failure.
 */
struct sl_queue *sl_queue_create(struct sl_shm *, size_t npools,
    size_t ntenants, size_t nentries, size_t nrows);
void sl_queue_destroy(struct sl_queue *);

/*
 * Master, before forking the first workers of a config with a queue: one
 * eventfd per row (a grant wakes its row's worker through it). Made once,
 * kept for the master's life (nrows descriptors in every process, so a
 * config without queue costs none). 0, or -1 (errno; those made stay).
 */
int sl_queue_enable_wake(struct sl_queue *);

/* Worker: the fd to watch (EV_READ) for grants to its row; -1 if none. */
int sl_queue_wake_fd(const struct sl_queue *, size_t row);

/*
 * Master, on start and reload: pool's settings (max 0: no queue; new
 * waiters get SL_QUEUE_NONE, present ones stay), a tenant's weight
 * (1..1000) and priority (-100..100). Apply at once to waiters.
 */
void sl_queue_set_pool(struct sl_queue *, size_t pool, int32_t max,
    int32_t timeout_ms, enum sl_queue_fairness);
void sl_queue_set_tenant(struct sl_queue *, size_t tenant, int32_t weight,
    int32_t priority);
/*
 * The shared index `tenant` goes to another name (master, under row's
 * window, nothing of it waiting): its service counters, weight and
 * priority start again from zero, as a new tenant's do.
 */
void sl_queue_forget_tenant(struct sl_queue *, size_t row, size_t tenant);

/*
 * Master: a reload removed the pool: no queue any more, and every waiter
 * gets a grant of SL_QUEUE_CLOSED (answer 503 upstream_unavailable).
 * row: the caller's row (the master: SL_QUEUE_ROW).
 */
void sl_queue_close_pool(struct sl_queue *, size_t row, size_t pool);
/*
 * Master, before a pool index goes to another upstream (no live worker
 * may use it any more): close it and zero its counters, and every
 * tenant's service and cell in it.
 */
void sl_queue_reset_pool(struct sl_queue *, size_t pool);

/* The pool's queue timeout now, ms (a reload's applies to waiters). */
int32_t sl_queue_timeout_ms(const struct sl_queue *, size_t pool);

/*
 * Anyone, lock-free: waiters of pool right now (seq_cst). The path with
 * no queue in use reads only this before sl_pool_pick.
 */
int32_t sl_queue_waiting(const struct sl_queue *, size_t pool);

/*
 * Worker row `row`: wait for a slot of pool, for tenant, at now_ms
 * (CLOCK_MONOTONIC ms). dispatch_cost (tokens, e.g. the prompt's
 * estimate) is charged to the tenant's counter when it is dispatched.
 * SL_QUEUE_OK: *handle names the waiter until it is collected, cancelled
 * or expired; the caller then tries the pool once more and offers what
 * it gets. Counts full and shed outcomes itself.
 */
enum sl_queue_res sl_queue_enqueue(struct sl_queue *, size_t row,
    size_t pool, size_t tenant, int64_t now_ms, uint64_t dispatch_cost,
    uint64_t *handle);

/*
 * The same for a request that only one replica can serve (it names a
 * stored response that replica holds): it takes only a slot of the
 * replica whose shared index is want (SL_QUEUE_ANY: any, as
 * sl_queue_enqueue). Waiters that want another replica are passed over
 * for a slot, not reordered: each keeps its place for the slots it
 * takes. A waiter whose replica stays full or goes down waits out the
 * pool's timeout.
 */
#define SL_QUEUE_ANY SIZE_MAX
enum sl_queue_res sl_queue_enqueue_for(struct sl_queue *, size_t row,
    size_t pool, size_t tenant, int64_t now_ms, uint64_t dispatch_cost,
    size_t want, uint64_t *handle);

/*
 * Worker row `row` holds a slot of replica index slot of pool (from
 * sl_pool_pick) that it does not want: hand it to the pool's best waiter
 * without releasing it. 1: handed over (row no longer holds it); 0: no
 * waiter that takes it (row still holds it: release it or use it).
 */
int sl_queue_offer(struct sl_queue *, size_t row, size_t pool, size_t slot,
    int64_t now_ms);

/*
 * Worker row `row`, when its eventfd is readable (reads it): take up to
 * max grants of its waiters; each slot is now held by row (as if
 * sl_pool_pick had taken it), each handle is done. Returns how many.
 */
size_t sl_queue_collect(struct sl_queue *, size_t row,
    struct sl_queue_grant *out, size_t max, int64_t now_ms);

/*
 * Worker row `row`: its waiter leaves (client gone: SL_QUEUE_O_GONE; its
 * own timer: SL_QUEUE_O_TIMEOUT). 0: it was waiting and is gone; 1: it
 * had been granted a slot, which went on to the next waiter (or back);
 * -1: no such waiter (stale handle, already collected).
 */
int sl_queue_cancel(struct sl_queue *, size_t row, uint64_t handle,
    enum sl_queue_outcome why);

/*
 * Worker row `row`, every 100 ms or so: its waiters older than their
 * pool's timeout (read now: a reload's applies at once) leave, counted
 * timeout; their handles in out (up to max). Returns how many.
 */
size_t sl_queue_expire(struct sl_queue *, size_t row, int64_t now_ms,
    uint64_t *out, size_t max);

/*
 * Charge tokens (prompt + 2 x completion) to tenant's counter in pool:
 * tokens * 1000 / weight. Lock-free; any process.
 */
void sl_queue_charge(struct sl_queue *, size_t pool, size_t tenant,
    uint64_t tokens);

/*
 * Master, after waitpid() and sl_shm_reclaim_rows() for rows that died
 * together: drop their waiters, pass on the slots granted to them, and
 * repair a lock a dead process held. Returns the waiters dropped.
 */
size_t sl_queue_reclaim_rows(struct sl_queue *, const size_t *rows, size_t n);

/* Metrics (master): lock-free reads. */
int32_t sl_queue_waiting_tenant(const struct sl_queue *, size_t pool,
    size_t tenant);
uint64_t sl_queue_service(const struct sl_queue *, size_t pool, size_t tenant);
uint64_t sl_queue_outcomes(const struct sl_queue *, size_t pool,
    enum sl_queue_outcome);
/* Sum of the waits of dispatched waiters, ms. */
uint64_t sl_queue_wait_ms_sum(const struct sl_queue *, size_t pool);
/*
 * Dispatched waiters that waited at most sl_shm_hist_bounds()[b] seconds
 * (cumulative; b == SL_HIST_BUCKETS: all of them).
 */
uint64_t sl_queue_wait_bucket(const struct sl_queue *, size_t pool, int b);

/*
 * Tests and the master's "shm check": take the lock and verify every
 * invariant (lists agree with entries, counts agree, the queue row's
 * held cells equal the GRANTED entries). 0 when all hold, else -1 and
 * the first broken one in why (may be NULL).
 */
int sl_queue_check(struct sl_queue *, char *why, size_t whylen);

/* Times the lock was found owner-dead and repaired (tests). */
uint64_t sl_queue_repairs(const struct sl_queue *);

/*
 * Tests only: take the lock and keep it (a child that then exits leaves
 * it owner-dead, as a worker killed inside the queue would).
 */
void sl_queue_lock_for_test(struct sl_queue *, size_t row);

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_queue: the fair queue of the upstream pools (issue 24), shared by the
 * master and every worker.
 *
 * ## Fair queue: design
 *
 * A request whose pool has replicas up but every one at its max_streams
 * waits here instead of getting 503 upstream_unavailable. The waiter is a
 * connection of one worker; the replica slot that frees may be released by
 * any worker. The choice of who goes next is made once, globally, by the
 * process that frees the slot, never by "whichever worker wakes first":
 *
 *   releasing worker A (slot of replica R, pool p)   waiting worker B
 *   ------------------------------------------------ -------------------
 *   sl_queue_waiting(p) == 0 ? plain release, as today (one atomic load)
 *   else sl_queue_offer(p, R):
 *     lock; best waiter W of p (band, counter, age);
 *     move R's slot from A's row to the queue's row
 *     (in-flight unchanged: never released, never
 *     seen free by anyone); W := GRANTED(R), on B's
 *     list; unlock; eventfd of row B += 1   ------->  ev_io readable:
 *                                                    sl_queue_collect(B):
 *                                                    slot moved queue row
 *                                                    -> row B, entry freed,
 *                                                    the request starts on R
 *
 * Who goes next: the highest priority band (the tenant's `priority`) with
 * a waiter; within it, with fairness tokens, the tenant whose service
 * counter is lowest, of equal ones the tenant with fewer waiters (fifo:
 * whose oldest waiter is oldest); within a tenant, its oldest waiter. A tenant's counter grows by
 * cost * 1000 / weight as its tokens are charged (sl_queue_charge), in
 * milli-tokens; a tenant that starts waiting after having had no waiter
 * in the pool is lifted to the lowest counter among the pool's waiting
 * tenants, or, when nobody waits, to the counter the last dispatched
 * tenant had (VTC's lift on arrival: no banked credit).
 *
 * Where things live: a MAP_SHARED region of its own, made by the master
 * before forking (its size fixed for the master's life, like sl_shm's):
 * one process-shared robust mutex over the whole queue; per pool its
 * settings, the count of waiters (an atomic on its own cache line: the
 * only thing the path without a queue reads), the list of tenants with
 * waiters and outcome counters; per pool and tenant the service counter,
 * the count of waiters and their FIFO; per tenant weight and priority
 * (the master publishes them on start and reload: they apply at once to
 * waiters); a slab of entries (tenant, pool, worker row, enqueue time and
 * order, state, the granted slot, a generation so that a stale handle is
 * refused); per worker row the list of grants not yet collected and a
 * wake flag. Each row has an eventfd made by the master before it forks
 * the first workers of a config with a queue (sl_queue_enable_wake): a
 * grant writes it once per batch, the worker watches it with ev_io.
 *
 * Where a granted slot is: replica slots are counted in sl_shm (in-flight
 * per replica index, held per worker row, reclaimed when a worker dies).
 * A slot granted but not yet collected is held by SL_QUEUE_ROW, the
 * master's row, which never serves traffic and never dies; its held
 * cells are written only under the queue's lock. Moving a slot between a
 * worker's row and the queue's row is sl_shm_move, inside the mover's
 * admission window, so a worker killed halfway is reconciled by the
 * master like any acquire or release (the queue's row is a live row).
 * Invariant under the lock: held(SL_QUEUE_ROW, idx) == the number of
 * GRANTED entries whose slot is idx.
 *
 * No lost wake-up, work-conserving: the enqueuer counts itself in the
 * pool's waiters (seq_cst) and then tries the pool once more
 * (sl_pool_pick); a slot it gets it offers (sl_queue_offer: to the best
 * waiter, perhaps itself). The releaser gives back (seq_cst) and then
 * reads the waiter count; when it is not 0 it takes a slot again and
 * offers it. Of the two, at least one sees the other. A slot freed while
 * waiters exist is always offered; one that a reload or a recovered
 * replica adds is found by the worker's once-a-second pump (pick + offer
 * while sl_queue_waiting).
 *
 * A worker that dies: the master, after waitpid and sl_shm_reclaim_rows,
 * calls sl_queue_reclaim_rows: the dead rows' waiters are dropped (their
 * tenant slots come back through sl_shm as today) and a slot granted to
 * a dead row's waiter goes to the next waiter, or back to its replica.
 * A process killed while holding the lock: the next to lock gets
 * EOWNERDEAD and repairs before going on: every list is rebuilt from the
 * entries (an entry's state is written last), and the queue row's held
 * cells are brought back to the GRANTED entries (a surplus slot is given
 * back, a grant without its slot returns to waiting). Nothing a crash
 * leaves can block the queue or leak a slot.
 *
 * Cost: with no waiter in a pool, one load (seq_cst) of that pool's
 * waiter count before the lock-free pick, and one after a release.
 * The lock is taken only to wait, to offer to a waiter, to collect, to
 * cancel and to sweep.
 *
 * What the caller does (relay/upstream; the master for settings and
 * reclaim) is written at each function.
 *
 * Not done yet (issue 24): the TTFT target (shortened
 * bench/fairness runs in bench/HISTORY.md: shares 36.6/30.6/32.8 % once
 * running streams are charged as they are relayed, but B's p99 wait is
 * still one stream's length, the shares swinging in 4 s steps); the full
 * 90 s run with nginx and its chart; a request that a busy head
 * or a connect failure moves to another replica after its dispatch is
 * retried as before (sl_pool_pick), never queued again; tokens of a
 * stream its client left are charged after its slot went on (conn_close
 * releases before conn_request_end charges). Known costs: one lock for
 * every pool (a lock per pool would split it); the entries are sized at
 * start (the sum of queue.max, 1024..65536), so a reload that raises
 * max past it gets queue_full early; sl_queue_expire and the repair scan
 * every entry; a worker of an older generation whose config has no
 * queue for a pool gives its slots back instead of handing them over
 * (the waiters get them within a second, by the pump).
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
 * Worker row `row` holds a slot of replica index slot of pool (from
 * sl_pool_pick) that it does not want: hand it to the pool's best waiter
 * without releasing it. 1: handed over (row no longer holds it); 0: no
 * waiter (row still holds it: release it or use it).
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

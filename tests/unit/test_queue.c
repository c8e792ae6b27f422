/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for the fair queue (src/queue.c): who goes next (priority
 * band, service counter, age), weights, lift on arrival, cancel, expiry,
 * closed pools, a dead worker's waiters and grants, a process killed
 * holding the lock, and real processes (fork) enqueueing and releasing at
 * once: no slot lost or granted twice, nothing left waiting while a slot
 * is free.
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "unit.h"

#include "sl_queue.h"
#include "sl_shm.h"

#define NIDX 64
#define NROWS 8
#define POOL 1
#define REP 40          /* a replica's shared index */
#define REP2 41
#define TA 3            /* tenants */
#define TB 4
#define TC 5

struct fx {
	struct sl_shm *shm;
	struct sl_queue *q;
	pid_t kids[16];
	size_t nkids;
	void *page;
	size_t page_len;
};

static int
setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return -1;
	f->shm = sl_shm_create(NIDX, NROWS, 128, 129);
	if (f->shm == NULL)
		return -1;
	f->q = sl_queue_create(f->shm, 4, NIDX, 256, NROWS);
	if (f->q == NULL || sl_queue_enable_wake(f->q) == -1)
		return -1;
	sl_shm_set_limit(f->shm, REP, 2);
	sl_shm_set_limit(f->shm, REP2, 2);
	sl_queue_set_pool(f->q, POOL, 100, 0, SL_QUEUE_TOKENS);
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fx *f = *state;
	size_t i;

	for (i = 0; i < f->nkids; i++)
		if (f->kids[i] > 0) {
			kill(f->kids[i], SIGKILL);
			waitpid(f->kids[i], NULL, 0);
		}
	sl_queue_destroy(f->q);
	sl_shm_destroy(f->shm);
	if (f->page != NULL)
		munmap(f->page, f->page_len);
	free(f);
	return 0;
}

static void
assert_consistent(struct sl_queue *q)
{
	char why[200];

	if (sl_queue_check(q, why, sizeof(why)) != 0)
		fail_msg("queue invariant broken: %s", why);
}

static uint64_t
enq(struct sl_queue *q, size_t row, size_t tenant, int64_t now,
    uint64_t cost)
{
	uint64_t h;

	assert_int_equal(sl_queue_enqueue(q, row, POOL, tenant, now, cost, &h),
	    SL_QUEUE_OK);
	assert_true(h != 0);
	return h;
}

/* Row takes a slot of REP and offers it; returns 1 when handed over. */
static int
take_and_offer(struct fx *f, size_t row, size_t idx)
{
	int rc;

	assert_int_equal(sl_shm_try_acquire(f->shm, row, idx), SL_ADMIT_OK);
	rc = sl_queue_offer(f->q, row, POOL, idx, 0);
	if (!rc)
		sl_shm_release(f->shm, row, idx);
	return rc;
}

/* Collect exactly one grant for row and give its slot back. */
static uint64_t
collect_one(struct fx *f, size_t row, size_t *slot)
{
	struct sl_queue_grant g[4];

	assert_int_equal(sl_queue_collect(f->q, row, g, 4, 0), 1);
	if (slot != NULL)
		*slot = g[0].slot;
	if (g[0].slot != SL_QUEUE_CLOSED) {
		assert_int_equal(sl_shm_held(f->shm, row, g[0].slot), 1);
		sl_shm_release(f->shm, row, g[0].slot);
	}
	return g[0].handle;
}

static void
test_queue_answers_none_full_shed(void **state)
{
	struct fx *f = *state;
	uint64_t h;
	int i;

	/* Pool 2 has no queue: as today, 503 upstream_unavailable. */
	assert_int_equal(sl_queue_enqueue(f->q, 1, 2, TA, 0, 0, &h),
	    SL_QUEUE_NONE);
	assert_int_equal(h, 0);
	/* The queue's own row never waits. */
	assert_int_equal(sl_queue_enqueue(f->q, SL_QUEUE_ROW, POOL, TA, 0, 0,
	    &h), SL_QUEUE_NONE);
	sl_queue_set_tenant(f->q, TB, 1, -1);
	assert_int_equal(sl_queue_enqueue(f->q, 1, POOL, TB, 0, 0, &h),
	    SL_QUEUE_SHED);
	sl_queue_set_pool(f->q, POOL, 3, 0, SL_QUEUE_TOKENS);
	for (i = 0; i < 3; i++)
		enq(f->q, 1, TA, i, 0);
	assert_int_equal(sl_queue_enqueue(f->q, 2, POOL, TA, 9, 0, &h),
	    SL_QUEUE_FULL);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 3);
	assert_int_equal(sl_queue_waiting_tenant(f->q, POOL, TA), 3);
	assert_int_equal(sl_queue_outcomes(f->q, POOL, SL_QUEUE_O_FULL), 1);
	assert_int_equal(sl_queue_outcomes(f->q, POOL, SL_QUEUE_O_SHED), 1);
	assert_string_equal(sl_queue_outcome_label(SL_QUEUE_O_DISPATCHED),
	    "dispatched");
	assert_consistent(f->q);
}

/* A freed slot goes by band, then counter, then age; never released. */
static void
test_queue_order_band_then_counter_then_age(void **state)
{
	struct fx *f = *state;
	uint64_t a1, a2, b1, c1, got;

	sl_queue_set_tenant(f->q, TC, 1, 1);
	sl_queue_charge(f->q, POOL, TA, 10);
	a1 = enq(f->q, 1, TA, 0, 0);       /* counter 10000 */
	b1 = enq(f->q, 2, TB, 1, 0);       /* lifted to 10000, younger */
	a2 = enq(f->q, 1, TA, 2, 0);
	c1 = enq(f->q, 2, TC, 3, 0);       /* band 1: first though last */
	assert_int_equal(sl_queue_service(f->q, POOL, TB), 10000);

	assert_int_equal(take_and_offer(f, 3, REP), 1);
	/* Not released in between: REP's in-flight never dropped. */
	assert_int_equal(sl_shm_inflight(f->shm, REP), 1);
	assert_int_equal(sl_shm_held(f->shm, SL_QUEUE_ROW, REP), 1);
	assert_int_equal(sl_shm_held(f->shm, 3, REP), 0);
	assert_consistent(f->q);
	got = collect_one(f, 2, NULL);
	assert_int_equal(got, c1);

	/* Band 0: TA charged more: TB is the least served. */
	sl_queue_charge(f->q, POOL, TA, 5);
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 2, NULL), b1);
	/* TA alone: its oldest first. */
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 1, NULL), a1);
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 1, NULL), a2);
	/* Nobody waits: the slot stays with its holder. */
	assert_int_equal(take_and_offer(f, 3, REP), 0);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 0);
	assert_int_equal(sl_queue_outcomes(f->q, POOL, SL_QUEUE_O_DISPATCHED), 4);
	assert_consistent(f->q);
}

/* Equal counters: fewer waiters first; equal waiters too: the oldest. */
static void
test_queue_tie_goes_to_fewer_waiters_then_oldest(void **state)
{
	struct fx *f = *state;
	uint64_t a1, b1, c1;

	a1 = enq(f->q, 1, TA, 0, 0);
	enq(f->q, 1, TA, 1, 0);
	b1 = enq(f->q, 2, TB, 2, 0);
	c1 = enq(f->q, 2, TC, 3, 0);
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 2, NULL), b1);   /* 1 waiter, older */
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 2, NULL), c1);   /* 1 waiter vs 2 */
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 1, NULL), a1);
	assert_consistent(f->q);
}

/*
 * The first test, in one process: a tenant with 40 waiters and
 * one that comes later with 1: the latter goes next, not 41st, because its
 * counter starts at the flooder's and the flooder's running streams keep
 * charging; and it banks nothing from having been idle.
 */
static void
test_queue_latecomer_goes_next_without_banked_credit(void **state)
{
	struct fx *f = *state;
	uint64_t b, h;
	int i, n;

	for (i = 0; i < 40; i++)
		enq(f->q, 1, TA, i, 100);
	/* Four of them dispatched and running, charging as they stream. */
	for (i = 0; i < 4; i++) {
		assert_int_equal(take_and_offer(f, 3, i < 2 ? REP : REP2), 1);
		collect_one(f, 1, NULL);
	}
	assert_int_equal(sl_queue_service(f->q, POOL, TB), 0);
	b = enq(f->q, 2, TB, 50, 100);
	/* Lifted to the lowest waiting counter: the flooder's. */
	assert_int_equal(sl_queue_service(f->q, POOL, TB),
	    sl_queue_service(f->q, POOL, TA));
	/* Equal counters: the tenant with 1 waiter before the one with 36. */
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 2, NULL), b);
	/* Then TA's 36 (TB has no waiter). */
	for (n = 0; n < 36; n++) {
		assert_int_equal(take_and_offer(f, 3, REP), 1);
		h = collect_one(f, 1, NULL);
		assert_true(h != 0);
	}
	assert_int_equal(sl_queue_waiting(f->q, POOL), 0);
	assert_consistent(f->q);
}

/* Weights 3:1, both always backlogged, equal costs: 300 and 100 of 400. */
static void
test_queue_weights_share_dispatches(void **state)
{
	struct fx *f = *state;
	struct sl_queue_grant g[4];
	int i, na = 0, nb = 0, k;
	int64_t now = 0;

	sl_queue_set_pool(f->q, POOL, 200, 0, SL_QUEUE_TOKENS);
	sl_queue_set_tenant(f->q, TA, 3, 0);
	sl_queue_set_tenant(f->q, TB, 1, 0);
	for (i = 0; i < 20; i++) {
		enq(f->q, 1, TA, now++, 300);
		enq(f->q, 2, TB, now++, 300);
	}
	for (i = 0; i < 400; i++) {
		assert_int_equal(take_and_offer(f, 3, REP), 1);
		for (k = 1; k <= 2; k++) {
			if (sl_queue_collect(f->q, (size_t)k, g, 4, now) == 0)
				continue;
			sl_shm_release(f->shm, (size_t)k, g[0].slot);
			/* Backlogged: each one served is replaced. */
			enq(f->q, (size_t)k, k == 1 ? TA : TB, now++, 300);
			if (k == 1)
				na++;
			else
				nb++;
		}
	}
	assert_int_equal(na + nb, 400);
	assert_int_equal(na, 300);
	assert_int_equal(nb, 100);
	assert_consistent(f->q);
}

static void
test_queue_fifo_is_oldest_across_tenants(void **state)
{
	struct fx *f = *state;
	uint64_t b, a;

	sl_queue_set_pool(f->q, POOL, 100, 0, SL_QUEUE_FIFO);
	sl_queue_charge(f->q, POOL, TB, 1000000);   /* served a lot: no matter */
	b = enq(f->q, 2, TB, 0, 0);
	a = enq(f->q, 1, TA, 1, 0);
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 2, NULL), b);
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 1, NULL), a);
}

/* A dispatched waiter's wait lands in its bucket (sl_shm's bounds). */
static void
test_queue_wait_histogram_counts_dispatched_waits(void **state)
{
	struct fx *f = *state;
	struct sl_queue_grant g[2];
	const double *b = sl_shm_hist_bounds();
	int i, le025 = -1, le05 = -1;

	for (i = 0; i < SL_HIST_BUCKETS; i++) {
		if (b[i] == 0.25)
			le025 = i;
		if (b[i] == 0.5)
			le05 = i;
	}
	assert_true(le025 >= 0 && le05 >= 0);
	enq(f->q, 1, TA, 1000, 0);
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(sl_queue_collect(f->q, 1, g, 2, 1300), 1);
	assert_int_equal(g[0].waited_ms, 300);
	sl_shm_release(f->shm, 1, g[0].slot);
	assert_int_equal(sl_queue_wait_bucket(f->q, POOL, le025), 0);
	assert_int_equal(sl_queue_wait_bucket(f->q, POOL, le05), 1);
	assert_int_equal(sl_queue_wait_bucket(f->q, POOL, SL_HIST_BUCKETS), 1);
	assert_int_equal(sl_queue_wait_ms_sum(f->q, POOL), 300);
}

/* Client gone: waiting leaves; granted passes its slot on; stale: -1. */
static void
test_queue_cancel_waiting_and_granted(void **state)
{
	struct fx *f = *state;
	uint64_t a1, a2, b1;
	size_t slot;

	a1 = enq(f->q, 1, TA, 0, 0);
	a2 = enq(f->q, 1, TA, 1, 0);
	b1 = enq(f->q, 2, TB, 2, 0);
	assert_int_equal(sl_queue_cancel(f->q, 1, a2, SL_QUEUE_O_GONE), 0);
	assert_int_equal(sl_queue_cancel(f->q, 1, a2, SL_QUEUE_O_GONE), -1);
	/* Another row cannot cancel it. */
	assert_int_equal(sl_queue_cancel(f->q, 2, a1, SL_QUEUE_O_GONE), -1);
	assert_int_equal(take_and_offer(f, 3, REP), 1);     /* -> a1 */
	assert_int_equal(sl_queue_cancel(f->q, 1, a1, SL_QUEUE_O_GONE), 1);
	/* a1's slot went on to b1 without being released. */
	assert_int_equal(sl_shm_inflight(f->shm, REP), 1);
	assert_consistent(f->q);
	assert_int_equal(collect_one(f, 2, &slot), b1);
	assert_int_equal(slot, REP);
	/* Nothing for row 1. */
	{
		struct sl_queue_grant g[2];

		assert_int_equal(sl_queue_collect(f->q, 1, g, 2, 0), 0);
	}
	/* Cancel with nobody to pass on to: the slot goes back. */
	a1 = enq(f->q, 1, TA, 3, 0);
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(sl_queue_cancel(f->q, 1, a1, SL_QUEUE_O_GONE), 1);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 0);
	assert_int_equal(sl_queue_outcomes(f->q, POOL, SL_QUEUE_O_GONE), 3);
	assert_int_equal(sl_queue_outcomes(f->q, POOL, SL_QUEUE_O_DISPATCHED), 1);
	assert_consistent(f->q);
}

static void
test_queue_expire_reads_timeout_now(void **state)
{
	struct fx *f = *state;
	uint64_t out[4], a, b;

	sl_queue_set_pool(f->q, POOL, 100, 1000, SL_QUEUE_TOKENS);
	a = enq(f->q, 1, TA, 0, 0);
	b = enq(f->q, 2, TB, 0, 0);
	assert_int_equal(sl_queue_expire(f->q, 1, 999, out, 4), 0);
	/* A reload shortens it: applies to those waiting. */
	sl_queue_set_pool(f->q, POOL, 100, 500, SL_QUEUE_TOKENS);
	assert_int_equal(sl_queue_expire(f->q, 1, 600, out, 4), 1);
	assert_int_equal(out[0], a);
	/* Only the caller's row. */
	assert_int_equal(sl_queue_waiting(f->q, POOL), 1);
	assert_int_equal(sl_queue_expire(f->q, 2, 600, out, 4), 1);
	assert_int_equal(out[0], b);
	assert_int_equal(sl_queue_outcomes(f->q, POOL, SL_QUEUE_O_TIMEOUT), 2);
	assert_consistent(f->q);
}

static void
test_queue_close_pool_answers_waiters(void **state)
{
	struct fx *f = *state;
	struct sl_queue_grant g[4];
	uint64_t a, h;

	a = enq(f->q, 1, TA, 0, 0);
	sl_queue_close_pool(f->q, SL_QUEUE_ROW, POOL);
	assert_int_equal(sl_queue_enqueue(f->q, 1, POOL, TA, 1, 0, &h),
	    SL_QUEUE_NONE);
	assert_int_equal(sl_queue_collect(f->q, 1, g, 4, 0), 1);
	assert_int_equal(g[0].handle, a);
	assert_true(g[0].slot == SL_QUEUE_CLOSED);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 0);
	assert_consistent(f->q);
}

/*
 * A pool index given to another upstream starts from nothing: no waiter,
 * no outcome, no tenant's service; the other pools keep theirs.
 */
static void
test_queue_reset_pool_forgets_only_that_pool(void **state)
{
	struct fx *f = *state;
	struct sl_queue_grant g[4];
	uint64_t h;

	sl_queue_set_pool(f->q, 2, 100, 0, SL_QUEUE_TOKENS);
	enq(f->q, 1, TA, 0, 0);
	sl_queue_charge(f->q, POOL, TA, 5000);
	sl_queue_charge(f->q, 2, TA, 7000);
	assert_int_equal(sl_queue_enqueue(f->q, 1, 2, TB, 0, 0, &h), SL_QUEUE_OK);
	sl_queue_close_pool(f->q, SL_QUEUE_ROW, POOL);
	assert_int_equal(sl_queue_collect(f->q, 1, g, 4, 0), 1);
	sl_queue_reset_pool(f->q, POOL);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 0);
	assert_int_equal(sl_queue_service(f->q, POOL, TA), 0);
	assert_int_equal(sl_queue_outcomes(f->q, POOL, SL_QUEUE_O_GONE), 0);
	assert_true(sl_queue_service(f->q, 2, TA) > 0);
	assert_int_equal(sl_queue_waiting_tenant(f->q, 2, TB), 1);
	/* Set up again, it queues like a new pool. */
	sl_queue_set_pool(f->q, POOL, 100, 0, SL_QUEUE_TOKENS);
	enq(f->q, 1, TC, 0, 0);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 1);
	assert_consistent(f->q);
}

/* The eventfd of a row is readable once grants wait for it. */
static void
test_queue_grant_wakes_the_row(void **state)
{
	struct fx *f = *state;
	struct pollfd pfd;

	enq(f->q, 2, TA, 0, 0);
	pfd.fd = sl_queue_wake_fd(f->q, 2);
	pfd.events = POLLIN;
	assert_true(pfd.fd >= 0);
	assert_int_equal(poll(&pfd, 1, 0), 0);
	assert_int_equal(take_and_offer(f, 1, REP), 1);
	assert_int_equal(poll(&pfd, 1, 0), 1);
	collect_one(f, 2, NULL);
	assert_int_equal(poll(&pfd, 1, 0), 0);
}

/*
 * A worker dies with waiters and a grant it had not collected: the master
 * reclaims its rows; the grant's slot goes to the next waiter (another
 * worker's), nothing leaks.
 */
static void
test_queue_reclaim_dead_row_passes_grant_on(void **state)
{
	struct fx *f = *state;
	size_t dead = 2;
	uint64_t a;

	enq(f->q, 2, TA, 0, 0);
	enq(f->q, 2, TA, 1, 0);
	a = enq(f->q, 1, TB, 2, 0);
	/* TA's oldest is granted but row 2 dies before collecting. */
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(sl_shm_reclaim_rows(f->shm, &dead, 1), 0);
	assert_int_equal(sl_queue_reclaim_rows(f->q, &dead, 1), 2);
	assert_consistent(f->q);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 1);
	assert_int_equal(collect_one(f, 1, NULL), a);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 0);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 0);
	assert_int_equal(sl_queue_outcomes(f->q, POOL, SL_QUEUE_O_GONE), 2);
}

/*
 * A process killed holding the lock, halfway through an offer (the slot
 * moved to the queue's row, no waiter granted yet): the next to lock
 * repairs, the surplus slot goes back, the lists are whole.
 */
static void
test_queue_owner_dead_lock_is_repaired(void **state)
{
	struct fx *f = *state;
	size_t row = 3;
	pid_t pid;
	int st;
	uint64_t a;

	a = enq(f->q, 1, TA, 0, 0);
	enq(f->q, 2, TB, 1, 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (sl_shm_try_acquire(f->shm, row, REP) != SL_ADMIT_OK)
			_exit(2);
		sl_queue_lock_for_test(f->q, row);
		sl_shm_move(f->shm, row, row, SL_QUEUE_ROW, REP);
		_exit(0);
	}
	f->kids[f->nkids++] = pid;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	f->kids[--f->nkids] = 0;
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 1);
	/* A live worker locks first: it repairs (the slot goes back). */
	assert_int_equal(sl_queue_cancel(f->q, 1, a, SL_QUEUE_O_GONE), 0);
	assert_int_equal(sl_queue_repairs(f->q), 1);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 0);
	assert_int_equal(sl_shm_reclaim_rows(f->shm, &row, 1), 0);
	assert_int_equal(sl_queue_reclaim_rows(f->q, &row, 1), 0);
	assert_consistent(f->q);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 1);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 0);
}

/*
 * The interleaving that would strand a waiter: row 1 finds REP full, row 2
 * gives its slot back seeing nobody waiting, then row 1 waits. Row 1's try
 * after counting itself finds the slot and offers it: to itself, the only
 * waiter, without it ever being free to anyone else.
 */
static void
test_queue_enqueue_then_retry_loses_no_wakeup(void **state)
{
	struct fx *f = *state;
	uint64_t a;

	sl_shm_set_limit(f->shm, REP, 1);
	assert_int_equal(sl_shm_try_acquire(f->shm, 2, REP), SL_ADMIT_OK);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 0);
	assert_int_equal(sl_shm_try_acquire(f->shm, 1, REP), SL_ADMIT_FULL);
	sl_shm_release(f->shm, 2, REP);          /* nobody waits: plain */
	assert_int_equal(sl_queue_waiting(f->q, POOL), 0);
	a = enq(f->q, 1, TA, 0, 0);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 1);
	assert_int_equal(take_and_offer(f, 1, REP), 1);
	assert_int_equal(collect_one(f, 1, NULL), a);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 0);
	assert_consistent(f->q);
}

/* ---- real processes ------------------------------------------------------ */

#define PROCS 4
#define ROUNDS 300
#define CAP 3            /* REP's max_streams */

struct shared {
	_Atomic int in_use;          /* slots in use by requests */
	_Atomic int max_seen;
	_Atomic int done;
	_Atomic int stuck;           /* waited > 10 s with a slot free */
	_Atomic int twice;           /* a grant for a handle not waiting */
};

static int64_t
mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * The release path the relay will take: hand the slot to a waiter if
 * there is one; else give it back, then look again (a waiter that came
 * meanwhile must not wait while the slot is free): take one and offer it.
 */
static void
release_slot(struct fx *f, size_t row, size_t idx)
{
	if (sl_queue_waiting(f->q, POOL) > 0 &&
	    sl_queue_offer(f->q, row, POOL, idx, mono_ms()))
		return;
	sl_shm_release(f->shm, row, idx);
	while (sl_queue_waiting(f->q, POOL) > 0 &&
	    sl_shm_try_acquire(f->shm, row, idx) == SL_ADMIT_OK)
		if (!sl_queue_offer(f->q, row, POOL, idx, mono_ms())) {
			sl_shm_release(f->shm, row, idx);
			break;
		}
}

static void
use_slot(struct shared *sh)
{
	int n = atomic_fetch_add(&sh->in_use, 1) + 1, m;

	m = atomic_load(&sh->max_seen);
	while (n > m && !atomic_compare_exchange_weak(&sh->max_seen, &m, n))
		;
	/*
	 * Held for a moment every time, so that the four processes contend
	 * for the three slots even when they barely overlap (under valgrind,
	 * which runs one thread at a time, a slot held for no time was
	 * mostly taken by the fast path and the queue was hardly used).
	 */
	usleep((useconds_t)(100 + rand() % 200));
	atomic_fetch_sub(&sh->in_use, 1);
}

/* One worker: ROUNDS requests, each through the queue when REP is full. */
static void
worker(struct fx *f, struct shared *sh, size_t row, int rounds)
{
	struct sl_queue_grant g[8];
	size_t tenant = TA + row % 3;
	uint64_t h;
	int i;

	srand((unsigned)(getpid() ^ (int)row));
	for (i = 0; i < rounds; i++) {
		int64_t since;
		size_t n;
		struct pollfd pfd;

		if (sl_queue_waiting(f->q, POOL) == 0 &&
		    sl_shm_try_acquire(f->shm, row, REP) == SL_ADMIT_OK) {
			use_slot(sh);
			release_slot(f, row, REP);
			atomic_fetch_add(&sh->done, 1);
			continue;
		}
		if (sl_queue_enqueue(f->q, row, POOL, tenant, mono_ms(), 10,
		    &h) != SL_QUEUE_OK)
			_exit(3);
		/* Try once more now that we are counted: offer what we get. */
		if (sl_shm_try_acquire(f->shm, row, REP) == SL_ADMIT_OK &&
		    !sl_queue_offer(f->q, row, POOL, REP, mono_ms()))
			sl_shm_release(f->shm, row, REP);
		since = mono_ms();
		pfd.fd = sl_queue_wake_fd(f->q, row);
		pfd.events = POLLIN;
		for (;;) {
			poll(&pfd, 1, 50);
			n = sl_queue_collect(f->q, row, g, 8, mono_ms());
			if (n > 0)
				break;
			if (mono_ms() - since > 10000) {
				atomic_fetch_add(&sh->stuck, 1);
				_exit(4);
			}
		}
		/* One waiter per worker at a time: one grant, ours. */
		if (n != 1 || g[0].handle != h || g[0].slot != REP)
			atomic_fetch_add(&sh->twice, 1);
		use_slot(sh);
		release_slot(f, row, REP);
		sl_queue_charge(f->q, POOL, tenant, 10);
		atomic_fetch_add(&sh->done, 1);
	}
}

static struct shared *
map_shared(struct fx *f)
{
	f->page_len = 4096;
	f->page = mmap(NULL, f->page_len, PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(f->page != MAP_FAILED);
	return f->page;
}

static void
test_queue_processes_never_lose_or_double_a_slot(void **state)
{
	struct fx *f = *state;
	struct shared *sh = map_shared(f);
	size_t r;
	int st, i;

	sl_shm_set_limit(f->shm, REP, CAP);
	for (r = 1; r <= PROCS; r++) {
		pid_t pid = fork();

		assert_true(pid >= 0);
		if (pid == 0) {
			worker(f, sh, r, ROUNDS);
			_exit(0);
		}
		f->kids[f->nkids++] = pid;
	}
	for (i = 0; i < PROCS; i++) {
		assert_int_equal(waitpid(f->kids[i], &st, 0), f->kids[i]);
		f->kids[i] = 0;
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 0);
	}
	f->nkids = 0;
	assert_int_equal(atomic_load(&sh->done), PROCS * ROUNDS);
	assert_int_equal(atomic_load(&sh->stuck), 0);
	assert_int_equal(atomic_load(&sh->twice), 0);
	assert_true(atomic_load(&sh->max_seen) <= CAP);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 0);
	for (r = 0; r < NROWS; r++)
		assert_int_equal(sl_shm_held(f->shm, r, REP), 0);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 0);
	assert_int_equal(sl_queue_repairs(f->q), 0);
	/* It was the queue that served most of them, not the fast path. */
	assert_true(sl_queue_outcomes(f->q, POOL, SL_QUEUE_O_DISPATCHED) >
	    PROCS * ROUNDS / 4);
	assert_consistent(f->q);
}

/*
 * kill -9 of workers in the middle of it, again and again: the master
 * reclaims each one's rows (sl_shm, then the queue); the others keep
 * draining, and at the end no slot is held by anyone.
 */
static void
test_queue_killed_processes_leave_nothing_behind(void **state)
{
	struct fx *f = *state;
	struct shared *sh = map_shared(f);
	size_t r, row;
	int st, i, kills = 0;
	pid_t pid;

	sl_shm_set_limit(f->shm, REP, CAP);
	for (r = 1; r <= PROCS; r++) {
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			/* Row PROCS is the one killed, again and again. */
			worker(f, sh, r, r == PROCS ? 1000000 : ROUNDS);
			_exit(0);
		}
		f->kids[f->nkids++] = pid;
	}
	for (kills = 0; kills < 8; kills++) {
		usleep(20000 + (useconds_t)(rand() % 20000));
		pid = f->kids[PROCS - 1];
		kill(pid, SIGKILL);
		assert_int_equal(waitpid(pid, &st, 0), pid);
		row = PROCS;
		assert_true(sl_shm_reclaim_rows(f->shm, &row, 1) >= 0);
		sl_queue_reclaim_rows(f->q, &row, 1);
		assert_consistent(f->q);
		assert_int_equal(sl_shm_held(f->shm, PROCS, REP), 0);
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			worker(f, sh, PROCS, kills == 7 ? 50 : 1000000);
			_exit(0);
		}
		f->kids[PROCS - 1] = pid;
	}
	for (i = 0; i < PROCS; i++) {
		assert_int_equal(waitpid(f->kids[i], &st, 0), f->kids[i]);
		f->kids[i] = 0;
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 0);
	}
	f->nkids = 0;
	assert_int_equal(atomic_load(&sh->stuck), 0);
	assert_int_equal(atomic_load(&sh->twice), 0);
	assert_int_equal(sl_shm_inflight(f->shm, REP), 0);
	for (r = 0; r < NROWS; r++)
		assert_int_equal(sl_shm_held(f->shm, r, REP), 0);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 0);
	assert_consistent(f->q);
}

/*
 * A waiter that wants one replica (a stored response's) takes only its
 * slots: another replica's slot passes it over to the next waiter, or
 * is refused when only such waiters wait; its own replica's slot reaches
 * it in its tenant's order, ahead of younger waiters of the same tenant.
 */
static void
test_queue_pinned_waiter_takes_only_its_replica(void **state)
{
	struct fx *f = *state;
	uint64_t p1, a2, b1, h;
	size_t slot;

	assert_int_equal(sl_queue_enqueue_for(f->q, 1, POOL, TA, 0, 0, REP,
	    &p1), SL_QUEUE_OK);
	a2 = enq(f->q, 1, TA, 1, 0);
	assert_consistent(f->q);
	/* REP2's slot: not for p1; TA's next waiter, a2, takes it. */
	assert_int_equal(take_and_offer(f, 3, REP2), 1);
	assert_int_equal(collect_one(f, 1, &slot), a2);
	assert_int_equal(slot, REP2);
	/* Only p1 waits: REP2's slot is refused, still held by row 3. */
	assert_int_equal(take_and_offer(f, 3, REP2), 0);
	assert_int_equal(sl_shm_held(f->shm, 3, REP2), 0);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 1);
	/* A younger waiter of another tenant does not stop p1 getting REP. */
	b1 = enq(f->q, 2, TB, 2, 0);
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 1, &slot), p1);
	assert_int_equal(slot, REP);
	assert_int_equal(take_and_offer(f, 3, REP2), 1);
	assert_int_equal(collect_one(f, 2, NULL), b1);
	assert_int_equal(sl_queue_waiting(f->q, POOL), 0);
	assert_consistent(f->q);
	/* A pinned waiter is repaired as it was (a lock left owner-dead). */
	assert_int_equal(sl_queue_enqueue_for(f->q, 1, POOL, TA, 5, 0, REP,
	    &h), SL_QUEUE_OK);
	{
		pid_t pid = fork();
		int st;

		assert_true(pid >= 0);
		if (pid == 0) {
			sl_queue_lock_for_test(f->q, 2);
			_exit(0);
		}
		assert_int_equal(waitpid(pid, &st, 0), pid);
	}
	assert_int_equal(take_and_offer(f, 3, REP2), 0);
	assert_int_equal(sl_queue_repairs(f->q), 1);
	assert_int_equal(take_and_offer(f, 3, REP), 1);
	assert_int_equal(collect_one(f, 1, NULL), h);
	assert_consistent(f->q);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_queue_answers_none_full_shed,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_order_band_then_counter_then_age, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_tie_goes_to_fewer_waiters_then_oldest, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_latecomer_goes_next_without_banked_credit, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_queue_weights_share_dispatches,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_fifo_is_oldest_across_tenants, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_wait_histogram_counts_dispatched_waits, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_cancel_waiting_and_granted, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_expire_reads_timeout_now, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_close_pool_answers_waiters, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_reset_pool_forgets_only_that_pool, setup, teardown),
		cmocka_unit_test_setup_teardown(test_queue_grant_wakes_the_row,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_reclaim_dead_row_passes_grant_on, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_owner_dead_lock_is_repaired, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_enqueue_then_retry_loses_no_wakeup, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_processes_never_lose_or_double_a_slot, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_killed_processes_leave_nothing_behind, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_queue_pinned_waiter_takes_only_its_replica, setup,
		    teardown),
	};

	return sl_unit_run(tests);
}

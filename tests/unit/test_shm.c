/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for the shared admission region (src/shm*.c): exact limits,
 * per-row held counts, reclaim of a dead worker's row, stats, and real
 * processes (fork) hammering one tenant at once.
 */
#include "config.h"

#include <errno.h>
#include <sched.h>
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

#include "sl_shm.h"

#define MODELS 128                 /* model slots of a test region */
#define UPSTREAMS 129              /* upstream slots of a test region */

/* The region under test, destroyed by the teardown even on failure. */
struct fx {
	struct sl_shm *shm;
	pid_t kids[16];
	size_t nkids;
	void *page;          /* extra MAP_SHARED page, page_len bytes */
	size_t page_len;
};

static int
setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return -1;
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fx *f = *state;
	size_t i;

	/* Children left behind by a failed assert must not outlive the test. */
	for (i = 0; i < f->nkids; i++)
		if (f->kids[i] > 0) {
			kill(f->kids[i], SIGKILL);
			waitpid(f->kids[i], NULL, 0);
		}
	sl_shm_destroy(f->shm);
	if (f->page != NULL)
		munmap(f->page, f->page_len);
	free(f);
	return 0;
}

static struct sl_shm *
make(struct fx *f, size_t tenants, size_t rows)
{
	f->shm = sl_shm_create(tenants, rows, MODELS, UPSTREAMS);
	assert_non_null(f->shm);
	return f->shm;
}

static void
test_new_region_is_zeroed(void **state)
{
	struct sl_shm *s = make(*state, 4, 3);
	size_t t, r;
	int st;

	assert_int_equal(sl_shm_max_tenants(s), 4);
	assert_int_equal(sl_shm_max_rows(s), 3);
	for (t = 0; t < 4; t++) {
		assert_int_equal(sl_shm_limit(s, t), 0);
		assert_int_equal(sl_shm_inflight(s, t), 0);
		for (r = 0; r < 3; r++)
			assert_int_equal(sl_shm_held(s, r, t), 0);
	}
	for (st = 0; st < SL_STAT_MAX; st++)
		assert_int_equal(sl_shm_stat_sum(s, (enum sl_stat)st), 0);
}

static void
test_create_rejects_zero_sizes(void **state)
{
	errno = 0;
	assert_null(sl_shm_create(0, 4, 1, 1));
	assert_int_equal(errno, EINVAL);
	errno = 0;
	assert_null(sl_shm_create(4, 0, 1, 1));
	assert_int_equal(errno, EINVAL);
	errno = 0;
	assert_null(sl_shm_create(4, 4, 0, 1));
	assert_int_equal(errno, EINVAL);
	errno = 0;
	assert_null(sl_shm_create(4, 4, 1, 0));
	assert_int_equal(errno, EINVAL);
}

/*
 * The fair queue's hand-over: a slot moves from a worker's row to the
 * queue's row (0) and on to another worker's without in-flight moving;
 * a dead row's reclaim then touches only what that row still holds.
 */
static void
test_move_keeps_inflight_and_reclaim_sees_new_holder(void **state)
{
	struct sl_shm *s = make(*state, 2, 4);
	size_t dead = 1;

	sl_shm_set_limit(s, 1, 2);
	assert_int_equal(sl_shm_try_acquire(s, 1, 1), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 1, 1), SL_ADMIT_OK);
	sl_shm_move(s, 1, 1, 0, 1);
	assert_int_equal(sl_shm_inflight(s, 1), 2);
	assert_int_equal(sl_shm_held(s, 1, 1), 1);
	assert_int_equal(sl_shm_held(s, 0, 1), 1);
	sl_shm_move(s, 2, 0, 2, 1);
	assert_int_equal(sl_shm_held(s, 0, 1), 0);
	assert_int_equal(sl_shm_held(s, 2, 1), 1);
	assert_int_equal(sl_shm_try_acquire(s, 3, 1), SL_ADMIT_FULL);
	/* Row 1 dies: its one slot comes back, row 2's stays. */
	assert_int_equal(sl_shm_reclaim_rows(s, &dead, 1), 1);
	assert_int_equal(sl_shm_inflight(s, 1), 1);
	sl_shm_move(s, 2, 2, 0, 1);
	sl_shm_release_as(s, 3, 0, 1);
	assert_int_equal(sl_shm_inflight(s, 1), 0);
	assert_int_equal(sl_shm_held(s, 0, 1), 0);
	assert_int_equal(sl_shm_held(s, 2, 1), 0);
	assert_int_equal(sl_shm_held(s, 3, 1), 0);
}

static void
test_acquire_up_to_limit_then_full(void **state)
{
	struct sl_shm *s = make(*state, 2, 2);
	int i;

	sl_shm_set_limit(s, 0, 3);
	assert_int_equal(sl_shm_limit(s, 0), 3);
	for (i = 0; i < 3; i++) {
		assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
		assert_int_equal(sl_shm_inflight(s, 0), i + 1);
	}
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	assert_int_equal(sl_shm_try_acquire(s, 1, 0), SL_ADMIT_FULL);
	/* Refusals change nothing. */
	assert_int_equal(sl_shm_inflight(s, 0), 3);
	assert_int_equal(sl_shm_held(s, 0, 0), 3);
	assert_int_equal(sl_shm_held(s, 1, 0), 0);
}

static void
test_release_frees_exactly_one_slot(void **state)
{
	struct sl_shm *s = make(*state, 1, 1);

	sl_shm_set_limit(s, 0, 2);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	sl_shm_release(s, 0, 0);
	assert_int_equal(sl_shm_inflight(s, 0), 1);
	assert_int_equal(sl_shm_held(s, 0, 0), 1);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	sl_shm_release(s, 0, 0);
	sl_shm_release(s, 0, 0);
	assert_int_equal(sl_shm_inflight(s, 0), 0);
	assert_int_equal(sl_shm_held(s, 0, 0), 0);
}

static void
test_tenants_are_independent(void **state)
{
	struct sl_shm *s = make(*state, 3, 1);

	sl_shm_set_limit(s, 0, 1);
	sl_shm_set_limit(s, 1, 2);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	/* A full tenant does not affect the others. */
	assert_int_equal(sl_shm_try_acquire(s, 0, 1), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 0, 1), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 0, 1), SL_ADMIT_FULL);
	assert_int_equal(sl_shm_inflight(s, 0), 1);
	assert_int_equal(sl_shm_inflight(s, 1), 2);
	assert_int_equal(sl_shm_inflight(s, 2), 0);
}

static void
test_raised_limit_applies_to_next_acquire(void **state)
{
	struct sl_shm *s = make(*state, 1, 1);

	sl_shm_set_limit(s, 0, 1);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	sl_shm_set_limit(s, 0, 3);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	assert_int_equal(sl_shm_inflight(s, 0), 3);
}

static void
test_lowered_limit_refuses_until_inflight_below(void **state)
{
	struct sl_shm *s = make(*state, 1, 1);
	int i;

	sl_shm_set_limit(s, 0, 5);
	for (i = 0; i < 5; i++)
		assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	/* Reload lowers the limit under what is in flight: nothing is cut. */
	sl_shm_set_limit(s, 0, 2);
	assert_int_equal(sl_shm_inflight(s, 0), 5);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	sl_shm_release(s, 0, 0);               /* 4 */
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	sl_shm_release(s, 0, 0);               /* 3 */
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	sl_shm_release(s, 0, 0);               /* 2: at the new limit */
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
	sl_shm_release(s, 0, 0);               /* 1: under it */
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_inflight(s, 0), 2);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_FULL);
}

static void
test_zero_limit_refuses_all(void **state)
{
	struct sl_shm *s = make(*state, 2, 2);
	int i;

	/* Fresh tenant: limit 0 until published. */
	assert_int_equal(sl_shm_try_acquire(s, 0, 1), SL_ADMIT_FULL);
	sl_shm_set_limit(s, 1, 4);
	assert_int_equal(sl_shm_try_acquire(s, 0, 1), SL_ADMIT_OK);
	sl_shm_set_limit(s, 1, 0);                /* retired */
	for (i = 0; i < 100; i++)
		assert_int_equal(sl_shm_try_acquire(s, (size_t)(i % 2), 1),
		    SL_ADMIT_FULL);
	assert_int_equal(sl_shm_inflight(s, 1), 1);
	sl_shm_release(s, 0, 1);
	assert_int_equal(sl_shm_inflight(s, 1), 0);
	assert_int_equal(sl_shm_try_acquire(s, 0, 1), SL_ADMIT_FULL);
}

static void
test_held_counts_per_row(void **state)
{
	struct sl_shm *s = make(*state, 2, 3);

	sl_shm_set_limit(s, 0, 10);
	sl_shm_set_limit(s, 1, 10);
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 2, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 2, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 2, 1), SL_ADMIT_OK);
	assert_int_equal(sl_shm_held(s, 0, 0), 1);
	assert_int_equal(sl_shm_held(s, 1, 0), 0);
	assert_int_equal(sl_shm_held(s, 2, 0), 2);
	assert_int_equal(sl_shm_held(s, 0, 1), 0);
	assert_int_equal(sl_shm_held(s, 2, 1), 1);
	assert_int_equal(sl_shm_inflight(s, 0), 3);
	assert_int_equal(sl_shm_inflight(s, 1), 1);
	sl_shm_release(s, 2, 0);
	assert_int_equal(sl_shm_held(s, 2, 0), 1);
	assert_int_equal(sl_shm_held(s, 0, 0), 1);
	assert_int_equal(sl_shm_inflight(s, 0), 2);
}

static void
test_reclaim_row_gives_back_exactly_that_row(void **state)
{
	struct sl_shm *s = make(*state, 3, 3);
	int i;

	sl_shm_set_limit(s, 0, 10);
	sl_shm_set_limit(s, 1, 10);
	sl_shm_set_limit(s, 2, 10);
	for (i = 0; i < 3; i++)
		assert_int_equal(sl_shm_try_acquire(s, 1, 0), SL_ADMIT_OK);
	for (i = 0; i < 2; i++)
		assert_int_equal(sl_shm_try_acquire(s, 1, 2), SL_ADMIT_OK);
	for (i = 0; i < 4; i++)
		assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 2, 1), SL_ADMIT_OK);

	assert_int_equal(sl_shm_reclaim_row(s, 1), 5);
	assert_int_equal(sl_shm_held(s, 1, 0), 0);
	assert_int_equal(sl_shm_held(s, 1, 1), 0);
	assert_int_equal(sl_shm_held(s, 1, 2), 0);
	/* Other rows untouched. */
	assert_int_equal(sl_shm_inflight(s, 0), 4);
	assert_int_equal(sl_shm_inflight(s, 1), 1);
	assert_int_equal(sl_shm_inflight(s, 2), 0);
	assert_int_equal(sl_shm_held(s, 0, 0), 4);
	assert_int_equal(sl_shm_held(s, 2, 1), 1);
	/* A second reclaim finds nothing. */
	assert_int_equal(sl_shm_reclaim_row(s, 1), 0);
	assert_int_equal(sl_shm_inflight(s, 0), 4);
	/* The row is reusable by a replacement worker. */
	assert_int_equal(sl_shm_try_acquire(s, 1, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_held(s, 1, 0), 1);
	assert_int_equal(sl_shm_inflight(s, 0), 5);
}

static void
test_reclaim_empty_row_returns_zero(void **state)
{
	struct sl_shm *s = make(*state, 2, 2);

	assert_int_equal(sl_shm_reclaim_row(s, 0), 0);
	assert_int_equal(sl_shm_reclaim_row(s, 1), 0);
	assert_int_equal(sl_shm_inflight(s, 0), 0);
}

static void
test_stats_add_and_sum_across_rows(void **state)
{
	struct sl_shm *s = make(*state, 1, 4);

	sl_shm_stat_add(s, 0, SL_STAT_ADMITTED, 3);
	sl_shm_stat_add(s, 1, SL_STAT_ADMITTED, 4);
	sl_shm_stat_add(s, 3, SL_STAT_ADMITTED, 5);
	sl_shm_stat_add(s, 3, SL_STAT_ADMITTED, 1);
	sl_shm_stat_add(s, 2, SL_STAT_BYTES_OUT, 1ULL << 40);
	sl_shm_stat_add(s, 0, SL_STAT_BYTES_OUT, 10);
	sl_shm_stat_add(s, 1, SL_STAT_REJECTED, 2);
	assert_int_equal(sl_shm_stat_sum(s, SL_STAT_ADMITTED), 13);
	assert_int_equal(sl_shm_stat_sum(s, SL_STAT_REJECTED), 2);
	assert_int_equal(sl_shm_stat_sum(s, SL_STAT_BYTES_OUT), (1ULL << 40) + 10);
	assert_int_equal(sl_shm_stat_sum(s, SL_STAT_PAUSES), 0);
	/* Out of range rows and stats are ignored, not written elsewhere. */
	sl_shm_stat_add(s, 4, SL_STAT_ADMITTED, 100);
	sl_shm_stat_add(s, 0, SL_STAT_MAX, 100);
	assert_int_equal(sl_shm_stat_sum(s, SL_STAT_ADMITTED), 13);
	assert_int_equal(sl_shm_stat_sum(s, SL_STAT_PAUSES), 0);
	assert_int_equal(sl_shm_stat_sum(s, SL_STAT_MAX), 0);
}

static void
test_invalid_indices_return_invalid(void **state)
{
	struct sl_shm *s = make(*state, 2, 2);

	sl_shm_set_limit(s, 0, 5);
	sl_shm_set_limit(s, 2, 5);               /* ignored */
	assert_int_equal(sl_shm_try_acquire(s, 0, 2), SL_ADMIT_INVALID);
	assert_int_equal(sl_shm_try_acquire(s, 2, 0), SL_ADMIT_INVALID);
	assert_int_equal(sl_shm_try_acquire(s, 2, 2), SL_ADMIT_INVALID);
	assert_int_equal(sl_shm_try_acquire(s, SIZE_MAX, 0), SL_ADMIT_INVALID);
	assert_int_equal(sl_shm_try_acquire(s, 0, SIZE_MAX), SL_ADMIT_INVALID);
	assert_int_equal(sl_shm_inflight(s, 0), 0);
	assert_int_equal(sl_shm_limit(s, 2), 0);
	assert_int_equal(sl_shm_inflight(s, 2), 0);
	assert_int_equal(sl_shm_held(s, 2, 0), 0);
	assert_int_equal(sl_shm_held(s, 0, 2), 0);
	assert_int_equal(sl_shm_reclaim_row(s, 2), 0);
	sl_shm_release(s, 2, 0);                 /* ignored */
	sl_shm_release(s, 0, 2);                 /* ignored */
	assert_int_equal(sl_shm_inflight(s, 0), 0);
	assert_int_equal(sl_shm_held(s, 0, 0), 0);
	/* The valid cell still works. */
	assert_int_equal(sl_shm_try_acquire(s, 1, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_inflight(s, 0), 1);
}

/* ---- many processes ---------------------------------------------------- */

/* Shared between the test and its children, on its own MAP_SHARED page. */
struct hammer {
	_Atomic int go;
	_Atomic int32_t violations;   /* inflight seen above the limit */
	_Atomic int32_t high_water;   /* largest inflight seen after an acquire */
	_Atomic int64_t acquired;
	_Atomic int64_t refused;
	_Atomic int32_t bad_held;     /* own row's held count disagreed */
};

#define HAMMER_KIDS 8
#define HAMMER_ITERS 20000
#define HAMMER_LIMIT 5
#define HAMMER_HOLD_MAX 3

static void
atomic_max(_Atomic int32_t *m, int32_t v)
{
	int32_t cur = atomic_load(m);

	while (cur < v && !atomic_compare_exchange_weak(m, &cur, v))
		;
}

/* A child: acquire and release on its own row; never uses cmocka. */
static void
hammer_child(struct sl_shm *s, struct hammer *h, size_t row)
{
	uint64_t x = 0x9e3779b97f4a7c15ULL * (row + 1);
	int32_t held = 0, in, lim;
	int i;

	while (!atomic_load(&h->go))
		sched_yield();
	for (i = 0; i < HAMMER_ITERS; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if (held < HAMMER_HOLD_MAX && (held == 0 || x % 3 != 0)) {
			enum sl_admit a = sl_shm_try_acquire(s, row, 0);

			if (a == SL_ADMIT_OK) {
				held++;
				in = sl_shm_inflight(s, 0);
				lim = sl_shm_limit(s, 0);
				if (in > lim || in < 1)
					atomic_fetch_add(&h->violations, 1);
				atomic_max(&h->high_water, in);
				atomic_fetch_add(&h->acquired, 1);
			} else if (a == SL_ADMIT_FULL) {
				atomic_fetch_add(&h->refused, 1);
			} else
				_exit(3);
		} else {
			sl_shm_release(s, row, 0);
			held--;
		}
		if (sl_shm_held(s, row, 0) != held)
			atomic_fetch_add(&h->bad_held, 1);
		if (x % 64 == 0)
			sched_yield();
	}
	while (held > 0) {
		sl_shm_release(s, row, 0);
		held--;
	}
	_exit(0);
}

static void
test_many_processes_never_exceed_limit(void **state)
{
	struct fx *f = *state;
	struct sl_shm *s = make(f, 2, HAMMER_KIDS + 1);
	struct hammer *h;
	size_t i;
	int st;

	h = mmap(NULL, sizeof(*h), PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(h != MAP_FAILED);
	f->page = h;
	f->page_len = sizeof(*h);
	sl_shm_set_limit(s, 0, HAMMER_LIMIT);
	sl_shm_set_limit(s, 1, 1000);

	for (i = 0; i < HAMMER_KIDS; i++) {
		pid_t pid = fork();

		if (pid == -1)
			break;
		if (pid == 0)
			hammer_child(s, h, i);
		f->kids[f->nkids++] = pid;
	}
	atomic_store(&h->go, 1);
	for (i = 0; i < f->nkids; i++) {
		assert_int_equal(waitpid(f->kids[i], &st, 0), f->kids[i]);
		f->kids[i] = 0;
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 0);
	}
	assert_int_equal(f->nkids, HAMMER_KIDS);

	assert_int_equal(atomic_load(&h->violations), 0);
	assert_int_equal(atomic_load(&h->bad_held), 0);
	assert_int_equal(sl_shm_inflight(s, 0), 0);
	for (i = 0; i < HAMMER_KIDS; i++)
		assert_int_equal(sl_shm_held(s, i, 0), 0);
	/* The limit was actually reached, and contended. */
	assert_int_equal(atomic_load(&h->high_water), HAMMER_LIMIT);
	assert_true(atomic_load(&h->refused) > 0);
	assert_true(atomic_load(&h->acquired) > 0);
	/* The other tenant saw nothing. */
	assert_int_equal(sl_shm_inflight(s, 1), 0);
}

/* A child that takes slots on its row, reports, then waits to be killed. */
static void
holder_child(struct sl_shm *s, size_t row, int wfd)
{
	char ok = 'y';
	int i;

	for (i = 0; i < 3; i++)
		if (sl_shm_try_acquire(s, row, 0) != SL_ADMIT_OK)
			ok = 'n';
	for (i = 0; i < 2; i++)
		if (sl_shm_try_acquire(s, row, 1) != SL_ADMIT_OK)
			ok = 'n';
	if (write(wfd, &ok, 1) != 1)
		_exit(1);
	for (;;)
		pause();
}

static void
test_killed_worker_slots_reclaimed(void **state)
{
	struct fx *f = *state;
	struct sl_shm *s = make(f, 2, 3);
	int p[2], st;
	pid_t pid;
	char c = 0;

	sl_shm_set_limit(s, 0, 5);
	sl_shm_set_limit(s, 1, 2);
	/* Another worker (row 0) holds a slot that must survive the reclaim. */
	assert_int_equal(sl_shm_try_acquire(s, 0, 0), SL_ADMIT_OK);

	assert_int_equal(pipe(p), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		holder_child(s, 2, p[1]);
	}
	f->kids[f->nkids++] = pid;
	close(p[1]);
	assert_int_equal(read(p[0], &c, 1), 1);
	close(p[0]);
	assert_int_equal(c, 'y');

	assert_int_equal(sl_shm_inflight(s, 0), 4);
	assert_int_equal(sl_shm_inflight(s, 1), 2);
	assert_int_equal(sl_shm_try_acquire(s, 0, 1), SL_ADMIT_FULL);

	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	f->kids[0] = 0;
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGKILL);

	/* The dead worker's slots are still counted until the master reclaims. */
	assert_int_equal(sl_shm_held(s, 2, 0), 3);
	assert_int_equal(sl_shm_held(s, 2, 1), 2);
	assert_int_equal(sl_shm_inflight(s, 0), 4);
	assert_int_equal(sl_shm_reclaim_row(s, 2), 5);
	assert_int_equal(sl_shm_inflight(s, 0), 1);
	assert_int_equal(sl_shm_inflight(s, 1), 0);
	assert_int_equal(sl_shm_held(s, 2, 0), 0);
	assert_int_equal(sl_shm_held(s, 2, 1), 0);
	assert_int_equal(sl_shm_held(s, 0, 0), 1);
	/* Exactly the limit is available again: no leak, no over-admission. */
	assert_int_equal(sl_shm_try_acquire(s, 1, 1), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 1, 1), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 1, 1), SL_ADMIT_FULL);
	assert_int_equal(sl_shm_try_acquire(s, 1, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 1, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 1, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 1, 0), SL_ADMIT_OK);
	assert_int_equal(sl_shm_try_acquire(s, 1, 0), SL_ADMIT_FULL);
}

/* A worker in its hot loop: admit and finish requests as fast as it can. */
static void
churn_child_on(struct sl_shm *s, size_t row, size_t idx, int wfd)
{
	char c = 'y';

	if (sl_shm_try_acquire(s, row, idx) != SL_ADMIT_OK)
		_exit(1);
	sl_shm_release(s, row, idx);
	if (write(wfd, &c, 1) != 1)
		_exit(1);
	for (;;)
		if (sl_shm_try_acquire(s, row, idx) == SL_ADMIT_OK)
			sl_shm_release(s, row, idx);
}

/*
 * A child churning idx on row is killed with SIGKILL after 20-220 us
 * (*x: the xorshift state of the delays), at any instruction.
 */
static void
churn_and_kill(struct fx *f, size_t row, size_t idx, uint64_t *x)
{
	struct timespec ts;
	int p[2], st;
	pid_t pid;
	char c;

	f->nkids = 1;
	assert_int_equal(pipe(p), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		churn_child_on(f->shm, row, idx, p[1]);
	}
	f->kids[0] = pid;
	close(p[1]);
	assert_int_equal(read(p[0], &c, 1), 1);
	close(p[0]);
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	ts.tv_sec = 0;
	ts.tv_nsec = (long)(20000 + *x % 200000);
	nanosleep(&ts, NULL);
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	f->kids[0] = 0;
	assert_true(WIFSIGNALED(st));
}

/*
 * kill -9 can land on any instruction, including the ones between the
 * tenant's CAS and the row's held count (acquire) or between the held count
 * and the tenant's decrement (release). Whatever the instant, reclaiming the
 * dead row must bring in-flight back exactly: no slot leaked, none freed
 * twice. 200 kills at varying delays.
 */
static void
test_sigkill_at_any_instant_reclaims_exactly(void **state)
{
	struct fx *f = *state;
	uint64_t x = 0x2545f4914f6cdd1dULL;
	int round, leaked = 0, freed_twice = 0, bad_rounds = 0;
	int32_t in;

	for (round = 0; round < 200; round++) {
		/* A fresh region per round: each kill is judged on its own. */
		sl_shm_destroy(f->shm);
		f->shm = NULL;
		make(f, 1, 2);
		sl_shm_set_limit(f->shm, 0, 1000);
		churn_and_kill(f, 1, 0, &x);

		sl_shm_reclaim_row(f->shm, 1);
		in = sl_shm_inflight(f->shm, 0);
		if (in != 0)
			bad_rounds++;
		if (in > 0)
			leaked += in;
		else if (in < 0)
			freed_twice -= in;
	}
	if (bad_rounds != 0)
		fail_msg("%d of 200 kills left in-flight wrong after reclaim: "
		    "%d slot(s) leaked, %d freed twice", bad_rounds, leaked,
		    freed_twice);
}

/*
 * The same on an index a reload removed and the master gave to another
 * tenant (sl_shm_index_reset): the old tenant's slot held by a row that
 * lives on, the index's epoch moved, and a worker of the new tenant
 * killed at any instant; reclaim gives back exactly what the dead row
 * held, and the live row's slot stays counted. 100 kills.
 */
static void
test_sigkill_on_a_reused_index_reclaims_exactly(void **state)
{
	struct fx *f = *state;
	uint64_t x = 0x9e3779b97f4a7c15ULL;
	int round, bad = 0;
	size_t idx = 1500;       /* a page of held cells of its own */
	uint32_t epoch;

	for (round = 0; round < 100; round++) {
		sl_shm_destroy(f->shm);
		f->shm = NULL;
		make(f, 2048, 4);
		/* The old tenant: served by row 3, then removed and quiet. */
		sl_shm_set_limit(f->shm, idx, 5);
		assert_int_equal(sl_shm_try_acquire(f->shm, 3, idx), SL_ADMIT_OK);
		sl_shm_release(f->shm, 3, idx);
		sl_shm_set_limit(f->shm, idx, 0);
		assert_true(sl_shm_index_quiet(f->shm, idx));
		epoch = sl_shm_epoch(f->shm, idx);
		sl_shm_index_reset(f->shm, idx);
		assert_int_equal(sl_shm_epoch(f->shm, idx), epoch + 1);
		assert_int_equal(sl_shm_held(f->shm, 3, idx), 0);
		/* The new tenant: one stream on row 2 that lives on. */
		sl_shm_set_limit(f->shm, idx, 1000);
		assert_int_equal(sl_shm_try_acquire(f->shm, 2, idx), SL_ADMIT_OK);
		churn_and_kill(f, 1, idx, &x);
		sl_shm_reclaim_row(f->shm, 1);
		if (sl_shm_inflight(f->shm, idx) != 1 ||
		    sl_shm_held(f->shm, 1, idx) != 0 ||
		    sl_shm_held(f->shm, 2, idx) != 1)
			bad++;
		sl_shm_release(f->shm, 2, idx);
		if (sl_shm_inflight(f->shm, idx) != 0 ||
		    !sl_shm_index_quiet(f->shm, idx))
			bad++;
	}
	if (bad != 0)
		fail_msg("%d check(s) of 100 kills on a reused index wrong", bad);
}

/* Resident kB of the mapping that starts at p (/proc/self/smaps). */
static long
mapping_rss_kb(const void *p)
{
	char line[512];
	FILE *fp = fopen("/proc/self/smaps", "r");
	unsigned long lo, hi;
	long kb = -1;
	int in = 0;

	assert_non_null(fp);
	while (fgets(line, sizeof(line), fp) != NULL) {
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
			/* A mapping's first line: "start-end perms ..." */
			in = lo == (unsigned long)(uintptr_t)p;
			continue;
		}
		if (in && sscanf(line, "Rss: %ld kB", &kb) == 1)
			break;
	}
	fclose(fp);
	return kb;
}

/*
 * Room costs nothing until used: a region with room for two million
 * indices and 129 rows (some gigabytes reserved) in which 1,000 indices
 * are served by two rows, counted, charged tokens under models, walked,
 * a row reclaimed after a crash and every used index checked quiet, has
 * written and read only the pages those indices need.
 */
static void
test_a_region_with_room_for_millions_costs_what_its_used_indices_cost(
    void **state)
{
	struct fx *f = *state;
	struct sl_shm *s = make(f, SL_SHM_MAX_INDICES, 129);
	uint64_t n[SL_TOKENS_KINDS] = { 3, 4, 0 }, got[SL_TOKENS_KINDS];
	size_t t, pos = 0, tt, mm, pairs = 0, rows[1] = { 2 };
	long kb;

	assert_true(sl_shm_size(s) > (size_t)1 << 30);
	sl_shm_set_rows_used(s, 3);
	sl_shm_set_indices_used(s, 1000);
	for (t = 0; t < 1000; t++) {
		sl_shm_set_limit(s, t, 10);
		sl_shm_set_token_budget(s, t, 1000);
		assert_int_equal(sl_shm_try_acquire(s, 1, t), SL_ADMIT_OK);
		assert_int_equal(sl_shm_try_acquire(s, 2, t), SL_ADMIT_OK);
		sl_shm_release(s, 1, t);
		sl_shm_count_request(s, 1, t, 200);
		sl_shm_tokens_charge(s, t, 1 + t % 3, 1000, n);
	}
	/* Row 2 dies holding one slot of each index. */
	assert_int_equal(sl_shm_reclaim_rows(s, rows, 1), 1000);
	for (t = 0; t < 1000; t++) {
		assert_int_equal(sl_shm_inflight(s, t), 0);
		assert_true(sl_shm_index_quiet(s, t));
		assert_int_equal(sl_shm_requests_sum(s, t, sl_shm_code_slot(200)),
		    1);
		assert_int_equal(sl_shm_tokens_window(s, t, 1001, 0, NULL), 7);
	}
	while (sl_shm_tokens_next(s, &pos, &tt, &mm, got)) {
		assert_int_equal(mm, 1 + tt % 3);
		assert_int_equal(got[SL_TOKENS_COMPLETION], 4);
		pairs++;
	}
	assert_int_equal(pairs, 1000);
	sl_shm_index_reset(s, 999);
	sl_shm_retire_stats(s, 2);
	/*
	 * 1,000 indices of 536 bytes, two rows' held pages, the pairs', the
	 * rows' stats and the affinity table's header pages: about 1.5 MiB.
	 */
	kb = mapping_rss_kb(s);
	assert_true(kb > 0);
	print_message("the region: %ld kB resident of %zu MiB\n", kb,
	    sl_shm_size(s) >> 20);
	if (kb > 2048)
		fail_msg("the region has %ld kB resident for 1,000 indices", kb);
}

/* Affinity hints: tag-checked, "ended" sticky for a hash, a collision
 * overwrites, a dropped slot is forgotten, an out-of-range slot ignored. */
static void
test_hints_answer_only_their_own_hash(void **state)
{
	struct sl_shm *s = make(*state, 8, 2);
	uint64_t a = 0x123456789abcdef1ULL;
	uint64_t same_index = a ^ (1ULL << 63);   /* same low bits, other tag */
	uint64_t b = a + 1;
	size_t slot = 99;
	int ended = 7;

	assert_int_equal(sl_shm_hint_get(s, a, &slot, &ended), -1);
	sl_shm_hint_put(s, a, 3, 1);
	assert_int_equal(sl_shm_hint_get(s, a, &slot, &ended), 0);
	assert_int_equal(slot, 3);
	assert_int_equal(ended, 1);
	assert_int_equal(sl_shm_hint_get(s, same_index, &slot, &ended), -1);
	/* Routed on inside a longer prompt, elsewhere: the mark stays. */
	sl_shm_hint_put(s, a, 5, 0);
	assert_int_equal(sl_shm_hint_get(s, a, &slot, &ended), 0);
	assert_int_equal(slot, 5);
	assert_int_equal(ended, 1);
	/* A colliding hash takes the word over, its own mark with it. */
	sl_shm_hint_put(s, same_index, 2, 0);
	assert_int_equal(sl_shm_hint_get(s, a, &slot, &ended), -1);
	assert_int_equal(sl_shm_hint_get(s, same_index, &slot, &ended), 0);
	assert_int_equal(slot, 2);
	assert_int_equal(ended, 0);
	sl_shm_hint_put(s, b, 0, 0);
	assert_int_equal(sl_shm_hint_get(s, b, &slot, &ended), 0);
	assert_int_equal(slot, 0);
	sl_shm_hint_drop_slot(s, 2);
	assert_int_equal(sl_shm_hint_get(s, same_index, &slot, &ended), -1);
	assert_int_equal(sl_shm_hint_get(s, b, &slot, &ended), 0);
	sl_shm_hint_put(s, a, 8, 1);            /* not a slot of this region */
	assert_int_equal(sl_shm_hint_get(s, a, &slot, &ended), -1);
}

/*
 * Issue 22: a runner reporting 2^63-1 tokens three times made the counter
 * wrap and go backwards. Counters saturate; so does the window.
 */
static void
test_token_counters_saturate_never_wrap(void **state)
{
	struct fx *f = *state;
	struct sl_shm *s = make(f, 2, 1);
	uint64_t n[SL_TOKENS_KINDS] = { (uint64_t)INT64_MAX, 1, 0 }, last = 0, v;
	int i;

	for (i = 0; i < 3; i++) {
		sl_shm_tokens_charge(s, 0, 0, 1000, n);
		v = sl_shm_tokens_total(s, 0, SL_TOKENS_PROMPT);
		assert_true(v >= last);
		last = v;
	}
	assert_true(last == UINT64_MAX);
	assert_int_equal(sl_shm_tokens_total(s, 0, SL_TOKENS_COMPLETION), 3);
	v = sl_shm_tokens_window(s, 0, 1000, 0, NULL);
	assert_true(v > 0);
	sl_shm_tokens_charge(s, 0, 0, 1000, n);
	assert_true(sl_shm_tokens_window(s, 0, 1000, 0, NULL) >= v);
	assert_int_equal(sl_shm_tokens_total(s, 1, SL_TOKENS_PROMPT), 0);
}

/* ---- models (issue 23) --------------------------------------------------- */

/* A dead worker's model counters and histograms move to row 0, exactly. */
static void
test_model_counters_survive_a_dead_row(void **state)
{
	struct sl_shm *s = make(*state, 2, 3);
	int n;

	sl_shm_count_model_request(s, 1, 3, 200);
	sl_shm_count_model_request(s, 1, 3, 200);
	sl_shm_count_model_request(s, 2, 3, 404);
	sl_shm_count_model_request(s, 2, 0, 200);
	sl_shm_model_observe(s, 1, 3, SL_MHIST_TTFT, 0.03);
	sl_shm_model_observe(s, 2, 3, SL_MHIST_TTFT, 20.0);
	sl_shm_model_observe(s, 1, 3, SL_MHIST_DURATION, 1.0);
	sl_shm_retire_stats(s, 1);
	assert_int_equal(sl_shm_model_requests_sum(s, 3, sl_shm_code_slot(200)), 2);
	assert_int_equal(sl_shm_model_requests_sum(s, 3, sl_shm_code_slot(404)), 1);
	assert_int_equal(sl_shm_model_requests_sum(s, 0, sl_shm_code_slot(200)), 1);
	assert_int_equal(sl_shm_model_requests_sum(s, 1, sl_shm_code_slot(200)), 0);
	sl_shm_mhist_bounds(SL_MHIST_TTFT, &n);
	assert_int_equal(sl_shm_model_hist_bucket(s, 3, SL_MHIST_TTFT, 3), 0);
	assert_int_equal(sl_shm_model_hist_bucket(s, 3, SL_MHIST_TTFT, 4), 1);
	assert_int_equal(sl_shm_model_hist_bucket(s, 3, SL_MHIST_TTFT, n - 1), 1);
	assert_int_equal(sl_shm_model_hist_bucket(s, 3, SL_MHIST_TTFT, n), 2);
	assert_true(sl_shm_model_hist_sum(s, 3, SL_MHIST_TTFT) > 20.029 &&
	    sl_shm_model_hist_sum(s, 3, SL_MHIST_TTFT) < 20.031);
	assert_int_equal(sl_shm_model_hist_bucket(s, 3, SL_MHIST_DURATION, 14), 1);
	assert_int_equal(sl_shm_model_hist_bucket(s, 3, SL_MHIST_TPOT, 13), 0);
	/* Row 1 was zeroed: a new worker on it starts from nothing. */
	sl_shm_retire_stats(s, 1);
	assert_int_equal(sl_shm_model_requests_sum(s, 3, sl_shm_code_slot(200)), 2);
	/* Out of range: ignored. */
	sl_shm_count_model_request(s, 3, 3, 200);
	sl_shm_count_model_request(s, 0, MODELS, 200);
	assert_int_equal(sl_shm_model_requests_sum(s, MODELS, 0), 0);
}

/* The OpenTelemetry GenAI buckets; a value on a bound falls in it. */
static void
test_model_histograms_use_the_genai_bounds(void **state)
{
	static const double ttft[] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06,
	    0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0 };
	static const double tpot[] = { 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
	    0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5 };
	static const double dur[] = { 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64,
	    1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92 };
	struct sl_shm *s = make(*state, 1, 1);
	const double *b;
	int n, i;

	b = sl_shm_mhist_bounds(SL_MHIST_TTFT, &n);
	assert_int_equal(n, 16);
	assert_memory_equal(b, ttft, sizeof(ttft));
	b = sl_shm_mhist_bounds(SL_MHIST_TPOT, &n);
	assert_int_equal(n, 13);
	assert_memory_equal(b, tpot, sizeof(tpot));
	b = sl_shm_mhist_bounds(SL_MHIST_DURATION, &n);
	assert_int_equal(n, 14);
	assert_memory_equal(b, dur, sizeof(dur));
	for (i = 0; i < 13; i++)
		sl_shm_model_observe(s, 0, 1, SL_MHIST_TPOT, tpot[i]);
	sl_shm_model_observe(s, 0, 1, SL_MHIST_TPOT, -1.0);   /* as 0 */
	sl_shm_model_observe(s, 0, 1, SL_MHIST_TPOT, 3.0);
	assert_int_equal(sl_shm_model_hist_bucket(s, 1, SL_MHIST_TPOT, 0), 2);
	for (i = 1; i < 13; i++)
		assert_int_equal(sl_shm_model_hist_bucket(s, 1, SL_MHIST_TPOT, i),
		    i + 2);
	assert_int_equal(sl_shm_model_hist_bucket(s, 1, SL_MHIST_TPOT, 13), 15);
	assert_int_equal(sl_shm_model_hist_bucket(s, 1, SL_MHIST_TPOT, 14), 0);
	assert_int_equal(sl_shm_model_hist_bucket(s, 2, SL_MHIST_TPOT, 13), 0);
}

/* The tokens of each tenant and model; together, the tenant's total. */
static void
test_tokens_per_model_add_up_to_the_tenant(void **state)
{
	struct sl_shm *s = make(*state, 4, 1);
	uint64_t a[SL_TOKENS_KINDS] = { 10, 2, 0 }, b[SL_TOKENS_KINDS] = { 0, 0, 7 };
	uint64_t seen[4][MODELS][SL_TOKENS_KINDS], n[SL_TOKENS_KINDS];
	size_t pos = 0, t, m, pairs = 0;
	int k;

	sl_shm_tokens_charge(s, 0, 0, 1000, a);
	sl_shm_tokens_charge(s, 0, 3, 1000, a);
	sl_shm_tokens_charge(s, 0, 3, 1001, b);
	sl_shm_tokens_charge(s, 0, 127, 1001, b);
	sl_shm_tokens_charge(s, 1, 3, 1001, a);
	sl_shm_tokens_charge(s, 2, MODELS, 1001, a);   /* as "-" */
	assert_int_equal(sl_shm_tokens_model(s, 0, 0, SL_TOKENS_PROMPT), 10);
	assert_int_equal(sl_shm_tokens_model(s, 0, 3, SL_TOKENS_PROMPT), 10);
	assert_int_equal(sl_shm_tokens_model(s, 0, 3, SL_TOKENS_ESTIMATED), 7);
	assert_int_equal(sl_shm_tokens_model(s, 0, 127, SL_TOKENS_ESTIMATED), 7);
	assert_int_equal(sl_shm_tokens_model(s, 0, 4, SL_TOKENS_PROMPT), 0);
	assert_int_equal(sl_shm_tokens_model(s, 1, 3, SL_TOKENS_COMPLETION), 2);
	assert_int_equal(sl_shm_tokens_model(s, 1, 0, SL_TOKENS_COMPLETION), 0);
	assert_int_equal(sl_shm_tokens_model(s, 2, 0, SL_TOKENS_PROMPT), 10);
	assert_int_equal(sl_shm_tokens_total(s, 0, SL_TOKENS_PROMPT), 20);
	assert_int_equal(sl_shm_tokens_total(s, 0, SL_TOKENS_ESTIMATED), 14);
	/* The window is the tenant's, whatever the model (tokens_per_minute). */
	assert_int_equal(sl_shm_tokens_window(s, 0, 1001, 0, NULL), 12 + 12 + 7 + 7);
	memset(seen, 0, sizeof(seen));
	while (sl_shm_tokens_next(s, &pos, &t, &m, n)) {
		assert_true(t < 4 && m > 0 && m < MODELS);
		for (k = 0; k < SL_TOKENS_KINDS; k++)
			seen[t][m][k] += n[k];
		pairs++;
	}
	assert_int_equal(pairs, 3);
	assert_int_equal(seen[0][3][SL_TOKENS_PROMPT], 10);
	assert_int_equal(seen[0][3][SL_TOKENS_ESTIMATED], 7);
	assert_int_equal(seen[0][127][SL_TOKENS_ESTIMATED], 7);
	assert_int_equal(seen[1][3][SL_TOKENS_COMPLETION], 2);
}

/*
 * The pair table is bounded (SL_SHM_PAIRS_PER_TENANT per index of the
 * capacity, each index's pairs from its home on): past it, a pair's tokens count under "-", and each tenant's
 * models still add up to its total.
 */
static void
test_token_pairs_past_the_table_count_under_dash(void **state)
{
	size_t tenants = 1000, t, m, pos = 0, pairs = 0, tt, mm;
	struct sl_shm *s = make(*state, tenants, 1);
	uint64_t one[SL_TOKENS_KINDS] = { 1, 0, 0 }, n[SL_TOKENS_KINDS];
	uint64_t *sum = calloc(tenants, sizeof(*sum));

	assert_non_null(sum);
	for (t = 0; t < tenants; t++)
		for (m = 1; m <= 80; m++)
			sl_shm_tokens_charge(s, t, m, 1000, one);
	while (sl_shm_tokens_next(s, &pos, &tt, &mm, n)) {
		assert_int_equal(n[SL_TOKENS_PROMPT], 1);
		sum[tt] += n[SL_TOKENS_PROMPT];
		pairs++;
	}
	/*
	 * 80,000 pairs; a table of 2 x 1000 + 64 and a spill of 65,536:
	 * full, the rest under "-".
	 */
	assert_true(pairs <= 2064 + 65536 && pairs > 60000);
	for (t = 0; t < tenants; t++) {
		assert_int_equal(sum[t] + sl_shm_tokens_model(s, t, 0,
		    SL_TOKENS_PROMPT), 80);
		assert_int_equal(sl_shm_tokens_total(s, t, SL_TOKENS_PROMPT), 80);
	}
	free(sum);
}

/* A slot given to another name starts from zero; the others keep theirs. */
static void
test_model_reset_zeroes_only_that_slot(void **state)
{
	struct sl_shm *s = make(*state, 2, 2);
	uint64_t a[SL_TOKENS_KINDS] = { 5, 1, 0 }, n[SL_TOKENS_KINDS];
	size_t pos = 0, t, m, pairs = 0;
	unsigned char drop[MODELS] = { 0 };

	sl_shm_count_model_request(s, 1, 2, 200);
	sl_shm_count_model_request(s, 1, 3, 200);
	sl_shm_model_observe(s, 0, 2, SL_MHIST_DURATION, 0.5);
	sl_shm_model_observe(s, 1, 3, SL_MHIST_DURATION, 0.5);
	sl_shm_count_fallback(s, 2, 3);
	sl_shm_count_fallback(s, 3, 2);
	sl_shm_count_fallback(s, 3, 3);
	sl_shm_count_fallback(s, 3, 4);
	sl_shm_tokens_charge(s, 0, 2, 1000, a);
	sl_shm_tokens_charge(s, 0, 3, 1000, a);
	sl_shm_tokens_charge(s, 1, 2, 1000, a);
	drop[2] = 1;
	sl_shm_models_reset(s, drop);
	assert_int_equal(sl_shm_model_requests_sum(s, 2, sl_shm_code_slot(200)), 0);
	assert_int_equal(sl_shm_model_requests_sum(s, 3, sl_shm_code_slot(200)), 1);
	assert_int_equal(sl_shm_model_hist_bucket(s, 2, SL_MHIST_DURATION, 14), 0);
	assert_int_equal(sl_shm_model_hist_bucket(s, 3, SL_MHIST_DURATION, 14), 1);
	assert_int_equal(sl_shm_fallbacks(s, 2, 3), 0);
	assert_int_equal(sl_shm_fallbacks(s, 3, 2), 0);
	assert_int_equal(sl_shm_fallbacks(s, 3, 3), 1);
	assert_int_equal(sl_shm_fallbacks(s, 3, 4), 1);
	assert_int_equal(sl_shm_tokens_model(s, 0, 2, SL_TOKENS_PROMPT), 0);
	assert_int_equal(sl_shm_tokens_model(s, 0, 3, SL_TOKENS_PROMPT), 5);
	while (sl_shm_tokens_next(s, &pos, &t, &m, n))
		pairs++;
	assert_int_equal(pairs, 1);
	/* The new model's first tokens make a new pair. */
	sl_shm_tokens_charge(s, 1, 2, 1000, a);
	assert_int_equal(sl_shm_tokens_model(s, 1, 2, SL_TOKENS_COMPLETION), 1);
	assert_int_equal(sl_shm_tokens_total(s, 1, SL_TOKENS_COMPLETION), 2);
}

/*
 * A region for 10,000 models (2 x 10,000 + 1 slots): the far slots count
 * like the near ones, and the fallback table's walk names every pair
 * counted, once, with its count.
 */
static void
test_ten_thousand_models_count_and_walk(void **state)
{
	struct fx *f = *state;
	size_t slots = 2 * 10000 + 1, m, pos = 0, from, to, pairs = 0;
	uint64_t n, total = 0;

	f->shm = sl_shm_create(4, 2, slots, 3);
	assert_non_null(f->shm);
	assert_int_equal(sl_shm_model_slots(f->shm), slots);
	for (m = 1; m < slots; m += 7) {
		sl_shm_count_model_request(f->shm, 1, m, 200);
		sl_shm_model_observe(f->shm, 1, m, SL_MHIST_TTFT, 0.002);
		sl_shm_count_fallback(f->shm, m, m == slots - 1 ? 1 : m + 1);
	}
	sl_shm_count_fallback(f->shm, 8, 9);
	assert_int_equal(sl_shm_model_requests_sum(f->shm, slots - 1,
	    sl_shm_code_slot(200)), 1);
	assert_int_equal(sl_shm_model_hist_bucket(f->shm, slots - 1,
	    SL_MHIST_TTFT, 1), 1);
	assert_int_equal(sl_shm_fallbacks(f->shm, 8, 9), 2);
	assert_int_equal(sl_shm_fallbacks(f->shm, 9, 8), 0);
	/* Out of range: ignored. */
	sl_shm_count_model_request(f->shm, 1, slots, 200);
	sl_shm_count_fallback(f->shm, slots, 1);
	assert_int_equal(sl_shm_model_requests_sum(f->shm, slots, 0), 0);
	while (sl_shm_fallbacks_next(f->shm, &pos, &from, &to, &n)) {
		assert_true(from < slots && to < slots);
		assert_int_equal(sl_shm_fallbacks(f->shm, from, to), n);
		total += n;
		pairs++;
	}
	assert_int_equal(pairs, (slots - 1 + 6) / 7);
	assert_int_equal(total, pairs + 1);
}

/*
 * The fallback table is bounded (65,536 pairs): a pair that finds no room
 * counts under (from, "-"), so every move of a model is still counted.
 */
static void
test_fallback_pairs_past_the_table_count_under_dash(void **state)
{
	struct fx *f = *state;
	size_t slots = 200001, m, pos = 0, from, to, pairs = 0;
	uint64_t n, total = 0, under_dash = 0;

	f->shm = sl_shm_create(4, 2, slots, 3);
	assert_non_null(f->shm);
	for (m = 1; m <= 100000; m++)
		sl_shm_count_fallback(f->shm, m, m + 1);
	while (sl_shm_fallbacks_next(f->shm, &pos, &from, &to, &n)) {
		total += n;
		if (to == 0)
			under_dash += n;
		pairs++;
	}
	assert_true(pairs <= 65536);
	assert_true(under_dash > 0);
	/* A pair with neither its cell nor (from, "-") room is the rest. */
	assert_true(total >= 65536 && total <= 100000);
	for (m = 1; m <= 100000; m++)
		assert_int_equal(sl_shm_fallbacks(f->shm, m, m + 1) +
		    sl_shm_fallbacks(f->shm, m, 0) <= 1, 1);
}

/*
 * Upstream counters are shared by the workers: a worker's row retiring
 * loses none, a slot reset for reuse zeroes that slot only, and the far
 * slot of a 2,001-slot region counts like the first.
 */
static void
test_upstream_counters_shared_and_reset_per_slot(void **state)
{
	struct fx *f = *state;
	size_t slots = 2 * 1000 + 1;

	f->shm = sl_shm_create(4, 3, 2, slots);
	assert_non_null(f->shm);
	assert_int_equal(sl_shm_upstream_slots(f->shm), slots);
	sl_shm_count_uerr(f->shm, 1, 7, SL_UERR_RESET);
	sl_shm_count_uerr(f->shm, 2, 7, SL_UERR_RESET);
	sl_shm_count_retry(f->shm, 1, 7, SL_RETRY_R_BUSY);
	sl_shm_count_affinity(f->shm, 2, slots - 1, SL_AFF_HIT);
	sl_shm_count_uerr(f->shm, 2, 8, SL_UERR_CONNECT);
	sl_shm_retire_stats(f->shm, 1);
	assert_int_equal(sl_shm_uerr_sum(f->shm, 7, SL_UERR_RESET), 2);
	assert_int_equal(sl_shm_retry_sum(f->shm, 7, SL_RETRY_R_BUSY), 1);
	assert_int_equal(sl_shm_affinity_sum(f->shm, slots - 1, SL_AFF_HIT), 1);
	sl_shm_upstream_reset(f->shm, 7);
	assert_int_equal(sl_shm_uerr_sum(f->shm, 7, SL_UERR_RESET), 0);
	assert_int_equal(sl_shm_retry_sum(f->shm, 7, SL_RETRY_R_BUSY), 0);
	assert_int_equal(sl_shm_uerr_sum(f->shm, 8, SL_UERR_CONNECT), 1);
	/* Out of range: ignored. */
	sl_shm_count_uerr(f->shm, 1, slots, SL_UERR_RESET);
	sl_shm_upstream_reset(f->shm, slots);
	assert_int_equal(sl_shm_uerr_sum(f->shm, slots, SL_UERR_RESET), 0);
}

/* Workers claim pairs and add tokens at once: every token is counted. */
#define PAIR_KIDS 4
#define PAIR_ITERS 3000
static void
test_token_pairs_exact_across_processes(void **state)
{
	struct fx *f = *state;
	struct sl_shm *s = make(f, 64, 1);
	uint64_t one[SL_TOKENS_KINDS] = { 1, 2, 0 };
	size_t i, t, m;
	int st, j;

	for (i = 0; i < PAIR_KIDS; i++) {
		pid_t pid = fork();

		assert_true(pid >= 0);
		if (pid == 0) {
			for (j = 0; j < PAIR_ITERS; j++)
				sl_shm_tokens_charge(s, (size_t)j % 64,
				    1 + (size_t)j % 5, 1000, one);
			_exit(0);
		}
		f->kids[f->nkids++] = pid;
	}
	for (i = 0; i < f->nkids; i++) {
		assert_int_equal(waitpid(f->kids[i], &st, 0), f->kids[i]);
		f->kids[i] = 0;
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	for (t = 0; t < 64; t++)
		for (m = 1; m <= 5; m++) {
			uint64_t want = 0;

			for (j = 0; j < PAIR_ITERS; j++)
				want += (size_t)j % 64 == t && 1 + (size_t)j % 5 == m;
			assert_int_equal(sl_shm_tokens_model(s, t, m,
			    SL_TOKENS_PROMPT), PAIR_KIDS * want);
			assert_int_equal(sl_shm_tokens_model(s, t, m,
			    SL_TOKENS_COMPLETION), 2 * PAIR_KIDS * want);
		}
	assert_int_equal(sl_shm_tokens_model(s, 0, 0, SL_TOKENS_PROMPT), 0);
}

int
main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_new_region_is_zeroed),
		T(test_create_rejects_zero_sizes),
		T(test_acquire_up_to_limit_then_full),
		T(test_move_keeps_inflight_and_reclaim_sees_new_holder),
		T(test_release_frees_exactly_one_slot),
		T(test_tenants_are_independent),
		T(test_raised_limit_applies_to_next_acquire),
		T(test_lowered_limit_refuses_until_inflight_below),
		T(test_zero_limit_refuses_all),
		T(test_held_counts_per_row),
		T(test_reclaim_row_gives_back_exactly_that_row),
		T(test_reclaim_empty_row_returns_zero),
		T(test_stats_add_and_sum_across_rows),
		T(test_invalid_indices_return_invalid),
		T(test_many_processes_never_exceed_limit),
		T(test_killed_worker_slots_reclaimed),
		T(test_sigkill_at_any_instant_reclaims_exactly),
		T(test_sigkill_on_a_reused_index_reclaims_exactly),
		T(test_a_region_with_room_for_millions_costs_what_its_used_indices_cost),
		T(test_hints_answer_only_their_own_hash),
		T(test_token_counters_saturate_never_wrap),
		T(test_model_counters_survive_a_dead_row),
		T(test_model_histograms_use_the_genai_bounds),
		T(test_tokens_per_model_add_up_to_the_tenant),
		T(test_token_pairs_past_the_table_count_under_dash),
		T(test_model_reset_zeroes_only_that_slot),
		T(test_ten_thousand_models_count_and_walk),
		T(test_fallback_pairs_past_the_table_count_under_dash),
		T(test_upstream_counters_shared_and_reset_per_slot),
		T(test_token_pairs_exact_across_processes),
	};
#undef T

	return sl_unit_run(tests);
}

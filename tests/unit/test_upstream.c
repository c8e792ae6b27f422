/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for replica choice and outcomes (src/upstream.c, the pools
 * part): least_loaded by weight, caps, tried replicas, busy marks, passive
 * ejection with max_percent, smooth weighted round robin. The shared region
 * is real (sl_shm_create); the config is built here.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "sl_shm.h"
#include "sl_upstream.h"

#define NREP 3

struct fx {
	struct sl_shm *shm;
	struct sl_config cfg;
	struct sl_upstream_conf up;
	struct sl_replica_conf rep[NREP];
	size_t slots[NREP];
	const size_t *slot_of[1];
	struct sl_pools *ps;
};

static char *urls[NREP] = { "http://a", "http://b", "http://c" };

static int
setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	int i;

	assert_non_null(f);
	f->shm = sl_shm_create(16, 4, 128, 129);
	assert_non_null(f->shm);
	for (i = 0; i < NREP; i++) {
		f->rep[i].url = urls[i];
		f->rep[i].weight = 1;
		f->slots[i] = (size_t)(2 + i);   /* 0 and 1 play tenants */
		sl_shm_set_limit(f->shm, f->slots[i], INT32_MAX);
	}
	f->up.name = "main";
	f->up.replicas = f->rep;
	f->up.nreplicas = NREP;
	f->up.retries = 2;
	f->up.retry_on = SL_RETRY_CONNECT | SL_RETRY_BUSY;
	f->up.health.interval_ms = 2000;
	f->up.health.rise = 2;
	f->up.eject.failures = 5;
	f->up.eject.duration_ms = 30000;
	f->up.eject.max_percent = 50;
	f->cfg.upstreams = &f->up;
	f->cfg.nupstreams = 1;
	f->slot_of[0] = f->slots;
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fx *f = *state;

	sl_pools_free(f->ps);
	sl_shm_destroy(f->shm);
	free(f);
	return 0;
}

static void
pools(struct fx *f)
{
	f->ps = sl_pools_new(&f->cfg, f->shm, 1, f->slot_of, NULL);
	assert_non_null(f->ps);
}

static int
pick(struct fx *f, uint64_t tried, int *ra)
{
	int dummy;

	return sl_pool_pick(f->ps, 0, tried, ra ? ra : &dummy);
}

static void
test_least_loaded_takes_the_lowest_load_per_weight(void **state)
{
	struct fx *f = *state;
	int i, r, n[NREP] = { 0 };

	f->rep[1].weight = 2;
	pools(f);
	/* 40 streams held at once: shares follow the weights 1:2:1. */
	for (i = 0; i < 40; i++) {
		r = pick(f, 0, NULL);
		assert_in_range(r, 0, NREP - 1);
		n[r]++;
	}
	assert_int_equal(n[0], 10);
	assert_int_equal(n[1], 20);
	assert_int_equal(n[2], 10);
	for (i = 0; i < NREP; i++)
		assert_int_equal(sl_shm_inflight(f->shm, f->slots[i]), n[i]);
	for (i = 0; i < NREP; i++)
		while (n[i]-- > 0)
			sl_pool_release(f->ps, 0, i);
	for (i = 0; i < NREP; i++)
		assert_int_equal(sl_shm_inflight(f->shm, f->slots[i]), 0);
}

static void
test_cap_and_tried_replicas_are_skipped(void **state)
{
	struct fx *f = *state;
	int ra = 0, i;

	sl_shm_set_limit(f->shm, f->slots[0], 2);
	pools(f);
	/* b and c already tried: only a, twice, then none. */
	assert_int_equal(pick(f, 0x6, NULL), 0);
	assert_int_equal(pick(f, 0x6, NULL), 0);
	assert_int_equal(pick(f, 0x6, &ra), -1);
	assert_int_equal(ra, 1);
	assert_int_equal(sl_shm_inflight(f->shm, f->slots[0]), 2);
	for (i = 0; i < 2; i++)
		sl_pool_release(f->ps, 0, 0);
}

static void
test_busy_mark_keeps_a_replica_out_for_its_retry_after(void **state)
{
	struct fx *f = *state;
	int ra = 0;

	pools(f);
	assert_int_equal(sl_pool_report(f->ps, 0, 0, 503, 7), 0);
	assert_int_equal(pick(f, 0x6, &ra), -1);
	assert_in_range(ra, 6, 7);
	/* A 503 without Retry-After marks nothing. */
	assert_int_equal(sl_pool_report(f->ps, 0, 1, 503, 0), 0);
	assert_int_equal(pick(f, 0x5, NULL), 1);
	sl_pool_release(f->ps, 0, 1);
	/* Counted by status. */
	assert_int_equal(sl_shm_requests_sum(f->shm, f->slots[0],
	    sl_shm_code_slot(503)), 1);
}

static void
test_consecutive_failures_eject_and_a_success_clears_them(void **state)
{
	struct fx *f = *state;
	int i, ra = 0;

	pools(f);
	for (i = 0; i < 4; i++)
		assert_int_equal(sl_pool_report(f->ps, 0, 0, SL_CODE_CONNECT, 0), 0);
	assert_int_equal(sl_pool_report(f->ps, 0, 0, 200, 0), 0);
	for (i = 0; i < 4; i++)
		assert_int_equal(sl_pool_report(f->ps, 0, 0, 500, 0), 0);
	/* The fifth in a row ejects it: out, for about duration. */
	assert_int_equal(sl_pool_report(f->ps, 0, 0, SL_CODE_RESET, 0), 1);
	assert_int_equal(pick(f, 0x6, &ra), -1);
	assert_in_range(ra, 29, 30);
	/* Failures after the ejection do not eject it again. */
	assert_int_equal(sl_pool_report(f->ps, 0, 0, SL_CODE_RESET, 0), 0);
	assert_int_equal(sl_shm_requests_sum(f->shm, f->slots[0],
	    sl_shm_code_slot(SL_CODE_CONNECT)), 4);
}

static void
test_max_percent_keeps_part_of_the_pool_in(void **state)
{
	struct fx *f = *state;
	int i;

	pools(f);
	/* 50 % of three: one may be out, never two. */
	for (i = 0; i < 5; i++)
		sl_pool_report(f->ps, 0, 0, SL_CODE_CONNECT, 0);
	for (i = 0; i < 10; i++)
		assert_int_equal(sl_pool_report(f->ps, 0, 1, SL_CODE_CONNECT, 0), 0);
	assert_int_equal(pick(f, 0x4, NULL), 1);
	sl_pool_release(f->ps, 0, 1);
}

static void
test_pool_of_one_is_never_ejected(void **state)
{
	struct fx *f = *state;
	int i;

	f->up.nreplicas = 1;
	pools(f);
	for (i = 0; i < 20; i++)
		assert_int_equal(sl_pool_report(f->ps, 0, 0, SL_CODE_CONNECT, 0), 0);
	assert_int_equal(pick(f, 0, NULL), 0);
	sl_pool_release(f->ps, 0, 0);
}

static void
test_round_robin_is_smooth_and_weighted(void **state)
{
	struct fx *f = *state;
	static const int want[7] = { 0, 0, 1, 0, 2, 0, 0 };   /* nginx's a a b a c a a */
	int i, r;

	f->rep[0].weight = 5;
	f->up.balance = SL_BALANCE_ROUND_ROBIN;
	pools(f);
	for (i = 0; i < 7; i++) {
		r = pick(f, 0, NULL);
		assert_int_equal(r, want[i]);
		sl_pool_release(f->ps, 0, r);
	}
}

static void
test_down_replica_waits_interval_times_rise(void **state)
{
	struct fx *f = *state;
	int ra = 0;

	pools(f);
	atomic_store(&sl_shm_replica(f->shm, f->slots[2])->down, SL_REPLICA_LOADING);
	assert_int_equal(pick(f, 0x3, &ra), -1);
	assert_int_equal(ra, 4);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

static void
test_a_reused_index_is_never_taken_by_an_older_mapping(void **state)
{
	struct fx *f = *state;
	int i;

	pools(f);
	/* The master retires a (limit 0), then reuses its index (epoch moves). */
	sl_shm_set_limit(f->shm, f->slots[0], 0);
	assert_int_equal(sl_shm_index_quiet(f->shm, f->slots[0]), 1);
	sl_shm_index_reset(f->shm, f->slots[0]);
	sl_shm_set_limit(f->shm, f->slots[0], INT32_MAX);
	for (i = 0; i < 12; i++)
		assert_int_not_equal(pick(f, 0, NULL), 0);
	assert_int_equal(sl_shm_inflight(f->shm, f->slots[0]), 0);
	assert_int_equal(sl_shm_held(f->shm, 1, f->slots[0]), 0);
	assert_int_equal(sl_shm_inflight(f->shm, f->slots[1]) +
	    sl_shm_inflight(f->shm, f->slots[2]), 12);
	/* Only a: none, though its new replica has room. */
	assert_int_equal(pick(f, 0x6, NULL), -1);
}

static void
test_busy_mark_is_capped_at_busy_max(void **state)
{
	struct fx *f = *state;
	struct sl_shm_replica *h;
	int64_t now;

	f->up.busy_max_ms = 2000;
	pools(f);
	sl_pool_report(f->ps, 0, 0, 429, 86400);
	h = sl_shm_replica(f->shm, f->slots[0]);
	now = sl_mono_ms();
	assert_true(atomic_load(&h->busy_until_ms) <= now + 2000);
	assert_true(atomic_load(&h->busy_until_ms) > now + 1000);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_least_loaded_takes_the_lowest_load_per_weight),
		T(test_cap_and_tried_replicas_are_skipped),
		T(test_busy_mark_keeps_a_replica_out_for_its_retry_after),
		T(test_consecutive_failures_eject_and_a_success_clears_them),
		T(test_max_percent_keeps_part_of_the_pool_in),
		T(test_pool_of_one_is_never_ejected),
		T(test_round_robin_is_smooth_and_weighted),
		T(test_down_replica_waits_interval_times_rise),
		T(test_a_reused_index_is_never_taken_by_an_older_mapping),
		T(test_busy_mark_is_capped_at_busy_max),
	};

	return sl_unit_run(tests);
}

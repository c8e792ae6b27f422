/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for the stored-response table (src/stored.c): learn and
 * find, the exact LRU order of eviction, ttl expiry, a full pool and a
 * full slab, settings that shrink a pool, a process killed holding the
 * lock, processes (fork) hammering it at once, and the id read from a
 * relayed answer (JSON body, event stream, cut anywhere).
 */
#include "config.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "unit.h"
#include "sl_stored.h"

#define POOL 3
#define HOUR_MS (3600 * 1000)

static void
assert_consistent(struct sl_stored *t)
{
	char why[200];

	if (sl_stored_check(t, why, sizeof(why)) != 0)
		fail_msg("table broken: %s", why);
}

static void
put(struct sl_stored *t, size_t pool, const char *id, uint64_t owner,
    int64_t now)
{
	sl_stored_put(t, pool, id, strlen(id), owner, now);
}

/* The owner of id, or 0 when unknown. */
static uint64_t
get(struct sl_stored *t, size_t pool, const char *id, int64_t now)
{
	uint64_t o = 0;

	if (sl_stored_get(t, pool, id, strlen(id), now, &o) != 0)
		return 0;
	return o;
}

static void
test_stored_learns_and_finds_per_pool(void **state)
{
	struct sl_stored *t = sl_stored_create(8, 1024);

	(void)state;
	assert_non_null(t);
	/* Off until the master sets a max: nothing learnt. */
	put(t, POOL, "resp_a", 11, 1000);
	assert_int_equal(get(t, POOL, "resp_a", 1000), 0);
	sl_stored_set_pool(t, POOL, 100, HOUR_MS);
	sl_stored_set_pool(t, POOL + 1, 100, HOUR_MS);
	put(t, POOL, "resp_a", 11, 1000);
	put(t, POOL, "resp_b", 22, 1000);
	assert_int_equal(get(t, POOL, "resp_a", 1001), 11);
	assert_int_equal(get(t, POOL, "resp_b", 1001), 22);
	/* Another pool's table, another id of the same prefix: unknown. */
	assert_int_equal(get(t, POOL + 1, "resp_a", 1001), 0);
	assert_int_equal(get(t, POOL, "resp_", 1001), 0);
	assert_int_equal(get(t, POOL, "resp_ab", 1001), 0);
	/* Learnt again from another replica: the new owner. */
	put(t, POOL, "resp_a", 33, 1002);
	assert_int_equal(get(t, POOL, "resp_a", 1003), 33);
	assert_int_equal(sl_stored_count(t, POOL), 2);
	assert_int_equal(sl_stored_count(t, POOL + 1), 0);
	assert_consistent(t);
	sl_stored_destroy(t);
}

static void
test_stored_evicts_least_recently_used_exactly(void **state)
{
	struct sl_stored *t = sl_stored_create(8, 1024);
	uint64_t owners[8];
	char id[16];
	int i;

	(void)state;
	sl_stored_set_pool(t, POOL, 4, HOUR_MS);
	for (i = 1; i <= 4; i++) {
		snprintf(id, sizeof(id), "r%d", i);
		put(t, POOL, id, (uint64_t)i, 1000 + i);
	}
	/* Used: r1 (looked up), r3 (learnt again). Order now 3 1 4 2. */
	assert_int_equal(get(t, POOL, "r1", 1010), 1);
	put(t, POOL, "r3", 3, 1011);
	assert_int_equal(sl_stored_walk(t, POOL, owners, 8), 4);
	assert_int_equal(owners[0], 3);
	assert_int_equal(owners[1], 1);
	assert_int_equal(owners[2], 4);
	assert_int_equal(owners[3], 2);
	/* Full: each new id evicts the least recently used, in that order. */
	put(t, POOL, "r5", 5, 1012);
	assert_int_equal(get(t, POOL, "r2", 1013), 0);
	assert_int_equal(sl_stored_count(t, POOL), 4);
	put(t, POOL, "r6", 6, 1014);
	assert_int_equal(get(t, POOL, "r4", 1015), 0);
	put(t, POOL, "r7", 7, 1016);
	assert_int_equal(get(t, POOL, "r1", 1017), 0);
	assert_int_equal(sl_stored_walk(t, POOL, owners, 8), 4);
	assert_int_equal(owners[0], 7);
	assert_int_equal(owners[1], 6);
	assert_int_equal(owners[2], 5);
	assert_int_equal(owners[3], 3);
	assert_int_equal(get(t, POOL, "r3", 1018), 3);
	assert_consistent(t);
	sl_stored_destroy(t);
}

static void
test_stored_ttl_expires_from_last_use(void **state)
{
	struct sl_stored *t = sl_stored_create(8, 1024);

	(void)state;
	sl_stored_set_pool(t, POOL, 100, 1000);
	put(t, POOL, "a", 1, 0);
	put(t, POOL, "b", 2, 0);
	/* A look-up within the ttl renews it; b is left to age. */
	assert_int_equal(get(t, POOL, "a", 900), 1);
	assert_int_equal(get(t, POOL, "a", 1800), 1);
	assert_int_equal(get(t, POOL, "b", 1001), 0);
	assert_int_equal(sl_stored_count(t, POOL), 1);
	assert_int_equal(get(t, POOL, "a", 2801), 0);
	assert_int_equal(sl_stored_count(t, POOL), 0);
	/* A reload's ttl applies to every id at once. */
	put(t, POOL, "c", 3, 5000);
	sl_stored_set_pool(t, POOL, 100, 100);
	assert_int_equal(get(t, POOL, "c", 5101), 0);
	assert_consistent(t);
	sl_stored_destroy(t);
}

static void
test_stored_lower_max_or_off_evicts_now(void **state)
{
	struct sl_stored *t = sl_stored_create(8, 1024);
	uint64_t owners[16];
	char id[16];
	int i;

	(void)state;
	sl_stored_set_pool(t, POOL, 10, HOUR_MS);
	for (i = 1; i <= 10; i++) {
		snprintf(id, sizeof(id), "id%d", i);
		put(t, POOL, id, (uint64_t)i, i);
	}
	sl_stored_set_pool(t, POOL, 3, HOUR_MS);
	assert_int_equal(sl_stored_walk(t, POOL, owners, 16), 3);
	assert_int_equal(owners[0], 10);
	assert_int_equal(owners[1], 9);
	assert_int_equal(owners[2], 8);
	assert_consistent(t);
	sl_stored_set_pool(t, POOL, 0, HOUR_MS);
	assert_int_equal(sl_stored_count(t, POOL), 0);
	assert_false(sl_stored_on(t, POOL));
	put(t, POOL, "x", 1, 20);
	assert_int_equal(sl_stored_count(t, POOL), 0);
	/* A pool reset for another upstream forgets only its own. */
	sl_stored_set_pool(t, POOL, 10, HOUR_MS);
	sl_stored_set_pool(t, POOL + 1, 10, HOUR_MS);
	put(t, POOL, "x", 1, 21);
	put(t, POOL + 1, "y", 2, 21);
	sl_stored_reset_pool(t, POOL);
	assert_int_equal(get(t, POOL, "x", 22), 0);
	assert_int_equal(get(t, POOL + 1, "y", 22), 2);
	assert_consistent(t);
	sl_stored_destroy(t);
}

static void
test_stored_full_slab_evicts_oldest_of_any_pool(void **state)
{
	struct sl_stored *t = sl_stored_create(8, 6);
	char id[16];
	int i;

	(void)state;
	/* Two pools of max 5 on a slab of 6 entries. */
	sl_stored_set_pool(t, 1, 5, HOUR_MS);
	sl_stored_set_pool(t, 2, 5, HOUR_MS);
	for (i = 0; i < 3; i++) {
		snprintf(id, sizeof(id), "a%d", i);
		put(t, 1, id, 1, 10 + i);
		snprintf(id, sizeof(id), "b%d", i);
		put(t, 2, id, 2, 20 + i);
	}
	/* Six used: a0 b0 a1 b1 a2 b2 in use order. a0 is renewed. */
	assert_int_equal(get(t, 1, "a0", 30), 1);
	put(t, 2, "b3", 2, 31);   /* slab full: the oldest, b0, goes */
	assert_int_equal(get(t, 2, "b0", 32), 0);
	assert_int_equal(get(t, 1, "a0", 33), 1);
	put(t, 1, "a3", 1, 34);   /* next oldest: a1 */
	assert_int_equal(get(t, 1, "a1", 35), 0);
	assert_int_equal(sl_stored_count(t, 1) + sl_stored_count(t, 2), 6);
	assert_consistent(t);
	sl_stored_destroy(t);
}

static void
test_stored_owner_dead_lock_is_repaired_in_order(void **state)
{
	struct sl_stored *t = sl_stored_create(8, 1024);
	uint64_t owners[8];
	pid_t pid;
	int st;

	(void)state;
	sl_stored_set_pool(t, POOL, 3, HOUR_MS);
	put(t, POOL, "a", 1, 1);
	put(t, POOL, "b", 2, 2);
	put(t, POOL, "c", 3, 3);
	assert_int_equal(get(t, POOL, "a", 4), 1);   /* order: a c b */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		sl_stored_lock_for_test(t);
		_exit(0);   /* dies holding the lock */
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	/* The next to lock rebuilds: nothing lost, the order kept. */
	put(t, POOL, "d", 4, 5);   /* evicts b, the least recently used */
	assert_int_equal(sl_stored_repairs(t), 1);
	assert_int_equal(sl_stored_walk(t, POOL, owners, 8), 3);
	assert_int_equal(owners[0], 4);
	assert_int_equal(owners[1], 1);
	assert_int_equal(owners[2], 3);
	assert_consistent(t);
	sl_stored_destroy(t);
}

#define KIDS 6
#define ROUNDS 4000

static void
test_stored_processes_hammer_and_kill(void **state)
{
	struct sl_stored *t = sl_stored_create(16, 4096);
	pid_t kids[KIDS];
	char id[32];
	int i, k, st;

	(void)state;
	sl_stored_set_pool(t, 1, 1000, HOUR_MS);
	sl_stored_set_pool(t, 2, 1000, HOUR_MS);
	sl_stored_set_pool(t, 3, 1000, HOUR_MS);
	for (k = 0; k < KIDS; k++) {
		kids[k] = fork();
		assert_true(kids[k] >= 0);
		if (kids[k] == 0) {
			uint64_t o;

			for (i = 0; i < ROUNDS; i++) {
				snprintf(id, sizeof(id), "k%d_%d", k, i % 1500);
				sl_stored_put(t, (size_t)(1 + i % 3), id, strlen(id),
				    (uint64_t)(k * 100000 + i % 1500), i);
				snprintf(id, sizeof(id), "k%d_%d", (k + 1) % KIDS,
				    i % 1500);
				(void)sl_stored_get(t, (size_t)(1 + i % 3), id,
				    strlen(id), i, &o);
			}
			_exit(0);
		}
	}
	/* Half of them killed at any instant. */
	usleep(20000);
	for (k = 0; k < KIDS; k += 2)
		kill(kids[k], SIGKILL);
	for (k = 0; k < KIDS; k++)
		assert_int_equal(waitpid(kids[k], &st, 0), kids[k]);
	/* Whatever they left: a whole table, each pool at most its max. */
	assert_consistent(t);
	assert_true(sl_stored_count(t, 1) <= 1000);
	/* And it goes on: learnt and found. */
	{
		uint64_t o = 0;

		sl_stored_put(t, 2, "after", 5, 77, ROUNDS);
		assert_int_equal(sl_stored_get(t, 2, "after", 5, ROUNDS, &o), 0);
		assert_int_equal(o, 77);
	}
	assert_consistent(t);
	sl_stored_destroy(t);
}

/* Feed s text in pieces of `step` bytes: 1 and the id when found. */
static int
scan(int sse, const char *text, size_t step, char *out, size_t outlen)
{
	struct sl_stored_scan s;
	size_t off, n = strlen(text);

	sl_stored_scan_init(&s, sse);
	for (off = 0; off < n; off += step)
		if (sl_stored_scan_feed(&s, text + off,
		    n - off < step ? n - off : step)) {
			snprintf(out, outlen, "%.*s", (int)s.idlen, s.id);
			return 1;
		}
	return 0;
}

static void
test_stored_scan_reads_id_of_json_and_stream(void **state)
{
	static const char *json = "{\"object\":\"response\",\"meta\":{\"id\":"
	    "\"no\"},\"list\":[\"id\",{\"id\":\"no2\"}],\"id\" : \"resp_J1\","
	    "\"output\":[]}";
	static const char *sse = ": comment\n\n"
	    "event: response.created\r\n"
	    "data: {\"type\":\"response.created\",\"sequence_number\":0,"
	    "\"response\":{\"object\":\"response\",\"output\":[{\"id\":\"msg\"}],"
	    "\"id\":\"resp_S1\",\"status\":\"in_progress\"}}\r\n\r\n"
	    "event: response.completed\n"
	    "data: {\"response\":{\"id\":\"resp_OTHER\"}}\n\n";
	static const char *sse2 = "event: x\ndata: {\"item\":{\"id\":\"i\"},"
	    "\"id\":\"top\"}\n\nevent: response.created\ndata: {\"response\":\n"
	    "data: {\"id\":\"resp_S2\"}}\n\n";
	char id[300];
	size_t step;

	(void)state;
	for (step = 1; step <= 7; step++) {
		assert_int_equal(scan(0, json, step, id, sizeof(id)), 1);
		assert_string_equal(id, "resp_J1");
		assert_int_equal(scan(1, sse, step, id, sizeof(id)), 1);
		assert_string_equal(id, "resp_S1");
		assert_int_equal(scan(1, sse2, step, id, sizeof(id)), 1);
		assert_string_equal(id, "resp_S2");
	}
	/* Not learnt: an escaped id, an answer without one. */
	assert_int_equal(scan(0, "{\"id\":\"re\\u0073p\"}", 3, id, sizeof(id)),
	    0);
	assert_int_equal(scan(0, "{\"error\":{\"id\":\"x\"}}", 3, id,
	    sizeof(id)), 0);
	assert_int_equal(scan(1, "data: {\"id\":\"x\"}\n\n", 3, id,
	    sizeof(id)), 0);
}

static void
test_stored_scan_reads_a_bounded_prefix(void **state)
{
	size_t pad = SL_STORED_SCAN_MAX, n;
	char *big, id[300];

	(void)state;
	/* The id past SL_STORED_SCAN_MAX bytes: not read. */
	big = malloc(pad + 64);
	assert_non_null(big);
	n = (size_t)snprintf(big, 32, "{\"x\":\"");
	memset(big + n, 'a', pad);
	strcpy(big + n + pad, "\",\"id\":\"late\"}");
	assert_int_equal(scan(0, big, 4096, id, sizeof(id)), 0);
	/* Just inside: read. */
	n = (size_t)snprintf(big, 32, "{\"x\":\"");
	memset(big + n, 'a', pad - 40);
	strcpy(big + n + pad - 40, "\",\"id\":\"ok\"}");
	assert_int_equal(scan(0, big, 4096, id, sizeof(id)), 1);
	assert_string_equal(id, "ok");
	free(big);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stored_learns_and_finds_per_pool),
		cmocka_unit_test(test_stored_evicts_least_recently_used_exactly),
		cmocka_unit_test(test_stored_ttl_expires_from_last_use),
		cmocka_unit_test(test_stored_lower_max_or_off_evicts_now),
		cmocka_unit_test(test_stored_full_slab_evicts_oldest_of_any_pool),
		cmocka_unit_test(test_stored_owner_dead_lock_is_repaired_in_order),
		cmocka_unit_test(test_stored_processes_hammer_and_kill),
		cmocka_unit_test(test_stored_scan_reads_id_of_json_and_stream),
		cmocka_unit_test(test_stored_scan_reads_a_bounded_prefix),
	};

	return sl_unit_run(tests);
}

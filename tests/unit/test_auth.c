/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for the API key index (src/auth.c).
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "sl_auth.h"
#include "sl_config.h"

#define NTENANTS 7
#define NKEYS 150

/* A config with NTENANTS tenants of NKEYS keys each: "k-<t>-<i>". */
static struct sl_config *
make_config(void)
{
	struct sl_config *cfg = calloc(1, sizeof(*cfg));
	size_t t, i;

	assert_non_null(cfg);
	cfg->ntenants = NTENANTS;
	cfg->tenants = calloc(NTENANTS, sizeof(*cfg->tenants));
	assert_non_null(cfg->tenants);
	for (t = 0; t < NTENANTS; t++) {
		cfg->tenants[t].name = strdup("t");
		cfg->tenants[t].keys = calloc(NKEYS, sizeof(char *));
		assert_non_null(cfg->tenants[t].keys);
		cfg->tenants[t].nkeys = NKEYS;
		for (i = 0; i < NKEYS; i++) {
			char buf[32];

			snprintf(buf, sizeof(buf), "k-%zu-%zu", t, i);
			cfg->tenants[t].keys[i] = strdup(buf);
		}
	}
	return cfg;
}

static void
test_every_key_finds_its_tenant(void **state)
{
	struct sl_config *cfg = make_config();
	struct sl_keyidx *x = sl_keyidx_build(cfg);
	size_t t, i;

	assert_non_null(x);
	for (t = 0; t < NTENANTS; t++)
		for (i = 0; i < NKEYS; i++) {
			const char *k = cfg->tenants[t].keys[i];

			assert_int_equal(sl_keyidx_lookup(x, k, strlen(k)), (int)t);
		}
	sl_keyidx_free(x);
	sl_config_free(cfg);
}

static void
test_near_misses_are_refused(void **state)
{
	struct sl_config *cfg = make_config();
	struct sl_keyidx *x = sl_keyidx_build(cfg);
	static const char *const bad[] = {
		"", "k", "k-0-", "k-0-1x", "xk-0-1", "K-0-1", "k-0-1 ", "k-99-0",
		"k-0-150", "k-0-1\n"
	};
	size_t i;

	assert_non_null(x);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(sl_keyidx_lookup(x, bad[i], strlen(bad[i])), -1);
	/* A prefix of a real key, by length: "k-0-1" against "k-0-10". */
	assert_int_equal(sl_keyidx_lookup(x, "k-0-10", 5), 0);   /* is k-0-1 */
	assert_int_equal(sl_keyidx_lookup(x, "k-0-10", 4), -1);
	sl_keyidx_free(x);
	sl_config_free(cfg);
}

static void
test_empty_config_finds_nothing(void **state)
{
	struct sl_config cfg;
	struct sl_keyidx *x;

	memset(&cfg, 0, sizeof(cfg));
	x = sl_keyidx_build(&cfg);
	assert_non_null(x);
	assert_int_equal(sl_keyidx_lookup(x, "anything", 8), -1);
	sl_keyidx_free(x);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_key_finds_its_tenant),
		cmocka_unit_test(test_near_misses_are_refused),
		cmocka_unit_test(test_empty_config_finds_nothing),
	};

	return sl_unit_run(tests);
}

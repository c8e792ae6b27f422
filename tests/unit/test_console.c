/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for src/console.c: the window of samples behind the console's
 * "last minute" numbers, the quantile of bucket deltas, JSON strings, and
 * the embedded page (present, and referring only to its own files).
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

#include "sl_console.h"

static void
test_window_answers_the_oldest_sample_of_the_span(void **state)
{
	struct sl_window *w = sl_window_new(4);
	uint64_t v[2];
	const uint32_t *b;
	size_t n, i;

	(void)state;
	assert_non_null(w);
	assert_null(sl_window_since(w, 0, &n));
	assert_int_equal(n, 0);
	for (i = 0; i < 6; i++) {      /* samples at 10..15 s; 4 kept: 12..15 */
		v[0] = 100 * i;
		v[1] = i;
		assert_int_equal(sl_window_push(w, 10.0 + (double)i, v, 2), 0);
	}
	b = sl_window_since(w, 0, &n);     /* the oldest kept */
	assert_non_null(b);
	assert_int_equal(n, 2);
	assert_int_equal(b[0], 200);
	b = sl_window_since(w, 13.5, &n);  /* the first at or after */
	assert_int_equal(b[0], 400);
	b = sl_window_since(w, 15.0, &n);
	assert_int_equal(b[1], 5);
	assert_null(sl_window_since(w, 15.5, &n));
	sl_window_free(w);
}

static void
test_window_samples_may_grow_and_new_indices_count_from_zero(void **state)
{
	struct sl_window *w = sl_window_new(3);
	uint64_t v[4] = { 5, 6, 7, 8 };
	const uint32_t *b;
	size_t n;

	(void)state;
	assert_int_equal(sl_window_push(w, 1, v, 2), 0);
	assert_int_equal(sl_window_push(w, 2, v, 4), 0);
	b = sl_window_since(w, 0, &n);
	assert_int_equal(n, 2);
	assert_int_equal(sl_window_delta(b, n, 0, 9), 4);   /* 9 - 5 */
	assert_int_equal(sl_window_delta(b, n, 3, 9), 9);   /* not in it: from 0 */
	assert_int_equal(sl_window_delta(NULL, 0, 0, 9), 9);
	/* Modulo 2^32: a counter that passed 2^32 since is still exact. */
	assert_int_equal(sl_window_delta(b, n, 1, (UINT64_C(1) << 32) + 8), 2);
	/* An index reset for reuse is forgotten: it counts from zero. */
	sl_window_forget(w, 1, 1);
	assert_int_equal(sl_window_delta(b, n, 1, 2), 2);
	assert_int_equal(sl_window_delta(b, n, 0, 9), 4);
	/* Wrapping reuses a slot whose buffer is smaller: it grows. */
	assert_int_equal(sl_window_push(w, 3, v, 1), 0);
	assert_int_equal(sl_window_push(w, 4, v, 4), 0);
	b = sl_window_since(w, 0, &n);
	assert_int_equal(n, 4);                 /* at 2 */
	b = sl_window_since(w, 3.5, &n);
	assert_int_equal(n, 4);
	assert_int_equal(b[3], 8);
	sl_window_free(w);
	sl_window_free(NULL);
	assert_null(sl_window_new(0));
}

static void
test_quantile_interpolates_inside_the_bucket(void **state)
{
	static const double bounds[] = { 0.1, 0.25, 0.5, 1.0 };
	/* 10 at or under 0.1, 10 more under 0.25, none above. */
	uint64_t cum[] = { 10, 20, 20, 20, 20 };
	uint64_t none[] = { 0, 0, 0, 0, 0 };
	uint64_t inf[] = { 0, 0, 0, 0, 4 };

	(void)state;
	assert_true(sl_console_quantile(bounds, 4, none, 0.5) < 0);
	/* rank 10: the top of the first bucket. */
	assert_float_equal(sl_console_quantile(bounds, 4, cum, 0.5), 0.1, 1e-12);
	/* rank 15: half way through (0.1, 0.25]. */
	assert_float_equal(sl_console_quantile(bounds, 4, cum, 0.75), 0.175, 1e-12);
	/* rank 19.8: 98 % of the way. */
	assert_float_equal(sl_console_quantile(bounds, 4, cum, 0.99), 0.247, 1e-12);
	/* rank 5 in the first bucket: from 0. */
	assert_float_equal(sl_console_quantile(bounds, 4, cum, 0.25), 0.05, 1e-12);
	/* Everything above the last bound: that bound. */
	assert_float_equal(sl_console_quantile(bounds, 4, inf, 0.5), 1.0, 1e-12);
}

static void
test_json_strings_escape_quotes_backslashes_and_controls(void **state)
{
	struct sl_str o = { NULL, 0, 0 };

	(void)state;
	sl_console_json_str(&o, "a\"b\\c\nd\te\x01\x7f" "\xc3\xa9");
	assert_string_equal(o.p, "\"a\\\"b\\\\c\\nd\\u0009e\\u0001\\u007f\xc3\xa9\"");
	sl_str_free(&o);
	sl_console_json_str(&o, "");
	assert_string_equal(o.p, "\"\"");
	sl_str_free(&o);
}

static int
contains(const struct sl_console_asset *a, const char *s)
{
	size_t n = strlen(s), i;

	for (i = 0; i + n <= a->len; i++)
		if (memcmp(a->data + i, s, n) == 0)
			return 1;
	return 0;
}

static void
test_the_page_is_embedded_and_names_only_its_own_files(void **state)
{
	const struct sl_console_asset *page = sl_console_asset("/");
	const char *const files[] = { "/console.css", "/console.js", "/favicon.svg" };
	size_t i;

	(void)state;
	assert_non_null(page);
	assert_string_equal(page->content_type, "text/html; charset=utf-8");
	assert_true(page->len > 100);
	assert_memory_equal(page->data, "<!doctype html>", 15);
	for (i = 0; i < 3; i++) {
		const struct sl_console_asset *a = sl_console_asset(files[i]);
		char ref[64];

		assert_non_null(a);
		assert_true(a->len > 0);
		snprintf(ref, sizeof(ref), "\"%s\"", files[i]);
		assert_true(contains(page, ref));
	}
	assert_true(contains(sl_console_asset("/console.js"), "\"/status.json\""));
	assert_false(contains(page, "<style"));
	assert_false(contains(page, "http"));
	assert_null(sl_console_asset("/status.json"));
	assert_null(sl_console_asset("/index.html"));
	assert_null(sl_console_asset(""));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_window_answers_the_oldest_sample_of_the_span),
		cmocka_unit_test(test_window_samples_may_grow_and_new_indices_count_from_zero),
		cmocka_unit_test(test_quantile_interpolates_inside_the_bucket),
		cmocka_unit_test(test_json_strings_escape_quotes_backslashes_and_controls),
		cmocka_unit_test(test_the_page_is_embedded_and_names_only_its_own_files),
	};

	return sl_unit_run(tests);
}

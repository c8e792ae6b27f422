/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for src/loadmetrics.c: each engine's real page (fixtures in
 * tests/unit/fixtures, as vLLM 0.6 / 0.9 / 0.11, TGI 2 and llama.cpp's
 * server print them), the same pages with CRLF and without a last newline,
 * and the corners of the text format one line at a time.
 */
#include "config.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "sl_loadmetrics.h"

/* ------------------------------------------------------------------ helpers */

/* Read $SLUICE_SRCDIR/tests/unit/fixtures/name (or ./...) whole. */
static char *
read_fixture(const char *name, size_t *len)
{
	const char *dir = getenv("SLUICE_SRCDIR");
	char path[4096];
	FILE *fp;
	char *buf = NULL;
	long n = 0;

	if (dir == NULL || dir[0] == '\0')
		dir = ".";
	if ((size_t)snprintf(path, sizeof(path), "%s/tests/unit/fixtures/%s", dir, name) >=
	    sizeof(path))
		fail_msg("path too long");
	if ((fp = fopen(path, "rb")) == NULL)
		fail_msg("cannot open %s: %s (set SLUICE_SRCDIR to the source tree)", path,
		    strerror(errno));
	if (fseek(fp, 0, SEEK_END) != 0 || (n = ftell(fp)) < 0 || fseek(fp, 0, SEEK_SET) != 0)
		fail_msg("cannot size %s", path);
	buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	if (fread(buf, 1, (size_t)n, fp) != (size_t)n)
		fail_msg("cannot read %s", path);
	fclose(fp);
	buf[n] = '\0';
	*len = (size_t)n;
	return buf;
}

/* An exact-size heap copy, so ASan sees a read past len. */
static char *
exact(const char *s, size_t len)
{
	char *p = malloc(len ? len : 1);

	assert_non_null(p);
	memcpy(p, s, len);
	return p;
}

static int
parse(const char *s, size_t len, struct sl_load_sample *out)
{
	char *p = exact(s, len);
	int n = sl_loadmetrics_parse(p, len, out);

	free(p);
	return n;
}

static int
parse_str(const char *s, struct sl_load_sample *out)
{
	return parse(s, strlen(s), out);
}

static void
assert_same(const struct sl_load_sample *a, const struct sl_load_sample *b)
{
	assert_int_equal(a->have_waiting, b->have_waiting);
	assert_int_equal(a->have_running, b->have_running);
	assert_int_equal(a->have_kv, b->have_kv);
	assert_true(a->waiting == b->waiting);
	assert_true(a->running == b->running);
	/* Values are read to within an ulp or two (no locale, no strtod). */
	assert_true(fabs(a->kv_cache - b->kv_cache) <= 1e-15);
}

/* LF -> CRLF; caller frees. */
static char *
to_crlf(const char *s, size_t len, size_t *olen)
{
	char *p = malloc(2 * len + 1);
	size_t i, k = 0;

	assert_non_null(p);
	for (i = 0; i < len; i++) {
		if (s[i] == '\n')
			p[k++] = '\r';
		p[k++] = s[i];
	}
	*olen = k;
	return p;
}

/*
 * Parse a fixture as it is, with CRLF line ends, without its last newline,
 * and at every prefix length (exact-size copies: nothing read past len).
 */
static void
check_fixture(const char *name, int found, const struct sl_load_sample *want)
{
	struct sl_load_sample s, t;
	size_t len, clen, cut;
	char *body = read_fixture(name, &len), *crlf;

	assert_int_equal(parse(body, len, &s), found);
	assert_same(&s, want);

	crlf = to_crlf(body, len, &clen);
	assert_int_equal(parse(crlf, clen, &t), found);
	assert_same(&t, want);
	free(crlf);

	assert_true(len > 0 && body[len - 1] == '\n');
	assert_int_equal(parse(body, len - 1, &t), found);
	assert_same(&t, want);

	for (cut = 0; cut < len; cut += 7)
		(void)parse(body, cut, &t);
	free(body);
}

/* ------------------------------------------------------------ the engines */

static void
test_vllm_0_6_page(void **state)
{
	struct sl_load_sample want = { 1, 1, 1, 7.0, 24.0, 0.8123069607807515 };

	(void)state;
	check_fixture("vllm-0.6.metrics", 3, &want);
}

static void
test_vllm_0_9_page_sums_engines_and_takes_fullest_cache(void **state)
{
	/* Two data-parallel engines: queues add up, the fuller cache counts. */
	struct sl_load_sample want = { 1, 1, 1, 4.0, 21.0, 0.6846153846153846 };

	(void)state;
	check_fixture("vllm-0.9.metrics", 3, &want);
}

static void
test_vllm_0_11_page_kv_cache_usage_and_not_waiting_by_reason(void **state)
{
	struct sl_load_sample want = { 1, 1, 1, 11.0, 31.0, 0.9731481481481481 };

	(void)state;
	check_fixture("vllm-0.11.metrics", 3, &want);
}

static void
test_tgi_page_has_queue_and_batch_but_no_cache(void **state)
{
	struct sl_load_sample want = { 1, 1, 0, 6.0, 17.0, 0.0 };

	(void)state;
	check_fixture("tgi-2.metrics", 2, &want);
}

static void
test_llamacpp_page(void **state)
{
	struct sl_load_sample want = { 1, 1, 1, 2.0, 4.0, 0.384521 };

	(void)state;
	check_fixture("llamacpp.metrics", 3, &want);
}

/* ------------------------------------------------------------ the format */

static void
test_empty_and_unrelated_pages_find_nothing(void **state)
{
	struct sl_load_sample s;

	(void)state;
	assert_int_equal(sl_loadmetrics_parse(NULL, 0, &s), 0);
	assert_int_equal(parse_str("", &s), 0);
	assert_int_equal(parse_str("\n\n\r\n  \n", &s), 0);
	assert_int_equal(parse_str("# HELP up x\n# TYPE up gauge\nup 1\n", &s), 0);
	assert_int_equal(s.have_waiting + s.have_running + s.have_kv, 0);
	assert_true(s.waiting == 0 && s.running == 0 && s.kv_cache == 0);
}

static void
test_names_that_extend_a_wanted_name_do_not_match(void **state)
{
	struct sl_load_sample s;

	(void)state;
	assert_int_equal(parse_str(
	    "vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9\n"
	    "vllm:num_requests_waiting_total 5\n"
	    "vllm:num_requests_waiting_created 1.7e9\n"
	    "vllm:num_requests_running_bucket{le=\"1\"} 3\n"
	    "vllm:num_requests_running_sum 3\n"
	    "vllm:num_requests_running_count 3\n"
	    "tgi_queue_size_bucket{le=\"+Inf\"} 4\n"
	    "tgi_queue_size2 4\n"
	    "xtgi_queue_size 4\n"
	    "llamacpp:requests_deferred_total 4\n"
	    "vllm:kv_cache_usage_perc_max 0.5\n"
	    "vllm:num_requests_waitin 2\n", &s), 0);
	assert_int_equal(parse_str("vllm:num_requests_waiting_total 5\nvllm:num_requests_waiting 2\n",
	    &s), 1);
	assert_true(s.waiting == 2.0);
}

static void
test_comments_are_never_samples(void **state)
{
	struct sl_load_sample s;

	(void)state;
	assert_int_equal(parse_str(
	    "# HELP tgi_queue_size Current queue size\n"
	    "# TYPE tgi_queue_size gauge\n"
	    "#tgi_queue_size 3\n"
	    "  # tgi_queue_size 3\n"
	    "# EOF\n", &s), 0);
}

static void
test_labels_with_escapes(void **state)
{
	struct sl_load_sample s;

	(void)state;
	/* A quote, a backslash and a newline escape inside values. */
	assert_int_equal(parse_str(
	    "vllm:num_requests_waiting{model_name=\"a\\\"b} 99\",engine=\"0\"} 3\n"
	    "vllm:num_requests_waiting{model_name=\"c:\\\\\"} 5\n"
	    "vllm:num_requests_waiting{model_name=\"line\\nbreak\",} 2\n"
	    "vllm:num_requests_waiting{} 1\n"
	    "vllm:num_requests_waiting { model_name = \"spaced\" } 10\n", &s), 1);
	assert_true(s.waiting == 21.0);
	/* Broken label sets lose only their own line. */
	assert_int_equal(parse_str(
	    "vllm:num_requests_running{model_name=\"x\" 3\n"
	    "vllm:num_requests_running{model_name=\"x} 3\n"
	    "vllm:num_requests_running{model_name=x} 3\n"
	    "vllm:num_requests_running{=\"x\"} 3\n"
	    "vllm:num_requests_running{model_name=\"x\"}3\n"
	    "vllm:num_requests_running{model_name=\"x\\\"} 3\n"
	    "vllm:num_requests_running{a=\"1\" b=\"2\"} 3\n"
	    "vllm:num_requests_running{model_name=\"ok\"} 4\n", &s), 1);
	assert_true(s.running == 4.0);
}

static void
test_timestamps_and_trailing_fields_are_ignored(void **state)
{
	struct sl_load_sample s;

	(void)state;
	assert_int_equal(parse_str(
	    "tgi_queue_size 4 1712345678000\n"
	    "tgi_batch_current_size{a=\"b\"} 8\t-1712345678000\n"
	    "llamacpp:kv_cache_usage_ratio 0.25 # {trace_id=\"x\"} 1\n", &s), 3);
	assert_true(s.waiting == 4.0 && s.running == 8.0 && s.kv_cache == 0.25);
}

static void
test_non_finite_and_negative_values_are_ignored(void **state)
{
	struct sl_load_sample s;

	(void)state;
	assert_int_equal(parse_str(
	    "vllm:num_requests_waiting NaN\n"
	    "vllm:num_requests_waiting +Inf\n"
	    "vllm:num_requests_waiting -Inf\n"
	    "vllm:num_requests_waiting -1\n"
	    "vllm:num_requests_running nan\n"
	    "vllm:kv_cache_usage_perc -0.5\n"
	    "vllm:kv_cache_usage_perc Inf\n", &s), 0);
	assert_true(s.waiting == 0 && s.running == 0 && s.kv_cache == 0);
	assert_int_equal(parse_str("vllm:num_requests_waiting NaN\nvllm:num_requests_waiting 2\n",
	    &s), 1);
	assert_true(s.waiting == 2.0);
	/* A sum that overflows is not a queue length either. */
	assert_int_equal(parse_str("tgi_queue_size 1.7e308\ntgi_queue_size 1.7e308\n", &s), 0);
}

static void
test_exponents_and_value_forms(void **state)
{
	struct sl_load_sample s;

	(void)state;
	assert_int_equal(parse_str("tgi_queue_size 1.5e+01\ntgi_queue_size 2E0\n"
	    "tgi_queue_size .5\ntgi_queue_size 5.\ntgi_queue_size +3\n"
	    "tgi_queue_size 2.5e-1\ntgi_queue_size 000\n", &s), 1);
	assert_true(s.waiting == 15 + 2 + 0.5 + 5 + 3 + 0.25);
	assert_int_equal(parse_str("tgi_queue_size 1e\ntgi_queue_size e1\ntgi_queue_size .\n"
	    "tgi_queue_size 0x10\ntgi_queue_size 1,5\ntgi_queue_size 1_000\n"
	    "tgi_queue_size 3abc\ntgi_queue_size\ntgi_queue_size \n", &s), 0);
}

static void
test_number_parser(void **state)
{
	static const struct {
		const char *s;
		double v;
	} ok[] = {
		{ "0", 0 }, { "7.0", 7 }, { "1.5e+01", 15 }, { "0.8123069607807515", 0.8123069607807515 },
		{ "1.7181405583e+09", 1.7181405583e+09 }, { "1e-3", 1e-3 }, { "-2.5", -2.5 },
		{ "123456789012345678901234", 1.23456789012345678e23 },
		{ "0.000000000000000000000000001", 1e-27 }, { "1e400", INFINITY },
		{ "1e-400", 0 }, { "1E99999999999999999999", INFINITY },
	};
	static const char *const bad[] = { "", "+", "-", ".", "e5", "1e", "1e+", "1.2.3", "0x1p3",
		"1 ", " 1", "Infinit", "nana", "1f" };
	double v;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		v = -42;
		assert_int_equal(sl_loadmetrics_number(ok[i].s, strlen(ok[i].s), &v), 0);
		if (isinf(ok[i].v))
			assert_true(isinf(v) && v > 0);
		else
			assert_true(fabs(v - ok[i].v) <= fabs(ok[i].v) * 1e-15);
	}
	assert_int_equal(sl_loadmetrics_number("NaN", 3, &v), 0);
	assert_true(isnan(v));
	assert_int_equal(sl_loadmetrics_number("-inf", 4, &v), 0);
	assert_true(isinf(v) && v < 0);
	assert_int_equal(sl_loadmetrics_number("+Infinity", 9, &v), 0);
	assert_true(isinf(v) && v > 0);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = -42;
		assert_int_equal(sl_loadmetrics_number(bad[i], strlen(bad[i]), &v), -1);
		assert_true(v == -42);
	}
}

static void
test_numbers_do_not_depend_on_the_locale(void **state)
{
	static const char *const locales[] = { "de_DE.UTF-8", "fr_FR.UTF-8", "de_DE", "ru_RU.UTF-8" };
	struct sl_load_sample s;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(locales) / sizeof(locales[0]); i++)
		if (setlocale(LC_NUMERIC, locales[i]) != NULL)
			break;
	/* Where no comma-decimal locale is installed this runs in "C": still true. */
	assert_int_equal(parse_str("llamacpp:kv_cache_usage_ratio 0.5\n", &s), 1);
	assert_true(s.kv_cache == 0.5);
	assert_int_equal(parse_str("llamacpp:kv_cache_usage_ratio 0,5\n", &s), 0);
	setlocale(LC_NUMERIC, "C");
}

static void
test_kv_is_clamped_and_max_over_label_sets(void **state)
{
	struct sl_load_sample s;

	(void)state;
	assert_int_equal(parse_str("vllm:gpu_cache_usage_perc{engine=\"0\"} 1.7\n", &s), 1);
	assert_true(s.kv_cache == 1.0);
	assert_int_equal(parse_str("vllm:gpu_cache_usage_perc{engine=\"0\"} 0.2\n"
	    "vllm:gpu_cache_usage_perc{engine=\"1\"} 0.9\n"
	    "vllm:kv_cache_usage_perc{engine=\"0\"} 0.4\n", &s), 1);
	assert_true(s.kv_cache == 0.9);
	assert_int_equal(parse_str("vllm:kv_cache_usage_perc 0\n", &s), 1);
	assert_int_equal(s.have_kv, 1);
	assert_true(s.kv_cache == 0);
}

static void
test_line_ends_blank_lines_and_no_last_newline(void **state)
{
	struct sl_load_sample s;

	(void)state;
	assert_int_equal(parse_str("\r\n\n  \t\ntgi_queue_size 3\r\n\r\n"
	    "tgi_batch_current_size 4", &s), 2);
	assert_true(s.waiting == 3 && s.running == 4);
	/* A lone CR is not a line end: the value token is then "3\rtgi_...". */
	assert_int_equal(parse_str("tgi_queue_size 3\rtgi_batch_current_size 4\n", &s), 0);
	/* Leading blanks before a sample are tolerated. */
	assert_int_equal(parse_str("   tgi_queue_size 3\n", &s), 1);
}

static void
test_body_need_not_be_nul_terminated(void **state)
{
	struct sl_load_sample s;
	const char *full = "tgi_queue_size 12345";

	(void)state;
	/* len stops inside the value: what lies beyond is not read. */
	assert_int_equal(parse(full, strlen("tgi_queue_size 12"), &s), 1);
	assert_true(s.waiting == 12);
	assert_int_equal(parse(full, strlen("tgi_queue_size"), &s), 0);
}

static void
test_very_long_lines(void **state)
{
	struct sl_load_sample s;
	size_t big = 1 << 20, k = 0;
	char *p = malloc(3 * big);
	const char *a = "vllm:num_requests_waiting{model_name=\"";
	const char *b = "\"} 6\nvllm:num_requests_running 2\n";

	(void)state;
	assert_non_null(p);
	memset(p, 'x', big);   /* a 1 MiB line of junk first */
	k = big;
	p[k++] = '\n';
	memcpy(p + k, a, strlen(a));
	k += strlen(a);
	memset(p + k, 'y', big);   /* a 1 MiB label value */
	k += big;
	memcpy(p + k, b, strlen(b));
	k += strlen(b);
	assert_int_equal(parse(p, k, &s), 2);
	assert_true(s.waiting == 6 && s.running == 2);
	free(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vllm_0_6_page),
		cmocka_unit_test(test_vllm_0_9_page_sums_engines_and_takes_fullest_cache),
		cmocka_unit_test(test_vllm_0_11_page_kv_cache_usage_and_not_waiting_by_reason),
		cmocka_unit_test(test_tgi_page_has_queue_and_batch_but_no_cache),
		cmocka_unit_test(test_llamacpp_page),
		cmocka_unit_test(test_empty_and_unrelated_pages_find_nothing),
		cmocka_unit_test(test_names_that_extend_a_wanted_name_do_not_match),
		cmocka_unit_test(test_comments_are_never_samples),
		cmocka_unit_test(test_labels_with_escapes),
		cmocka_unit_test(test_timestamps_and_trailing_fields_are_ignored),
		cmocka_unit_test(test_non_finite_and_negative_values_are_ignored),
		cmocka_unit_test(test_exponents_and_value_forms),
		cmocka_unit_test(test_number_parser),
		cmocka_unit_test(test_numbers_do_not_depend_on_the_locale),
		cmocka_unit_test(test_kv_is_clamped_and_max_over_label_sets),
		cmocka_unit_test(test_line_ends_blank_lines_and_no_last_newline),
		cmocka_unit_test(test_body_need_not_be_nul_terminated),
		cmocka_unit_test(test_very_long_lines),
	};

	return sl_unit_run(tests);
}

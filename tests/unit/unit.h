/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The main() of every unit test binary: `return sl_unit_run(tests);`.
 *
 * tests/run.py -k SUBSTR selects unit test cases by name, as it selects
 * end-to-end tests: a case is named BINARY::CASE (test_model::
 * test_read_multipart_model_field) and runs when its name contains one of
 * the substrings, which run.py passes one a line in $SLUICE_TEST_FILTER.
 * Unset, every case runs. Set, the binary first prints how many of its
 * cases it selected ("[  FILTER  ] 1 of 18 test(s) ..."), so run.py can
 * tell a binary that matched nothing (0 run, not a failure) from one whose
 * main() ignores the filter. cmocka 1.1's own cmocka_set_test_filter()
 * takes one glob, which cannot say "any of these", and sees no binary
 * name; hence this.
 */
#ifndef SL_UNIT_H
#define SL_UNIT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* Whether BINARY::CASE (bin: blen bytes) contains a line of filter. */
static int
sl_unit_selected(const char *bin, size_t blen, const char *name,
    const char *filter)
{
	size_t nlen = strlen(name), flen;
	char *full;
	const char *f, *nl;
	int hit = 0;

	if ((full = malloc(blen + 2 + nlen + 1)) == NULL)
		return 1;   /* run it rather than lose it */
	memcpy(full, bin, blen);
	memcpy(full + blen, "::", 2);
	memcpy(full + blen + 2, name, nlen + 1);
	for (f = filter; !hit; f = nl + 1) {
		nl = strchr(f, '\n');
		flen = nl != NULL ? (size_t)(nl - f) : strlen(f);
		if (flen <= blen + 2 + nlen) {
			size_t i;

			for (i = 0; i + flen <= blen + 2 + nlen && !hit; i++)
				hit = memcmp(full + i, f, flen) == 0;
		}
		if (nl == NULL)
			break;
	}
	free(full);
	return hit;
}

/*
 * Run the n cases of tests that $SLUICE_TEST_FILTER selects (all when it
 * is unset); file is the test's source (__FILE__), whose name without ".c"
 * is the binary's. Returns main()'s exit status. Use sl_unit_run().
 */
static int
sl_unit_run_(const char *file, const struct CMUnitTest *tests, size_t n)
{
	const char *filter = getenv("SLUICE_TEST_FILTER");
	const char *bin = strrchr(file, '/');
	struct CMUnitTest *sel;
	size_t blen, i, k = 0;
	int rc;

	/* What cmocka_run_group_tests(tests, NULL, NULL) expands to. */
	if (filter == NULL)
		return _cmocka_run_group_tests("tests", tests, n, NULL, NULL);
	bin = bin != NULL ? bin + 1 : file;
	blen = strlen(bin);
	if (blen > 2 && strcmp(bin + blen - 2, ".c") == 0)
		blen -= 2;
	if ((sel = calloc(n > 0 ? n : 1, sizeof(*sel))) == NULL) {
		fprintf(stderr, "%.*s: out of memory\n", (int)blen, bin);
		return 1;
	}
	for (i = 0; i < n; i++)
		if (sl_unit_selected(bin, blen, tests[i].name, filter))
			sel[k++] = tests[i];
	printf("[  FILTER  ] %zu of %zu test(s) selected by SLUICE_TEST_FILTER\n",
	    k, n);
	fflush(stdout);
	rc = k > 0 ? _cmocka_run_group_tests("tests", sel, k, NULL, NULL) : 0;
	free(sel);
	return rc;
}

#define sl_unit_run(tests) \
	sl_unit_run_(__FILE__, (tests), sizeof(tests) / sizeof((tests)[0]))

#endif

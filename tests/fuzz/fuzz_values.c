/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * fuzz_values: sl_parse_size() and sl_parse_duration_ms() on any string.
 *
 * The input, NUL-terminated in a buffer of exactly its size, goes to both
 * parsers. Each answer is compared with a reference written from the
 * grammar in sl_config.h (blanks, digits, optional fraction for durations,
 * a unit, blanks); a rejected string must leave the output untouched; an
 * accepted value must come back unchanged when printed as "<n>B" / "<n>ms"
 * (and in the largest unit that divides it) and parsed again.
 *
 * The parsers refuse some numbers near 2^64 that would fit (their
 * overflow checks are conservative); every configurable range ends far
 * below, so the reference lets either answer pass in that band.
 */
#include "config.h"

#include <inttypes.h>

#include "sl_config.h"
#include "fuzz.h"

#define SENTINEL 0xa5a5a5a5a5a5a5a5ULL

enum ref { REF_REJECT, REF_ACCEPT, REF_EITHER };

static const char *
blanks(const char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	return s;
}

/* Digits at *s into *v; 1 if the value is beyond what the parsers promise. */
static int
digits(const char **s, uint64_t *v)
{
	int big = 0;

	*v = 0;
	while (**s >= '0' && **s <= '9') {
		if (__builtin_mul_overflow(*v, 10, v) ||
		    __builtin_add_overflow(*v, (uint64_t)(**s - '0'), v))
			big = 1;
		(*s)++;
	}
	return big || *v > UINT64_MAX / 10;
}

/* The unit at s, blanks around it allowed: index in units or -1. */
static int
unit(const char *s, const char *const *units)
{
	size_t i, l;

	s = blanks(s);
	for (i = 0; units[i] != NULL; i++) {
		l = strlen(units[i]);
		if (strncmp(s, units[i], l) == 0 && *blanks(s + l) == '\0' &&
		    (l > 0 || *s == '\0'))
			return (int)i;
	}
	return -1;
}

static enum ref
ref_size(const char *s, uint64_t *out)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "", NULL };
	static const uint64_t mul[] = { 1, 1ULL << 10, 1ULL << 20, 1ULL << 30, 1 };
	uint64_t v;
	int big, u;

	s = blanks(s);
	if (*s < '0' || *s > '9')
		return REF_REJECT;
	big = digits(&s, &v);
	if ((u = unit(s, units)) == -1)
		return REF_REJECT;
	if (big)
		return REF_EITHER;
	if (__builtin_mul_overflow(v, mul[u], out))
		return REF_REJECT;
	return REF_ACCEPT;
}

static enum ref
ref_duration(const char *s, uint64_t *out)
{
	static const char *const units[] = { "ms", "s", "m", "h", NULL };
	static const uint64_t ms[] = { 1, 1000, 60000, 3600000 };
	uint64_t whole, frac = 0, scale = 1, w;
	int big, u, nd = 0;

	s = blanks(s);
	if (*s < '0' || *s > '9')
		return REF_REJECT;
	big = digits(&s, &whole);
	if (*s == '.') {
		s++;
		if (*s < '0' || *s > '9')
			return REF_REJECT;
		/* Nine places (a nanosecond of an hour is below a millisecond). */
		for (; *s >= '0' && *s <= '9'; s++, nd++)
			if (nd < 9) {
				frac = frac * 10 + (uint64_t)(*s - '0');
				scale *= 10;
			}
	}
	if ((u = unit(s, units)) == -1)
		return REF_REJECT;
	if (big)
		return REF_EITHER;
	if (__builtin_mul_overflow(whole, ms[u], &w) || w > UINT64_MAX / 2)
		return REF_REJECT;
	*out = w + frac * ms[u] / scale;
	/* The parser keeps results below 2^63; near that it may refuse. */
	return w > UINT64_MAX / 4 ? REF_EITHER : REF_ACCEPT;
}

/* parse(buf) must give want; buf is a value printed back. */
static void
again(int (*parse)(const char *, uint64_t *), const char *what, const char *buf,
    uint64_t want)
{
	uint64_t got = SENTINEL;

	fz_check(parse(buf, &got) == 0 && got == want, "reparse",
	    "%s(\"%s\") gave %" PRIu64 ", expected %" PRIu64, what, buf, got, want);
}

static void
check_size(const char *s)
{
	uint64_t got = SENTINEL, want = SENTINEL;
	char buf[64];
	int rc = sl_parse_size(s, &got);
	enum ref r = ref_size(s, &want);

	if (rc != 0)
		fz_check(got == SENTINEL, "untouched", "rejected size wrote its output");
	if (r != REF_EITHER) {
		if (rc != (r == REF_ACCEPT ? 0 : -1) || (rc == 0 && got != want))
			fz_dump("size", s, strlen(s));
		fz_check(rc == (r == REF_ACCEPT ? 0 : -1), "size-accept",
		    "sl_parse_size returned %d, the grammar says %s", rc,
		    r == REF_ACCEPT ? "accept" : "reject");
		fz_check(rc != 0 || got == want, "size-value",
		    "sl_parse_size gave %" PRIu64 ", expected %" PRIu64, got, want);
	}
	if (rc != 0)
		return;
	snprintf(buf, sizeof(buf), "%" PRIu64 "B", got);
	again(sl_parse_size, "sl_parse_size", buf, got);
	snprintf(buf, sizeof(buf), "%" PRIu64, got);
	again(sl_parse_size, "sl_parse_size", buf, got);
	snprintf(buf, sizeof(buf), " %" PRIu64 " B\t", got);
	again(sl_parse_size, "sl_parse_size", buf, got);
	if (got != 0 && got % (1ULL << 30) == 0)
		snprintf(buf, sizeof(buf), "%" PRIu64 "GiB", got >> 30);
	else if (got != 0 && got % (1ULL << 20) == 0)
		snprintf(buf, sizeof(buf), "%" PRIu64 "MiB", got >> 20);
	else if (got % (1ULL << 10) == 0)
		snprintf(buf, sizeof(buf), "%" PRIu64 "KiB", got >> 10);
	again(sl_parse_size, "sl_parse_size", buf, got);
}

static void
check_duration(const char *s)
{
	uint64_t got = SENTINEL, want = SENTINEL;
	char buf[64];
	int rc = sl_parse_duration_ms(s, &got);
	enum ref r = ref_duration(s, &want);

	if (rc != 0)
		fz_check(got == SENTINEL, "untouched", "rejected duration wrote its output");
	if (r != REF_EITHER) {
		if (rc != (r == REF_ACCEPT ? 0 : -1) || (rc == 0 && got != want))
			fz_dump("duration", s, strlen(s));
		fz_check(rc == (r == REF_ACCEPT ? 0 : -1), "duration-accept",
		    "sl_parse_duration_ms returned %d, the grammar says %s", rc,
		    r == REF_ACCEPT ? "accept" : "reject");
		fz_check(rc != 0 || got == want, "duration-value",
		    "sl_parse_duration_ms gave %" PRIu64 ", expected %" PRIu64, got, want);
	}
	if (rc != 0)
		return;
	snprintf(buf, sizeof(buf), "%" PRIu64 "ms", got);
	again(sl_parse_duration_ms, "sl_parse_duration_ms", buf, got);
	snprintf(buf, sizeof(buf), " %" PRIu64 " ms ", got);
	again(sl_parse_duration_ms, "sl_parse_duration_ms", buf, got);
	if (got != 0 && got % 3600000 == 0)
		snprintf(buf, sizeof(buf), "%" PRIu64 "h", got / 3600000);
	else if (got != 0 && got % 60000 == 0)
		snprintf(buf, sizeof(buf), "%" PRIu64 "m", got / 60000);
	else if (got % 1000 == 0)
		snprintf(buf, sizeof(buf), "%" PRIu64 "s", got / 1000);
	else
		snprintf(buf, sizeof(buf), "%" PRIu64 ".%03" PRIu64 "s", got / 1000, got % 1000);
	again(sl_parse_duration_ms, "sl_parse_duration_ms", buf, got);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);

	if (s == NULL)
		abort();
	memcpy(s, data, size);
	s[size] = '\0';
	check_size(s);
	check_duration(s);
	free(s);
	return 0;
}

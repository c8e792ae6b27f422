/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Engine load from a Prometheus text page: see sl_loadmetrics.h.
 *
 * One pass over the body, a line at a time, in place (nothing is copied,
 * so a line may be any length). Per line: skip comments and blank lines,
 * read the metric name and look it up in names[] by exact length and
 * bytes, skip the label set (honouring escapes inside quoted values),
 * read the value token and parse it by hand, so neither the locale nor
 * a missing NUL can change what is read. Every access is checked against
 * the end of the line.
 */
#include "config.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sl_loadmetrics.h"

enum signal { SIG_WAITING, SIG_RUNNING, SIG_KV };

static const struct {
	const char *name;
	enum signal sig;
} names[] = {
	{ "vllm:num_requests_waiting", SIG_WAITING },
	{ "vllm:num_requests_running", SIG_RUNNING },
	{ "vllm:kv_cache_usage_perc", SIG_KV },
	{ "vllm:gpu_cache_usage_perc", SIG_KV },
	{ "tgi_queue_size", SIG_WAITING },
	{ "tgi_batch_current_size", SIG_RUNNING },
	{ "llamacpp:requests_deferred", SIG_WAITING },
	{ "llamacpp:requests_processing", SIG_RUNNING },
	{ "llamacpp:kv_cache_usage_ratio", SIG_KV },
};

#define BLANK(c) ((c) == ' ' || (c) == '\t')
#define DIGIT(c) ((c) >= '0' && (c) <= '9')

static int
name_char(unsigned char c, int first)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
	    (!first && DIGIT(c));
}

/* Case-insensitive compare of s[0..len) with the lower-case word w. */
static int
word_is(const char *s, size_t len, const char *w)
{
	size_t i;

	if (len != strlen(w))
		return 0;
	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c >= 'A' && c <= 'Z')
			c = (unsigned char)(c - 'A' + 'a');
		if (c != (unsigned char)w[i])
			return 0;
	}
	return 1;
}

/* Exact powers of ten a double holds (10^0 .. 10^22). */
static const double pow10_exact[] = {
	1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
	1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

int
sl_loadmetrics_number(const char *s, size_t len, double *v)
{
	size_t i = 0;
	int neg = 0, ndig = 0, any = 0, eneg = 0;
	uint64_t mant = 0;
	long exp10 = 0, e = 0;
	long double r;
	double d;

	if (len > 0 && (s[0] == '+' || s[0] == '-')) {
		neg = s[0] == '-';
		i = 1;
	}
	if (word_is(s + i, len - i, "nan")) {
		*v = NAN;
		return 0;
	}
	if (word_is(s + i, len - i, "inf") || word_is(s + i, len - i, "infinity")) {
		*v = neg ? -INFINITY : INFINITY;
		return 0;
	}
	/*
	 * Keep the first 19 significant digits in a uint64 (exact), count the
	 * rest into the exponent; a double has 15-17, so nothing that matters
	 * for a queue length or a fraction is lost.
	 */
	for (; i < len && DIGIT(s[i]); i++) {
		any = 1;
		if (ndig < 19) {
			if (mant != 0 || s[i] != '0') {
				mant = mant * 10 + (uint64_t)(s[i] - '0');
				ndig++;
			}
		} else {
			exp10++;
		}
	}
	if (i < len && s[i] == '.') {
		for (i++; i < len && DIGIT(s[i]); i++) {
			any = 1;
			if (ndig < 19) {
				if (mant != 0 || s[i] != '0')
					ndig++;
				mant = mant * 10 + (uint64_t)(s[i] - '0');
				exp10--;
			}
		}
	}
	if (!any)
		return -1;
	if (i < len && (s[i] == 'e' || s[i] == 'E')) {
		i++;
		if (i < len && (s[i] == '+' || s[i] == '-')) {
			eneg = s[i] == '-';
			i++;
		}
		if (i >= len || !DIGIT(s[i]))
			return -1;
		for (; i < len && DIGIT(s[i]); i++)
			if (e < 100000)
				e = e * 10 + (s[i] - '0');
		exp10 += eneg ? -e : e;
	}
	if (i != len)
		return -1;
	/*
	 * Scale in long double (64-bit mantissa on x86, 113 on others), so the
	 * few roundings of a large exponent stay below the final one to double.
	 */
	r = (long double)mant;
	if (r != 0) {
		while (exp10 > 0) {
			long k = exp10 > 22 ? 22 : exp10;

			r *= (long double)pow10_exact[k];
			exp10 -= k;
			if (r > (long double)DBL_MAX)
				break;
		}
		while (exp10 < 0) {
			long k = -exp10 > 22 ? 22 : -exp10;

			r /= (long double)pow10_exact[k];
			exp10 += k;
			if (r == 0)
				break;
		}
	}
	d = r > (long double)DBL_MAX ? INFINITY : (double)r;
	*v = neg ? -d : d;
	return 0;
}

/*
 * Skip a label set starting at p[*i] == '{'. Returns 0 with *i just past the
 * closing brace, -1 if the line ends first or the set is malformed.
 */
static int
skip_labels(const char *p, size_t n, size_t *i)
{
	size_t k = *i + 1;

	for (;;) {
		while (k < n && BLANK(p[k]))
			k++;
		if (k >= n)
			return -1;
		if (p[k] == '}')
			break;
		if (!name_char((unsigned char)p[k], 1))
			return -1;
		while (k < n && name_char((unsigned char)p[k], 0))
			k++;
		while (k < n && BLANK(p[k]))
			k++;
		if (k >= n || p[k] != '=')
			return -1;
		k++;
		while (k < n && BLANK(p[k]))
			k++;
		if (k >= n || p[k] != '"')
			return -1;
		for (k++; k < n && p[k] != '"'; k++)
			if (p[k] == '\\')
				k++;   /* \" \\ \n: the next byte is part of the value */
		if (k >= n)
			return -1;
		k++;   /* closing quote */
		while (k < n && BLANK(p[k]))
			k++;
		if (k >= n)
			return -1;
		if (p[k] == ',')
			k++;
		else if (p[k] != '}')
			return -1;
	}
	*i = k + 1;
	return 0;
}

/* One line without its terminator: fold a wanted sample into out. */
static void
parse_line(const char *p, size_t n, struct sl_load_sample *out)
{
	size_t i = 0, name_at, name_len, v_at, k;
	int which = -1;
	double v;

	while (i < n && BLANK(p[i]))
		i++;
	if (i >= n || p[i] == '#' || !name_char((unsigned char)p[i], 1))
		return;
	name_at = i;
	while (i < n && name_char((unsigned char)p[i], 0))
		i++;
	name_len = i - name_at;
	for (k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		if (strlen(names[k].name) == name_len &&
		    memcmp(names[k].name, p + name_at, name_len) == 0) {
			which = (int)names[k].sig;
			break;
		}
	}
	if (which < 0)
		return;
	k = i;
	while (i < n && BLANK(p[i]))
		i++;
	if (i < n && p[i] == '{') {
		if (skip_labels(p, n, &i) < 0)
			return;
		k = i;
		while (i < n && BLANK(p[i]))
			i++;
	}
	if (i == k || i >= n)
		return;   /* the value must be separated from the name or labels */
	v_at = i;
	while (i < n && !BLANK(p[i]))
		i++;
	/* What follows the value (a timestamp, an exemplar) is not needed. */
	if (sl_loadmetrics_number(p + v_at, i - v_at, &v) < 0 || !isfinite(v) || v < 0)
		return;
	switch ((enum signal)which) {
	case SIG_WAITING:
		out->waiting += v;
		out->have_waiting = 1;
		break;
	case SIG_RUNNING:
		out->running += v;
		out->have_running = 1;
		break;
	case SIG_KV:
		if (v > 1)
			v = 1;
		if (!out->have_kv || v > out->kv_cache)
			out->kv_cache = v;
		out->have_kv = 1;
		break;
	}
}

int
sl_loadmetrics_parse(const char *body, size_t len, struct sl_load_sample *out)
{
	size_t at = 0, end, n;
	const char *nl;

	memset(out, 0, sizeof(*out));
	while (at < len) {
		nl = memchr(body + at, '\n', len - at);
		end = nl != NULL ? (size_t)(nl - body) : len;
		n = end - at;
		if (n > 0 && body[at + n - 1] == '\r')
			n--;
		parse_line(body + at, n, out);
		at = end + 1;
	}
	/* A sum of finite values can still overflow to +Inf. */
	if (!isfinite(out->waiting)) {
		out->waiting = 0;
		out->have_waiting = 0;
	}
	if (!isfinite(out->running)) {
		out->running = 0;
		out->have_running = 0;
	}
	return out->have_waiting + out->have_running + out->have_kv;
}

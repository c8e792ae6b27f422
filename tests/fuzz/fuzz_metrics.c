/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * libFuzzer target for src/loadmetrics.c and the prompt side of
 * src/affinity.c.
 *
 * Input: bytes 0-1 pick a split point, a block size and a max; all of the
 * input is a metrics page, and the input after byte 1 is a request body.
 *
 * Metrics parser:
 *   - the result is sane: the count is the number of signals had, values
 *     finite and >= 0, kv <= 1, a signal not had reads 0;
 *   - trailing comment and blank lines change nothing; without CR in the
 *     input, CRLF line ends change nothing;
 *   - cut after any LF, the two halves add up: have = either, kv = max,
 *     waiting/running = sum (to rounding);
 *   - sl_loadmetrics_number agrees with strtod (C locale) wherever it
 *     accepts a decimal number.
 * Prompt hashes: at most max; the same as sl_affinity_hash_text over the
 * prompt extracted here independently with jansson; a smaller max gives a
 * prefix; recorded in a table, the whole chain (up to capacity) is found.
 */
#include "config.h"

#include <math.h>

#include <jansson.h>

#include "fuzz.h"
#include "sl_affinity.h"
#include "sl_loadmetrics.h"

static void
check_sane(const struct sl_load_sample *s, int r)
{
	fz_check(s->have_waiting >= 0 && s->have_waiting <= 1 && s->have_running >= 0 &&
	    s->have_running <= 1 && s->have_kv >= 0 && s->have_kv <= 1, "have", "have flags");
	fz_check(r == s->have_waiting + s->have_running + s->have_kv, "count", "returned %d", r);
	fz_check(isfinite(s->waiting) && s->waiting >= 0 && isfinite(s->running) &&
	    s->running >= 0 && isfinite(s->kv_cache) && s->kv_cache >= 0 && s->kv_cache <= 1,
	    "range", "%g %g %g", s->waiting, s->running, s->kv_cache);
	fz_check((s->have_waiting || s->waiting == 0) && (s->have_running || s->running == 0) &&
	    (s->have_kv || s->kv_cache == 0), "zero-when-absent", "value without its flag");
}

static int
same(const struct sl_load_sample *a, const struct sl_load_sample *b)
{
	return a->have_waiting == b->have_waiting && a->have_running == b->have_running &&
	    a->have_kv == b->have_kv && a->waiting == b->waiting && a->running == b->running &&
	    a->kv_cache == b->kv_cache;
}

static int
close_to(double a, double b, double scale)
{
	return fabs(a - b) <= 1e-9 * (scale > 1 ? scale : 1);
}

static int
parse_copy(const char *p, size_t n, struct sl_load_sample *s)
{
	char *c = malloc(n ? n : 1);   /* exact size: ASan sees a read past n */
	int r;

	if (c == NULL)
		abort();
	if (n > 0)
		memcpy(c, p, n);
	r = sl_loadmetrics_parse(c, n, s);
	free(c);
	return r;
}

static void
check_metrics(const char *in, size_t len, size_t cut_seed, int big)
{
	struct sl_load_sample s, t, a, b;
	struct fz_buf x = { 0 };
	size_t i, cut;
	int r, ra, rb;

	r = parse_copy(in, len, &s);
	check_sane(&s, r);

	fz_add(&x, in, len);
	fz_add(&x, "\n# HELP x y\n\n\r\n", 16);
	parse_copy((const char *)x.p, x.len, &t);
	fz_check(same(&s, &t), "comment-tail", "a comment line changed the result");
	fz_free(&x);

	if (memchr(in, '\r', len) == NULL) {
		for (i = 0; i < len; i++) {
			if (in[i] == '\n')
				fz_add(&x, "\r", 1);
			fz_add(&x, in + i, 1);
		}
		parse_copy((const char *)x.p, x.len, &t);
		fz_check(same(&s, &t), "crlf", "CRLF line ends changed the result");
		fz_free(&x);
	}

	/* Cut just after the first LF at or after cut_seed. */
	if (len == 0)
		return;
	for (cut = cut_seed % len; cut < len && in[cut] != '\n'; cut++)
		;
	if (cut >= len)
		return;
	cut++;
	ra = parse_copy(in, cut, &a);
	rb = parse_copy(in + cut, len - cut, &b);
	check_sane(&a, ra);
	check_sane(&b, rb);
	fz_check(s.have_kv == (a.have_kv | b.have_kv) &&
	    s.kv_cache == (a.kv_cache > b.kv_cache ? a.kv_cache : b.kv_cache), "halves-kv",
	    "kv %d %g vs %d %g / %d %g", s.have_kv, s.kv_cache, a.have_kv, a.kv_cache, b.have_kv,
	    b.kv_cache);
	/* With huge values a sum may overflow (and be dropped) in one part only. */
	if (big)
		return;
	fz_check(s.have_waiting == (a.have_waiting | b.have_waiting) &&
	    close_to(s.waiting, a.waiting + b.waiting, a.waiting + b.waiting),
	    "halves-sum", "waiting %g vs %g + %g", s.waiting, a.waiting, b.waiting);
	fz_check(s.have_running == (a.have_running | b.have_running) &&
	    close_to(s.running, a.running + b.running, a.running + b.running),
	    "halves-sum", "running %g vs %g + %g", s.running, a.running, b.running);
}

/*
 * sl_loadmetrics_number against strtod on each blank-separated token (every
 * value token the parser reads is one of them). Returns 1 when one of them
 * is so large that a sum of them may overflow.
 */
#define SEP(c) ((c) == ' ' || (c) == '\n' || (c) == '\t' || (c) == '\r')
static int
check_numbers(const char *in, size_t len)
{
	int big = 0;

	char tok[128], *end;
	size_t i = 0, j, n;
	double mine, ref;

	while (i < len) {
		while (i < len && SEP(in[i]))
			i++;
		for (j = i; j < len && !SEP(in[j]); j++)
			;
		n = j - i;
		if (n > 0 && sl_loadmetrics_number(in + i, n, &mine) == 0 && !isnan(mine) &&
		    fabs(mine) > 1e290)
			big = 1;
		if (n > 0 && n < sizeof(tok) && sl_loadmetrics_number(in + i, n, &mine) == 0) {
			memcpy(tok, in + i, n);
			tok[n] = '\0';
			ref = strtod(tok, &end);
			fz_check(end == tok + n, "number-grammar", "strtod stops early in '%s'", tok);
			if (isnan(ref))
				fz_check(isnan(mine), "number-value", "'%s': %g vs nan", tok, mine);
			else if (fabs(ref) < 1e-300)
				fz_check(fabs(mine) < 1e-300, "number-value", "'%s': %g vs %g", tok,
				    mine, ref);
			else if (isinf(ref) || isinf(mine))
				fz_check(mine == ref || (isinf(mine) && fabs(ref) > 1.79e308) ||
				    (isinf(ref) && fabs(mine) > 1.79e308), "number-value",
				    "'%s': %g vs %g", tok, mine, ref);
			else
				fz_check(fabs(mine - ref) <= 4e-16 * fabs(ref), "number-value",
				    "'%s': %.17g vs %.17g", tok, mine, ref);
		}
		i = j;
	}
	return big;
}

static void
add_string(struct fz_buf *b, const json_t *s)
{
	if (json_is_string(s))
		fz_add(b, json_string_value(s), json_string_length(s));
}

/* The prompt text, per the contract in sl_affinity.h, written out plainly. */
static int
extract(const char *in, size_t len, struct fz_buf *t)
{
	json_error_t err;
	json_t *root = json_loadb(in, len, JSON_ALLOW_NUL, &err), *msgs, *c, *part, *pr;
	size_t i, k;

	if (root == NULL)
		return 0;
	if (json_is_object(root)) {
		msgs = json_object_get(root, "messages");
		pr = json_object_get(root, "prompt");
		if (json_is_array(msgs)) {
			for (i = 0; i < json_array_size(msgs); i++) {
				c = json_object_get(json_array_get(msgs, i), "content");
				add_string(t, c);
				for (k = 0; json_is_array(c) && k < json_array_size(c); k++) {
					part = json_array_get(c, k);
					if (json_is_string(json_object_get(part, "type")) &&
					    json_string_length(json_object_get(part, "type")) == 4 &&
					    memcmp(json_string_value(json_object_get(part, "type")),
					    "text", 4) == 0)
						add_string(t, json_object_get(part, "text"));
				}
			}
		} else if (json_is_string(pr)) {
			add_string(t, pr);
		} else {
			for (i = 0; json_is_array(pr) && i < json_array_size(pr); i++)
				add_string(t, json_array_get(pr, i));
		}
	}
	json_decref(root);
	return 1;
}

static void
check_affinity(const char *in, size_t len, size_t block, size_t max)
{
	uint64_t h[64], g[64], k[64];
	struct fz_buf t = { 0 };
	struct sl_affinity *a;
	size_t n, m, i, matched;
	char *c = malloc(len ? len : 1);

	if (c == NULL)
		abort();
	if (len > 0)
		memcpy(c, in, len);
	n = sl_affinity_hashes(c, len, block, h, max);
	free(c);
	fz_check(n <= max, "hash-max", "%zu hashes for max %zu", n, max);
	/*
	 * The oracle is jansson's tree. Where jansson and the walker differ on
	 * what is a body (it refuses NaN, a BOM, lone surrogates; it skips a raw
	 * NUL between tokens, which Python and the walker refuse) there is none.
	 */
	if (extract(in, len, &t) && memchr(in, '\0', len) == NULL) {
		m = sl_affinity_hash_text((const char *)t.p, t.len, block, g, max);
		fz_check(m == n && (n == 0 || memcmp(h, g, n * sizeof(h[0])) == 0), "hash-text",
		    "%zu hashes of the body, %zu of its %zu-byte prompt", n, m, t.len);
		if (t.len > 0)
			fz_check(n == (t.len / block < max ?
			    (t.len < block ? 1 : t.len / block) : max), "hash-count",
			    "%zu hashes of %zu bytes, block %zu, max %zu", n, t.len, block, max);
	}
	if (n > 1) {
		m = sl_affinity_hashes(in, len, block, k, n / 2);
		fz_check(m == n / 2 && memcmp(h, k, m * sizeof(h[0])) == 0, "hash-prefix",
		    "a smaller max is not a prefix");
	}
	fz_free(&t);
	if (n > 0) {
		a = sl_affinity_new(16);
		if (a == NULL)
			abort();
		sl_affinity_record(a, 1, h, n, 2);
		i = (size_t)sl_affinity_lookup(a, 1, h, n, &matched);
		fz_check(i == 2 && matched == (n < 16 ? n : 16) && sl_affinity_size(a) == matched,
		    "table", "lookup %zu matched %zu of %zu, size %u", i, matched, n,
		    sl_affinity_size(a));
		sl_affinity_drop_replica(a, 1, 2);
		fz_check(sl_affinity_size(a) == 0, "table", "drop left %u", sl_affinity_size(a));
		sl_affinity_free(a);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *in = (const char *)data;

	int big = check_numbers(in, size);

	check_metrics(in, size, size >= 2 ? (size_t)data[0] << 8 | data[1] : 0, big);
	if (size >= 2)
		check_affinity(in + 2, size - 2, 1 + data[0] % 80, 1 + data[1] % 64);
	return 0;
}

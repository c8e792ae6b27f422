/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The usage scanner's event templates: an event recorded once (the
 * scanner's state before and after it) is applied to the next events of
 * the same shape without lexing them byte by byte. Private to
 * usage_scan.c, which applies them, and usage_template.c, which records
 * them; the lexer's state is usage_lexer.h's.
 */
#ifndef SL_USAGE_TEMPLATE_H
#define SL_USAGE_TEMPLATE_H

#include "usage_lexer.h"

/* ------------------------------------------------------------------ event templates */

/* A template (usage_template.c says when an event is one). */
#define TPL_MAX_EVENT SL_USAGE_TEMPLATE    /* far below SL_USAGE_MAX_EVENT */
#define TPL_MAX_RANGES 4

struct sl_usage_tpl {
	const char *ev;         /* the template's bytes ev[0..len); NULL: none */
	uint32_t len;
	uint32_t s0, s1;        /* its counted string ev[s0..s1), quotes outside */
	uint32_t content;       /* content bytes it added, less the string's */
	uint16_t r_off[TPL_MAX_RANGES], r_end[TPL_MAX_RANGES];  /* from ev; r_off[0] unused */
	uint16_t run;           /* where it left the run, if run_moved */
	uint8_t nr;             /* ranges it emitted */
	uint8_t run_moved;
	uint8_t avx2;           /* the CPU has AVX2 (asked when recorded) */
	uint32_t cap;           /* kept (sl_usage_scan_keep): bytes of copy[] */
	char copy[];
};

/* An event being recorded: where it started, and all as it was there. */
struct rec {
	size_t i;               /* SIZE_MAX: none */
	size_t n, run_s;        /* out->n and the run then */
	struct sl_usage_scan s;
};

/*
 * s->tpl, the kept template, with room for an event of n bytes (its
 * template, if any, is unchanged). 0: none (too big, or no memory).
 */
int usage_tpl_room(struct sl_usage_scan *s, size_t n);

/*
 * The event recorded in r ended at f->in[j], with the scanner now as s:
 * t becomes its template if it is one, else t->ev is NULL.
 */
void usage_tpl_record(struct sl_usage_tpl *t, const struct rec *r,
    const struct sl_usage_scan *s, const struct feed *f, size_t j);

/*
 * Applying a template: tpl_apply() runs once per event in the scanner's
 * loop, so it is inline there (out of line it cost up to 10 % of the
 * scanner's time per byte in bench/scan-micro); the compares it makes
 * were out of line already.
 */
#if defined(__SSE2__) && !defined(SL_USAGE_NO_SIMD)
#define TPL_SSE2 1           /* the compares take 16 bytes at a time */
#endif

/*
 * a[0..n) is b[0..n), but where both bytes are digits (32 bytes at a time
 * with AVX2 where avx2 says the CPU has it).
 */
int usage_same_but_digits(const char *a, const char *b, size_t n, int avx2);

/* The first quote, backslash, CR or LF of p[0..e), or e. */
static inline const char *
str_stop(const char *p, const char *e)
{
#ifdef TPL_SSE2
	const __m128i q = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\');
	const __m128i cr = _mm_set1_epi8('\r'), lf = _mm_set1_epi8('\n');
	__m128i v;
	unsigned m;

	for (; e - p >= 16; p += 16) {
		v = _mm_loadu_si128((const __m128i *)(const void *)p);
		m = (unsigned)_mm_movemask_epi8(_mm_or_si128(
		    _mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, bs)),
		    _mm_or_si128(_mm_cmpeq_epi8(v, cr), _mm_cmpeq_epi8(v, lf))));
		if (m != 0)
			return p + __builtin_ctz(m);
	}
#endif
	while (p < e && *p != '"' && *p != '\\' && *p != '\r' && *p != '\n')
		p++;
	return p;
}

/*
 * The event at f->in[i] (len: the call's input length) is t's: does to s
 * and f what the scanner would have done and returns the event's length;
 * 0, with s and f untouched, when it is not.
 */
static inline size_t
tpl_apply(const struct sl_usage_tpl *t, struct sl_usage_scan *s,
    struct feed *f, size_t i, size_t len)
{
	const char *p = f->in + i, *q, *lim;
	size_t blen = t->len - t->s1, avail = len - i, n, k, esc = 0, cnt;

	if (avail > TPL_MAX_EVENT)
		avail = TPL_MAX_EVENT;
	if (avail < t->s0 + blen || !usage_same_but_digits(p, t->ev, t->s0, t->avx2))
		return 0;
	/*
	 * The string to its quote (by lim, where the rest must start), counted
	 * as lex_fast() counts it: an escape is one byte.
	 */
	lim = p + avail - blen;
	for (q = p + t->s0;;) {
		if ((q = str_stop(q, p + avail)) > lim)
			return 0;
		if (*q == '"')
			break;
		if (*q != '\\')
			return 0;       /* a line end */
		n = q + 1 < lim && q[1] == 'u' ? 6 : 2;
		if ((size_t)(lim - q) < n)
			return 0;
		for (k = 1; k < n; k++)
			if (q[k] == '\r' || q[k] == '\n')
				return 0;
		esc += n - 1;           /* bytes not counted */
		q += n;
	}
	n = (size_t)(q - (p + t->s0));
	cnt = n - esc;
	if ((esc == 0 && key_of(p + t->s0, n) != 0) ||
	    !usage_same_but_digits(q, t->ev + t->s1, blen, t->avx2))
		return 0;

	s->content_bytes += t->content + cnt;
#define TPL_AT(x) (i + ((x) > t->s1 ? (x) - (t->s1 - t->s0) + n : (x)))
	for (k = 0; k < t->nr; k++) {
		if (k > 0)
			f->run_s = TPL_AT(t->r_off[k]);
		emit(f, TPL_AT(t->r_end[k]));
	}
	if (t->run_moved)
		f->run_s = TPL_AT(t->run);
#undef TPL_AT
	return (size_t)(q - p) + blen;
}

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The SSE scanner's event templates: an event taken in a compare against
 * the one before it. Here: recording a template and the compare of bytes;
 * applying one, tpl_apply(), is inline in usage_lexer.h.
 *
 * A runner's events differ from one another in the token (a counted string)
 * and in numbers (a sequence, a timestamp); the rest are the same bytes.
 * When the scanner has taken one event the ordinary way, and that event
 * left the scanner in the very state it found it in, copied no usage
 * object, and had a counted string lex_fast() took whole and that is none
 * of the keys, it is the template. A next event that has the template's
 * bytes up to that string's opening quote and from its closing quote on
 * (where both bytes are digits they may differ), and in between a string
 * of any length with no line end that is none of the keys, is taken in a
 * compare: the scanner would go through the same states on it (all digits
 * are one class to every part of it; only a usage object's copy reads
 * their values, and the template copied none; the string changes only the
 * count), so it does what it did on the template: the same content bytes
 * but for the string's, the same ranges forwarded and cut (shifted by the
 * string's change of length), the same state after. The fuzz target holds
 * this to the reference scanner. Within one call the template is the
 * call's input and nothing is allocated; across calls it is a copy in
 * s->tpl, kept only while the caller allows (sl_usage_scan_keep()), and
 * any event taken the ordinary way in between ends it.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sl_usage.h"
#include "usage_template.h"

static inline int
digit(char c)
{
	return (unsigned char)(c - '0') < 10;
}

#ifdef TPL_SSE2
/* The 16 bytes at a and b: equal but where both are digits? */
static inline int
same16(const char *a, const char *b)
{
	const __m128i lo = _mm_set1_epi8('0' - 1), hi = _mm_set1_epi8('9' + 1);
	__m128i x = _mm_loadu_si128((const __m128i *)(const void *)a);
	__m128i y = _mm_loadu_si128((const __m128i *)(const void *)b);
	unsigned ne = 0xffffu ^ (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, y));

	if (ne == 0)
		return 1;
	/* (signed compares: bytes past 0x7f are below '0') */
	x = _mm_and_si128(_mm_cmpgt_epi8(x, lo), _mm_cmplt_epi8(x, hi));
	y = _mm_and_si128(_mm_cmpgt_epi8(y, lo), _mm_cmplt_epi8(y, hi));
	return (ne & ~(unsigned)_mm_movemask_epi8(_mm_and_si128(x, y))) == 0;
}
#endif

#ifdef SL_USAGE_AVX2
/* same_but_digits() for n >= 32, 32 bytes at a time. */
static __attribute__((target("avx2"), noinline)) int
same_but_digits_avx2(const char *a, const char *b, size_t n)
{
	const __m256i lo = _mm256_set1_epi8('0' - 1), hi = _mm256_set1_epi8('9' + 1);
	__m256i x, y;
	uint32_t ne;
	size_t k;

	for (k = 0;; k += 32) {
		if (k + 32 > n)
			k = n - 32;             /* the last 32, overlapping */
		x = _mm256_loadu_si256((const __m256i *)(const void *)(a + k));
		y = _mm256_loadu_si256((const __m256i *)(const void *)(b + k));
		ne = ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(x, y));
		if (ne != 0) {
			x = _mm256_and_si256(_mm256_cmpgt_epi8(x, lo), _mm256_cmpgt_epi8(hi, x));
			y = _mm256_and_si256(_mm256_cmpgt_epi8(y, lo), _mm256_cmpgt_epi8(hi, y));
			if ((ne & ~(uint32_t)_mm256_movemask_epi8(_mm256_and_si256(x, y))) != 0)
				return 0;
		}
		if (k + 32 == n)
			return 1;
	}
}
#endif

/* a[0..n) is b[0..n), but where both bytes are digits. */
int
usage_same_but_digits(const char *a, const char *b, size_t n, int avx2)
{
	size_t k;

#ifdef SL_USAGE_AVX2
	if (avx2 && n >= 32)
		return same_but_digits_avx2(a, b, n);
#else
	(void)avx2;
#endif
#ifdef TPL_SSE2
	if (n >= 16) {
		for (k = 0;; k += 16) {
			if (k + 16 > n)
				k = n - 16;     /* the last 16, overlapping */
			if (!same16(a + k, b + k))
				return 0;
			if (k + 16 == n)
				return 1;
		}
	}
#endif
	for (k = 0; k < n; k++)
		if (a[k] != b[k] && (!digit(a[k]) || !digit(b[k])))
			return 0;
	return 1;
}

/*
 * a and b as the scanner goes on from them, at an event boundary: every
 * field but the count, the instrumentation, and those set before they are
 * read again from where a blank line leaves the scanner (pfx under H_NEW,
 * field at a line's start, kpos with no key candidate, ux in value
 * position, the matcher's fields with no match under way); a, which
 * event_end() left, is checked to be there.
 */
static int
same_state(const struct sl_usage_scan *a, const struct sl_usage_scan *b)
{
	return a->hs == H_NEW && a->line == LS_START && a->lx == LX_VAL && a->kmask == 0 &&
	    a->mt == MT_NONE && a->cap_depth == 0 && a->hold_len == 0 &&
	    a->prompt == b->prompt && a->completion == b->completion &&
	    a->total == b->total && a->hold == b->hold && a->cap == b->cap &&
	    a->hold_len == b->hold_len && a->hold_alloc == b->hold_alloc &&
	    a->cap_len == b->cap_len && a->cap_alloc == b->cap_alloc &&
	    a->depth == b->depth && a->cap_depth == b->cap_depth &&
	    a->drop == b->drop && a->dropped == b->dropped && a->have == b->have &&
	    a->cr == b->cr && a->line == b->line && a->hs == b->hs &&
	    a->kmask == b->kmask && a->key == b->key && a->cnt == b->cnt &&
	    a->ev == b->ev && a->lx == b->lx && a->top == b->top &&
	    a->after_drop == b->after_drop && a->pending_ok == b->pending_ok &&
	    a->mt == b->mt && a->first == b->first &&
	    a->p_prompt == b->p_prompt && a->p_completion == b->p_completion &&
	    a->p_total == b->p_total;
}

/* A position of the template that is not inside its string: kept. */
static int
tpl_pos(const struct sl_usage_tpl *t, size_t x)
{
	return x < t->s0 || x > t->s1;
}

/*
 * s->tpl, the kept template, with room for an event of n bytes (its
 * template, if any, is unchanged). 0: none (too big, or no memory).
 */
int
usage_tpl_room(struct sl_usage_scan *s, size_t n)
{
	struct sl_usage_tpl *t;
	size_t cap;

	if (n > TPL_MAX_EVENT)
		return 0;
	if (s->tpl != NULL && s->tpl->cap >= n)
		return 1;
	cap = (n + 63) & ~(size_t)63;
	if ((t = realloc(s->tpl, sizeof(*t) + cap)) == NULL)
		return 0;
	if (s->tpl == NULL)
		t->ev = NULL;
	else if (t->ev != NULL)
		t->ev = t->copy;        /* (moved with it) */
	t->cap = (uint32_t)cap;
	s->tpl = t;
	return 1;
}

/*
 * The event recorded from r ended at j, with the scanner as s: make it the
 * template if it is one (see above); otherwise there is none.
 */
void
usage_tpl_record(struct sl_usage_tpl *t, const struct rec *r,
    const struct sl_usage_scan *s, const struct feed *f, size_t j)
{
	const struct sl_usage_out *o = f->out;
	const char *ev = f->in + r->i;
	size_t k, x, end;

	t->ev = NULL;
	if (j - r->i > TPL_MAX_EVENT || f->cs0 == NULL || f->cs0 <= ev ||
	    f->cs1 >= f->in + j || s->capt || o->held_len != 0 ||
	    o->n - r->n > TPL_MAX_RANGES || !same_state(s, &r->s) ||
	    key_of(f->cs0, (size_t)(f->cs1 - f->cs0)) != 0)
		return;
#ifdef SL_USAGE_AVX2
	t->avx2 = __builtin_cpu_supports("avx2") != 0;
#else
	t->avx2 = 0;
#endif
	t->len = (uint32_t)(j - r->i);
	t->s0 = (uint32_t)(f->cs0 - ev);
	t->s1 = (uint32_t)(f->cs1 - ev);
	t->content = (uint32_t)(s->content_bytes - r->s.content_bytes - (t->s1 - t->s0));
	t->nr = (uint8_t)(o->n - r->n);
	for (k = 0; k < t->nr; k++) {
		x = o->range[r->n + k].off;
		end = x + o->range[r->n + k].len;
		if (k == 0 ? x != r->run_s : x < r->i || !tpl_pos(t, x - r->i))
			return;
		if (end <= r->i || !tpl_pos(t, end - r->i))
			return;
		t->r_off[k] = (uint16_t)(x - r->i);
		t->r_end[k] = (uint16_t)(end - r->i);
	}
	t->run_moved = f->run_s != r->run_s;
	if (t->run_moved) {
		if (f->run_s < r->i || !tpl_pos(t, f->run_s - r->i))
			return;
		t->run = (uint16_t)(f->run_s - r->i);
	}
	if (t == s->tpl) {
		if (t->cap < t->len)
			return;         /* (sl_usage_scan_feed() made room) */
		memcpy(t->copy, ev, t->len);
		ev = t->copy;
	}
	t->ev = ev;
}

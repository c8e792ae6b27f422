/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * What the files of token usage promise one another; sl_usage.h is what
 * they promise the rest of sluice.
 *
 *   usage.c          the usage object: a "usage" member's bytes read into
 *                    struct sl_usage, as jansson and usage_from_obj() would
 *   usage_request.c  the request editor (nothing of it is shared here)
 *   usage_scan.c     the SSE scanner: lines, the JSON lexer, the hold and
 *                    cut of the usage event
 *   usage_simd.c     the scanner's block loaders: class masks of 64 bytes
 *   usage_template.c the scanner's event templates: an event like the one
 *                    before it taken in a compare
 *   usage_api.c      the responses and messages streams' own scanner, and
 *                    those APIs' (and embeddings') non-streamed bodies
 *
 * What is called per byte or per token stays static inline here or static
 * in the scanner's own file: only calls made once per 64 bytes, per event
 * or per usage object cross files.
 */
#ifndef SL_USAGE_LEXER_H
#define SL_USAGE_LEXER_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(SL_USAGE_NO_SIMD) && \
    !defined(SL_USAGE_NO_AVX2)
#include <immintrin.h>
#define SL_USAGE_AVX2 1         /* used when the CPU has it (asked once per run) */
#endif

#include "sl_usage.h"

/* ------------------------------------------------------------------ usage object */

/*
 * The bytes p[0..len) of a usage object as the scanner copied them: 1 with
 * *u filled when they are one JSON object whose "prompt_tokens" and
 * "completion_tokens" are non-negative integers ("total_tokens" optional,
 * likewise), 0 for anything else (*u then unspecified).
 */
int usage_obj_read(const char *p, size_t len, struct sl_usage *u);

/*
 * usage_api.c: a usage object's counts read without jansson, for the names
 * given: r[i] one of these, v[i] the integer (UCR_INT) or 0. 1 when read,
 * -1 when jansson must decide (escapes, floats, deeper nesting, ...).
 */
enum { UCR_OTHER = -1, UCR_ABSENT = 0, UCR_INT = 1, UCR_NULL = 2 };
int usage_counts_read(const char *p, size_t len, const char *const *names, int n,
    int *r, uint64_t *v);

/*
 * usage_api.c: the scanner of the responses and messages streams, for a
 * struct sl_usage_scan whose api is set (sl_usage_scan_init_api); the
 * public feed and finish hand such a scanner over at their top.
 */
size_t usage_api_feed(struct sl_usage_scan *s, const char *in, size_t len,
    struct sl_usage_out *out);
void usage_api_finish(struct sl_usage_scan *s, struct sl_usage_out *out);
/*
 * And its side of the public *_api calls, which usage.c dispatches by API
 * (chat and completions stay usage.c's): a freshly initialised scanner
 * made a Responses or Messages one; a JSON answer's usage and content.
 */
void usage_api_init(struct sl_usage_scan *s, enum sl_api api);
int usage_api_from_json(enum sl_api api, const char *body, size_t len,
    struct sl_usage *u);
uint64_t usage_api_json_content(enum sl_api api, const char *body, size_t len);

/* ------------------------------------------------------------------ scanner state */

/*
 * The values of struct sl_usage_scan's state fields, by field.
 * line: where in the current SSE line
 */
enum { LS_START, LS_FIELD, LS_DATA_SP, LS_DATA, LS_IGNORE };
/* hs: what happens to the current event's bytes */
enum {
	H_NEW,        /* at an event boundary: decided at the event's first byte */
	H_PASS,       /* forwarded */
	H_PREFIX,     /* held: does the first data line start "data:" [" "] "{"? */
	H_HOLD        /* held: is it the usage event? */
};
/* lx: JSON lexer over the event's data */
enum { LX_VAL, LX_STR, LX_ESC, LX_U, LX_AFTER_STR, LX_AFTER_COLON, LX_CHOICES };
/*
 * Keys the lexer recognises (raw, unescaped bytes). The string values of
 * the K_COUNT keys are counted for the estimate, wherever they are: the
 * text (content, text), tool calls' function arguments and the reasoning
 * (vLLM's reasoning_content, reasoning) a client is sent.
 */
enum {
	K_USAGE = 1, K_CONTENT = 2, K_TEXT = 4, K_CHOICES = 8, K_ARGUMENTS = 16,
	K_REASONING = 32, K_REASONING_CONTENT = 64, K_ALL = 127,
	K_COUNT = K_CONTENT | K_TEXT | K_ARGUMENTS | K_REASONING | K_REASONING_CONTENT
};
/* ev: per-event facts */
enum {
	EV_DATA = 1,        /* a data line was seen (the next one joins with \n) */
	EV_USAGE = 2,       /* "usage": { at depth 1 */
	EV_BAD = 4,         /* not one JSON object */
	EV_NOTDROP = 8,     /* known not to be the usage chunk */
	EV_CAPFAIL = 16     /* the usage object did not fit or memory ran out */
};
enum { TOP_NONE, TOP_OPEN, TOP_CLOSED };

/* mt: the matcher of a "usage" member to cut, over the raw bytes of one data line */
enum {
	MT_NONE,
	MT_SEP,       /* after the comma: blanks, then the key's quote */
	MT_KEY,       /* mpos bytes of usage" seen */
	MT_COLON,     /* blanks, then the colon */
	MT_VALUE,     /* blanks, then null (or an object's brace) */
	MT_NULL,      /* mpos bytes of null seen */
	MT_END,       /* blanks, then a comma or the closing brace */
	MT_OBJ        /* a usage object (the lexer follows it) until it closes */
};

/* Per call: the forwarded run of in [run_s, ..) and the held tail [tent_s, ..). */
struct feed {
	struct sl_usage_out *out;
	const char *in;
	size_t run_s, tent_s;
	int stop;               /* end the call before the byte where it was set */
	int cap_busy;           /* s->cap holds what out->held points to */
	const char *cs0, *cs1;  /* the last counted string lex_fast() took whole */
};

static inline void
emit(struct feed *f, size_t end)
{
	struct sl_usage_out *o = f->out;

	if (end <= f->run_s)
		return;
	if (o->n == SL_USAGE_MAX_RANGES)
		abort();      /* broken invariant: mt_begin() keeps three ranges spare */
	o->range[o->n].off = f->run_s;
	o->range[o->n].len = end - f->run_s;
	o->n++;
}

/* The recognised key the whole raw string p[0..n) is (K_*), or 0. */
static inline unsigned
key_of(const char *p, size_t n)
{
	switch (n) {
	case 4:
		return memcmp(p, "text", 4) == 0 ? K_TEXT : 0;
	case 5:
		return memcmp(p, "usage", 5) == 0 ? K_USAGE : 0;
	case 7:
		if (memcmp(p, "content", 7) == 0)
			return K_CONTENT;
		return memcmp(p, "choices", 7) == 0 ? K_CHOICES : 0;
	case 9:
		if (memcmp(p, "arguments", 9) == 0)
			return K_ARGUMENTS;
		return memcmp(p, "reasoning", 9) == 0 ? K_REASONING : 0;
	case 17:
		return memcmp(p, "reasoning_content", 17) == 0 ? K_REASONING_CONTENT : 0;
	default:
		return 0;
	}
}

/* ------------------------------------------------------------------ block loaders */

/*
 * Byte classes: the bytes that end a skip. Inside a string only its end,
 * an escape and a line end matter; between values (below the top level)
 * only strings, brackets and line ends do: commas, colons, numbers,
 * literals and blanks change nothing there (but a comma at the top level
 * in drop mode, where a "usage":null member may start).
 */
enum { C_STR = 1, C_VAL = 2, C_VAL1 = 4 };
extern const uint8_t usage_cls[256];

/*
 * Class masks of 64 bytes of a data line, computed once and read by
 * lex_fast() with a count of trailing zeros per token instead of a scan
 * per token. Bit j describes base + j; the bytes from the run's end on are
 * set in str and val as if they were line ends, so a search stops there.
 */
struct blk {
	uintptr_t base;         /* the masks' first byte; lo - 64 before a load */
	const char *lo;         /* the call's input: loads may start there */
	uint64_t str;           /* C_STR: " \ CR LF */
	uint64_t val;           /* C_VAL: " CR LF { } [ ] */
	uint64_t cm;            /* commas (C_VAL1 is val | cm) */
	int avx2;               /* the CPU has AVX2 (asked once per run) */
};

/*
 * b's masks for [p, p + 64), p < e, b->base set to p; nothing before
 * b->lo or at or past e is read, and the bits of the bytes from e on are
 * set in str and val (a line end) and clear in cm. The same masks either
 * way; the AVX2 one only where the CPU has AVX2.
 */
void usage_blk_load(struct blk *b, const char *p, const char *e);
#ifdef SL_USAGE_AVX2
void usage_blk_load_avx2(struct blk *b, const char *p, const char *e);
#endif

/* An event is held whole, undecided yet. */
static inline int
held(const struct sl_usage_scan *s)
{
	return s->hs == H_PREFIX || s->hs == H_HOLD;
}

/* Bytes are held: an undecided event, or what may be a "usage":null member. */
static inline int
holding(const struct sl_usage_scan *s)
{
	return held(s) || s->mt != MT_NONE;
}

/*
 * The first byte of [p, e) in class k, or e. Sixteen bytes at a time where
 * SSE2 is there (every x86-64), then a table lookup per byte.
 */
static inline const char *
skip(const char *p, const char *e, unsigned k)
{
#if defined(__SSE2__) && !defined(SL_USAGE_NO_SIMD)
	const __m128i q = _mm_set1_epi8('"'), cr = _mm_set1_epi8('\r'),
	    lf = _mm_set1_epi8('\n'), bs = _mm_set1_epi8('\\'),
	    b20 = _mm_set1_epi8(0x20), ob = _mm_set1_epi8('{'), cb = _mm_set1_epi8('}'),
	    cm = _mm_set1_epi8(',');

	while (e - p >= 16) {
		__m128i v = _mm_loadu_si128((const __m128i *)(const void *)p), m;
		unsigned bits;

		m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, cr)),
		    _mm_cmpeq_epi8(v, lf));
		if (k == C_STR)
			m = _mm_or_si128(m, _mm_cmpeq_epi8(v, bs));
		else {
			if (k == C_VAL1)
				m = _mm_or_si128(m, _mm_cmpeq_epi8(v, cm));
			/* [ and ] are { and } with bit 5 clear: one compare each */
			v = _mm_or_si128(v, b20);
			m = _mm_or_si128(m, _mm_or_si128(_mm_cmpeq_epi8(v, ob),
			    _mm_cmpeq_epi8(v, cb)));
		}
		if ((bits = (unsigned)_mm_movemask_epi8(m)) != 0)
			return p + __builtin_ctz(bits);
		p += 16;
	}
#endif
	while (p < e && !(usage_cls[(unsigned char)*p] & k))
		p++;
	return p;
}

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The SSE scanner declared in sl_usage.h: one pass over three layered
 * machines sharing struct sl_usage_scan:
 *   line   SSE lines (CRLF, LF or CR), fields, comments, blank line = event end;
 *          a byte at a time, but for "data:" at a line's start in one step;
 *   lexer  a JSON tokenizer over the data of the current event, just enough
 *          to know nesting depth, strings, and which key a value belongs to
 *          ("usage", "choices", and the keys whose strings the estimate
 *          counts: "content", "text", "arguments", "reasoning",
 *          "reasoning_content"); it takes a data line as
 *          one run and jumps over the bytes that cannot change its state:
 *          inside a string all but the quote, backslash and line ends;
 *          between values below the top level all but quotes, brackets and
 *          line ends. Its common path, lex_fast(), reads class masks of 64
 *          bytes (SSE2, or AVX2 where the CPU has it; a scalar loop
 *          elsewhere) a token at a time and decides a key once per string;
 *          what it does not cover it leaves to lex_run()'s own steps;
 *   hold   (drop mode) whether the current event's bytes are forwarded,
 *          held until known, or dropped.
 * Its observable behaviour is that of the byte-at-a-time scanner it
 * replaced, kept in tests/ref: the fuzz target compares the two.
 * Only the bytes of a `usage` object value are copied; they are read when
 * the object closes (usage_obj_read(), usage.c) and
 * committed when its event ends.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "sl_json.h"
#include "sl_usage.h"
#include "usage_internal.h"

/* ------------------------------------------------------------------ SSE scanner */

/* line: where in the current SSE line */
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
static const char *const keys[] = {
	"usage", "content", "text", "choices", "arguments", "reasoning", "reasoning_content"
};
static const uint8_t keylen[] = { 5, 7, 4, 7, 9, 9, 17 };
#define NKEYS 7
#define KEY_MAXLEN 17
/* ev: per-event facts */
enum {
	EV_DATA = 1,        /* a data line was seen (the next one joins with \n) */
	EV_USAGE = 2,       /* "usage": { at depth 1 */
	EV_BAD = 4,         /* not one JSON object */
	EV_NOTDROP = 8,     /* known not to be the usage chunk */
	EV_CAPFAIL = 16     /* the usage object did not fit or memory ran out */
};
enum { TOP_NONE, TOP_OPEN, TOP_CLOSED };

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

void
sl_usage_scan_init(struct sl_usage_scan *s, int drop_usage_event)
{
	memset(s, 0, sizeof(*s));
	s->drop = drop_usage_event != 0;
	s->hs = H_NEW;
}

void
sl_usage_scan_keep(struct sl_usage_scan *s, int keep)
{
	s->keep = keep != 0;
	if (!keep && s->tpl != NULL) {
		free(s->tpl);
		s->tpl = NULL;
	}
}

void
sl_usage_scan_free(struct sl_usage_scan *s)
{
	free(s->hold);
	free(s->cap);
	free(s->tpl);
	s->tpl = NULL;
	s->hold = s->cap = NULL;
	s->hold_len = s->hold_alloc = s->cap_len = s->cap_alloc = 0;
}

/* Append n bytes to a buffer capped at SL_USAGE_MAX_EVENT. -1: does not fit. */
static int
grow_add(char **buf, uint32_t *blen, uint32_t *balloc, const char *p, size_t n)
{
	size_t need = (size_t)*blen + n, na;
	char *nb;

	if (need > SL_USAGE_MAX_EVENT)
		return -1;
	if (need > *balloc) {
		for (na = *balloc ? *balloc : 256; na < need; na *= 2)
			;
		if (na > SL_USAGE_MAX_EVENT)
			na = SL_USAGE_MAX_EVENT;
		if ((nb = realloc(*buf, na)) == NULL)
			return -1;
		*buf = nb;
		*balloc = (uint32_t)na;
	}
	if (n > 0)
		memcpy(*buf + *blen, p, n);
	*blen = (uint32_t)need;
	return 0;
}

/* Bytes of the usage object being copied (a no-op once the copy failed). */
static void
cap_add(struct sl_usage_scan *s, const char *p, size_t n)
{
	if (!(s->ev & EV_CAPFAIL) &&
	    grow_add(&s->cap, &s->cap_len, &s->cap_alloc, p, n) < 0)
		s->ev |= EV_CAPFAIL;
}
/* The usage object closed: parse the copy; the result waits for the event's end. */
static void
capture_done(struct sl_usage_scan *s)
{
	struct sl_usage u;

	s->cap_depth = 0;
	s->pending_ok = 0;
	if (s->ev & EV_CAPFAIL)
		return;
	if (usage_obj_read(s->cap, s->cap_len, &u) == 1) {
		s->p_prompt = u.prompt_tokens;
		s->p_completion = u.completion_tokens;
		s->p_total = u.total_tokens;
		s->pending_ok = 1;
	}
}

/*
 * A value starts with c right after a recognised key's colon. Returns
 * whether it opens the array of "choices" (checked for emptiness next).
 */
static int
key_value(struct sl_usage_scan *s, char c)
{
	int choices = 0;

	if (s->depth == 1 && (s->key & K_USAGE)) {
		if (c == '{') {
			s->ev |= EV_USAGE;
			s->ev &= (uint8_t)~EV_CAPFAIL;
			s->cap_len = 0;
			s->cap_depth = 2;        /* depth inside the object */
			s->capt = 1;
			cap_add(s, "{", 1);
		} else {
			/* "usage": null (or anything else): not this event */
			s->ev = (uint8_t)((s->ev & ~EV_USAGE) | EV_NOTDROP);
			s->pending_ok = 0;
		}
	}
	if (s->depth == 1 && (s->key & K_CHOICES)) {
		if (c == '[')
			choices = 1;
		else
			s->ev |= EV_NOTDROP;
	}
	if ((s->key & K_COUNT) && c == '"')
		s->cnt = 1;
	return choices;
}

/*
 * c in value position (lx is LX_VAL): strings start, brackets nest; at the
 * top (depth 0) anything but blanks and the one object is bad. choices:
 * c follows "choices": at the top level.
 */
static void
value(struct sl_usage_scan *s, char c, int choices)
{
	switch (c) {
	case '"':
		s->lx = LX_STR;     /* s->cnt as key_value() left it */
		s->kmask = K_ALL;
		s->kpos = 0;
		return;
	case '{':
	case '[':
		if (s->depth == 0) {
			if (s->top != TOP_NONE || c != '{')
				s->ev |= EV_BAD;
			s->top = TOP_OPEN;
			s->first = s->drop;     /* its first member comes next */
		}
		if (s->depth == UINT16_MAX) {
			s->ev |= EV_BAD;
			return;
		}
		s->depth++;
		if (choices)
			s->lx = LX_CHOICES;
		return;
	case '}':
	case ']':
		if (s->depth == 0) {
			s->ev |= EV_BAD;
			return;
		}
		s->depth--;
		if (s->cap_depth && s->depth + 1 == s->cap_depth)
			capture_done(s);
		if (s->depth == 0) {
			s->top = TOP_CLOSED;
			if (!(s->ev & EV_USAGE))
				s->ev |= EV_NOTDROP;
		}
		return;
	default:
		if (s->depth == 0 && !JSON_WS(c))
			s->ev |= EV_BAD;
		return;
	}
}

/*
 * n raw bytes of a string that may still be a key: narrow the candidates.
 * ends: the string's closing quote follows, so only keys of exactly this
 * length can still match (string_end() would drop the others).
 */
static void
key_run(struct sl_usage_scan *s, const char *p, size_t n, int ends)
{
	/* the keys a string's first byte leaves (n is never 0) */
	static const uint8_t first[256] = {
		['u'] = K_USAGE, ['c'] = K_CONTENT | K_CHOICES, ['t'] = K_TEXT,
		['a'] = K_ARGUMENTS, ['r'] = K_REASONING | K_REASONING_CONTENT
	};
	size_t end = s->kpos + n;
	unsigned k, m = s->kmask, left;

	if (end > KEY_MAXLEN) {
		s->kmask = 0;
		return;
	}
	if (s->kpos == 0)
		m &= first[(unsigned char)p[0]];
	for (left = m; left != 0; left &= left - 1) {
		k = (unsigned)__builtin_ctz(left);
		if (end > keylen[k] || (ends && end != keylen[k]) ||
		    memcmp(keys[k] + s->kpos, p, n) != 0)
			m &= ~(1u << k);
	}
	s->kmask = (uint8_t)m;
	s->kpos = (uint8_t)end;
}

/* A string's closing quote: a recognised key only if its length matches. */
static void
string_end(struct sl_usage_scan *s)
{
	s->lx = LX_AFTER_STR;
	s->cnt = 0;
	if (s->kmask) {
		uint8_t m = 0;
		unsigned k;

		for (k = 0; k < NKEYS; k++)
			if ((s->kmask & (1u << k)) && keylen[k] == s->kpos)
				m |= (uint8_t)(1u << k);
		s->kmask = m;
	}
	s->key = s->kmask;
}

/*
 * One byte of data as the byte-at-a-time lexer took it (any state): the
 * slow path of lex_run(), and the \n that joins two data lines.
 */
static void
lex_byte(struct sl_usage_scan *s, char c)
{
	int choices = 0;

	switch (s->lx) {
	case LX_STR:
		if (c == '"') {
			string_end(s);
			return;
		}
		if (s->cnt)
			s->content_bytes++;
		if (c == '\\') {
			s->lx = LX_ESC;
			s->kmask = 0;
		} else if (s->kmask)
			key_run(s, &c, 1, 0);
		return;
	case LX_ESC:
		s->lx = c == 'u' ? LX_U : LX_STR;
		s->ux = 4;
		return;
	case LX_U:
		if (--s->ux == 0)
			s->lx = LX_STR;
		return;
	case LX_AFTER_STR:
		if (JSON_WS(c))
			return;
		if (c == ':') {
			s->lx = LX_AFTER_COLON;
			return;
		}
		s->key = 0;
		s->lx = LX_VAL;
		break;
	case LX_AFTER_COLON:
		if (JSON_WS(c))
			return;
		s->lx = LX_VAL;
		if (s->key)
			choices = key_value(s, c);
		s->key = 0;
		break;
	case LX_CHOICES:
		if (JSON_WS(c))
			return;
		if (c != ']')
			s->ev |= EV_NOTDROP;
		s->lx = LX_VAL;
		break;
	default:
		break;
	}
	value(s, c, choices);
}

/* Per call: the forwarded run of in [run_s, ..) and the held tail [tent_s, ..). */
struct feed {
	struct sl_usage_out *out;
	const char *in;
	size_t run_s, tent_s;
	int stop;               /* end the call before the byte where it was set */
	int cap_busy;           /* s->cap holds what out->held points to */
	const char *cs0, *cs1;  /* the last counted string lex_fast() took whole */
};

static void
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

/* The held bytes go out after all (the memory stays valid until the next call). */
static void
release(struct sl_usage_scan *s, struct feed *f)
{
	if (s->hold_len > 0) {
		f->out->held = s->hold;
		f->out->held_len = s->hold_len;
		s->hold_len = 0;
	}
}

/* The held event is not the usage event: its bytes go out after all. */
static void
flush(struct sl_usage_scan *s, struct feed *f)
{
	release(s, f);
	s->hs = H_PASS;
}

/* Byte i (a line terminator or the LF after one) leaves the client's stream. */
static void
drop_through(struct feed *f, size_t i)
{
	emit(f, i);
	f->run_s = i + 1;
}

static int
held(const struct sl_usage_scan *s)
{
	return s->hs == H_PREFIX || s->hs == H_HOLD;
}

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

/* Bytes are held: an undecided event, or what may be a "usage":null member. */
static int
holding(const struct sl_usage_scan *s)
{
	return held(s) || s->mt != MT_NONE;
}

static void
swap_hold_cap(struct sl_usage_scan *s)
{
	char *b = s->hold;
	uint32_t a = s->hold_alloc;

	s->hold = s->cap;
	s->hold_alloc = s->cap_alloc;
	s->cap = b;
	s->cap_alloc = a;
	s->cap_len = 0;
}

/*
 * in[i] is c, a comma at the top level of the data object or the quote of
 * its first key (drop mode): a "usage":null member may start here, so the
 * bytes from here are held. An event still held that would have been let
 * go by now (known not to be the usage event, or too big) goes first.
 * Called before the lexer takes in[i]. -1: the held bytes went out in this
 * call already, or too few ranges are left for a member, a drop and the
 * tail: the call must end before in[i] (never at i == 0).
 */
static int
mt_begin(struct sl_usage_scan *s, struct feed *f, size_t i, char c)
{
	if (held(s) && ((s->ev & (EV_NOTDROP | EV_BAD)) ||
	    s->hold_len + (i - f->tent_s) > SL_USAGE_MAX_EVENT))
		flush(s, f);
	if (f->out->n + 3 > SL_USAGE_MAX_RANGES)
		return -1;
	if (!held(s)) {
		if (f->out->held_len > 0) {
			if (i > 0)
				return -1;
			/*
			 * The comma that ended a member, at the call's first byte,
			 * let the held bytes go: they stay where out->held points
			 * (the copy buffer, unused at the top level, for the rest of
			 * this call) and a fresh buffer holds from here.
			 */
			swap_hold_cap(s);
			f->cap_busy = 1;
		}
		f->tent_s = i;      /* nothing is held: hold_len is 0 */
	}
	s->mstart = (uint32_t)(s->hold_len + (i - f->tent_s));
	s->mt = c == ',' ? MT_SEP : MT_KEY;
	s->mfirst = c == '"';
	s->mpos = 0;
	return 0;
}

/* Not a "usage":null member after all: its bytes stay. */
static void
mt_abort(struct sl_usage_scan *s, struct feed *f)
{
	s->mt = MT_NONE;
	if (!held(s))
		release(s, f);
	else if (s->ev & (EV_NOTDROP | EV_BAD))
		flush(s, f);
}

/*
 * The member is [mstart, b) of the held bytes (held bytes from earlier
 * calls, then in[tent_s..]): cut it out, let the rest go. Its event is not
 * the usage event ("usage" is not an object in it), so nothing stays held.
 */
static void
strip(struct sl_usage_scan *s, struct feed *f, size_t b)
{
	size_t a = s->mstart, h = s->hold_len;

	if (a < h) {
		if (b < h)
			memmove(s->hold + a, s->hold + b, h - b);
		s->hold_len = (uint32_t)(b < h ? h - (b - a) : a);
	}
	if (b > h) {
		emit(f, f->tent_s + (a > h ? a - h : 0));
		f->run_s = f->tent_s + (b - h);
	}
	s->mt = MT_NONE;
	flush(s, f);
}

/*
 * in[i] is c, the next byte of a data line while a member is being matched,
 * before the lexer takes it. Returns 1 when c is the comma that ends a
 * first member: it is cut with the member, so no other member starts at it.
 */
static int
mt_step(struct sl_usage_scan *s, struct feed *f, size_t i, char c)
{
	int blank = c == ' ' || c == '\t';

	switch (s->mt) {
	case MT_SEP:
		if (blank)
			return 0;
		if (c == '"') {
			s->mt = MT_KEY;
			return 0;
		}
		break;
	case MT_KEY:
		if (c == "usage\""[s->mpos]) {
			if (++s->mpos == 6)
				s->mt = MT_COLON;
			return 0;
		}
		break;
	case MT_COLON:
		if (blank)
			return 0;
		if (c == ':') {
			s->mt = MT_VALUE;
			return 0;
		}
		break;
	case MT_VALUE:
		if (blank)
			return 0;
		if (c == 'n') {
			s->mt = MT_NULL;
			s->mpos = 1;
			return 0;
		}
		/*
		 * A usage object in a chunk already known to carry content
		 * (vLLM's continuous_usage_stats, llama.cpp's last chunk): cut
		 * as well, once it closes (lex_run() sees to that). It is
		 * still read and counted; never the first member: the usage
		 * chunk itself is dropped whole.
		 */
		if (c == '{' && !s->mfirst && (s->ev & EV_NOTDROP)) {
			s->mt = MT_OBJ;
			return 0;
		}
		break;
	case MT_OBJ:
		return 0;
	case MT_NULL:
		if (c == "null"[s->mpos]) {
			if (++s->mpos == 4) {
				s->mt = MT_END;
				s->mnull = (uint32_t)(s->hold_len + (i + 1 - f->tent_s));
			}
			return 0;
		}
		break;
	case MT_END:
		if (blank)
			return 0;
		/* cut only what the byte-at-a-time hold bound would have kept */
		if ((c == ',' || c == '}') &&
		    s->hold_len + (i - f->tent_s) <= SL_USAGE_MAX_EVENT) {
			if (s->mfirst && c == ',') {
				strip(s, f, s->hold_len + (i + 1 - f->tent_s));
				return 1;
			}
			strip(s, f, s->mnull);
			return 0;
		}
		break;
	default:
		break;
	}
	mt_abort(s, f);
	return 0;
}

/* b ready for blk_next() over the input starting at lo: nothing loaded. */
static void
blk_init(struct blk *b, const char *lo)
{
	memset(b, 0, sizeof(*b));
	/* unsigned arithmetic: any p >= lo is 64 or more past it */
	b->base = (uintptr_t)lo - 64;
	b->lo = lo;
#ifdef SL_USAGE_AVX2
	b->avx2 = __builtin_cpu_supports("avx2") != 0;
#endif
}

/*
 * blk_next() past the block at hand, which has no byte of class k from p
 * on when p is in it: loads block after block. Out of line.
 */
static __attribute__((noinline)) const char *
blk_next_far(struct blk *b, const char *p, const char *e, unsigned k)
{
	uint64_t m;

	if ((uintptr_t)p - b->base < 64)
		p += 64 - ((uintptr_t)p - b->base);
	for (; p < e; p += 64) {
#ifdef SL_USAGE_AVX2
		if (b->avx2)
			usage_blk_load_avx2(b, p, e);
		else
#endif
			usage_blk_load(b, p, e);
		m = k == 0 ? b->str : k == 1 ? b->val : b->val | b->cm;
		if (m != 0)
			return p + __builtin_ctzll(m);     /* at most e */
	}
	return e;
}

/*
 * skip() on the masks: the first byte of [p, e) in class C_STR (k 0),
 * C_VAL (k 1) or C_VAL1 (k 2), or e. Inline, only the search in the block
 * at hand (p at e is either in it, where e's bit is set, or past it);
 * blk_next_far() goes on from block to block.
 */
static inline __attribute__((always_inline)) const char *
blk_next(struct blk *b, const char *p, const char *e, unsigned k)
{
	uint64_t m, off = (uintptr_t)p - b->base;

	if (off < 64) {
		m = (k == 0 ? b->str : k == 1 ? b->val : b->val | b->cm) >> off;
		if (m != 0)
			return p + __builtin_ctzll(m);
	}
	return blk_next_far(b, p, e, k);
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

static const char *
blanks(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t'))
		p++;
	return p;
}

/*
 * Drop mode, depth 1, the lexer in value position at p: a comma (first 0)
 * or the quote of the data object's first key (first 1), where mt_begin()
 * would start matching a "usage":null member. Does what the matcher and
 * the lexer together would do, when nothing is held from earlier calls and
 * no early end of the call is due, and returns
 *   1  a key other than "usage" follows: *np is the byte after its quote;
 *   2  a "usage":null member, cut from the output: *np is where the lexer
 *      goes on in value position after it (at the comma or brace that ends
 *      it; past that comma for a first member, which takes it along);
 *   0  anything else, nothing done: lex_run()'s own steps take p.
 */
static int
top_member(struct sl_usage_scan *s, struct feed *f, const char *p, const char *e,
    int first, const char **np)
{
	const char *r = first ? p : blanks(p + 1, e), *k, *z;
	size_t i = (size_t)(p - f->in), tent;
	int h;

	if (s->hold_len != 0 || f->out->held_len != 0 ||
	    f->out->n + 3 > SL_USAGE_MAX_RANGES ||
	    e - r < 2 || *r != '"' || r[1] == '\r' || r[1] == '\n')
		return 0;
	/* still held after mt_begin()'s check (else flushed: nothing to release) */
	h = held(s) && !(s->ev & (EV_NOTDROP | EV_BAD)) &&
	    i - f->tent_s <= SL_USAGE_MAX_EVENT;
	tent = h ? f->tent_s : i;
	if (r[1] != 'u') {
		/* the matcher gives up at r[1]; the lexer is in the key */
		*np = r + 1;
		goto begun;
	}
	k = r + 1;
	if (e - k < 6 || memcmp(k, "usage\"", 6) != 0)
		return 0;
	k = blanks(k + 6, e);
	if (k == e || *k != ':')
		return 0;
	k = blanks(k + 1, e);
	if (e - k < 4 || memcmp(k, "null", 4) != 0)
		return 0;
	z = k + 4;
	k = blanks(z, e);
	if (k == e || (*k != ',' && *k != '}') ||
	    (size_t)(k - f->in) - tent > SL_USAGE_MAX_EVENT)
		return 0;
	/* strip(): nothing held, so the member is cut from this call's bytes */
	emit(f, i);
	if (first && *k == ',') {
		f->run_s = (size_t)(k + 1 - f->in);
		*np = k + 1;
	} else {
		f->run_s = (size_t)(z - f->in);
		*np = k;
	}
	/* "usage": null: not the usage event (key_value()) */
	s->ev = (uint8_t)((s->ev & ~EV_USAGE) | EV_NOTDROP);
	s->pending_ok = 0;
	s->hs = H_PASS;
	if (!h)
		f->tent_s = i;
	return 2;
begun:
	if (!h) {
		s->hs = H_PASS;
		f->tent_s = i;
	}
	return 1;
}

/*
 * top_member()'s usual case, inline: at p a top-level comma in drop mode
 * or the quote of the data object's first key (not in a bad event, not
 * nocand), at r (p + 1 or p) the quote of a key that does not start with
 * u, nothing held from earlier calls, no early end due: the matcher would
 * give up at r + 1, leaving what is done here. 1 if it is that case (the
 * caller goes on in the key's string at r + 1).
 */
static inline int
member_key(struct sl_usage_scan *s, struct feed *f, const char *p, const char *r,
    const char *e)
{
	size_t i;

	if (e - r < 2 || *r != '"' || r[1] == 'u' || r[1] == '\r' || r[1] == '\n' ||
	    s->hold_len != 0 || f->out->held_len != 0 ||
	    f->out->n + 3 > SL_USAGE_MAX_RANGES)
		return 0;
	i = (size_t)(p - f->in);
	if (held(s) && ((s->ev & (EV_NOTDROP | EV_BAD)) || i - f->tent_s > SL_USAGE_MAX_EVENT))
		s->hs = H_PASS;         /* mt_begin()'s flush: nothing to release */
	if (!held(s))
		f->tent_s = i;
	return 1;
}

/*
 * The common path of lex_run(): from p, takes the bytes the way lex_run()
 * and the matcher would, with the same effect on s and f, a token at a time
 * on the masks in b (but that after a string that is none of our keys,
 * below the top level, it is in value position where the lexer would be
 * after the string or its colon: states that take every byte that may
 * follow alike; and that kpos is left as it was outside strings, where
 * nothing reads it), and returns where it stopped: at e, or at the first
 * byte it leaves to lex_run()'s own steps (a line end, the top level, an
 * escape at the run's end, the value of "usage": {, a top-level member in
 * drop mode that needs the hold buffer, the usage event). Call only with no
 * member being matched, no usage object being copied and the bytes not
 * under H_PREFIX's one-byte check. nocand: a comma that starts no member.
 * The lexer's hot fields live in locals and are written back on return.
 */
static __attribute__((noinline)) const char *
lex_fast(struct sl_usage_scan *s, struct feed *f, struct blk *b, const char *p,
    const char *e, const char *nocand)
{
	uint64_t content = s->content_bytes;
	unsigned lx = s->lx, depth = s->depth, kmask = s->kmask, key = s->key;
	unsigned cnt = s->cnt, m, k, first = s->first, drop = s->drop;
	int fresh = kmask == K_ALL && s->kpos == 0;   /* no byte of the string taken */
	const char *q;
	size_t n;
	char c;

	while (p < e) {
		switch (lx) {
		case LX_VAL:
			if (depth == 0)
				goto out;
			if (first) {
				c = *p;
				if (c == ' ' || c == '\t') {
					p++;
					continue;
				}
				if (c == '\r' || c == '\n')
					goto out;
				/* the first key: the usual one is the loop's below */
				if (c == '"' && drop && depth == 1 && !(s->ev & EV_BAD) &&
				    p != nocand && !member_key(s, f, p, p, e)) {
					if ((k = (unsigned)top_member(s, f, p, e, 1, &q)) == 0)
						goto out;
					first = 0;
					p = q;
					goto member;
				}
				first = 0;
			}
			if (depth > 1 || !drop) {
				/*
				 * Below the top level of drop mode: only strings and
				 * brackets matter here. A string that ends on this run
				 * unescaped is taken whole; one that is none of our
				 * keys leaves the lexer in value position (where its
				 * colon or comma changes nothing). What the loop does
				 * not take, the steps below do.
				 */
				for (;;) {
					p = blk_next(b, p, e, 1);
					if (p == e)
						goto out;
					c = *p;
					if (c == '"') {
						q = blk_next(b, p + 1, e, 0);
						if (q == e || *q != '"')
							break;
						n = (size_t)(q - (p + 1));
						if (cnt) {
							content += n;
							f->cs0 = p + 1;     /* for tpl_record() */
							f->cs1 = q;
						}
						cnt = 0;
						kmask = key_of(p + 1, n);
						p = q + 1;
						if ((key = kmask) != 0) {
							lx = LX_AFTER_STR;
							goto next;
						}
						continue;
					}
					if (c == '{' || c == '[') {
						if (depth == UINT16_MAX)
							break;
						depth++;
						p++;
						continue;
					}
					if ((c != '}' && c != ']') || depth == 1 ||
					    (depth == 2 && drop))
						break;
					depth--;
					p++;
				}
			} else if (!(s->ev & EV_BAD)) {
				/*
				 * The same at the top level in drop mode, where a comma
				 * may start a "usage" member: member_key() takes the
				 * usual one, the steps below the others.
				 */
				for (;;) {
					p = blk_next(b, p, e, 2);
					if (p == e)
						goto out;
					c = *p;
					if (c == ',') {
						if (p == nocand || !member_key(s, f, p, p + 1, e))
							break;
						p++;
					} else if (c != '"')
						break;
					q = blk_next(b, p + 1, e, 0);
					if (q == e || *q != '"')
						break;
					n = (size_t)(q - (p + 1));
					if (cnt)
						content += n;
					cnt = 0;
					kmask = key_of(p + 1, n);
					p = q + 1;
					if ((key = kmask) != 0) {
						lx = LX_AFTER_STR;
						goto next;
					}
				}
			}
			/*
			 * The byte here is usually a token already (after a colon,
			 * a bracket or a key's quote): taken without the masks.
			 */
			c = *p;
			if (c != '"' && c != '{' && c != '}' && c != '[' && c != ']' &&
			    !(c == ',' && drop && depth == 1)) {
				p = blk_next(b, p, e, drop && depth == 1 ? 2 : 1);
				if (p == e)
					goto out;
				c = *p;
			}
			switch (c) {
			case '"':
				lx = LX_STR;
				kmask = K_ALL;
				s->kpos = 0;
				fresh = 1;
				p++;
				continue;
			case '{':
			case '[':
				if (depth == UINT16_MAX)
					goto out;
				depth++;
				p++;
				continue;
			case '}':
			case ']':
				depth--;
				p++;
				if (depth == 0) {
					s->top = TOP_CLOSED;
					if (!(s->ev & EV_USAGE))
						s->ev |= EV_NOTDROP;
				}
				continue;
			case ',':
				break;
			default:
				goto out;       /* a line end */
			}
			/* a comma at the top level in drop mode */
			if ((s->ev & EV_BAD) || p == nocand) {
				p++;            /* value() ignores it */
				continue;
			}
			if (member_key(s, f, p, p + 1, e)) {
				p += 2;
				k = 1;
				goto member;
			}
			if ((k = (unsigned)top_member(s, f, p, e, 0, &q)) == 0)
				goto out;
			p = q;
member:
			if (k == 1) {
				lx = LX_STR;
				kmask = K_ALL;
				s->kpos = 0;
				fresh = 1;
			} else {
				/* as the lexer leaves "usage": null */
				lx = LX_VAL;
				kmask = K_USAGE;
				s->kpos = 5;
				key = 0;
				cnt = 0;
			}
			continue;
		case LX_STR:
			q = blk_next(b, p, e, 0);
			n = (size_t)(q - p);
			if (cnt)
				content += n;
			if (q < e && *q == '"') {
				if (fresh)
					kmask = key_of(p, n);   /* the whole string is p[0..n) */
				else if (kmask) {
					if (n > 0) {
						s->kmask = (uint8_t)kmask;
						key_run(s, p, n, 1);
					}
					/* string_end(): only keys of this length */
					for (m = 0, k = 0; k < NKEYS; k++)
						if ((s->kmask & (1u << k)) && keylen[k] == s->kpos)
							m |= 1u << k;
					kmask = m;
				}
				key = kmask;
				cnt = 0;
				p = q + 1;
				/*
				 * None of our keys, below the top: the lexer goes on
				 * in value position, which takes the blanks, colon or
				 * comma that follow as the states after a string
				 * would.
				 */
				lx = key == 0 && depth > 0 ? LX_VAL : LX_AFTER_STR;
				continue;
			}
			if (q == e || *q != '\\') {
				if (kmask && n > 0) {
					s->kmask = (uint8_t)kmask;
					key_run(s, p, n, 0);
					kmask = s->kmask;
					fresh = 0;
				}
				p = q;
				goto out;               /* a line end */
			}
			if (cnt)
				content++;
			kmask = 0;
			fresh = 0;
			/* the escaped byte (and a \u's four) while on this line */
			p = q + 1;
			if (p == e || *p == '\r' || *p == '\n') {
				lx = LX_ESC;
				goto out;
			}
			if (*p == 'u') {
				if (e - p < 5 || p[1] == '\r' || p[1] == '\n' || p[2] == '\r' ||
				    p[2] == '\n' || p[3] == '\r' || p[3] == '\n' ||
				    p[4] == '\r' || p[4] == '\n') {
					lx = LX_ESC;
					goto out;
				}
				p += 4;
				s->ux = 0;      /* as LX_U leaves it */
			} else
				s->ux = 4;
			p++;
			continue;
		case LX_AFTER_STR:
			c = *p;
			if (c == ':') {
				lx = LX_AFTER_COLON;
				p++;
			} else if (c == ' ' || c == '\t')
				p++;
			else if (c == '\r' || c == '\n')
				goto out;
			else {
				key = 0;
				lx = LX_VAL;
			}
			continue;
		case LX_AFTER_COLON:
			c = *p;
			if (c == ' ' || c == '\t') {
				p++;
				continue;
			}
			if (c == '\r' || c == '\n')
				goto out;
			if (key) {
				/* key_value(), but for the usage object's copy */
				if (depth == 1 && (key & K_USAGE)) {
					if (c == '{')
						goto out;
					s->ev = (uint8_t)((s->ev & ~EV_USAGE) | EV_NOTDROP);
					s->pending_ok = 0;
				}
				if (depth == 1 && (key & K_CHOICES)) {
					if (c == '[') {
						key = 0;
						depth++;
						lx = LX_CHOICES;
						p++;
						continue;
					}
					s->ev |= EV_NOTDROP;
				}
				if ((key & K_COUNT) && c == '"')
					cnt = 1;
				key = 0;
			}
			lx = LX_VAL;
			continue;               /* c again, as a value */
		case LX_CHOICES:
			c = *p;
			if (c == ' ' || c == '\t') {
				p++;
				continue;
			}
			if (c == '\r' || c == '\n')
				goto out;
			if (c != ']')
				s->ev |= EV_NOTDROP;
			lx = LX_VAL;
			continue;
		default:
			goto out;               /* LX_ESC, LX_U */
		}
next:
		;
	}
out:
	s->content_bytes = content;
	s->lx = (uint8_t)lx;
	s->depth = (uint16_t)depth;
	s->kmask = (uint8_t)kmask;
	s->key = (uint8_t)key;
	s->cnt = (uint8_t)cnt;
	s->first = (uint8_t)first;
	return p;
}

/*
 * The data of the current line from in[i]: lexes up to the line's end (a CR
 * or LF, not consumed) or in[end], whichever comes first, and returns where
 * it stopped (earlier with f->stop set: the call ends there). Runs of bytes
 * that change nothing are skipped by class; the bytes of a usage object are
 * copied a run at a time (cs: the first byte not yet copied), split at
 * closing brackets so the copy is whole when the object closes. While a
 * "usage":null member is being matched (drop mode) it goes a byte at a time.
 */
static size_t
lex_run(struct sl_usage_scan *s, struct feed *f, size_t i, size_t end)
{
	const char *in = f->in, *p = in + i, *e = in + end, *q;
	const char *cs = s->cap_depth ? p : NULL;
	const char *nocand = NULL;      /* a comma cut with a first member */
	struct blk b;
	char c;

	blk_init(&b, in);
	while (p < e) {
		if (s->mt == MT_NONE && cs == NULL && s->cap_depth == 0 && s->hs != H_PREFIX &&
		    (s->depth > 0 || s->lx != LX_VAL)) {   /* (it leaves the top level alone) */
			/* the common path; what it leaves is a step for the code below */
			if ((p = lex_fast(s, f, &b, p, e, nocand)) == e)
				break;
		}
		c = *p;
		if (s->mt != MT_NONE) {
			if (c == '\r' || c == '\n')
				break;
			if (s->mt == MT_VALUE && c == '{' && f->cap_busy) {
				f->stop = 1;    /* the copy buffer is out->held's: next call */
				goto out;
			}
			if (mt_step(s, f, (size_t)(p - in), c))
				nocand = p;
			if (s->mt == MT_NONE)
				continue;       /* c again, with nothing matching */
			goto one;
		}
		switch (s->lx) {
		case LX_STR:
			q = skip(p, e, C_STR);
			if (q > p) {
				if (s->cnt)
					s->content_bytes += (uint64_t)(q - p);
				if (s->kmask)
					key_run(s, p, (size_t)(q - p), q < e && *q == '"');
				if ((p = q) == e)
					goto out;
				c = *p;
			}
			if (c == '\\') {
				if (s->cnt)
					s->content_bytes++;
				s->lx = LX_ESC;
				s->kmask = 0;
				p++;
				continue;
			}
			if (c != '"')
				goto out;        /* the line ends */
			string_end(s);
			/*
			 * What usually follows, without a trip through lex_byte():
			 * a colon and a value after a key that is none of ours
			 * (the value is then an ordinary LX_VAL byte), or a comma
			 * or bracket after a string value.
			 */
			if (++p == e)
				goto out;
			c = *p;
			if (c == ':') {
				s->lx = LX_AFTER_COLON;
				if (++p < e && s->key == 0 && !JSON_WS(*p))
					s->lx = LX_VAL;
			} else if (!JSON_WS(c)) {
				s->key = 0;
				s->lx = LX_VAL;
			}
			continue;
		case LX_VAL:
			if (s->depth > 0 && !s->first) {
				p = s->drop && s->depth == 1 ? skip(p, e, C_VAL1) :
				    skip(p, e, C_VAL);
				if (p == e)
					goto out;
				c = *p;
			}
			if (c == '\r' || c == '\n')
				goto out;
			if (s->drop && s->depth == 1 && !(s->ev & EV_BAD) && p != nocand &&
			    (c == ',' || (c == '"' && s->first)) &&
			    mt_begin(s, f, (size_t)(p - in), c) < 0) {
				f->stop = 1;
				goto out;
			}
			if (!JSON_WS(c))
				s->first = 0;
			if (cs != NULL && (c == '}' || c == ']')) {
				/* may close the usage object: copy through it first */
				cap_add(s, cs, (size_t)(p + 1 - cs));
				cs = p + 1;
			}
			value(s, c, 0);
			p++;
			if (cs == NULL && s->cap_depth)
				cs = p;                  /* "usage": { opened at c */
			else if (cs != NULL && !s->cap_depth)
				cs = NULL;               /* ... and closed */
			continue;
		case LX_AFTER_STR:
			if (c == ':') {
				s->lx = LX_AFTER_COLON;
				p++;
				continue;
			}
			if (!JSON_WS(c)) {
				s->key = 0;
				s->lx = LX_VAL;
				continue;       /* c again, as a value */
			}
			break;
		case LX_AFTER_COLON:
			if (JSON_WS(c))
				break;
			if (f->cap_busy && c == '{' && s->depth == 1 && (s->key & K_USAGE)) {
				f->stop = 1;    /* the copy buffer is out->held's: next call */
				goto out;
			}
			s->lx = LX_VAL;
			if (s->key) {
				int choices = key_value(s, c);

				s->key = 0;
				if (choices) {
					value(s, c, 1);      /* its [ : LX_CHOICES */
					p++;
					continue;
				}
			}
			continue;               /* c again, as a value */
		case LX_CHOICES:
			if (JSON_WS(c))
				break;
			if (c != ']')
				s->ev |= EV_NOTDROP;
			s->lx = LX_VAL;
			continue;
		default:
			goto one;               /* LX_ESC, LX_U */
		}
		/* a blank between tokens */
		if (c == '\r' || c == '\n')
			goto out;
		p++;
		continue;
one:
		/* one byte as the byte-at-a-time lexer took it */
		if (c == '\r' || c == '\n')
			goto out;
		if (cs != NULL && (c == '}' || c == ']')) {
			/* may close the usage object: copy through it first */
			cap_add(s, cs, (size_t)(p + 1 - cs));
			cs = p + 1;
		}
		lex_byte(s, c);
		p++;
		if (cs == NULL && s->cap_depth)
			cs = p;                  /* "usage": { opened at c */
		else if (cs != NULL && !s->cap_depth)
			cs = NULL;               /* ... and closed */
		if (s->mt == MT_OBJ && s->depth == 1) {
			/* the usage object of a member being matched closed at c */
			s->mt = MT_END;
			s->mnull = (uint32_t)(s->hold_len + ((size_t)(p - in) - f->tent_s));
		}
	}
out:
	if (cs != NULL)
		cap_add(s, cs, (size_t)(p - cs));
	return (size_t)(p - in);
}

/* A blank line: commit the usage of a well-formed usage event; next event. */
static void
event_end(struct sl_usage_scan *s)
{
	if (s->pending_ok && s->top == TOP_CLOSED && s->depth == 0 &&
	    !(s->ev & EV_BAD) && s->lx == LX_VAL && s->cap_depth == 0) {
		s->have = 1;
		s->prompt = s->p_prompt;
		s->completion = s->p_completion;
		s->total = s->p_total;
	}
	s->pending_ok = 0;
	s->ev = 0;
	s->top = TOP_NONE;
	s->depth = 0;
	s->cap_depth = 0;
	s->lx = LX_VAL;
	s->key = s->kmask = s->cnt = 0;
	s->first = s->mt = 0;
}

/*
 * Droppable: one JSON object with "usage": {..} at the top and no non-empty
 * choices. Every such event is dropped, not only the first: a runner that
 * sends two must not get the second to a client that did not ask.
 */
static int
droppable(const struct sl_usage_scan *s)
{
	return (s->ev & (EV_USAGE | EV_NOTDROP | EV_BAD)) == EV_USAGE &&
	    s->top == TOP_CLOSED && s->depth == 0 && s->lx == LX_VAL;
}

/* Data bytes start: a second data line of the event joins with a newline. */
static void
data_begins(struct sl_usage_scan *s)
{
	if (s->ev & EV_DATA) {
		if (s->cap_depth)
			cap_add(s, "\n", 1);
		lex_byte(s, '\n');
	}
	s->ev |= EV_DATA;
}


/*
 * H_PREFIX, byte c of the event before its first data byte. Lines of other
 * fields (id:, event:, retry:, ...) and comments are held with the event,
 * so a usage event is dropped whole, never leaving them behind; the first
 * data line decides: "data:" [" "] "{" holds the event as a candidate,
 * anything else (or an event without data) lets it go. pfx: the bytes of
 * "data: " seen on this line, PFX_OTHER on a line of another field.
 */
#define PFX_OTHER 7

static void
prefix_step(struct sl_usage_scan *s, struct feed *f, char c)
{
	int eol = c == '\r' || c == '\n';

	if (s->pfx == PFX_OTHER) {
		if (eol)
			s->pfx = 0;
	} else if (s->pfx < 5 ? c == "data:"[s->pfx] : (s->pfx == 5 && c == ' '))
		s->pfx++;
	else if (c == '{' && s->pfx >= 5)
		s->hs = H_HOLD;
	else if (s->pfx >= 5 || (eol && (s->pfx == 0 || s->pfx == 4)))
		flush(s, f);    /* data not starting with {, "data" alone, or no data */
	else
		s->pfx = eol ? 0 : PFX_OTHER;   /* a field other than data */
}

/* Index of the first CR or LF in in[i..len), or len. */
static size_t
line_end(const char *in, size_t i, size_t len)
{
	while (i < len && in[i] != '\r' && in[i] != '\n')
		i++;
	return i;
}

/* ------------------------------------------------------------------ event templates */

/*
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

static inline int
digit(char c)
{
	return (unsigned char)(c - '0') < 10;
}

#if defined(__SSE2__) && !defined(SL_USAGE_NO_SIMD)
#define TPL_SSE2 1
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
static int
same_but_digits(const char *a, const char *b, size_t n, int avx2)
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
static int
tpl_room(struct sl_usage_scan *s, size_t n)
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
static void
tpl_record(struct sl_usage_tpl *t, const struct rec *r, const struct sl_usage_scan *s,
    const struct feed *f, size_t j)
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

/*
 * The event at in[i] is the template's (see above): do what the scanner
 * would, and return its length; 0: it is not.
 */
static size_t
tpl_apply(const struct sl_usage_tpl *t, struct sl_usage_scan *s, struct feed *f, size_t i,
    size_t len)
{
	const char *p = f->in + i, *q, *lim;
	size_t blen = t->len - t->s1, avail = len - i, n, k, esc = 0, cnt;

	if (avail > TPL_MAX_EVENT)
		avail = TPL_MAX_EVENT;
	if (avail < t->s0 + blen || !same_but_digits(p, t->ev, t->s0, t->avx2))
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
	if ((esc == 0 && key_of(p + t->s0, n) != 0) || !same_but_digits(q, t->ev + t->s1, blen, t->avx2))
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

/*
 * Line structure and the hold decision go a byte at a time (a few bytes an
 * event: "data: ", line ends); the data of a line goes to lex_run() as one
 * run, which skips what cannot matter.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
/* gcc does not see that tl and r are read only where they were set */
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
size_t
sl_usage_scan_feed(struct sl_usage_scan *s, const char *in, size_t len,
    struct sl_usage_out *out)
{
	struct feed f;
	struct sl_usage_tpl tl, *t = &tl;
	struct rec r;
	size_t i = 0, k;
	char c;

	out->held = NULL;       /* the ranges past n are never read */
	out->held_len = out->n = 0;
	f.out = out;
	f.in = in;
	f.run_s = f.tent_s = 0;
	f.stop = f.cap_busy = 0;
	f.cs0 = f.cs1 = NULL;
	tl.ev = NULL;                   /* the rest is read only once set */
	r.i = SIZE_MAX;                 /* (r too) */
	if (s->keep && s->tpl != NULL)
		t = s->tpl;
	while (i < len) {
		c = in[i];
		if (s->cr && c == '\n') {
			/* second byte of a CRLF: goes where its CR went */
			s->cr = 0;
			if (s->after_drop)
				drop_through(&f, i);
			s->after_drop = 0;
			i++;
			continue;
		}
		if (s->hs == H_NEW) {
			if (r.i != SIZE_MAX) {
				/* (t->ev is NULL since r.i was set, and s->tpl's if any) */
				t = s->keep && tpl_room(s, i - r.i) ? s->tpl : &tl;
				tpl_record(t, &r, s, &f, i);
				r.i = SIZE_MAX;
			}
			if (s->drop) {
				/*
				 * The hold buffer is being flushed in this call, or too
				 * few ranges are left for a drop (the bytes before the
				 * event, a CRLF's LF, the tail): next call. A range is
				 * never empty, so n > 0 means i > 0.
				 */
				if (out->held_len > 0 || out->n + 3 > SL_USAGE_MAX_RANGES)
					break;
			}
			if (s->cr || s->after_drop)
				t->ev = NULL;   /* an ordinary event: the template was for another state */
			else {
				if (t->ev != NULL && out->n + t->nr + 3 <= SL_USAGE_MAX_RANGES &&
				    (k = tpl_apply(t, s, &f, i, len)) > 0) {
					i += k;
					continue;       /* at the next event boundary */
				}
				t->ev = NULL;   /* (until this one is recorded) */
				r.i = i;
				r.n = out->n;
				r.run_s = f.run_s;
				r.s = *s;
				s->capt = 0;
				f.cs0 = f.cs1 = NULL;
			}
			if (s->drop) {
				s->hs = H_PREFIX;
				s->pfx = 0;
				f.tent_s = i;
			} else
				s->hs = H_PASS;
		}
		s->cr = 0;
		s->after_drop = 0;

		if (s->line == LS_START && len - i > 5 && memcmp(in + i, "data:", 5) == 0 &&
		    (s->hs != H_PREFIX || s->pfx == 0)) {
			/* The usual line, its field name in one step (as byte by byte). */
			if (s->hs == H_PREFIX)
				s->pfx = 5;
			s->line = LS_DATA_SP;
			data_begins(s);
			i += 5;
			if (in[i] == ' ') {
				if (s->hs == H_PREFIX)
					s->pfx = 6;
				s->line = LS_DATA;
				i++;
			}
			continue;         /* no hold decision changes on these bytes */
		}

		if (s->hs == H_PREFIX)
			prefix_step(s, &f, c);

		if (c == '\r' || c == '\n') {
			if (s->mt != MT_NONE)
				mt_abort(s, &f);    /* a member never spans lines */
			s->cr = c == '\r';
			if (s->line == LS_START) {
				if (held(s) && droppable(s)) {
					s->hold_len = 0;
					emit(&f, f.tent_s);
					f.run_s = i + 1;
					s->dropped = 1;
					s->after_drop = s->cr;
				} else if (held(s))
					flush(s, &f);
				event_end(s);
				s->hs = H_NEW;
				i++;
				continue;
			}
			if (s->line == LS_FIELD && s->field == 4)
				data_begins(s);     /* "data" alone: an empty data line */
			s->line = LS_START;
			i++;
		} else {
			switch (s->line) {
			case LS_START:
				if (c == ':') {
					s->line = LS_IGNORE;
					i++;
					break;
				}
				s->line = LS_FIELD;
				s->field = 0;
				/* FALLTHROUGH */
			case LS_FIELD:
				if (c == ':') {
					if (s->field == 4) {
						s->line = LS_DATA_SP;
						data_begins(s);
					} else
						s->line = LS_IGNORE;
				} else if (s->field < 4 && c == "data"[s->field])
					s->field++;
				else
					s->field = 5;
				i++;
				break;
			case LS_DATA_SP:
				s->line = LS_DATA;
				if (c == ' ') {
					i++;
					break;
				}
				/* FALLTHROUGH */
			case LS_DATA:
				/* this byte passed the prefix check; the rest need none */
				i = lex_run(s, &f, i, s->hs == H_PREFIX ? i + 1 : len);
				break;
			default:
				/* (under H_PREFIX only a line of another field: held whole) */
				i = line_end(in, i, len);
				break;
			}
			if (f.stop)
				break;
		}
		if (held(s) && s->mt == MT_NONE && (s->ev & (EV_NOTDROP | EV_BAD)))
			flush(s, &f);
		else if (holding(s) && s->hold_len + (i - f.tent_s) > SL_USAGE_MAX_EVENT) {
			s->mt = MT_NONE;    /* too big to be a member worth holding */
			flush(s, &f);
		}
	}
	if (r.i != SIZE_MAX && i == len && s->hs == H_NEW && s->keep &&
	    tpl_room(s, i - r.i))
		tpl_record(s->tpl, &r, s, &f, i);   /* for the next call's events */
	if (holding(s)) {
		if (grow_add(&s->hold, &s->hold_len, &s->hold_alloc, in + f.tent_s,
		    i - f.tent_s) == 0) {
			emit(&f, f.tent_s);
			return i;
		}
		s->mt = MT_NONE;
		flush(s, &f);       /* no memory to hold it: let it through */
	}
	emit(&f, i);
	return i;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

void
sl_usage_scan_finish(struct sl_usage_scan *s, struct sl_usage_out *out)
{
	memset(out, 0, sizeof(*out));
	if (holding(s) && s->hold_len > 0) {
		out->held = s->hold;
		out->held_len = s->hold_len;
		s->hold_len = 0;
	}
	s->hs = H_PASS;
	s->mt = MT_NONE;
	s->pending_ok = 0;
}

int
sl_usage_scan_result(const struct sl_usage_scan *s, struct sl_usage *u,
    uint64_t *content_bytes)
{
	memset(u, 0, sizeof(*u));
	if (s->have) {
		u->have = 1;
		u->prompt_tokens = s->prompt;
		u->completion_tokens = s->completion;
		u->total_tokens = s->total;
	}
	if (content_bytes != NULL)
		*content_bytes = s->content_bytes;
	return u->have;
}

int
sl_usage_scan_dropped(const struct sl_usage_scan *s)
{
	return s->dropped;
}

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
#include "usage_template.h"

/* ------------------------------------------------------------------ SSE scanner */

/* The keys of K_*, by bit; their lengths. */
static const char *const keys[] = {
	"usage", "content", "text", "choices", "arguments", "reasoning", "reasoning_content"
};
static const uint8_t keylen[] = { 5, 7, 4, 7, 9, 9, 17 };
#define NKEYS 7
#define KEY_MAXLEN 17

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
							f->cs0 = p + 1;     /* for usage_tpl_record() */
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

	if (__builtin_expect(s->api != 0, 0))
		return usage_api_feed(s, in, len, out);   /* responses, messages */
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
				t = s->keep && usage_tpl_room(s, i - r.i) ? s->tpl : &tl;
				usage_tpl_record(t, &r, s, &f, i);
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
	    usage_tpl_room(s, i - r.i))
		usage_tpl_record(s->tpl, &r, s, &f, i);   /* for the next call's events */
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

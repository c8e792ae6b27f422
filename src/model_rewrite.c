/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * An answer's "model" set back (sl_mrw, sl_model.h): a runner answers
 * under the name sluice sent it; the client is shown the name it asked
 * for, in a JSON body or in every event of a stream, fed in any split.
 */
#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_buf.h"
#include "sl_model.h"

enum { MRW_L_START = 0, MRW_L_DATA, MRW_L_OTHER };
/*
 * In the object read (the top-level one, or the "response" or "message"
 * object in it), between its tokens: what comes next. INTYPE: in the
 * string value of a top-level "type" (event streams), matched byte by byte.
 */
enum {
	MRW_P_KEY = 0, MRW_P_INKEY, MRW_P_COLON, MRW_P_VALUE, MRW_P_OTHER,
	MRW_P_INTYPE
};
/* The key just read: another, "model", "response" / "message", "type". */
enum { MRW_K_OTHER = 0, MRW_K_MODEL, MRW_K_SUB, MRW_K_TYPE };
/* Keys still matched byte by byte (kmatch): bits of mrw_keys[]. */
#define MRW_KM_MODEL 1u
#define MRW_KM_TOP 7u       /* at the top level of a JSON answer */
#define MRW_KM_TOP_SSE 15u  /* ... of an event's: "type" too */
#define MRW_NKEYS 4

static const struct {
	const char *s;
	unsigned len, kind;
} mrw_keys[MRW_NKEYS] = {
	{ "model", 5, MRW_K_MODEL },
	{ "response", 8, MRW_K_SUB },
	{ "message", 7, MRW_K_SUB },
	{ "type", 4, MRW_K_TYPE },
};

/*
 * Event types that carry no model (sl_model.h): a line whose top-level
 * "type" names one, before any "model" member, passes unread. Compared as
 * written. The Responses API's are every "response." type (something
 * after the dot) but the six below, which carry the response object;
 * Anthropic's Messages API's are listed. Byte by byte (a value split
 * across reads), the candidates are bits of kmatch: MRW_T_SKIP names,
 * then MRW_T_KEEP names, then the "response." prefix.
 */
#define MRW_T_SKIP 6
#define MRW_T_KEEP 6
#define MRW_T_PREFIX (MRW_T_SKIP + MRW_T_KEEP)   /* its bit index */
#define MRW_T_PREFIX_LEN 9
#define MRW_T_ALL ((1u << (MRW_T_PREFIX + 1)) - 1)

static const struct {
	const char *s;
	unsigned len;
} mrw_types[MRW_T_PREFIX + 1] = {
	{ "content_block_start", 19 }, { "content_block_delta", 19 },
	{ "content_block_stop", 18 }, { "message_delta", 13 },
	{ "message_stop", 12 }, { "ping", 4 },
	{ "response.created", 16 }, { "response.in_progress", 20 },
	{ "response.queued", 15 }, { "response.completed", 18 },
	{ "response.incomplete", 19 }, { "response.failed", 15 },
	{ "response.", MRW_T_PREFIX_LEN },
};

/* A type value v[0..n), as written: 1 when its line carries no model. */
static __attribute__((noinline)) int
mrw_type_skips(const char *v, size_t n)
{
	unsigned b;

	if (n > MRW_T_PREFIX_LEN && memcmp(v, "response.", MRW_T_PREFIX_LEN) == 0) {
		for (b = MRW_T_SKIP; b < MRW_T_PREFIX; b++)
			if (n == mrw_types[b].len && memcmp(v, mrw_types[b].s, n) == 0)
				return 0;
		return 1;
	}
	for (b = 0; b < MRW_T_SKIP; b++)
		if (n == mrw_types[b].len && memcmp(v, mrw_types[b].s, n) == 0)
			return 1;
	return 0;
}

/* The same for a value that may hold escapes (then it is no such name). */
static __attribute__((noinline)) int
mrw_type_value_skips(const char *v, size_t n)
{
	return memchr(v, '\\', n) == NULL && mrw_type_skips(v, n);
}

/* The same for a value matched byte by byte: candidates left, kidx bytes. */
static __attribute__((noinline)) int
mrw_type_skips_bits(unsigned bits, unsigned kidx)
{
	unsigned b;

	for (b = 0; b < MRW_T_SKIP; b++)
		if ((bits & 1u << b) && kidx == mrw_types[b].len)
			return 1;
	if (!(bits & 1u << MRW_T_PREFIX) || kidx <= MRW_T_PREFIX_LEN)
		return 0;
	for (b = MRW_T_SKIP; b < MRW_T_PREFIX; b++)
		if ((bits & 1u << b) && kidx == mrw_types[b].len)
			return 0;
	return 1;
}

/* The candidates of bits still matched after byte ch at kidx. */
static __attribute__((noinline)) unsigned
mrw_type_narrow(unsigned bits, unsigned kidx, unsigned char ch)
{
	unsigned b;

	for (b = 0; b < MRW_T_PREFIX; b++)
		if ((bits & 1u << b) && (kidx >= mrw_types[b].len ||
		    ch != (unsigned char)mrw_types[b].s[kidx]))
			bits &= ~(1u << b);
	/* the prefix: its bytes, then any */
	if ((bits & 1u << MRW_T_PREFIX) && kidx < MRW_T_PREFIX_LEN &&
	    ch != (unsigned char)"response."[kidx])
		bits &= ~(1u << MRW_T_PREFIX);
	return bits;
}

/*
 * A key whose opening quote is at k[-1], the text from k on at least
 * MRW_KEY_WHOLE - 1 bytes: which of the keys looked for it is (mask: the
 * bits of mrw_keys[]), with its closing quote, as written. Its length in
 * *klen.
 */
#define MRW_KEY_WHOLE 10   /* "response": the longest key, quotes included */

static inline __attribute__((always_inline)) unsigned
mrw_key_whole(const char *k, unsigned mask, size_t *klen)
{
	if (k[0] == 'm') {
		if (memcmp(k, "model\"", 6) == 0) {
			*klen = 5;
			return MRW_K_MODEL;
		}
		if (mask != MRW_KM_MODEL && memcmp(k, "message\"", 8) == 0) {
			*klen = 7;
			return MRW_K_SUB;
		}
	} else if (k[0] == 'r' && mask != MRW_KM_MODEL &&
	    memcmp(k, "response\"", 9) == 0) {
		*klen = 8;
		return MRW_K_SUB;
	} else if (k[0] == 't' && (mask & 8u) && memcmp(k, "type\"", 5) == 0) {
		*klen = 4;
		return MRW_K_TYPE;
	}
	return MRW_K_OTHER;
}

void
sl_mrw_init(struct sl_mrw *m, int sse, const char *lit, size_t litlen)
{
	memset(m, 0, sizeof(*m));
	m->lit = lit;
	m->litlen = litlen;
	m->sse = sse != 0;
}

static int
mrw_put(struct sl_mrw_buf *o, const char *p, size_t n)
{
	if (n == 0)
		return 0;
	if (sl_bytes_reserve(&o->p, &o->cap, o->len + n, 4096) == -1)
		return -1;
	memcpy(o->p + o->len, p, n);
	o->len += n;
	return 0;
}

/*
 * The first byte from in[i] on that may end a string or matter inside it
 * (a quote, a backslash; in an event stream a line end too), or n: found
 * with memchr, so a long string (a token's text, padding) costs little.
 */
static size_t
mrw_str_end(const char *in, size_t i, size_t n, int sse)
{
	const char *q = memchr(in + i, '"', n - i);
	size_t e = q != NULL ? (size_t)(q - in) : n;

	if ((q = memchr(in + i, '\\', e - i)) != NULL)
		e = (size_t)(q - in);
	if (sse) {
		if ((q = memchr(in + i, '\n', e - i)) != NULL)
			e = (size_t)(q - in);
		if ((q = memchr(in + i, '\r', e - i)) != NULL)
			e = (size_t)(q - in);
	}
	return e;
}

/* The first line end ('\n' or '\r') from in[i] on, or n. */
static size_t
mrw_line_end(const char *in, size_t i, size_t n)
{
	const char *q = memchr(in + i, '\n', n - i);
	size_t e = q != NULL ? (size_t)(q - in) : n;

	if ((q = memchr(in + i, '\r', e - i)) != NULL)
		e = (size_t)(q - in);
	return e;
}

/*
 * The end of the string whose opening quote is p[i]: the index of its
 * closing quote (one not escaped: after an even run of backslashes), or
 * -1 when it does not end before len.
 */
static ptrdiff_t
mrw_str_close(const char *p, size_t i, size_t len)
{
	size_t k = i + 1, b;
	const char *q;

	while ((q = memchr(p + k, '"', len - k)) != NULL) {
		for (b = 0; q - b - 1 >= p + i + 1 && q[-(ptrdiff_t)b - 1] == '\\'; b++)
			;
		if (b % 2 == 0)
			return q - p;
		k = (size_t)(q - p) + 1;
	}
	return -1;
}

/*
 * A byte outside strings, other than a quote, by the rules both readers
 * below share: nesting, and where the object read (the top-level one, or
 * the "response" or "message" object directly in it: *sub) is between its
 * tokens. Returns 1 when it starts a "model" value that is not a string
 * (left as it is: that line, or the answer, is done).
 */
static inline int
mrw_struct(unsigned char ch, unsigned *depth, unsigned *top_obj,
    unsigned *phase, unsigned *sub, unsigned key)
{
	int top = *depth == 1 + *sub && *top_obj;

	switch (ch) {
	case '{':
	case '[':
		if (*depth == 0) {
			*top_obj = ch == '{';
			*phase = MRW_P_KEY;
		} else if (top && *phase == MRW_P_VALUE) {
			if (key == MRW_K_MODEL) {
				*phase = MRW_P_OTHER;
				return 1;
			}
			if (key == MRW_K_SUB && ch == '{') {
				/* "response": {  - its members are read */
				*sub = 1;
				*phase = MRW_P_KEY;
			} else
				*phase = MRW_P_OTHER;
		}
		if (*depth < 1u << 30)
			(*depth)++;
		return 0;
	case '}':
	case ']':
		if (*depth > 0)
			(*depth)--;
		if (*sub && *depth == 1) {
			/* back in the top-level object, its value read */
			*sub = 0;
			*phase = MRW_P_OTHER;
		}
		return 0;
	case ':':
		if (top && *phase == MRW_P_COLON)
			*phase = MRW_P_VALUE;
		return 0;
	case ',':
		if (top)
			*phase = MRW_P_KEY;
		return 0;
	case ' ':
	case '\t':
	case '\n':
	case '\r':
		return 0;
	default:
		if (top && *phase == MRW_P_VALUE) {
			*phase = MRW_P_OTHER;
			return key == MRW_K_MODEL;
		}
		return 0;
	}
}

/*
 * The common case of an event stream: a data line whose end is in this
 * read, read from its start. The same rules as the state machine below,
 * token by token: 1 and the value's quotes at [*vs, *ve) when the first
 * "model" member met (top-level, or directly in a top-level "response" or
 * "message" object) is a string; 0 when the line has none (or not a
 * string, or a top-level "type" met before it names an event with no
 * model); -1 when a string does not end in the line (the machine decides
 * those).
 */
static int
mrw_line_fast(const char *p, size_t len, size_t *vs, size_t *ve)
{
	unsigned depth = 0, top_obj = 0, phase = MRW_P_KEY, key = MRW_K_OTHER;
	unsigned sub = 0;
	size_t i;
	ptrdiff_t j;

	for (i = 0; i < len; i++) {
		int top = depth == 1 + sub && top_obj;

		switch (p[i]) {
		case '"':
			if ((j = mrw_str_close(p, i, len)) < 0)
				return -1;
			if (top && phase == MRW_P_KEY) {
				const char *k = p + i + 1;
				size_t kl = (size_t)(j - (ptrdiff_t)i) - 1;

				/* by its first byte: most keys are none of these */
				key = MRW_K_OTHER;
				if (k[0] == 'm') {
					if (kl == 5 && memcmp(k, "model", 5) == 0)
						key = MRW_K_MODEL;
					else if (!sub && kl == 7 && memcmp(k, "message", 7) == 0)
						key = MRW_K_SUB;
				} else if (sub)
					;
				else if (k[0] == 'r') {
					if (kl == 8 && memcmp(k, "response", 8) == 0)
						key = MRW_K_SUB;
				} else if (k[0] == 't' && kl == 4 && memcmp(k, "type", 4) == 0)
					key = MRW_K_TYPE;
				phase = MRW_P_COLON;
			} else if (top && phase == MRW_P_VALUE) {
				if (key == MRW_K_MODEL) {
					*vs = i;
					*ve = (size_t)j + 1;
					return 1;
				}
				if (key == MRW_K_TYPE && mrw_type_value_skips(p + i + 1,
				    (size_t)(j - (ptrdiff_t)i) - 1))
					return 0;   /* an event with no model */
				phase = MRW_P_OTHER;
			}
			i = (size_t)j;
			break;
		default:
			if (mrw_struct((unsigned char)p[i], &depth, &top_obj, &phase,
			    &sub, key))
				return 0;   /* not a string: left */
			break;
		}
	}
	return 0;
}

/*
 * sl_mrw_feed's state, unpacked from struct sl_mrw for the loop (and
 * packed back at its end): the steps below are inline, so it lives in
 * registers as the loop's own locals did.
 */
struct mrw_run {
	unsigned line, pidx, in_str, esc, top_obj, phase, kidx, kmatch;
	unsigned key, skip, done, sub, depth;
	size_t i, seg;             /* the next byte; the first not yet put */
	int changed;               /* out holds what replaces the input */
};

static inline __attribute__((always_inline)) void
mrw_reset(struct mrw_run *r)
{
	r->in_str = r->esc = r->top_obj = r->phase = r->kidx = r->kmatch = 0;
	r->key = r->skip = r->done = r->sub = 0;
	r->depth = 0;
}

/* The input up to `to`, then the literal: a value replaced. -1: memory. */
static inline __attribute__((always_inline)) int
mrw_replace(struct mrw_run *r, const struct sl_mrw *m, const char *in,
    size_t to, struct sl_mrw_buf *out)
{
	if (!r->changed) {
		r->changed = 1;
		r->seg = 0;
	}
	if (mrw_put(out, in + r->seg, to - r->seg) == -1 ||
	    mrw_put(out, m->lit, m->litlen) == -1)
		return -1;
	return 0;
}

/*
 * An event stream's line structure, at byte ch = in[r->i]: a line's
 * start ("data:" or another field), its end, a line that is not data.
 * 1: the byte was taken, 0: it is the data's (lex it), -1: no memory.
 */
static inline __attribute__((always_inline)) int
mrw_sse_line(struct mrw_run *r, const struct sl_mrw *m, const char *in,
    size_t n, struct sl_mrw_buf *out, unsigned char ch)
{
	size_t i = r->i;

	if (r->line == MRW_L_START) {
		if (ch == '\n' || ch == '\r') {
			r->i++;
			return 1;
		}
		if (r->pidx == 0 && n - i >= 5 && memcmp(in + i, "data:", 5) == 0) {
			size_t le = mrw_line_end(in, i + 5, n), vs, ve;
			int k = le == n ? -1 : mrw_line_fast(in + i + 5,
			    le - i - 5, &vs, &ve);

			r->line = MRW_L_DATA;
			mrw_reset(r);
			if (k == 1) {
				if (mrw_replace(r, m, in, i + 5 + vs, out) == -1)
					return -1;
				r->seg = i + 5 + ve;
			}
			/* decided: on to the line's end */
			r->i = k == -1 ? i + 5 : le;
			return 1;
		}
		if (ch == (unsigned char)"data:"[r->pidx]) {
			if (++r->pidx == 5) {
				r->line = MRW_L_DATA;
				mrw_reset(r);
			}
		} else
			r->line = MRW_L_OTHER;
		r->i++;
		return 1;
	}
	if (ch == '\n' || ch == '\r') {
		if (r->skip)   /* a value cut by the line's end */
			r->seg = i;
		mrw_reset(r);
		r->line = MRW_L_START;
		r->pidx = 0;
		r->i++;
		return 1;
	}
	if (r->line == MRW_L_OTHER) {
		r->i = mrw_line_end(in, i, n);
		return 1;
	}
	return 0;
}

/*
 * Inside a string, or the value being replaced, at byte ch: a key that
 * may be one looked for, byte by byte, else to the string's end. 1: the
 * input ended inside it.
 */
static inline __attribute__((always_inline)) int
mrw_in_string(struct mrw_run *r, const char *in, size_t n, int sse,
    unsigned char ch)
{
	int top = r->depth == 1 + r->sub && r->top_obj;
	unsigned b;
	size_t j;

	if (r->esc) {
		r->esc = 0;
		r->i++;
		return 0;
	}
	if (r->kmatch && r->phase == MRW_P_INTYPE && !r->skip && top) {
		/* A type that may name an event with no model: byte by byte. */
		if (ch == '\\') {
			r->esc = 1;
			r->kmatch = 0;   /* an escaped type is not matched */
		} else if (ch == '"') {
			r->in_str = 0;
			r->phase = MRW_P_OTHER;
			if (mrw_type_skips_bits(r->kmatch, r->kidx))
				r->done = 1;   /* the rest of the line passes */
		} else {
			r->kmatch = mrw_type_narrow(r->kmatch, r->kidx, ch);
			if (r->kidx < 255)
				r->kidx++;
		}
		r->i++;
		return 0;
	}
	if (r->kmatch && r->phase == MRW_P_INKEY && !r->skip && top) {
		/* A key that may be one looked for: byte by byte. */
		if (ch == '\\') {
			r->esc = 1;
			r->kmatch = 0;   /* an escaped key is not matched */
		} else if (ch == '"') {
			r->in_str = 0;
			r->key = MRW_K_OTHER;
			for (b = 0; b < MRW_NKEYS; b++)
				if ((r->kmatch & 1u << b) &&
				    r->kidx == mrw_keys[b].len)
					r->key = mrw_keys[b].kind;
			r->phase = MRW_P_COLON;
		} else {
			for (b = 0; b < MRW_NKEYS; b++)
				if ((r->kmatch & 1u << b) &&
				    (r->kidx >= mrw_keys[b].len ||
				    ch != (unsigned char)mrw_keys[b].s[r->kidx]))
					r->kmatch &= ~(1u << b);
			r->kidx++;
		}
		r->i++;
		return 0;
	}
	if ((j = mrw_str_end(in, r->i, n, sse)) == n) {
		r->i = n;
		return 1;
	}
	if (in[j] == '\\') {
		r->esc = 1;
		r->kmatch = 0;
		r->i = j + 1;
	} else if (in[j] == '"') {
		if (r->skip) {
			/* the end of the value replaced */
			r->skip = 0;
			r->done = 1;
			r->seg = j + 1;
		} else if (top && r->phase == MRW_P_INKEY) {
			r->key = MRW_K_OTHER;
			r->phase = MRW_P_COLON;
		} else if (top && r->phase == MRW_P_INTYPE)
			r->phase = MRW_P_OTHER;   /* no longer a candidate */
		r->in_str = 0;
		r->i = j + 1;
	} else
		r->i = j;   /* a line end: mrw_sse_line's */
	return 0;
}

/*
 * Outside strings, at byte ch: a quote opens a key (maybe one looked for)
 * or a value (maybe the one replaced); other bytes move the structure.
 * -1: no memory.
 */
static inline __attribute__((always_inline)) int
mrw_outside(struct mrw_run *r, const struct sl_mrw *m, const char *in,
    size_t n, struct sl_mrw_buf *out, unsigned char ch)
{
	int top = r->depth == 1 + r->sub && r->top_obj;
	size_t i = r->i;

	switch (ch) {
	case '"':
		if (top && r->phase == MRW_P_KEY) {
			unsigned mask = r->sub ? MRW_KM_MODEL :
			    m->sse ? MRW_KM_TOP_SSE : MRW_KM_TOP;

			if (n - i >= MRW_KEY_WHOLE) {
				/* the whole key is here: compare it */
				size_t klen;
				unsigned k = mrw_key_whole(in + i + 1, mask, &klen);

				if (k != MRW_K_OTHER) {
					r->key = k;
					r->phase = MRW_P_COLON;
					r->i += klen + 2;
					return 0;
				}
				r->kmatch = 0;
			} else
				r->kmatch = mask;
			r->phase = MRW_P_INKEY;
			r->kidx = 0;
		} else if (top && r->phase == MRW_P_VALUE &&
		    r->key == MRW_K_MODEL) {
			/* The value: what came before it, then ours. */
			if (mrw_replace(r, m, in, i, out) == -1)
				return -1;
			r->skip = 1;   /* in_str is implied by skip */
			r->i++;
			return 0;
		} else if (top && r->phase == MRW_P_VALUE &&
		    r->key == MRW_K_TYPE) {
			/* A top-level "type" (an event's): the event it names. */
			size_t j = mrw_str_end(in, i + 1, n, 1);

			if (j < n && in[j] == '"') {
				/* whole in this read */
				r->phase = MRW_P_OTHER;
				if (mrw_type_skips(in + i + 1, j - i - 1))
					r->done = 1;   /* the rest of the line passes */
				r->i = j + 1;
				return 0;
			}
			/* an escape, the line's end (not one), or the read's end */
			if (j == n) {
				r->phase = MRW_P_INTYPE;
				r->kmatch = MRW_T_ALL;
				r->kidx = 0;
			} else
				r->phase = MRW_P_OTHER;
		} else if (top && r->phase == MRW_P_VALUE)
			r->phase = MRW_P_OTHER;
		r->in_str = 1;
		break;
	default:
		if (mrw_struct(ch, &r->depth, &r->top_obj, &r->phase, &r->sub,
		    r->key))
			r->done = 1;   /* not a string: left */
		break;
	}
	r->i++;
	return 0;
}

/*
 * One state machine, fed any split of the answer; the state lives in
 * struct mrw_run while a feed runs (stored back at its end). Strings are crossed
 * with memchr and a key is compared whole when all of it is in this read;
 * otherwise byte by byte, with the same outcome (fuzz_model checks every
 * split against the whole).
 */
int
sl_mrw_feed(struct sl_mrw *m, const char *in, size_t n, struct sl_mrw_buf *out)
{
	const int sse = m->sse;
	struct mrw_run r = {
		m->line, m->pidx, m->in_str, m->esc, m->top_obj, m->phase,
		m->kidx, m->kmatch, m->key, m->skip, m->done, m->sub, m->depth,
		0, 0, m->skip   /* bytes of a replaced value go */
	};
	int rc = 1, k;

	out->len = 0;
	while (r.i < n) {
		unsigned char ch;

		if (r.done) {
			/*
			 * The member is set: a JSON answer's other bytes pass;
			 * an event's, up to its line's end.
			 */
			if (!sse || (r.i = mrw_line_end(in, r.i, n)) == n)
				break;
		}
		ch = (unsigned char)in[r.i];
		if (sse && (k = mrw_sse_line(&r, m, in, n, out, ch)) != 0) {
			if (k == -1) {
				rc = -1;
				goto end;
			}
			continue;
		}
		if (r.skip || r.in_str) {
			if (mrw_in_string(&r, in, n, sse, ch))
				break;
			continue;
		}
		if (mrw_outside(&r, m, in, n, out, ch) == -1) {
			rc = -1;
			goto end;
		}
	}
	if (r.changed && !r.skip && mrw_put(out, in + r.seg, n - r.seg) == -1)
		rc = -1;
end:
	m->line = (unsigned char)r.line;
	m->pidx = (unsigned char)r.pidx;
	m->in_str = (unsigned char)r.in_str;
	m->esc = (unsigned char)r.esc;
	m->top_obj = (unsigned char)r.top_obj;
	m->phase = (unsigned char)r.phase;
	m->kidx = (unsigned char)r.kidx;
	m->kmatch = (unsigned short)r.kmatch;
	m->key = (unsigned char)r.key;
	m->skip = (unsigned char)r.skip;
	m->done = r.done != 0;
	m->sub = r.sub != 0;
	m->depth = r.depth;
	return rc == -1 ? -1 : r.changed;
}

char *
sl_mrw_literal(const char *name, size_t len, size_t *outlen)
{
	static const char hex[] = "0123456789abcdef";
	char *o, *p;
	size_t i;

	if ((o = malloc(len * 6 + 3)) == NULL)
		return NULL;
	p = o;
	*p++ = '"';
	for (i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)name[i];

		if (ch == '"' || ch == '\\') {
			*p++ = '\\';
			*p++ = (char)ch;
		} else if (ch < 0x20 || ch == 0x7f) {
			*p++ = '\\';
			*p++ = 'u';
			*p++ = '0';
			*p++ = '0';
			*p++ = hex[ch >> 4];
			*p++ = hex[ch & 15];
		} else
			*p++ = (char)ch;
	}
	*p++ = '"';
	*outlen = (size_t)(p - o);
	return o;
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Reference SSE usage scanner: src/usage.c at dc4cb72, renamed (see
 * usage_ref.h). Keep it as it is: it is the behaviour being preserved;
 * a deliberate change of behaviour is made here and in src/usage_scan.c alike
 * (usage_ref.h lists them).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "usage_ref.h"

#define JSON_WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r')

/* u from a "usage" object: prompt and completion required, total optional. */
static int
usage_from_obj(const json_t *o, struct sl_usage *u)
{
	const json_t *p, *c, *t;

	if (!json_is_object(o))
		return -1;
	p = json_object_get(o, "prompt_tokens");
	c = json_object_get(o, "completion_tokens");
	t = json_object_get(o, "total_tokens");
	if (!json_is_integer(p) || json_integer_value(p) < 0 ||
	    !json_is_integer(c) || json_integer_value(c) < 0)
		return -1;
	if (t != NULL && (!json_is_integer(t) || json_integer_value(t) < 0))
		return -1;
	u->prompt_tokens = (uint64_t)json_integer_value(p);
	u->completion_tokens = (uint64_t)json_integer_value(c);
	u->total_tokens = t != NULL ? (uint64_t)json_integer_value(t) :
	    u->prompt_tokens + u->completion_tokens;
	u->have = 1;
	return 0;
}

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
/* ev: per-event facts */
enum {
	EV_DATA = 1,        /* a data line was seen (the next one joins with \n) */
	EV_USAGE = 2,       /* "usage": { at depth 1 */
	EV_BAD = 4,         /* not one JSON object */
	EV_NOTDROP = 8,     /* known not to be the usage chunk */
	EV_CAPFAIL = 16     /* the usage object did not fit or memory ran out */
};
enum { TOP_NONE, TOP_OPEN, TOP_CLOSED };

void
ref_scan_init(struct ref_scan *s, int drop_usage_event)
{
	memset(s, 0, sizeof(*s));
#ifdef REF_STRIP
	s->nocand = SIZE_MAX;
#endif
	s->drop = drop_usage_event != 0;
	s->hs = H_NEW;
}

void
ref_scan_free(struct ref_scan *s)
{
	free(s->hold);
	free(s->cap);
#ifdef REF_STRIP
	free(s->spans);
	s->spans = NULL;
	s->nspans = s->spans_cap = 0;
#endif
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

/* The usage object closed: parse the copy; the result waits for the event's end. */
static void
capture_done(struct ref_scan *s)
{
	struct sl_usage u;
	json_error_t err;
	json_t *o;

	s->cap_depth = 0;
	s->pending_ok = 0;
	if (s->ev & EV_CAPFAIL)
		return;
	if ((o = json_loadb(s->cap, s->cap_len, 0, &err)) == NULL)
		return;
	if (usage_from_obj(o, &u) == 0) {
		s->p_prompt = u.prompt_tokens;
		s->p_completion = u.completion_tokens;
		s->p_total = u.total_tokens;
		s->pending_ok = 1;
	}
	json_decref(o);
}

/* A value starts with c right after a recognised key's colon. */
static void
key_value(struct ref_scan *s, char c)
{
	if (s->depth == 1 && (s->key & K_USAGE)) {
		if (c == '{') {
			s->ev |= EV_USAGE;
			s->ev &= (uint8_t)~EV_CAPFAIL;
			s->cap_len = 0;
			s->cap_depth = 2;        /* depth inside the object */
			if (grow_add(&s->cap, &s->cap_len, &s->cap_alloc, "{", 1) < 0)
				s->ev |= EV_CAPFAIL;
		} else {
			/* "usage": null (or anything else): not this event */
			s->ev = (uint8_t)((s->ev & ~EV_USAGE) | EV_NOTDROP);
			s->pending_ok = 0;
		}
	}
	if (s->depth == 1 && (s->key & K_CHOICES)) {
		if (c == '[')
			s->lx = LX_CHOICES;  /* set again below, after the bracket */
		else
			s->ev |= EV_NOTDROP;
	}
	if ((s->key & K_COUNT) && c == '"')
		s->cnt = 1;
}

#ifdef REF_STRIP
/*
 * The "usage":null rule of sl_usage.h, on the whole input at once (the
 * scanner is fed it in one read): at a comma at the top level of the data
 * object, or at the quote of its first key, look ahead in the raw bytes for
 * the member and record the bytes to cut. A member is cut only where the
 * streaming scanner can hold it: what it holds (the undecided event from
 * its start, or the member from its start) stays within SL_USAGE_MAX_EVENT
 * up to the byte that decides.
 */
static int
ref_match(const char *in, size_t len, size_t k, int first, int obj, size_t *mnull, size_t *r)
{
	unsigned depth;

#define BLANKS() while (k < len && (in[k] == ' ' || in[k] == '\t')) k++
	if (!first) {
		k++;
		BLANKS();
	}
	if (len - k < 7 || memcmp(in + k, "\"usage\"", 7) != 0)
		return 0;
	k += 7;
	BLANKS();
	if (k >= len || in[k] != ':')
		return 0;
	k++;
	BLANKS();
	if (obj && k < len && in[k] == '{') {
		/*
		 * A usage object (the event known not to be the usage chunk, not
		 * the first member): to its close on this line, nesting counted
		 * as the lexer counts it ({ and [ in, } and ] out, strings
		 * skipped, an escape's byte and a \u's four taken whatever they
		 * are).
		 */
		for (depth = 0; k < len; k++) {
			char c = in[k];

			if (c == '\r' || c == '\n')
				return 0;
			if (c == '"') {
				for (k++; k < len && in[k] != '"'; k++) {
					if (in[k] == '\r' || in[k] == '\n')
						return 0;
					if (in[k] == '\\') {
						/* the escaped byte, and a \u's four: none a line end */
						unsigned m = k + 1 < len && in[k + 1] == 'u' ? 5 : 1;

						for (; m > 0; m--)
							if (++k >= len || in[k] == '\r' || in[k] == '\n')
								return 0;
					}
				}
				if (k >= len)
					return 0;
				continue;
			}
			if (c == '{' || c == '[')
				depth++;
			else if ((c == '}' || c == ']') && --depth == 0)
				break;
		}
		if (k >= len)
			return 0;
		k++;
	} else {
		if (len - k < 4 || memcmp(in + k, "null", 4) != 0)
			return 0;
		k += 4;
	}
	*mnull = k;
	BLANKS();
	if (k >= len || (in[k] != ',' && in[k] != '}'))
		return 0;
	*r = k;
	return 1;
#undef BLANKS
}

static void
ref_strip_hook(struct ref_scan *s, char c)
{
	size_t x = s->at, mnull, r, start, end;

	if (s->drop && s->depth == 1 && !(s->ev & EV_BAD) && x + s->base != s->nocand &&
	    (c == ',' || (c == '"' && s->first)) &&
	    ref_match(s->in, s->in_len, x, c == '"', c == ',' && (s->ev & EV_NOTDROP),
	    &mnull, &r)) {
		start = (s->hs == H_PREFIX || s->hs == H_HOLD) ? s->ev_start : x;
		if (r - start <= SL_USAGE_MAX_EVENT) {
			end = c == '"' && s->in[r] == ',' ? r + 1 : mnull;
			if (c == '"' && s->in[r] == ',')
				s->nocand = r + s->base;
			if (s->nspans == s->spans_cap) {
				s->spans_cap = s->spans_cap ? 2 * s->spans_cap : 16;
				s->spans = realloc(s->spans, s->spans_cap * sizeof(s->spans[0]));
				if (s->spans == NULL)
					abort();
			}
			s->spans[s->nspans].off = x + s->base;
			s->spans[s->nspans].len = end - x;
			s->nspans++;
		}
	}
	if (!JSON_WS(c))
		s->first = 0;
	if ((c == '{' || c == '[') && s->depth == 0)
		s->first = s->drop;
}
#endif

/* One byte of the current event's data (with \n between data lines). */
static void
lex(struct ref_scan *s, char c)
{
	int choices;

	if (s->cap_depth && !(s->ev & EV_CAPFAIL) &&
	    grow_add(&s->cap, &s->cap_len, &s->cap_alloc, &c, 1) < 0)
		s->ev |= EV_CAPFAIL;
again:
	switch (s->lx) {
	case LX_STR:
		if (c == '"') {
			s->lx = LX_AFTER_STR;
			s->cnt = 0;
			/* a candidate key matches only if its length is what was seen */
			if (s->kmask) {
				uint8_t m = 0;
				int k;

				for (k = 0; k < NKEYS; k++)
					if ((s->kmask & (1 << k)) && keylen[k] == s->kpos)
						m |= (uint8_t)(1 << k);
				s->kmask = m;
			}
			s->key = s->kmask;
			return;
		}
		if (s->cnt)
			s->content_bytes++;
		if (c == '\\') {
			s->lx = LX_ESC;
			s->kmask = 0;
			return;
		}
		if (s->kmask) {
			int k;

			for (k = 0; k < NKEYS; k++)
				if ((s->kmask & (1 << k)) &&
				    (s->kpos >= keylen[k] || keys[k][s->kpos] != c))
					s->kmask &= (uint8_t)~(1 << k);
			s->kpos++;
		}
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
		goto again;
	case LX_AFTER_COLON:
		if (JSON_WS(c))
			return;
		s->lx = LX_VAL;
		if (s->key)
			key_value(s, c);
		s->key = 0;
		if (s->lx == LX_CHOICES) {
			s->lx = LX_VAL;
			choices = 1;
		} else
			choices = 0;
		goto value;
	case LX_CHOICES:
		if (JSON_WS(c))
			return;
		if (c != ']')
			s->ev |= EV_NOTDROP;
		s->lx = LX_VAL;
		goto again;
	default:
		break;
	}
	choices = 0;
value:
#ifdef REF_STRIP
	ref_strip_hook(s, c);
#endif
	/* LX_VAL */
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
		}
		if (s->depth == UINT16_MAX) {
			s->ev |= EV_BAD;
			break;
		}
		s->depth++;
		if (choices)
			s->lx = LX_CHOICES;
		break;
	case '}':
	case ']':
		if (s->depth == 0) {
			s->ev |= EV_BAD;
			break;
		}
		s->depth--;
		if (s->cap_depth && s->depth + 1 == s->cap_depth)
			capture_done(s);
		if (s->depth == 0) {
			s->top = TOP_CLOSED;
			if (!(s->ev & EV_USAGE))
				s->ev |= EV_NOTDROP;
		}
		break;
	default:
		if (s->depth == 0 && !JSON_WS(c))
			s->ev |= EV_BAD;
		break;
	}
}

/* A blank line: commit the usage of a well-formed usage event; next event. */
static void
event_end(struct ref_scan *s)
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
#ifdef REF_STRIP
	s->first = 0;
#endif
}

/* Droppable: one JSON object with "usage": {..} at the top and no non-empty choices. */
static int
droppable(const struct ref_scan *s)
{
	return (s->ev & (EV_USAGE | EV_NOTDROP | EV_BAD)) == EV_USAGE &&
	    s->top == TOP_CLOSED && s->depth == 0 && s->lx == LX_VAL;
}

/* Data bytes start: a second data line of the event joins with a newline. */
static void
data_begins(struct ref_scan *s)
{
	if (s->ev & EV_DATA)
		lex(s, '\n');
	s->ev |= EV_DATA;
}

/* Per call: the forwarded run of in [run_s, ..) and the held tail [tent_s, ..). */
struct feed {
	struct ref_out *out;
	size_t run_s, tent_s;
};

static void
emit(struct feed *f, size_t end)
{
	struct ref_out *o = f->out;

	if (end <= f->run_s)
		return;
	if (o->n == REF_MAX_RANGES)
		abort();      /* broken invariant: a call ends after a drop */
	o->range[o->n].off = f->run_s;
	o->range[o->n].len = end - f->run_s;
	o->n++;
}

/* The held event is not the usage event: its bytes go out after all. */
static void
flush(struct ref_scan *s, struct feed *f)
{
	if (s->hold_len > 0) {
		f->out->held = s->hold;
		f->out->held_len = s->hold_len;
		s->hold_len = 0;   /* the memory stays valid until the next call */
	}
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
held(const struct ref_scan *s)
{
	return s->hs == H_PREFIX || s->hs == H_HOLD;
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
prefix_step(struct ref_scan *s, struct feed *f, char c)
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

/* Non-zero when some byte of w equals b (the classic SWAR zero-byte test). */
static inline uint64_t
swar_has(uint64_t w, unsigned char b)
{
	uint64_t x = w ^ (UINT64_C(0x0101010101010101) * b);

	return (x - UINT64_C(0x0101010101010101)) & ~x &
	    UINT64_C(0x8080808080808080);
}

static size_t ref_feed(struct ref_scan *, const char *, size_t, struct ref_out *);

size_t
ref_scan_feed(struct ref_scan *s, const char *in, size_t len,
    struct ref_out *out)
{
	size_t n = ref_feed(s, in, len, out);

#ifdef REF_STRIP
	s->base += n;           /* spans are offsets in the whole input */
#endif
	return n;
}

static size_t
ref_feed(struct ref_scan *s, const char *in, size_t len,
    struct ref_out *out)
{
	struct feed f;
	size_t i;
	char c;

	memset(out, 0, sizeof(*out));
#ifdef REF_STRIP
	s->in = in;
	s->in_len = len;
#endif
	f.out = out;
	f.run_s = f.tent_s = 0;
	for (i = 0; i < len; i++) {
		c = in[i];
#ifdef REF_STRIP
		s->at = i;
#endif
		if (s->cr && c == '\n') {
			/* second byte of a CRLF: goes where its CR went */
			s->cr = 0;
			if (s->after_drop)
				drop_through(&f, i);
			s->after_drop = 0;
			continue;
		}
		if (s->hs == H_NEW) {
			if (s->drop) {
				/* the hold buffer is being flushed in this call: next call */
				if (out->held_len > 0)
					break;
				s->hs = H_PREFIX;
				s->pfx = 0;
				f.tent_s = i;
#ifdef REF_STRIP
				s->ev_start = i;
#endif
			} else
				s->hs = H_PASS;
		}
		s->cr = 0;
		s->after_drop = 0;

		/*
		 * Fast path, most bytes of a stream: inside a data string that is
		 * not a key candidate and not copied, only its end matters.
		 */
		if (s->line == LS_DATA && s->lx == LX_STR && s->kmask == 0 &&
		    s->cap_depth == 0 && s->hs != H_PREFIX) {
			size_t j = i;

			/* Eight bytes at a time while none of them matters. */
			while (j + 8 <= len) {
				uint64_t w;

				memcpy(&w, in + j, 8);
				if (swar_has(w, '"') | swar_has(w, '\\') |
				    swar_has(w, '\r') | swar_has(w, '\n'))
					break;
				j += 8;
			}
			while (j < len && in[j] != '"' && in[j] != '\\' && in[j] != '\r' &&
			    in[j] != '\n')
				j++;
			if (j > i) {
				if (s->cnt)
					s->content_bytes += j - i;
				i = j - 1;
				if (held(s) && s->hold_len + (j - f.tent_s) > SL_USAGE_MAX_EVENT)
					flush(s, &f);
				continue;
			}
		}

		if (s->hs == H_PREFIX)
			prefix_step(s, &f, c);

		if (c == '\r' || c == '\n') {
			s->cr = c == '\r';
			if (s->line == LS_START) {
				if (held(s) && droppable(s)) {
					s->hold_len = 0;
					emit(&f, f.tent_s);
					f.run_s = i + 1;
					s->dropped = 1;
					s->after_drop = s->cr;
					/* end the call: the next drop needs ranges of its own */
					event_end(s);
					s->hs = H_NEW;
					i++;
					break;
				} else if (held(s))
					flush(s, &f);
				event_end(s);
				s->hs = H_NEW;
				continue;
			}
			if (s->line == LS_FIELD && s->field == 4)
				data_begins(s);     /* "data" alone: an empty data line */
			s->line = LS_START;
		} else {
			switch (s->line) {
			case LS_START:
				if (c == ':') {
					s->line = LS_IGNORE;
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
				break;
			case LS_DATA_SP:
				s->line = LS_DATA;
				if (c != ' ')
					lex(s, c);
				break;
			case LS_DATA:
				lex(s, c);
				break;
			default:
				break;
			}
		}
		if (held(s) && ((s->ev & (EV_NOTDROP | EV_BAD)) ||
		    s->hold_len + (i + 1 - f.tent_s) > SL_USAGE_MAX_EVENT))
			flush(s, &f);
	}
	if (held(s)) {
		if (grow_add(&s->hold, &s->hold_len, &s->hold_alloc, in + f.tent_s,
		    i - f.tent_s) == 0) {
			emit(&f, f.tent_s);
			return i;
		}
		flush(s, &f);       /* no memory to hold it: let it through */
	}
	emit(&f, i);
	return i;
}

void
ref_scan_finish(struct ref_scan *s, struct ref_out *out)
{
	memset(out, 0, sizeof(*out));
	if (held(s) && s->hold_len > 0) {
		out->held = s->hold;
		out->held_len = s->hold_len;
		s->hold_len = 0;
	}
	s->hs = H_PASS;
	s->pending_ok = 0;
}

int
ref_scan_result(const struct ref_scan *s, struct sl_usage *u,
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
ref_scan_dropped(const struct ref_scan *s)
{
	return s->dropped;
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The event streams of the Responses API and the Anthropic Messages API
 * read for their usage and content (sl_usage_scan_init_api, sl_usage.h).
 *
 * Their own lexer, beside chat's (usage_scan.c is not touched by them but
 * for one branch at the top of its feed): these streams are never edited,
 * so nothing is held and every feed is one range of all its input. Per
 * event it follows the data's JSON only as far as it must: the key of the
 * current member at depths 1 and 2 (matched against the few names that
 * matter while its bytes go by), the top-level "type" value, the strings
 * counted for the estimate, and the copy of one usage object (parsed with
 * jansson once it closes). String bodies are skipped 16 bytes at a time
 * (SSE2) and the bytes between tokens by a table; a value nothing is read
 * in (deeper than depth 2, and most at depth 2) is crossed for its nesting
 * only. With sl_usage_scan_keep, a token event (one counted string) is kept
 * as a template and the next ones like it are taken in compares (see
 * fresh() below). Nothing is allocated but the copy of a usage object,
 * kept for the stream, and that template.
 *
 * It uses struct sl_usage_scan's fields as chat's scanner does where they
 * mean the same (content_bytes, the usage, cap, depth, cr, line, lx, ...)
 * and the a_* fields of its own.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__) && !defined(SL_USAGE_NO_SIMD)
#include <emmintrin.h>
#endif

#include <jansson.h>

#include "sl_json.h"
#include "sl_usage.h"
#include "usage_lexer.h"
#include "usage_template.h"

/* line */
enum { A_BOL, A_FIELD, A_DATA, A_SKIP };
/* lx */
enum { J_OUT, J_STR, J_ESC, J_U };
/* key: what the current string is */
enum { R_NONE, R_KEY, R_TYPE };
/* cnt: where the current string's bytes are counted */
enum { C_NO, C_NOW, C_PEND };
/* ev */
enum { AE_BAD = 1, AE_CAPFAIL = 2, AE_OBJ = 4, AE_SKIP = 8 };
/* a_kind: depth 1 and 2 are objects; a key is expected next */
enum { AK_OBJ1 = 1, AK_OBJ2 = 2, AK_KEY = 4 };
/*
 * a_pf: the usage parsed in this event: PF_IN, PF_OUT from the usage object
 * (p_prompt, p_completion, p_total), for messages from the top-level one
 * (message_delta's); PF_IN2 from messages' message.usage (message_start's;
 * its prompt in p_total). a_capd: the depth of the object being copied.
 */
enum { PF_IN = 1, PF_OUT = 2, PF_IN2 = 4 };
/* a_have: what the stream's usage has (messages comes in two events) */
enum { AH_PROMPT = 1, AH_COMPL = 2 };

/* Keys (bits of kmask, ids 1..8 in a_k1/a_k2). */
enum {
	KI_TYPE = 1, KI_DELTA, KI_USAGE, KI_RESPONSE, KI_MESSAGE, KI_TEXT,
	KI_THINKING, KI_PARTIAL_JSON
};
#define KB(i) (1u << ((i) - 1))
static const char *const key_names[8] = {
	"type", "delta", "usage", "response", "message", "text", "thinking",
	"partial_json"
};
static const uint8_t key_lens[8] = { 4, 5, 5, 8, 7, 4, 8, 12 };

/* Event types, per API (ids 1..n in a_type; 0xff another type). */
#define T_OTHER 0xff
enum { TF_USAGE = 1, TF_CONTENT = 2, TF_START = 4, TF_DELTA = 8 };
struct types {
	const char *name[8];
	uint8_t len[8];
	uint8_t flags[8];
	uint8_t n;
};
static const struct types resp_types = {
	{ "response.completed", "response.incomplete", "response.failed",
	  "response.output_text.delta", "response.refusal.delta",
	  "response.reasoning_text.delta", "response.reasoning_summary_text.delta",
	  "response.function_call_arguments.delta" },
	{ 18, 19, 15, 26, 22, 29, 37, 38 },
	{ TF_USAGE, TF_USAGE, TF_USAGE, TF_CONTENT, TF_CONTENT, TF_CONTENT,
	  TF_CONTENT, TF_CONTENT },
	8
};
static const struct types msg_types = {
	{ "message_start", "message_delta", "content_block_delta" },
	{ 13, 13, 19 },
	{ TF_START, TF_DELTA, TF_CONTENT },
	3
};

static inline const struct types *
types_of(const struct sl_usage_scan *s)
{
	return s->api == SL_API_RESPONSES ? &resp_types : &msg_types;
}

static inline uint8_t
type_flags(const struct sl_usage_scan *s)
{
	if (s->a_type == 0 || s->a_type == T_OTHER)
		return 0;
	return types_of(s)->flags[s->a_type - 1];
}

/* Bytes that end a run between tokens: what the lexer acts on. */
static const uint8_t tok_stop[256] = {
	['"'] = 1, ['{'] = 1, ['}'] = 1, ['['] = 1, [']'] = 1, [','] = 1,
	['\n'] = 1, ['\r'] = 1
};
/* Bytes that end a run in a string (and a skipped line: \n \r). */
static const uint8_t str_stops[256] = {
	['"'] = 1, ['\\'] = 1, ['\n'] = 1, ['\r'] = 1
};

/* The first byte of p[0..e) that is '"', '\\', '\n' or '\r' (or e). */
static inline const char *
str_end(const char *p, const char *e)
{
#if defined(__SSE2__) && !defined(SL_USAGE_NO_SIMD)
	const __m128i q = _mm_set1_epi8('"'), b = _mm_set1_epi8('\\');
	const __m128i n = _mm_set1_epi8('\n'), r = _mm_set1_epi8('\r');

	while (e - p >= 16) {
		__m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
		unsigned m = (unsigned)_mm_movemask_epi8(_mm_or_si128(
		    _mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, b)),
		    _mm_or_si128(_mm_cmpeq_epi8(v, n), _mm_cmpeq_epi8(v, r))));

		if (m != 0)
			return p + __builtin_ctz(m);
		p += 16;
	}
#endif
	while (p < e && !str_stops[(unsigned char)*p])
		p++;
	return p;
}

/* The first '\n' or '\r' of p[0..e) (or e). */
static inline const char *
line_end(const char *p, const char *e)
{
#if defined(__SSE2__) && !defined(SL_USAGE_NO_SIMD)
	const __m128i n = _mm_set1_epi8('\n'), r = _mm_set1_epi8('\r');

	while (e - p >= 16) {
		__m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
		unsigned m = (unsigned)_mm_movemask_epi8(_mm_or_si128(
		    _mm_cmpeq_epi8(v, n), _mm_cmpeq_epi8(v, r)));

		if (m != 0)
			return p + __builtin_ctz(m);
		p += 16;
	}
#endif
	while (p < e && *p != '\n' && *p != '\r')
		p++;
	return p;
}

/* Narrow the candidates of kmask by the bytes p[0..n) at kpos. */
static void
match_run(struct sl_usage_scan *s, const char *p, size_t n, const char *const *names,
    const uint8_t *lens)
{
	unsigned mask = s->kmask, pos = s->kpos, m, i;
	size_t k;

	for (k = 0; k < n && mask != 0; k++, pos++) {
		for (m = mask; m != 0; m &= m - 1) {
			i = (unsigned)__builtin_ctz(m);
			if (pos >= lens[i] || names[i][pos] != p[k])
				mask &= ~(1u << i);
		}
	}
	s->kmask = (uint8_t)mask;
	s->kpos = pos > 200 ? 200 : (uint8_t)pos;
}

/* The id (1..) of the candidate matched whole, or 0. */
static unsigned
match_end(const struct sl_usage_scan *s, const uint8_t *lens)
{
	unsigned m, i;

	for (m = s->kmask; m != 0; m &= m - 1) {
		i = (unsigned)__builtin_ctz(m);
		if (lens[i] == s->kpos)
			return i + 1;
	}
	return 0;
}

/* The id of key k[0..n) if it is one of mask's, else 0. */
static inline unsigned
key_whole(const char *k, size_t n, unsigned mask)
{
	unsigned id;

	switch (n) {
	case 4:
		id = memcmp(k, "type", 4) == 0 ? KI_TYPE :
		    memcmp(k, "text", 4) == 0 ? KI_TEXT : 0;
		break;
	case 5:
		id = memcmp(k, "delta", 5) == 0 ? KI_DELTA :
		    memcmp(k, "usage", 5) == 0 ? KI_USAGE : 0;
		break;
	case 7:
		id = memcmp(k, "message", 7) == 0 ? KI_MESSAGE : 0;
		break;
	case 8:
		id = memcmp(k, "response", 8) == 0 ? KI_RESPONSE :
		    memcmp(k, "thinking", 8) == 0 ? KI_THINKING : 0;
		break;
	case 12:
		id = memcmp(k, "partial_json", 12) == 0 ? KI_PARTIAL_JSON : 0;
		break;
	default:
		return 0;
	}
	return id != 0 && (mask & KB(id)) ? id : 0;
}

/* The type id of v[0..n), or T_OTHER. */
static inline unsigned
type_whole(const struct types *t, const char *v, size_t n)
{
	unsigned i;

	for (i = 0; i < t->n; i++)
		if (t->len[i] == n && memcmp(t->name[i], v, n) == 0)
			return i + 1;
	return T_OTHER;
}

/* ---- the usage object ---------------------------------------------------- */

/*
 * The counts a usage object of any of these APIs may carry, each read as
 * a count: r 1 with v when a non-negative integer (over
 * SL_USAGE_MAX_TOKENS: SL_USAGE_MAX_TOKENS + 1, so sums cannot wrap), 0
 * absent or null, -1 anything else.
 */
enum { UC_IN, UC_OUT, UC_TOTAL, UC_CC, UC_CR, UC_PROMPT, UC_N };
static const char *const uc_names[UC_N] = {
	"input_tokens", "output_tokens", "total_tokens", "cache_creation_input_tokens",
	"cache_read_input_tokens", "prompt_tokens"
};
struct ucounts {
	int r[UC_N];
	uint64_t v[UC_N];
};

/* The counts of a usage object parsed by jansson. */
static void
counts_json(const json_t *o, struct ucounts *c)
{
	int k;

	for (k = 0; k < UC_N; k++) {
		const json_t *x = json_object_get(o, uc_names[k]);

		c->v[k] = 0;
		if (x == NULL || json_is_null(x))
			c->r[k] = 0;
		else if (!json_is_integer(x) || json_integer_value(x) < 0)
			c->r[k] = -1;
		else {
			c->r[k] = 1;
			c->v[k] = (uint64_t)json_integer_value(x);
			if (c->v[k] > SL_USAGE_MAX_TOKENS)
				c->v[k] = SL_USAGE_MAX_TOKENS + 1;
		}
	}
}

/*
 * The counts of a usage object as runners send it, without jansson: an
 * object of plain ASCII keys (no escapes) whose values are integers of at
 * most 18 digits, null, true, false, or objects of such members one level
 * down (*_tokens_details). r[i] and v[i] for the top-level member names[i]:
 * UCR_INT with its value, UCR_NULL, UCR_ABSENT or UCR_OTHER (v 0); the last
 * of a duplicate key wins, as in jansson. 1 when read, -1 for anything else
 * (jansson then decides). usage.c reads chat's usage object with it too.
 */
int
usage_counts_read(const char *p, size_t len, const char *const *names, int n,
    int *r, uint64_t *v)
{
	const char *e = p + len, *ks, *ds;
	int level = 0, t, k, i;
	uint64_t x = 0;
	size_t kl;

	for (i = 0; i < n; i++) {
		r[i] = UCR_ABSENT;
		v[i] = 0;
	}
#define CF_WS(q) while ((q) < e && JSON_WS(*(q))) (q)++
	CF_WS(p);
	if (p == e || *p != '{')
		return -1;
	p++;
	CF_WS(p);
	if (p < e && *p == '}') {
		p++;
		goto closed;
	}
	for (;;) {
		if (p == e || *p != '"')
			return -1;
		ks = ++p;
		while (p < e && *p != '"') {
			if (*p == '\\' || (unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
				return -1;
			p++;
		}
		if (p == e)
			return -1;
		kl = (size_t)(p - ks);
		p++;
		CF_WS(p);
		if (p == e || *p != ':')
			return -1;
		p++;
		CF_WS(p);
		if (p == e)
			return -1;
		k = -1;
		if (level == 0)
			for (i = 0; i < n; i++)
				if (strlen(names[i]) == kl && memcmp(ks, names[i], kl) == 0)
					k = i;
		if (*p >= '0' && *p <= '9') {
			/* no leading zero, fraction or exponent: jansson's integer */
			ds = p;
			for (x = 0; p < e && *p >= '0' && *p <= '9'; p++) {
				if (p - ds == 18)
					return -1;
				x = x * 10 + (uint64_t)(*p - '0');
			}
			if ((*ds == '0' && p - ds > 1) ||
			    (p < e && (*p == '.' || *p == 'e' || *p == 'E')))
				return -1;
			t = UCR_INT;
		} else if (e - p >= 4 && memcmp(p, "null", 4) == 0) {
			p += 4;
			t = UCR_NULL;
		} else if (e - p >= 4 && memcmp(p, "true", 4) == 0) {
			p += 4;
			t = UCR_OTHER;
		} else if (e - p >= 5 && memcmp(p, "false", 5) == 0) {
			p += 5;
			t = UCR_OTHER;
		} else if (*p == '{' && level == 0) {
			p++;
			CF_WS(p);
			if (k >= 0) {
				r[k] = UCR_OTHER;
				v[k] = 0;
				k = -1;
			}
			if (p < e && *p == '}') {
				p++;
				t = UCR_OTHER;
			} else {
				level = 1;
				continue;
			}
		} else
			return -1;
		if (k >= 0) {
			r[k] = t;
			v[k] = t == UCR_INT ? x : 0;
		}
		CF_WS(p);
		if (p < e && *p == ',') {
			p++;
			CF_WS(p);
			continue;
		}
		if (p == e || *p != '}')
			return -1;
		p++;
		if (level == 1) {
			level = 0;
			CF_WS(p);
			if (p < e && *p == ',') {
				p++;
				CF_WS(p);
				continue;
			}
			if (p == e || *p != '}')
				return -1;
			p++;
		}
		break;
	}
closed:
	CF_WS(p);
#undef CF_WS
	return p == e ? 1 : -1;
}

/* The counts of a usage object of these APIs, read without jansson. */
static int
counts_fast(const char *p, size_t len, struct ucounts *c)
{
	int k;

	if (usage_counts_read(p, len, uc_names, UC_N, c->r, c->v) == -1)
		return -1;
	for (k = 0; k < UC_N; k++) {
		/* as counts_json: null is absent, a count over the cap is cap + 1 */
		if (c->r[k] == UCR_NULL)
			c->r[k] = 0;
		else if (c->r[k] == UCR_INT && c->v[k] > SL_USAGE_MAX_TOKENS)
			c->v[k] = SL_USAGE_MAX_TOKENS + 1;
	}
	return 1;
}

/*
 * The counts of api's usage object: *prompt (with PF_IN) and *completion
 * (PF_OUT) as sl_usage.h says for the api, *total as reported or their sum.
 */
static unsigned
usage_counts(enum sl_api api, const struct ucounts *c, uint64_t *prompt,
    uint64_t *completion, uint64_t *total)
{
	const int *r = c->r;
	const uint64_t *v = c->v;
	unsigned pf = 0;
	uint64_t in = 0, out = 0;
	int rt = 0;

	*prompt = *completion = *total = 0;
	switch (api) {
	case SL_API_RESPONSES:
		if (r[UC_IN] != 1 || r[UC_OUT] != 1 || r[UC_TOTAL] < 0)
			return 0;
		in = v[UC_IN];
		out = v[UC_OUT];
		rt = r[UC_TOTAL];
		pf = PF_IN | PF_OUT;
		break;
	case SL_API_MESSAGES:
		if (r[UC_IN] == 1 && r[UC_CC] >= 0 && r[UC_CR] >= 0) {
			in = v[UC_IN] + v[UC_CC] + v[UC_CR];
			if (in > SL_USAGE_MAX_TOKENS)
				in = SL_USAGE_MAX_TOKENS + 1;
			pf |= PF_IN;
		}
		if (r[UC_OUT] == 1) {
			out = v[UC_OUT];
			pf |= PF_OUT;
		}
		break;
	case SL_API_EMBEDDINGS:
		if (r[UC_PROMPT] != 1 || r[UC_TOTAL] < 0)
			return 0;
		in = v[UC_PROMPT];
		rt = r[UC_TOTAL];
		pf = PF_IN | PF_OUT;
		break;
	default:
		return 0;
	}
	*prompt = in;
	*completion = out;
	*total = rt == 1 ? v[UC_TOTAL] : in + out;
	return pf;
}

/* The same from a jansson value (not an object: nothing). */
static unsigned
usage_obj_api(enum sl_api api, const json_t *o, uint64_t *prompt,
    uint64_t *completion, uint64_t *total)
{
	struct ucounts c;

	*prompt = *completion = *total = 0;
	if (!json_is_object(o))
		return 0;
	counts_json(o, &c);
	return usage_counts(api, &c, prompt, completion, total);
}

int
usage_api_from_json(enum sl_api api, const char *body, size_t len,
    struct sl_usage *u)
{
	json_t *root;
	json_error_t err;
	unsigned pf = 0;

	memset(u, 0, sizeof(*u));
	if (body == NULL || len == 0 || len > SL_USAGE_MAX_JSON)
		return -1;
	if ((root = json_loadb(body, len, 0, &err)) == NULL)
		return -1;
	if (json_is_object(root))
		pf = usage_obj_api(api, json_object_get(root, "usage"),
		    &u->prompt_tokens, &u->completion_tokens, &u->total_tokens);
	json_decref(root);
	if (pf != (PF_IN | PF_OUT)) {
		memset(u, 0, sizeof(*u));
		return -1;
	}
	u->have = 1;
	return 0;
}

static uint64_t
str_len(const json_t *v)
{
	return json_is_string(v) ? json_string_length(v) : 0;
}

/* The "text" (and name2's) strings of the objects of array a. */
static uint64_t
parts_text(const json_t *a, const char *name2)
{
	const json_t *x;
	uint64_t n = 0;
	size_t i;

	json_array_foreach(a, i, x) {
		n += str_len(json_object_get(x, "text"));
		if (name2 != NULL)
			n += str_len(json_object_get(x, name2));
	}
	return n;
}

uint64_t
usage_api_json_content(enum sl_api api, const char *body, size_t len)
{
	json_t *root, *x, *in;
	json_error_t err;
	uint64_t n = 0;
	size_t i;

	if (body == NULL || len == 0 || len > SL_USAGE_MAX_JSON ||
	    (root = json_loadb(body, len, 0, &err)) == NULL)
		return 0;
	if (api == SL_API_RESPONSES) {
		json_array_foreach(json_object_get(root, "output"), i, x) {
			n += parts_text(json_object_get(x, "content"), "refusal");
			n += parts_text(json_object_get(x, "summary"), NULL);
			n += str_len(json_object_get(x, "arguments"));
		}
	} else {
		json_array_foreach(json_object_get(root, "content"), i, x) {
			n += str_len(json_object_get(x, "text"));
			n += str_len(json_object_get(x, "thinking"));
			if ((in = json_object_get(x, "input")) != NULL &&
			    json_is_object(json_object_get(x, "input"))) {
				char *d = json_dumps(in, JSON_COMPACT);

				if (d != NULL) {
					n += strlen(d);
					free(d);
				}
			}
		}
	}
	json_decref(root);
	return n;
}

/* ---- the scanner --------------------------------------------------------- */

void
usage_api_init(struct sl_usage_scan *s, enum sl_api api)
{
	s->api = (uint8_t)api;
	s->line = A_BOL;
	s->lx = J_OUT;
}

/* Append to the copy of the usage object (bounded). */
static void
cap_add(struct sl_usage_scan *s, const char *p, size_t n)
{
	size_t want = (size_t)s->cap_len + n, na;
	char *nb;

	if (s->ev & AE_CAPFAIL || n == 0)
		return;
	if (want > SL_USAGE_MAX_EVENT) {
		s->ev |= AE_CAPFAIL;
		return;
	}
	if (want > s->cap_alloc) {
		na = s->cap_alloc ? s->cap_alloc : 256;
		while (na < want)
			na *= 2;
		if ((nb = realloc(s->cap, na)) == NULL) {
			s->ev |= AE_CAPFAIL;
			return;
		}
		s->cap = nb;
		s->cap_alloc = (uint32_t)na;
	}
	memcpy(s->cap + s->cap_len, p, n);
	s->cap_len = (uint32_t)want;
}

/* The usage object closed: parse the copy into the event's pending usage. */
static void
cap_done(struct sl_usage_scan *s)
{
	struct ucounts c;
	json_error_t err;
	json_t *o;
	uint64_t pr = 0, co = 0, to = 0;
	unsigned pf;

	s->cap_depth = 0;
	if (s->ev & AE_CAPFAIL) {
		/* too big to be a usage object: as one that does not read */
		s->ev &= (uint8_t)~AE_CAPFAIL;
		s->cap_len = 0;
		s->a_pf &= s->api == SL_API_MESSAGES && s->a_capd == 2 ?
		    (uint8_t)~PF_IN2 : (uint8_t)PF_IN2;
		return;
	}
	pf = 0;
	if (counts_fast(s->cap, s->cap_len, &c) == 1)
		pf = usage_counts((enum sl_api)s->api, &c, &pr, &co, &to);
	else if ((o = json_loadb(s->cap, s->cap_len, 0, &err)) != NULL) {
		pf = usage_obj_api((enum sl_api)s->api, o, &pr, &co, &to);
		json_decref(o);
	}
	s->cap_len = 0;
	if (s->api == SL_API_MESSAGES && s->a_capd == 2) {
		/* message_start's message.usage: its prompt only */
		s->a_pf = (uint8_t)((s->a_pf & (PF_IN | PF_OUT)) | (pf & PF_IN ? PF_IN2 : 0));
		s->p_total = pr;
		return;
	}
	s->a_pf = (uint8_t)((s->a_pf & PF_IN2) | pf);
	s->p_prompt = pr;
	s->p_completion = co;
	if (s->api == SL_API_RESPONSES)
		s->p_total = to;
}

static uint64_t
sat_add(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

/* A blank line: the event is complete; commit what it says, start anew. */
static void
event_end(struct sl_usage_scan *s)
{
	uint8_t tf = type_flags(s);
	int whole = !(s->ev & AE_BAD) && (s->ev & AE_OBJ) && s->depth == 0 &&
	    s->lx == J_OUT;

	if (s->a_pend > 0 && (tf & TF_CONTENT))
		s->content_bytes += s->a_pend;
	if (whole && s->api == SL_API_RESPONSES) {
		if ((tf & TF_USAGE) && s->a_pf == (PF_IN | PF_OUT)) {
			s->prompt = s->p_prompt;
			s->completion = s->p_completion;
			s->total = s->p_total;
			s->have = 1;
		}
	} else if (whole) {
		if ((tf & TF_START) && (s->a_pf & PF_IN2)) {
			s->prompt = s->p_total;
			s->a_have |= AH_PROMPT;
		}
		if ((tf & TF_DELTA) && (s->a_pf & PF_OUT)) {
			s->completion = s->p_completion;
			s->a_have |= AH_COMPL;
			if ((s->a_pf & PF_IN) && !(s->a_have & AH_PROMPT)) {
				s->prompt = s->p_prompt;
				s->a_have |= AH_PROMPT;
			}
		}
		if (s->a_have == (AH_PROMPT | AH_COMPL)) {
			s->have = 1;
			s->total = sat_add(s->prompt, s->completion);
		}
	}
	s->depth = s->cap_depth = 0;
	s->cap_len = 0;
	s->lx = J_OUT;
	s->ev = 0;
	s->a_pend = 0;
	s->a_k1 = s->a_k2 = s->a_type = s->a_kind = 0;
	s->a_pf = 0;
	s->key = R_NONE;
	s->cnt = C_NO;
}

/* A data line ended (at a line end, not the feed's). */
static void
data_line_end(struct sl_usage_scan *s)
{
	if (s->lx != J_OUT) {
		/* a string across lines: not JSON */
		s->ev |= AE_BAD;
		s->cap_depth = 0;
	}
}

/* A string opens after the data's bytes so far: what it is. */
static inline void
string_begins(struct sl_usage_scan *s)
{
	unsigned d = s->depth;

	s->lx = J_STR;
	s->cnt = C_NO;
	s->kmask = 0;
	s->kpos = 0;
	if (s->cap_depth)
		s->key = R_NONE;
	else if (s->a_kind & AK_KEY) {
		s->key = R_KEY;
		s->a_kind &= (uint8_t)~AK_KEY;
		if (d == 1)
			s->kmask = s->api == SL_API_RESPONSES ?
			    KB(KI_TYPE) | KB(KI_DELTA) | KB(KI_RESPONSE) :
			    KB(KI_TYPE) | KB(KI_DELTA) | KB(KI_USAGE) | KB(KI_MESSAGE);
		else if (s->a_k1 == KI_RESPONSE || s->a_k1 == KI_MESSAGE)
			s->kmask = KB(KI_USAGE);
		else if (s->a_k1 == KI_DELTA && s->api == SL_API_MESSAGES)
			s->kmask = KB(KI_TEXT) | KB(KI_THINKING) | KB(KI_PARTIAL_JSON);
	} else {
		s->key = R_NONE;
		if (d == 1 && s->a_k1 == KI_TYPE) {
			s->key = R_TYPE;
			s->kmask = (uint8_t)((1u << types_of(s)->n) - 1);
		} else if (s->api == SL_API_RESPONSES ? d == 1 && s->a_k1 == KI_DELTA :
		    d == 2 && s->a_k1 == KI_DELTA && (s->a_k2 == KI_TEXT ||
		    s->a_k2 == KI_THINKING || s->a_k2 == KI_PARTIAL_JSON)) {
			if (s->a_type == 0)
				s->cnt = C_PEND;
			else if (type_flags(s) & TF_CONTENT)
				s->cnt = C_NOW;
		}
	}
}

/* A type not of interest: the rest of the event is skipped unread. */
static inline void
type_set(struct sl_usage_scan *s, unsigned id)
{
	s->a_type = (uint8_t)id;
	if (id == T_OTHER)
		s->ev |= AE_SKIP;
}

/*
 * A string whole in the feed, v[0..n) between its quotes, no escape, met
 * outside strings: what string_begins and then its closing quote would
 * do, without the states they pass through (lx, key and cnt are J_OUT,
 * R_NONE and C_NO before and after; kmask and kpos matter only inside a
 * string). 1 when it is one counted (now or at the event's end).
 */
static inline int
string_at(struct sl_usage_scan *s, const char *v, size_t n)
{
	unsigned d = s->depth, a_k1 = s->a_k1, mask, id;

	if (s->cap_depth)
		return 0;   /* in the usage object copied */
	if (s->a_kind & AK_KEY) {
		s->a_kind &= (uint8_t)~AK_KEY;
		if (d == 1)
			mask = s->api == SL_API_RESPONSES ?
			    KB(KI_TYPE) | KB(KI_DELTA) | KB(KI_RESPONSE) :
			    KB(KI_TYPE) | KB(KI_DELTA) | KB(KI_USAGE) | KB(KI_MESSAGE);
		else if (a_k1 == KI_RESPONSE || a_k1 == KI_MESSAGE)
			mask = KB(KI_USAGE);
		else if (a_k1 == KI_DELTA && s->api == SL_API_MESSAGES)
			mask = KB(KI_TEXT) | KB(KI_THINKING) | KB(KI_PARTIAL_JSON);
		else
			mask = 0;
		id = mask ? key_whole(v, n, mask) : 0;
		if (d == 1)
			s->a_k1 = (uint8_t)id;
		else
			s->a_k2 = (uint8_t)id;
		return 0;
	}
	if (d == 1 && a_k1 == KI_TYPE) {
		type_set(s, type_whole(types_of(s), v, n));
		return 0;
	}
	if (a_k1 != KI_DELTA || (s->api == SL_API_RESPONSES ? d != 1 :
	    d != 2 || (s->a_k2 != KI_TEXT && s->a_k2 != KI_THINKING &&
	    s->a_k2 != KI_PARTIAL_JSON)))
		return 0;
	/* content: counted now, or at the event's end once its type says */
	if (s->a_type == 0) {
		uint64_t t = (uint64_t)s->a_pend + n;

		s->a_pend = t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
	} else if (type_flags(s) & TF_CONTENT)
		s->content_bytes += n;
	return 1;
}

/* The closing quote: a key sets the member's key, a type the event's. */
static inline void
string_ends(struct sl_usage_scan *s)
{
	s->lx = J_OUT;
	if (s->key == R_KEY) {
		unsigned id = s->kmask ? match_end(s, key_lens) : 0;

		if (s->depth == 1)
			s->a_k1 = (uint8_t)id;
		else
			s->a_k2 = (uint8_t)id;
	} else if (s->key == R_TYPE) {
		unsigned id = s->kmask ? match_end(s, types_of(s)->len) : 0;

		type_set(s, id ? id : T_OTHER);
	}
	s->key = R_NONE;
	s->cnt = C_NO;
}

/* A '{' at the usage object's place? (the brace not yet counted in depth) */
static inline int
usage_here(const struct sl_usage_scan *s)
{
	if (s->depth == 2)
		return s->a_k2 == KI_USAGE && (s->a_k1 == KI_RESPONSE ||
		    (s->a_k1 == KI_MESSAGE && s->api == SL_API_MESSAGES));
	return s->depth == 1 && s->a_k1 == KI_USAGE && s->api == SL_API_MESSAGES;
}

/*
 * An event being recorded as a template (usage_api_feed): on 1 while it
 * may be one, 2 once it may not; its counted string's quotes at s0, s1.
 */
struct arec {
	int on;
	const char *s0, *s1;
};

/* Bytes a nested value is crossed by: strings, brackets, line ends. */
static const uint8_t nest_stop[256] = {
	['"'] = 1, ['{'] = 1, ['}'] = 1, ['['] = 1, [']'] = 1,
	['\n'] = 1, ['\r'] = 1
};

/*
 * The object or array just opened (s->depth counts it): 1 when nothing in
 * it matters (lex would only track its nesting): deeper than depth 2; at
 * depth 2 an array, or an object but "response" / "message" (a usage in
 * it) and messages' "delta" (its text). A usage object being copied is
 * crossed too: the copy is of its bytes.
 */
static inline int
nest_dull(const struct sl_usage_scan *s, char c)
{
	if (s->depth >= 3)
		return 1;
	if (s->depth != 2)
		return 0;
	return c != '{' || !(s->a_k1 == KI_RESPONSE || s->a_k1 == KI_MESSAGE ||
	    (s->a_k1 == KI_DELTA && s->api == SL_API_MESSAGES));
}

/*
 * Inside a value whose contents do not matter (nest_dull), at p: its bytes
 * crossed up to the bracket that closes it, a line end, the end of the
 * feed, or a string that does not end before either (left at its opening
 * quote); the nesting tracked. What lex would do there, but the keys,
 * strings and commas it would look at and set nothing by (nothing at
 * depth 3 or more; a key at depth 2 only in "response", "message" or
 * messages' "delta", and no key in an array).
 */
static const char *
nest_skip(struct sl_usage_scan *s, const char *p, const char *e)
{
	unsigned depth = s->depth, floor = depth;
	const char *q;

	while (p < e) {
		while (p < e && !nest_stop[(unsigned char)*p])
			p++;
		if (p == e)
			break;
		switch (*p) {
		case '"':
			for (q = p + 1;;) {
				q = str_end(q, e);
				if (q == e || *q != '\\')
					break;
				/* an escape: \uXXXX as lex takes it, 4 bytes */
				if (e - q < 2 || q[1] == '\n' || q[1] == '\r')
					goto out;
				if (q[1] == 'u') {
					if (e - q < 6 || memchr(q + 2, '\n', 4) != NULL ||
					    memchr(q + 2, '\r', 4) != NULL)
						goto out;
					q += 6;
				} else
					q += 2;
			}
			if (q == e || *q != '"')
				goto out;   /* lex reads it: the line or feed ends in it */
			p = q + 1;
			break;
		case '{':
		case '[':
			if (depth >= UINT16_MAX - 1)
				goto out;   /* lex marks the event */
			depth++;
			p++;
			break;
		case '}':
		case ']':
			if (depth == floor)
				goto out;   /* lex closes it */
			depth--;
			p++;
			break;
		default:            /* \r \n */
			goto out;
		}
	}
out:
	s->depth = (uint16_t)depth;
	s->a_kind &= (uint8_t)~AK_KEY;
	return p;
}

/*
 * lex's common case, outside strings and with no usage object being
 * copied: the same steps, the state it moves most in locals. Returns where
 * it stopped: e, a line end, AE_SKIP set (after the type), or a token it
 * leaves to lex (a string not whole in the feed or with an escape, a '['
 * or a closing bracket at depth 0, a usage object's brace, the deepest
 * nesting).
 */
static const char *
lex_fast(struct sl_usage_scan *s, const char *p, const char *e, struct arec *r)
{
	const int msgs = s->api == SL_API_MESSAGES;
	const unsigned mask1 = msgs ?
	    KB(KI_TYPE) | KB(KI_DELTA) | KB(KI_USAGE) | KB(KI_MESSAGE) :
	    KB(KI_TYPE) | KB(KI_DELTA) | KB(KI_RESPONSE);
	unsigned depth = s->depth, kind = s->a_kind, k1 = s->a_k1, k2 = s->a_k2;
	unsigned mask;
	const char *q;
	char c;

	for (;;) {
		while (p < e && !tok_stop[(unsigned char)*p])
			p++;
		if (p == e)
			break;
		c = *p;
		if (c == '"') {
			const char *v = p + 1;
			size_t n;

			q = str_end(v, e);
			if (q == e || *q != '"')
				break;
			n = (size_t)(q - v);
			p = q + 1;
			if (kind & AK_KEY) {
				kind &= ~(unsigned)AK_KEY;
				if (depth == 1) {
					k1 = key_whole(v, n, mask1);
					continue;
				}
				mask = k1 == KI_RESPONSE || k1 == KI_MESSAGE ? KB(KI_USAGE) :
				    k1 == KI_DELTA && msgs ?
				    KB(KI_TEXT) | KB(KI_THINKING) | KB(KI_PARTIAL_JSON) : 0;
				k2 = mask ? key_whole(v, n, mask) : 0;
			} else if (depth == 1 && k1 == KI_TYPE) {
				type_set(s, type_whole(types_of(s), v, n));
				if (s->ev & AE_SKIP)
					break;
			} else if (k1 == KI_DELTA && (!msgs ? depth == 1 :
			    depth == 2 && (k2 == KI_TEXT || k2 == KI_THINKING ||
			    k2 == KI_PARTIAL_JSON))) {
				/* content: now, or at the event's end by its type */
				if (s->a_type == 0) {
					uint64_t t = (uint64_t)s->a_pend + n;

					s->a_pend = t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
					r->on = r->on ? 2 : 0;
				} else if (type_flags(s) & TF_CONTENT) {
					s->content_bytes += n;
					if (r->on == 1) {
						/* the template's string: one only */
						if (r->s0 != NULL)
							r->on = 2;
						r->s0 = v;
						r->s1 = q;
					}
				}
			}
			continue;
		}
		if (c == ',') {
			if ((depth == 1 && (kind & AK_OBJ1)) ||
			    (depth == 2 && (kind & AK_OBJ2)))
				kind |= AK_KEY;
			p++;
			continue;
		}
		if (c == '{' || c == '[') {
			if (depth == 0 && c == '{') {
				/* the event's object (lex's first bracket) */
				s->ev |= AE_OBJ;
				depth = 1;
				k1 = 0;
				kind = AK_OBJ1 | AK_KEY;
				p++;
				continue;
			}
			if (depth == 0 || depth >= UINT16_MAX - 1 || (c == '{' &&
			    (depth == 2 ? k2 == KI_USAGE && (k1 == KI_RESPONSE ||
			    (k1 == KI_MESSAGE && msgs)) : depth == 1 &&
			    k1 == KI_USAGE && msgs)))
				break;
			depth++;
			if (depth == 2) {
				k2 = 0;
				kind = (kind & AK_OBJ1) | (c == '{' ? AK_OBJ2 | AK_KEY : 0);
				if (c == '{' && (k1 == KI_RESPONSE || k1 == KI_MESSAGE ||
				    (k1 == KI_DELTA && msgs))) {
					p++;
					continue;
				}
			} else
				kind &= ~(unsigned)AK_KEY;
			/* nothing in it matters (nest_dull): crossed */
			s->depth = (uint16_t)depth;
			s->a_kind = (uint8_t)kind;
			p = nest_skip(s, p + 1, e);
			depth = s->depth;
			kind = s->a_kind;
			continue;
		}
		if (c == '}' || c == ']') {
			if (depth == 0)
				break;
			depth--;
			kind &= ~(unsigned)AK_KEY;
			p++;
			continue;
		}
		break;              /* \r \n: the line ends */
	}
	s->depth = (uint16_t)depth;
	s->a_kind = (uint8_t)kind;
	s->a_k1 = (uint8_t)k1;
	s->a_k2 = (uint8_t)k2;
	return p;
}

/*
 * The bytes of a data line, p[0..e) (e: the feed's end or the line's):
 * returns where it stopped (e, or a line end byte). *cs: where the copy of
 * a usage object resumes in this feed (NULL: none).
 */
static const char *
lex(struct sl_usage_scan *s, const char *p, const char *e, const char **cs,
    struct arec *r)
{
	const char *q;
	char c;

	while (p < e) {
		switch (s->lx) {
		case J_OUT:
			if (s->cap_depth == 0) {
				p = lex_fast(s, p, e, r);
				if (s->ev & AE_SKIP)
					return p;
			}
			while (p < e && !tok_stop[(unsigned char)*p])
				p++;
			if (p == e)
				return p;
			c = *p;
			switch (c) {
			case '"':
				q = str_end(p + 1, e);
				if (q < e && *q == '"') {
					/* the usual string: whole in this feed */
					if (string_at(s, p + 1, (size_t)(q - p - 1)))
						r->on = r->on ? 2 : 0;   /* not lex_fast's */
					p = q + 1;
					if (s->ev & AE_SKIP)
						return p;
					continue;
				}
				string_begins(s);
				if (s->cnt != C_NO)
					r->on = r->on ? 2 : 0;   /* counted, not whole */
				break;
			case '{':
			case '[':
				if (c == '{' && s->cap_depth == 0 && usage_here(s)) {
					s->cap_depth = (uint16_t)(s->depth + 1);
					s->a_capd = (uint8_t)s->depth;
					r->on = r->on ? 2 : 0;   /* no template */
					s->cap_len = 0;
					s->ev &= (uint8_t)~AE_CAPFAIL;
					*cs = p;
				}
				if (s->depth == UINT16_MAX) {
					/* no usage this deep: the rest of the event unread */
					s->ev |= AE_BAD | AE_SKIP;
					return p + 1;
				}
				s->depth++;
				if (s->depth == 1) {
					s->ev |= AE_OBJ;
					s->a_k1 = 0;
					s->a_kind = c == '{' ? AK_OBJ1 | AK_KEY : 0;
					if (c != '{')
						s->ev |= AE_BAD;   /* not an object: no usage */
				} else if (s->depth == 2) {
					s->a_k2 = 0;
					s->a_kind = (uint8_t)((s->a_kind & AK_OBJ1) |
					    (c == '{' ? AK_OBJ2 | AK_KEY : 0));
				} else
					s->a_kind &= (uint8_t)~AK_KEY;
				if (nest_dull(s, c)) {
					p = nest_skip(s, p + 1, e);
					continue;
				}
				break;
			case '}':
			case ']':
				if (s->depth == 0) {
					s->ev |= AE_BAD;
					break;
				}
				if (s->cap_depth == s->depth && *cs != NULL) {
					cap_add(s, *cs, (size_t)(p + 1 - *cs));
					*cs = NULL;
					cap_done(s);
				}
				s->depth--;
				s->a_kind &= (uint8_t)~AK_KEY;
				break;
			case ',':
				if ((s->depth == 1 && (s->a_kind & AK_OBJ1)) ||
				    (s->depth == 2 && (s->a_kind & AK_OBJ2)))
					s->a_kind |= AK_KEY;
				break;
			default:            /* \r \n: the line ends */
				return p;
			}
			p++;
			break;
		case J_STR:
			q = str_end(p, e);
			if (s->kmask)
				match_run(s, p, (size_t)(q - p), s->key == R_TYPE ?
				    types_of(s)->name : key_names, s->key == R_TYPE ?
				    types_of(s)->len : key_lens);
			if (s->cnt == C_NOW)
				s->content_bytes += (uint64_t)(q - p);
			else if (s->cnt == C_PEND) {
				uint64_t t = (uint64_t)s->a_pend + (uint64_t)(q - p);

				s->a_pend = t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
			}
			if ((p = q) == e)
				return p;
			c = *p;
			if (c == '"') {
				string_ends(s);
				if (s->ev & AE_SKIP)
					return p + 1;
			} else if (c == '\\') {
				/* an escape counts one byte */
				if (s->cnt == C_NOW)
					s->content_bytes++;
				else if (s->cnt == C_PEND && s->a_pend < UINT32_MAX)
					s->a_pend++;
				s->kmask = 0;
				s->lx = J_ESC;
			} else
				return p;           /* the line ends */
			p++;
			break;
		case J_ESC:
			c = *p;
			if (c == '\n' || c == '\r')
				return p;
			s->lx = c == 'u' ? J_U : J_STR;
			s->ux = 4;
			p++;
			break;
		default:                    /* J_U */
			c = *p;
			if (c == '\n' || c == '\r')
				return p;
			if (--s->ux == 0)
				s->lx = J_STR;
			p++;
			break;
		}
	}
	return p;
}

/*
 * Event templates (as chat's, usage_template.c): at a line's start with
 * nothing of an event read (fresh: every per-event field as event_end
 * leaves it), the scanner's steps depend on the bytes alone, and the same
 * on every digit (no key or type it looks for has one; a usage object's
 * copy, that reads them, spoils a template). An event read from a fresh
 * start to a fresh end within one feed, that counted one string (whole,
 * no escape, by lex_fast, its type known) and nothing else by another
 * way, and copied no usage object, is kept in s->tpl (with keep). A next
 * event from a fresh start that is its bytes but where both are digits,
 * and any string without quote, backslash or line end in the place of
 * its counted one, is taken in compares: the same steps, so the same
 * state after, and the content bytes it counted but for the string's,
 * plus the new string's.
 */
static inline int
fresh(const struct sl_usage_scan *s)
{
	return s->line == A_BOL && !s->cr && s->lx == J_OUT && s->depth == 0 &&
	    s->cap_depth == 0 && s->ev == 0 && s->a_type == 0 && s->a_pend == 0 &&
	    s->a_pf == 0 && s->a_k1 == 0 && s->a_k2 == 0 && s->a_kind == 0 &&
	    s->key == R_NONE && s->cnt == C_NO;
}

/* The template applied at p (fresh): the bytes it takes, or 0. */
static size_t
tpl_take(struct sl_usage_scan *s, const char *p, const char *e)
{
	const struct sl_usage_tpl *t = s->tpl;
	size_t tail = t->len - t->s1;
	const char *q;

	if ((size_t)(e - p) < t->len - (t->s1 - t->s0) ||
	    !usage_same_but_digits(p, t->ev, t->s0, t->avx2))
		return 0;
	q = str_end(p + t->s0, e);
	if (q == e || *q != '"' || (size_t)(e - q) < tail ||
	    !usage_same_but_digits(q, t->ev + t->s1, tail, t->avx2))
		return 0;
	s->content_bytes += t->content + (uint64_t)(q - p - t->s0);
	return (size_t)(q - p) + tail;
}

/* The event recorded from ev ended at p, the scanner fresh again: kept? */
static void
tpl_keep(struct sl_usage_scan *s, const struct arec *r, const char *ev,
    const char *p, uint64_t c0)
{
	size_t n = (size_t)(p - ev);
	struct sl_usage_tpl *t;

	if (r->on != 1 || r->s0 == NULL || !fresh(s) || !usage_tpl_room(s, n))
		return;
	t = s->tpl;
	memcpy(t->copy, ev, n);
	t->ev = t->copy;
	t->len = (uint32_t)n;
	t->s0 = (uint32_t)(r->s0 - ev);
	t->s1 = (uint32_t)(r->s1 - ev);
	t->content = (uint32_t)(s->content_bytes - c0 - (t->s1 - t->s0));
#ifdef SL_USAGE_AVX2
	t->avx2 = __builtin_cpu_supports("avx2") != 0;
#else
	t->avx2 = 0;
#endif
}

size_t
usage_api_feed(struct sl_usage_scan *s, const char *in, size_t len,
    struct sl_usage_out *out)
{
	const char *p = in, *e = in + len, *cs = NULL, *rec = NULL;
	struct arec r = { 0, NULL, NULL };
	uint64_t c0 = 0;
	size_t k;
	char c;

	out->held = NULL;
	out->held_len = 0;
	out->n = 1;
	out->range[0].off = 0;
	out->range[0].len = len;
	if (s->cap_depth && s->line == A_DATA)
		cs = p;
	while (p < e) {
		switch (s->line) {
		case A_BOL:
			if (s->keep && rec == NULL && fresh(s)) {
				/* (without keep there is no s->tpl) */
				if (s->tpl != NULL && s->tpl->ev != NULL &&
				    (k = tpl_take(s, p, e)) != 0) {
					p += k;   /* an event as the template */
					break;
				}
				/* record this event: a template? */
				rec = p;
				c0 = s->content_bytes;
				r.on = 1;
				r.s0 = r.s1 = NULL;
			}
			c = *p++;
			if (s->cr) {
				s->cr = 0;
				if (c == '\n')
					break;
			}
			if (c == '\n' || c == '\r') {
				s->cr = c == '\r';
				event_end(s);
				if (rec != NULL) {
					tpl_keep(s, &r, rec, p, c0);
					rec = NULL;
					r.on = 0;
				}
			} else if (c == 'd') {
				s->line = A_FIELD;
				s->field = 1;
				if (e - p >= 4 && memcmp(p, "ata:", 4) == 0) {
					/* the usual data line, whole in this feed */
					p += 4;
					s->line = (s->ev & (AE_BAD | AE_SKIP)) ? A_SKIP : A_DATA;
					if (s->cap_depth)
						cs = p;
				}
			} else
				s->line = A_SKIP;
			break;
		case A_FIELD:
			c = *p;
			if (s->field < 4 && c == "data"[s->field]) {
				s->field++;
				p++;
			} else if (s->field == 4 && c == ':') {
				p++;
				s->line = (s->ev & (AE_BAD | AE_SKIP)) ? A_SKIP : A_DATA;
				if (s->cap_depth)
					cs = p;
			} else if (s->field == 4 && (c == '\n' || c == '\r')) {
				s->line = A_BOL;   /* "data": an empty data line */
				s->cr = c == '\r';
				p++;
			} else
				s->line = A_SKIP;
			break;
		case A_DATA:
			p = lex(s, p, e, &cs, &r);
			if (s->ev & AE_SKIP) {
				/* not an event of interest: to its end unread */
				s->line = A_SKIP;
				s->cap_depth = 0;
				cs = NULL;
				break;
			}
			if (p == e)
				break;
			/* the line ends: a newline joins it to the next data line */
			if (cs != NULL) {
				cap_add(s, cs, (size_t)(p - cs));
				cap_add(s, "\n", 1);
				cs = NULL;
			}
			data_line_end(s);
			s->cr = *p == '\r';
			s->line = A_BOL;
			p++;
			break;
		default:                    /* A_SKIP */
			p = line_end(p, e);
			if (p == e)
				break;
			s->cr = *p == '\r';
			s->line = A_BOL;
			p++;
			break;
		}
	}
	if (cs != NULL && s->cap_depth)
		cap_add(s, cs, (size_t)(p - cs));
	return len;
}

void
usage_api_finish(struct sl_usage_scan *s, struct sl_usage_out *out)
{
	memset(out, 0, sizeof(*out));
	/* an event not ended by a blank line does not count its usage */
	s->line = A_SKIP;
	s->cap_depth = 0;
}

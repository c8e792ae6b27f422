/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * JSON text without a tree: see sl_json.h. One pass to validate a request
 * body, then walks over the validated text by offset.
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "sl_json.h"


size_t
sl_json_ws(const char *p, size_t len, size_t i)
{
	while (i < len && JSON_WS(p[i]))
		i++;
	return i;
}

/* *i at an opening quote: move past the closing one. -1 if unterminated. */
static int
skip_string(const char *p, size_t len, size_t *i)
{
	size_t k = *i + 1;

	while (k < len) {
		if (p[k] == '\\')
			k += 2;
		else if (p[k] == '"') {
			*i = k + 1;
			return 0;
		} else
			k++;
	}
	return -1;
}

/* *i at a value: move past it. Iterative, so nesting costs no stack. */
int
sl_json_skip(const char *p, size_t len, size_t *i)
{
	size_t k = *i, depth = 0;

	if (k >= len)
		return -1;
	if (p[k] != '"' && p[k] != '{' && p[k] != '[') {
		/* number or literal: up to the next delimiter */
		while (k < len && !JSON_WS(p[k]) && p[k] != ',' && p[k] != '}' && p[k] != ']')
			k++;
		if (k == *i)
			return -1;
		*i = k;
		return 0;
	}
	do {
		if (k >= len)
			return -1;
		switch (p[k]) {
		case '"':
			if (skip_string(p, len, &k) < 0)
				return -1;
			continue;
		case '{':
		case '[':
			depth++;
			break;
		case '}':
		case ']':
			if (depth == 0)
				return -1;
			depth--;
			break;
		}
		k++;
	} while (depth > 0);
	*i = k;
	return 0;
}

int
sl_json_hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/*
 * 1 if the raw string token p[s..e) (quotes included) decodes to the ASCII
 * name: keys are compared as jansson sees them, so "stream\u005foptions"
 * is stream_options.
 */
int
sl_json_key_is(const char *p, size_t s, size_t e, const char *name)
{
	size_t k = s + 1, n = 0, nl = strlen(name);
	int c, h, j;

	while (k + 1 < e) {
		c = (unsigned char)p[k++];
		if (c == '\\') {
			if (k >= e - 1)
				return 0;
			switch (p[k++]) {
			case '"': c = '"'; break;
			case '\\': c = '\\'; break;
			case '/': c = '/'; break;
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'n': c = '\n'; break;
			case 'r': c = '\r'; break;
			case 't': c = '\t'; break;
			case 'u':
				if (k + 4 > e - 1)
					return 0;
				for (c = 0, j = 0; j < 4; j++) {
					if ((h = sl_json_hexval(p[k++])) < 0)
						return 0;
					c = c * 16 + h;
				}
				if (c == 0 || c > 0x7f)
					return 0;    /* the names are ASCII */
				break;
			default:
				return 0;
			}
		}
		if (n >= nl || name[n] != c)
			return 0;
		n++;
	}
	return n == nl;
}

/*
 * The object opening at p[open]: the value span of its LAST member named
 * name (*found), the offset of its closing brace and its member count.
 */
int
sl_json_find(const char *p, size_t len, size_t open, const char *name,
    struct sl_json_span *last, int *found, size_t *close, size_t *nmemb)
{
	size_t i = open + 1, ks, ke, n = 0;
	struct sl_json_span v;

	*found = 0;
	if (open >= len || p[open] != '{')
		return -1;
	i = sl_json_ws(p, len, i);
	if (i < len && p[i] == '}') {
		*close = i;
		*nmemb = 0;
		return 0;
	}
	for (;;) {
		if (i >= len || p[i] != '"')
			return -1;
		ks = i;
		if (skip_string(p, len, &i) < 0)
			return -1;
		ke = i;
		i = sl_json_ws(p, len, i);
		if (i >= len || p[i] != ':')
			return -1;
		i = sl_json_ws(p, len, i + 1);
		v.vs = i;
		if (sl_json_skip(p, len, &i) < 0)
			return -1;
		v.ve = i;
		if (sl_json_key_is(p, ks, ke, name)) {
			*last = v;
			*found = 1;
		}
		n++;
		i = sl_json_ws(p, len, i);
		if (i < len && p[i] == ',') {
			i = sl_json_ws(p, len, i + 1);
			continue;
		}
		if (i < len && p[i] == '}')
			break;
		return -1;
	}
	*close = i;
	*nmemb = n;
	return 0;
}

/*
 * The request body, validated in one pass without building it: a 16 MiB
 * body of small values is 8M jansson nodes and seconds of a worker's loop;
 * this is a few milliseconds and no memory. What is accepted is what a
 * Python runner's json.loads accepts (vLLM, SGLang, TGI's router reads serde
 * but its Python clients do not care): RFC 8259 JSON, plus a leading UTF-8
 * BOM, NaN, Infinity and -Infinity, numbers of any size, lone surrogate
 * escapes and UTF-8-encoded surrogates (json.loads(bytes) decodes with
 * "surrogatepass"). Refused, as those runners refuse them: other invalid
 * UTF-8, raw control characters in strings, bad escapes, trailing garbage,
 * nesting deeper than SL_JSON_MAXDEPTH. tests/ref/json_ref.c is the
 * reference fuzz_usage holds this to.
 */

/* The byte after a valid UTF-8 sequence starting at p[k] (>= 0x80), or 0. */
static size_t
utf8_seq(const char *s, size_t len, size_t k)
{
	const unsigned char *p = (const unsigned char *)s;
	unsigned char c = p[k], lo = 0x80, hi = 0xbf;
	size_t n, j;

	if (c >= 0xc2 && c <= 0xdf)
		n = 1;
	else if (c >= 0xe0 && c <= 0xef) {
		n = 2;
		if (c == 0xe0)
			lo = 0xa0;
		/*
		 * 0xed: encoded surrogates (ED A0..BF xx) pass, as they do
		 * json.loads(bytes), which decodes with "surrogatepass".
		 */
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 3;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;    /* <= U+10FFFF */
	} else
		return 0;
	if (k + n >= len)
		return 0;
	if (p[k + 1] < lo || p[k + 1] > hi)
		return 0;
	for (j = 2; j <= n; j++)
		if (p[k + j] < 0x80 || p[k + j] > 0xbf)
			return 0;
	return k + n + 1;
}

/* *i at an opening quote: validate the string, move past it. */
static int
req_string(const char *p, size_t len, size_t *i)
{
	size_t k = *i + 1, j;
	unsigned char c;

	for (;;) {
		/* the plain run: printable ASCII but the quote and the backslash */
#if defined(__SSE2__)
		while (len - k >= 16) {
			__m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + k));
			unsigned m = (unsigned)_mm_movemask_epi8(_mm_or_si128(
			    _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
			    _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
			    _mm_cmplt_epi8(v, _mm_set1_epi8(0x20))));   /* and >= 0x80 */

			if (m != 0) {
				k += (size_t)__builtin_ctz(m);
				break;
			}
			k += 16;
		}
#endif
		while (k < len && (c = (unsigned char)p[k]) >= 0x20 && c < 0x80 &&
		    c != '"' && c != '\\')
			k++;
		if (k >= len)
			return -1;
		c = (unsigned char)p[k];
		if (c == '"') {
			*i = k + 1;
			return 0;
		}
		if (c == '\\') {
			if (k + 1 >= len)
				return -1;
			switch (p[k + 1]) {
			case '"': case '\\': case '/': case 'b': case 'f':
			case 'n': case 'r': case 't':
				k += 2;
				continue;
			case 'u':
				if (k + 6 > len)
					return -1;
				for (j = k + 2; j < k + 6; j++)
					if (sl_json_hexval(p[j]) < 0)
						return -1;
				k += 6;    /* a lone surrogate is Python's business */
				continue;
			default:
				return -1;
			}
		}
		if (c < 0x20 || (k = utf8_seq(p, len, k)) == 0)
			return -1;
	}
}

/* *i at a number or literal: validate it, move past it. */
static int
req_scalar(const char *p, size_t len, size_t *i)
{
	const char *lit;
	size_t k = *i, n, d;

	switch (p[k]) {
	case 't': lit = "true"; break;
	case 'f': lit = "false"; break;
	case 'n': lit = "null"; break;
	case 'N': lit = "NaN"; break;
	case 'I': lit = "Infinity"; break;
	case '-': lit = k + 1 < len && p[k + 1] == 'I' ? "-Infinity" : NULL; break;
	default: lit = NULL; break;
	}
	if (lit != NULL) {
		n = strlen(lit);
		if (len - k < n || memcmp(p + k, lit, n) != 0)
			return -1;
		*i = k + n;
		return 0;
	}
	/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
	if (k < len && p[k] == '-')
		k++;
	if (k < len && p[k] == '0')
		k++;
	else if (k < len && p[k] >= '1' && p[k] <= '9')
		while (k < len && p[k] >= '0' && p[k] <= '9')
			k++;
	else
		return -1;
	if (k < len && p[k] == '.') {
		for (d = ++k; k < len && p[k] >= '0' && p[k] <= '9'; k++)
			;
		if (k == d)
			return -1;
	}
	if (k < len && (p[k] == 'e' || p[k] == 'E')) {
		k++;
		if (k < len && (p[k] == '+' || p[k] == '-'))
			k++;
		for (d = k; k < len && p[k] >= '0' && p[k] <= '9'; k++)
			;
		if (k == d)
			return -1;
	}
	*i = k;
	return 0;
}

int
sl_json_wide(const char *p, size_t len)
{
	const unsigned char *u = (const unsigned char *)p;

	/* json.detect_encoding(): the UTF-32 and UTF-16 BOMs, then NULs. */
	if (len >= 2 && ((u[0] == 0xff && u[1] == 0xfe) ||
	    (u[0] == 0xfe && u[1] == 0xff)))
		return 1;
	if (len >= 4 || len == 2)
		return u[0] == 0 || u[1] == 0;
	return 0;
}

/*
 * Validate the whole body as one JSON object; *open and *close at its
 * braces, *nmemb its member count, and each of m[0..nm) found or not.
 * Iterative: the kind of each open container is one bit.
 */
static int
object_walk(const char *p, size_t len, struct sl_json_member *m, size_t nm,
    struct sl_json_first *f, size_t *open, size_t *close, size_t *nmemb);

int
sl_json_object(const char *p, size_t len, struct sl_json_member *m, size_t nm, size_t *open,
    size_t *close, size_t *nmemb)
{
	return object_walk(p, len, m, nm, NULL, open, close, nmemb);
}

int
sl_json_object_first(const char *p, size_t len, struct sl_json_first *f)
{
	size_t open, close, nmemb;

	return object_walk(p, len, NULL, 0, f, &open, &close, &nmemb);
}

/* sl_json_object's walk; f, if not NULL, is filled in too. */
static int
object_walk(const char *p, size_t len, struct sl_json_member *m, size_t nm,
    struct sl_json_first *f, size_t *open, size_t *close, size_t *nmemb)
{
	uint8_t arr[SL_JSON_MAXDEPTH / 8];
	enum { S_VALUE, S_KEY_OR_END, S_KEY, S_VALUE_OR_END, S_AFTER } st = S_VALUE;
	size_t i = 0, depth = 0, ks = 0, ke = 0, vs = 0, n = 0, j;
	int in_arr;
	char c;

	memset(arr, 0, sizeof(arr));
	for (j = 0; j < nm; j++)
		m[j].found = 0;
	if (f != NULL)
		f->count = 0;
	if (len >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0)
		i = 3;
	i = sl_json_ws(p, len, i);
	if (i >= len || p[i] != '{')
		return -1;
	*open = i;
	for (;;) {
		i = sl_json_ws(p, len, i);
		if (i >= len)
			return -1;
		c = p[i];
		in_arr = depth > 0 && (arr[(depth - 1) / 8] >> ((depth - 1) % 8)) & 1;
		switch (st) {
		case S_KEY_OR_END:
			if (c == '}')
				goto closed;
			/* FALLTHROUGH */
		case S_KEY:
			if (c != '"')
				return -1;
			j = i;
			if (req_string(p, len, &i) < 0)
				return -1;
			if (depth == 1) {
				ks = j;
				ke = i;
			}
			i = sl_json_ws(p, len, i);
			if (i >= len || p[i] != ':')
				return -1;
			i = sl_json_ws(p, len, i + 1);
			vs = depth == 1 ? i : vs;
			st = S_VALUE;
			continue;
		case S_VALUE_OR_END:
			if (c == ']')
				goto closed;
			/* FALLTHROUGH */
		case S_VALUE:
			if (c == '{' || c == '[') {
				if (depth == SL_JSON_MAXDEPTH)
					return -1;
				if (c == '[')
					arr[depth / 8] |= (uint8_t)(1u << (depth % 8));
				else
					arr[depth / 8] &= (uint8_t)~(1u << (depth % 8));
				depth++;
				i++;
				st = c == '{' ? S_KEY_OR_END : S_VALUE_OR_END;
				continue;
			}
			if (c == '"' ? req_string(p, len, &i) < 0 : req_scalar(p, len, &i) < 0)
				return -1;
			goto value_done;
		case S_AFTER:
			if (c == ',') {
				i++;
				st = in_arr ? S_VALUE : S_KEY;
				continue;
			}
			if (c == (in_arr ? ']' : '}'))
				goto closed;
			return -1;
		}
closed:
		i++;
		if (--depth == 0) {
			*close = i - 1;
			*nmemb = n;
			break;
		}
value_done:
		if (depth == 1) {
			n++;
			for (j = 0; j < nm; j++)
				if (sl_json_key_is(p, ks, ke, m[j].name)) {
					m[j].v.vs = vs;
					m[j].v.ve = i;
					m[j].found = 1;
				}
			if (f != NULL && sl_json_key_is(p, ks, ke, f->name) &&
			    f->count++ == 0) {
				f->v.vs = vs;
				f->v.ve = i;
			}
		}
		st = S_AFTER;
	}
	return sl_json_ws(p, len, i) == len ? 0 : -1;
}

/* 1 if the value span v is exactly the text t. */
int
sl_json_span_is(const char *p, struct sl_json_span v, const char *t)
{
	size_t n = strlen(t);

	return v.ve - v.vs == n && memcmp(p + v.vs, t, n) == 0;
}

int
sl_json_first(const char *p, size_t len, size_t *i)
{
	size_t k = sl_json_ws(p, len, *i + 1);

	*i = k;
	return k < len && p[k] != ']';
}

int
sl_json_after(const char *p, size_t len, size_t *i)
{
	size_t k = sl_json_ws(p, len, *i);

	if (k < len && p[k] == ',') {
		*i = sl_json_ws(p, len, k + 1);
		return *i < len;
	}
	*i = k;
	return 0;
}

/* The UTF-8 bytes of code point cp in b; their count. */
static size_t
utf8_put(uint32_t cp, unsigned char *b)
{
	if (cp < 0x80) {
		b[0] = (unsigned char)cp;
		return 1;
	}
	if (cp < 0x800) {
		b[0] = (unsigned char)(0xc0 | cp >> 6);
		b[1] = (unsigned char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		b[0] = (unsigned char)(0xe0 | cp >> 12);
		b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
		b[2] = (unsigned char)(0x80 | (cp & 0x3f));
		return 3;
	}
	b[0] = (unsigned char)(0xf0 | cp >> 18);
	b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
	b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
	b[3] = (unsigned char)(0x80 | (cp & 0x3f));
	return 4;
}

/* The code unit of \uXXXX at p[k] (k at the backslash), or -1. */
static long
u_escape(const char *p, size_t e, size_t k)
{
	long v = 0;
	size_t j;
	int h;

	if (k + 6 > e || p[k + 1] != 'u')
		return -1;
	for (j = k + 2; j < k + 6; j++) {
		if ((h = sl_json_hexval(p[j])) < 0)
			return -1;
		v = v * 16 + h;
	}
	return v;
}

int
sl_json_decode(const char *p, size_t s, size_t e,
    int (*sink)(void *arg, const unsigned char *b, size_t n), void *arg)
{
	size_t k = s + 1, r, n;
	unsigned char b[4];
	long u, lo;
	int rc;

	if (e < s + 2)
		return 0;
	e--;    /* the closing quote */
	while (k < e) {
		for (r = k; k < e && p[k] != '\\'; k++)
			;
		if (k > r && (rc = sink(arg, (const unsigned char *)p + r, k - r)) != 0)
			return rc;
		if (k + 1 >= e)
			break;
		switch (p[k + 1]) {
		case 'b': b[0] = '\b'; n = 1; k += 2; break;
		case 'f': b[0] = '\f'; n = 1; k += 2; break;
		case 'n': b[0] = '\n'; n = 1; k += 2; break;
		case 'r': b[0] = '\r'; n = 1; k += 2; break;
		case 't': b[0] = '\t'; n = 1; k += 2; break;
		case 'u':
			if ((u = u_escape(p, e, k)) < 0)
				return 0;
			k += 6;
			if (u >= 0xd800 && u <= 0xdbff &&
			    (lo = u_escape(p, e, k)) >= 0xdc00 && lo <= 0xdfff) {
				u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
				k += 6;
			} else if (u >= 0xd800 && u <= 0xdfff)
				u = 0xfffd;
			n = utf8_put((uint32_t)u, b);
			break;
		default:    /* " \ / */
			b[0] = (unsigned char)p[k + 1];
			n = 1;
			k += 2;
			break;
		}
		if ((rc = sink(arg, b, n)) != 0)
			return rc;
	}
	return 0;
}

/* ---- escaping -------------------------------------------------------- */

/*
 * Length of the well-formed UTF-8 sequence at p (RFC 3629: no overlongs,
 * no surrogates, nothing above U+10FFFF), or 0.
 */
static size_t
utf8_len(const unsigned char *p, size_t n)
{
	size_t len, i;
	unsigned lo = 0x80, hi = 0xbf;

	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		len = 2;
	else if (p[0] >= 0xe0 && p[0] <= 0xef) {
		len = 3;
		if (p[0] == 0xe0)
			lo = 0xa0;
		else if (p[0] == 0xed)
			hi = 0x9f;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		len = 4;
		if (p[0] == 0xf0)
			lo = 0x90;
		else if (p[0] == 0xf4)
			hi = 0x8f;
	} else
		return 0;
	if (n < len || p[1] < lo || p[1] > hi)
		return 0;
	for (i = 2; i < len; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return len;
}

/*
 * JSON-escape src into dst (always terminated). Well-formed UTF-8 is kept
 * as it is; a byte that is not part of one is written as \u00XX, so the
 * line stays valid JSON whatever a client sent.
 */
void
sl_json_escape(char *dst, size_t dlen, const char *src, size_t slen)
{
	const unsigned char *u = (const unsigned char *)src;
	size_t i, o = 0, k;

	for (i = 0; i < slen && o + 7 < dlen; i++) {
		unsigned char ch = u[i];

		if (ch == '"' || ch == '\\') {
			dst[o++] = '\\';
			dst[o++] = (char)ch;
		} else if (ch >= 0x80 && (k = utf8_len(u + i, slen - i)) > 0) {
			if (o + k + 7 >= dlen)
				break;
			memcpy(dst + o, u + i, k);
			o += k;
			i += k - 1;
		} else if (ch < 0x20 || ch >= 0x7f) {
			o += (size_t)snprintf(dst + o, dlen - o, "\\u%04x", ch);
		} else
			dst[o++] = (char)ch;
	}
	dst[o] = '\0';
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The reference reader declared in json_ref.h: decode, then descend.
 * Deliberately plain: the bytes are first decoded to code points (the
 * UTF-8 layer), then parsed recursively as Python's json module does.
 */
#include <stdlib.h>
#include <string.h>

#include "json_ref.h"

#define RJ_MAXDEPTH 2048

struct rd {
	const uint32_t *cp;      /* code points */
	const size_t *at;        /* byte offset of each code point */
	size_t n, i;
	const char *src;
	int depth;
};

/* ---- the UTF-8 layer: bytes.decode("utf-8-sig", "surrogatepass") ---- */

static int
decode_utf8(const unsigned char *p, size_t len, uint32_t *cp, size_t *at, size_t *n)
{
	size_t i = 0, k = 0, need, j;
	uint32_t c, min;

	if (len >= 3 && p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf)
		i = 3;
	while (i < len) {
		c = p[i];
		if (c < 0x80) {
			need = 0;
			min = 0;
		} else if ((c & 0xe0) == 0xc0) {
			need = 1;
			c &= 0x1f;
			min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			need = 2;
			c &= 0x0f;
			min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			need = 3;
			c &= 0x07;
			min = 0x10000;
		} else
			return -1;
		if (len - i <= need)
			return -1;
		for (j = 1; j <= need; j++) {
			if ((p[i + j] & 0xc0) != 0x80)
				return -1;
			c = c << 6 | (p[i + j] & 0x3f);
		}
		if (c < min || c > 0x10ffff)
			return -1;       /* overlong, or past Unicode */
		/* surrogates (U+D800..DFFF) pass: "surrogatepass" */
		at[k] = i;
		cp[k++] = c;
		i += need + 1;
	}
	at[k] = len;
	*n = k;
	return 0;
}

/* ---- nodes ---- */

static struct rj *
node(enum rj_type t, size_t s)
{
	struct rj *v = calloc(1, sizeof(*v));

	if (v != NULL) {
		v->t = t;
		v->s = s;
	}
	return v;
}

void
rj_free(struct rj *v)
{
	size_t i;

	if (v == NULL)
		return;
	for (i = 0; i < v->n; i++) {
		rj_free(v->kid[i]);
		if (v->key != NULL)
			rj_free(v->key[i]);
	}
	free(v->kid);
	free(v->key);
	free(v->str);
	free(v);
}

static int
add_kid(struct rj *c, struct rj *k, struct rj *v)
{
	if (c->n == c->cap) {
		size_t nc = c->cap ? c->cap * 2 : 4;
		struct rj **nk = realloc(c->kid, nc * sizeof(*nk)), **nkey;

		if (nk == NULL)
			return -1;
		c->kid = nk;
		if (c->t == RJ_OBJ) {
			if ((nkey = realloc(c->key, nc * sizeof(*nkey))) == NULL)
				return -1;
			c->key = nkey;
		}
		c->cap = nc;
	}
	c->kid[c->n] = v;
	if (c->t == RJ_OBJ)
		c->key[c->n] = k;
	c->n++;
	return 0;
}

static int
str_put(struct rj *v, uint32_t c)
{
	unsigned char b[4];
	size_t n;
	unsigned char *ns;

	if (c < 0x80) {
		b[0] = (unsigned char)c;
		n = 1;
	} else if (c < 0x800) {
		b[0] = (unsigned char)(0xc0 | c >> 6);
		b[1] = (unsigned char)(0x80 | (c & 0x3f));
		n = 2;
	} else if (c < 0x10000) {
		b[0] = (unsigned char)(0xe0 | c >> 12);
		b[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
		b[2] = (unsigned char)(0x80 | (c & 0x3f));
		n = 3;
	} else {
		b[0] = (unsigned char)(0xf0 | c >> 18);
		b[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3f));
		b[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
		b[3] = (unsigned char)(0x80 | (c & 0x3f));
		n = 4;
	}
	if ((ns = realloc(v->str, v->len + n + 1)) == NULL)
		return -1;
	v->str = ns;
	memcpy(v->str + v->len, b, n);
	v->len += n;
	v->str[v->len] = '\0';
	return 0;
}

/* ---- the grammar ---- */

static void
ws(struct rd *r)
{
	while (r->i < r->n && (r->cp[r->i] == ' ' || r->cp[r->i] == '\t' ||
	    r->cp[r->i] == '\n' || r->cp[r->i] == '\r'))
		r->i++;
}

static int
hex4(struct rd *r, uint32_t *u)
{
	size_t j;
	uint32_t c;

	if (r->n - r->i < 4)
		return -1;
	for (*u = 0, j = 0; j < 4; j++) {
		c = r->cp[r->i + j];
		if (c >= '0' && c <= '9')
			*u = *u * 16 + (c - '0');
		else if (c >= 'a' && c <= 'f')
			*u = *u * 16 + (c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			*u = *u * 16 + (c - 'A' + 10);
		else
			return -1;
	}
	r->i += 4;
	return 0;
}

static struct rj *
string(struct rd *r)
{
	struct rj *v = node(RJ_STR, r->at[r->i]);
	uint32_t c, u, lo;
	size_t save;

	if (v == NULL)
		return NULL;
	if (str_put(v, 'x') < 0)     /* allocate, then empty: "" has a buffer */
		goto bad;
	v->len = 0;
	v->str[0] = '\0';
	r->i++;                      /* the quote */
	for (;;) {
		if (r->i >= r->n)
			goto bad;
		c = r->cp[r->i++];
		if (c == '"')
			break;
		if (c < 0x20)
			goto bad;
		if (c != '\\') {
			if (str_put(v, c) < 0)
				goto bad;
			continue;
		}
		if (r->i >= r->n)
			goto bad;
		c = r->cp[r->i++];
		switch (c) {
		case '"': case '\\': case '/': break;
		case 'b': c = '\b'; break;
		case 'f': c = '\f'; break;
		case 'n': c = '\n'; break;
		case 'r': c = '\r'; break;
		case 't': c = '\t'; break;
		case 'u':
			if (hex4(r, &u) < 0)
				goto bad;
			c = u;
			if (u >= 0xd800 && u <= 0xdbff && r->n - r->i >= 2 &&
			    r->cp[r->i] == '\\' && r->cp[r->i + 1] == 'u') {
				save = r->i;
				r->i += 2;
				if (hex4(r, &lo) == 0 && lo >= 0xdc00 && lo <= 0xdfff)
					c = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
				else
					r->i = save;   /* read on its own next */
			}
			break;
		default:
			goto bad;
		}
		if (str_put(v, c) < 0)
			goto bad;
	}
	v->e = r->at[r->i];
	return v;
bad:
	rj_free(v);
	return NULL;
}

static int
lit(struct rd *r, const char *w)
{
	size_t k, n = strlen(w);

	if (r->n - r->i < n)
		return 0;
	for (k = 0; k < n; k++)
		if (r->cp[r->i + k] != (uint32_t)(unsigned char)w[k])
			return 0;
	r->i += n;
	return 1;
}

static int
digit(const struct rd *r, size_t i)
{
	return i < r->n && r->cp[i] >= '0' && r->cp[i] <= '9';
}

/* A number's text (ASCII) kept as its str. */
static int
num_text(struct rj *v, const char *src)
{
	if ((v->str = malloc(v->e - v->s + 1)) == NULL)
		return -1;
	memcpy(v->str, src + v->s, v->e - v->s);
	v->len = v->e - v->s;
	v->str[v->len] = '\0';
	return 0;
}

/* Python's NUMBER_RE: (-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)? */
static struct rj *
number(struct rd *r)
{
	struct rj *v = node(RJ_NUM, r->at[r->i]);
	size_t i = r->i;

	if (v == NULL)
		return NULL;
	v->is_int = 1;
	if (i < r->n && r->cp[i] == '-')
		i++;
	if (!digit(r, i))
		goto bad;
	if (r->cp[i] == '0')
		i++;
	else
		while (digit(r, i))
			i++;
	if (i + 1 < r->n && r->cp[i] == '.' && digit(r, i + 1)) {
		v->is_int = 0;
		for (i++; digit(r, i); i++)
			;
	}
	if (i < r->n && (r->cp[i] == 'e' || r->cp[i] == 'E')) {
		size_t k = i + 1;

		if (k < r->n && (r->cp[k] == '+' || r->cp[k] == '-'))
			k++;
		if (digit(r, k)) {
			v->is_int = 0;
			for (i = k; digit(r, i); i++)
				;
		}
	}
	r->i = i;
	v->e = r->at[i];
	return num_text(v, r->src) < 0 ? (rj_free(v), NULL) : v;
bad:
	rj_free(v);
	return NULL;
}

static struct rj *value(struct rd *r);

static struct rj *
container(struct rd *r, int obj)
{
	struct rj *c = node(obj ? RJ_OBJ : RJ_ARR, r->at[r->i]), *k = NULL, *v;

	if (c == NULL || ++r->depth > RJ_MAXDEPTH)
		goto bad;
	r->i++;
	ws(r);
	if (r->i < r->n && r->cp[r->i] == (obj ? '}' : ']')) {
		r->i++;
		goto done;
	}
	for (;;) {
		if (obj) {
			if (r->i >= r->n || r->cp[r->i] != '"' || (k = string(r)) == NULL)
				goto bad;
			ws(r);
			if (r->i >= r->n || r->cp[r->i] != ':')
				goto bad;
			r->i++;
			ws(r);
		}
		if ((v = value(r)) == NULL)
			goto bad;
		if (add_kid(c, k, v) < 0) {
			rj_free(v);
			goto bad;
		}
		k = NULL;
		ws(r);
		if (r->i < r->n && r->cp[r->i] == ',') {
			r->i++;
			ws(r);
			continue;
		}
		if (r->i < r->n && r->cp[r->i] == (obj ? '}' : ']')) {
			r->i++;
			break;
		}
		goto bad;
	}
done:
	r->depth--;
	c->e = r->at[r->i];
	return c;
bad:
	rj_free(k);
	rj_free(c);
	return NULL;
}

static struct rj *
value(struct rd *r)
{
	size_t s;
	struct rj *v;
	enum rj_type t;

	if (r->i >= r->n)
		return NULL;
	s = r->at[r->i];
	switch (r->cp[r->i]) {
	case '"':
		return string(r);
	case '{':
		return container(r, 1);
	case '[':
		return container(r, 0);
	}
	if (lit(r, "null"))
		t = RJ_NULL;
	else if (lit(r, "true"))
		t = RJ_TRUE;
	else if (lit(r, "false"))
		t = RJ_FALSE;
	else if (lit(r, "NaN") || lit(r, "Infinity") || lit(r, "-Infinity"))
		t = RJ_NUM;
	else
		return number(r);
	if ((v = node(t, s)) != NULL) {
		v->e = r->at[r->i];
		if (t == RJ_NUM && num_text(v, r->src) < 0) {
			rj_free(v);
			return NULL;
		}
	}
	return v;
}

struct rj *
rj_parse(const char *p, size_t len)
{
	uint32_t *cp = malloc((len + 1) * sizeof(*cp));
	size_t *at = malloc((len + 1) * sizeof(*at));
	struct rd r;
	struct rj *v = NULL;

	if (cp == NULL || at == NULL)
		goto out;
	memset(&r, 0, sizeof(r));
	if (decode_utf8((const unsigned char *)p, len, cp, at, &r.n) < 0)
		goto out;
	r.cp = cp;
	r.at = at;
	r.src = p;
	ws(&r);
	if ((v = value(&r)) == NULL)
		goto out;
	ws(&r);
	if (r.i != r.n) {            /* "Extra data" */
		rj_free(v);
		v = NULL;
	}
out:
	free(cp);
	free(at);
	return v;
}

/* ---- reading ---- */

/* The value of obj's last member whose key is the n bytes s. */
static const struct rj *
get_kl(const struct rj *obj, const unsigned char *s, size_t n)
{
	size_t i;

	if (obj == NULL || obj->t != RJ_OBJ)
		return NULL;
	for (i = obj->n; i-- > 0;)
		if (obj->key[i]->len == n && memcmp(obj->key[i]->str, s, n) == 0)
			return obj->kid[i];
	return NULL;
}

const struct rj *
rj_get(const struct rj *obj, const char *name)
{
	return get_kl(obj, (const unsigned char *)name, strlen(name));
}

static int
ieq(const struct rj *v, const char *w)
{
	size_t i, n = strlen(w);

	if (v->len != n)
		return 0;
	for (i = 0; i < n; i++) {
		unsigned char c = v->str[i];

		if (c >= 'A' && c <= 'Z')
			c = (unsigned char)(c - 'A' + 'a');
		if (c != (unsigned char)w[i])
			return 0;
	}
	return 1;
}

int
rj_bool(const struct rj *v)
{
	const char *t;
	double d;

	if (v == NULL)
		return -1;
	switch (v->t) {
	case RJ_TRUE:
		return 1;
	case RJ_FALSE:
	case RJ_NULL:
		return 0;           /* null: the field's default, False */
	case RJ_STR:
		if (v->len == 1 && v->str[0] == '1')
			return 1;
		if (v->len == 1 && v->str[0] == '0')
			return 0;
		if (ieq(v, "t") || ieq(v, "y") || ieq(v, "on") || ieq(v, "yes") || ieq(v, "true"))
			return 1;
		if (ieq(v, "f") || ieq(v, "n") || ieq(v, "no") || ieq(v, "off") || ieq(v, "false"))
			return 0;
		return -1;
	case RJ_NUM:
		t = (const char *)v->str;
		if (v->is_int)
			/* int(): "0", "-0", "1" (no leading zeros in the grammar) */
			return strcmp(t, "1") == 0 ? 1 :
			    strcmp(t, "0") == 0 || strcmp(t, "-0") == 0 ? 0 : -1;
		d = strtod(t, NULL);     /* NaN, Infinity: neither */
		return d == 1.0 ? 1 : d == 0.0 ? 0 : -1;
	default:
		return -1;
	}
}

int
rj_equal(const struct rj *a, const struct rj *b)
{
	size_t i;
	const struct rj *w;

	if (a->t != b->t)
		return 0;
	switch (a->t) {
	case RJ_STR:
		return a->len == b->len && memcmp(a->str, b->str, a->len) == 0;
	case RJ_NUM:
		/* the same text (an edit never touches a number) */
		return a->len == b->len && memcmp(a->str, b->str, a->len) == 0;
	case RJ_ARR:
		if (a->n != b->n)
			return 0;
		for (i = 0; i < a->n; i++)
			if (!rj_equal(a->kid[i], b->kid[i]))
				return 0;
		return 1;
	case RJ_OBJ:
		/* every effective member of each is the other's, equal */
		for (i = 0; i < a->n; i++) {
			if (get_kl(a, a->key[i]->str, a->key[i]->len) != a->kid[i])
				continue;   /* overridden by a later duplicate */
			if ((w = get_kl(b, a->key[i]->str, a->key[i]->len)) == NULL ||
			    !rj_equal(a->kid[i], w))
				return 0;
		}
		for (i = 0; i < b->n; i++)
			if (get_kl(a, b->key[i]->str, b->key[i]->len) == NULL)
				return 0;
		return 1;
	default:
		return 1;
	}
}

int
rj_set(struct rj *obj, const char *name, struct rj *v)
{
	struct rj *k = node(RJ_STR, 0);
	size_t n = strlen(name);

	if (k == NULL || (k->str = malloc(n + 1)) == NULL) {
		rj_free(k);
		return -1;
	}
	memcpy(k->str, name, n + 1);
	k->len = n;
	if (add_kid(obj, k, v) < 0) {
		rj_free(k);
		return -1;
	}
	return 0;
}

struct rj *
rj_new_true(void)
{
	return node(RJ_TRUE, 0);
}

struct rj *
rj_new_usage_option(void)
{
	struct rj *o = node(RJ_OBJ, 0), *t = rj_new_true();

	if (o == NULL || t == NULL || rj_set(o, "include_usage", t) < 0) {
		rj_free(o);
		rj_free(t);
		return NULL;
	}
	return o;
}

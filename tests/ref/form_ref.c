/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The reference form reader (form_ref.h): Python's readings, ported as
 * they are written, for clarity over speed. Strings are malloc'd copies.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "form_ref.h"
#include "sl_json.h"

struct s {
	char *p;
	size_t n;
};

static void
oom(void *p)
{
	if (p == NULL)
		abort();
}

static struct s
mk(const char *p, size_t n)
{
	struct s r = { malloc(n + 1), n };

	oom(r.p);
	memcpy(r.p, p, n);
	r.p[n] = '\0';
	return r;
}

/* Python's str.isspace() on a latin-1 character. */
static int
py_space(unsigned char c)
{
	return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f) ||
	    c == 0x85 || c == 0xa0;
}

static struct s
strip(const char *p, size_t n)
{
	while (n > 0 && py_space((unsigned char)*p)) {
		p++;
		n--;
	}
	while (n > 0 && py_space((unsigned char)p[n - 1]))
		n--;
	return mk(p, n);
}

static void
lower(struct s *x)
{
	size_t i;

	for (i = 0; i < x->n; i++)
		if (x->p[i] >= 'A' && x->p[i] <= 'Z')
			x->p[i] = (char)(x->p[i] - 'A' + 'a');
}

/* str.replace(a, b): left to right, without overlaps. */
static struct s
replace(struct s x, const char *a, const char *b)
{
	size_t al = strlen(a), bl = strlen(b), i = 0, o = 0;
	struct s r = { malloc(x.n * (bl > al ? bl : 1) + 1), 0 };

	oom(r.p);
	while (i < x.n) {
		if (x.n - i >= al && memcmp(x.p + i, a, al) == 0) {
			memcpy(r.p + o, b, bl);
			o += bl;
			i += al;
		} else
			r.p[o++] = x.p[i++];
	}
	r.p[o] = '\0';
	r.n = o;
	free(x.p);
	return r;
}

/* email.utils.unquote */
static struct s
unquote(struct s x)
{
	struct s r;

	if (x.n > 1 && x.p[0] == '"' && x.p[x.n - 1] == '"') {
		r = mk(x.p + 1, x.n - 2);
		free(x.p);
		r = replace(r, "\\\\", "\\");
		return replace(r, "\\\"", "\"");
	}
	if (x.n > 1 && x.p[0] == '<' && x.p[x.n - 1] == '>') {
		r = mk(x.p + 1, x.n - 2);
		free(x.p);
		return r;
	}
	return x;
}

/* email.utils.quote, then wrapped in quotes: '"%s"' % quote(v) */
static struct s
quoted(struct s x)
{
	struct s r;

	x = replace(x, "\\", "\\\\");
	x = replace(x, "\"", "\\\"");
	r.p = malloc(x.n + 3);
	oom(r.p);
	r.p[0] = '"';
	memcpy(r.p + 1, x.p, x.n);
	r.p[x.n + 1] = '"';
	r.p[x.n + 2] = '\0';
	r.n = x.n + 2;
	free(x.p);
	return r;
}

/* urllib.parse.unquote(s, encoding="latin-1"): %XX decoded, the rest kept. */
static struct s
pct_decode(struct s x)
{
	size_t i, o = 0;

	for (i = 0; i < x.n; i++) {
		if (x.p[i] == '%' && i + 2 < x.n && sl_json_hexval(x.p[i + 1]) >= 0 &&
		    sl_json_hexval(x.p[i + 2]) >= 0) {
			x.p[o++] = (char)(sl_json_hexval(x.p[i + 1]) << 4 | sl_json_hexval(x.p[i + 2]));
			i += 2;
		} else
			x.p[o++] = x.p[i];
	}
	x.n = o;
	x.p[o] = '\0';
	return x;
}

struct kv {
	struct s k, v;
};

struct opts {
	struct s main;
	struct kv *e;
	size_t n, cap;
};

static void
push(struct opts *o, struct s k, struct s v)
{
	if (o->n == o->cap) {
		o->cap = o->cap ? 2 * o->cap : 8;
		o->e = realloc(o->e, o->cap * sizeof(*o->e));
		oom(o->e);
	}
	o->e[o->n].k = k;
	o->e[o->n].v = v;
	o->n++;
}

static void
opts_free(struct opts *o)
{
	size_t i;

	for (i = 0; i < o->n; i++) {
		free(o->e[i].k.p);
		free(o->e[i].v.p);
	}
	free(o->e);
	free(o->main.p);
	memset(o, 0, sizeof(*o));
}

/* The last value of name k (the dict python-multipart builds), or NULL. */
static const struct s *
opt(const struct opts *o, const char *k)
{
	size_t i = o->n, kl = strlen(k);

	while (i-- > 0)
		if (o->e[i].k.n == kl && memcmp(o->e[i].k.p, k, kl) == 0)
			return &o->e[i].v;
	return NULL;
}

/* Occurrences of lit in p[0..n), without overlaps (str.count). */
static size_t
count(const char *p, size_t n, const char *lit)
{
	size_t l = strlen(lit), i = 0, c = 0;

	while (i + l <= n) {
		if (memcmp(p + i, lit, l) == 0) {
			c++;
			i += l;
		} else
			i++;
	}
	return c;
}

/* rfc2231_continuation: ^(\w+)\*(([0-9]+)\*?)?$ (ASCII). */
static int
continuation(const struct s *name, size_t *base, long *num)
{
	size_t i = 0, j;

	while (i < name->n && (name->p[i] == '_' ||
	    (name->p[i] >= 'a' && name->p[i] <= 'z') ||
	    (name->p[i] >= 'A' && name->p[i] <= 'Z') ||
	    (name->p[i] >= '0' && name->p[i] <= '9')))
		i++;
	if (i == 0 || i >= name->n || name->p[i] != '*')
		return 0;
	*base = i;
	*num = -1;
	j = ++i;
	if (j == name->n)
		return 1;
	while (i < name->n && name->p[i] >= '0' && name->p[i] <= '9')
		i++;
	if (i == j || i - j > 9)
		return i == j ? 0 : -1;   /* a huge number: leave it out */
	*num = strtol(name->p + j, NULL, 10);
	if (i < name->n && name->p[i] == '*')
		i++;
	return i == name->n;
}

struct cont {
	struct s base;
	long num;
	struct s v;
	int enc;
};

static int
cont_cmp(const void *a, const void *b)
{
	const struct cont *x = a, *y = b;
	size_t m = x->v.n < y->v.n ? x->v.n : y->v.n;
	int c;

	if (x->num != y->num)
		return x->num < y->num ? -1 : 1;
	if ((c = memcmp(x->v.p, y->v.p, m)) != 0)
		return c;
	if (x->v.n != y->v.n)
		return x->v.n < y->v.n ? -1 : 1;
	return x->enc - y->enc;
}

/*
 * python-multipart's parse_options_header(value). -1 where Python raises
 * (continuations numbered and not, which its sort cannot compare).
 */
static int
parse_options(const char *v, size_t n, struct opts *o)
{
	struct s *plist = NULL, pr;
	struct cont *cs = NULL;
	size_t np = 0, nc = 0, i, pos;
	int rc = 0;

	memset(o, 0, sizeof(*o));
	if (memchr(v, ';', n) == NULL) {
		o->main = strip(v, n);
		lower(&o->main);
		return 0;
	}
	/* _parseparam */
	pos = 0;   /* in ";" + v: index into v of the char after ';' */
	for (;;) {
		const char *r = v + pos;
		size_t rl = n - pos, end;
		const char *q = memchr(r, ';', rl);
		struct s f;

		end = q ? (size_t)(q - r) : rl;
		while (q != NULL && end > 0 &&
		    (count(r, end, "\"") - count(r, end, "\\\"")) % 2) {
			q = end + 1 <= rl ? memchr(r + end + 1, ';', rl - end - 1) :
			    NULL;
			end = q ? (size_t)(q - r) : rl;
		}
		f = mk(r, end);
		if ((q = memchr(f.p, '=', f.n)) != NULL) {
			size_t e = (size_t)(q - f.p);
			struct s a = strip(f.p, e), b = strip(f.p + e + 1,
			    f.n - e - 1);

			lower(&a);
			free(f.p);
			f.p = malloc(a.n + b.n + 2);
			oom(f.p);
			memcpy(f.p, a.p, a.n);
			f.p[a.n] = '=';
			memcpy(f.p + a.n + 1, b.p, b.n);
			f.n = a.n + 1 + b.n;
			free(a.p);
			free(b.p);
		}
		plist = realloc(plist, (np + 1) * sizeof(*plist));
		oom(plist);
		plist[np++] = strip(f.p, f.n);
		free(f.p);
		if (end >= rl)
			break;
		pos += end + 1;
	}
	/* _get_params_preserve, decode_params */
	for (i = 0; i < np; i++) {
		struct s name, val;
		const char *eq = memchr(plist[i].p, '=', plist[i].n);
		size_t base;
		long num;
		int c;

		if (eq != NULL) {
			size_t e = (size_t)(eq - plist[i].p);

			name = strip(plist[i].p, e);
			val = strip(plist[i].p + e + 1, plist[i].n - e - 1);
		} else {
			name = strip(plist[i].p, plist[i].n);
			val = mk("", 0);
		}
		if (i == 0) {
			o->main = name;
			free(val.p);
			continue;
		}
		val = unquote(val);
		c = continuation(&name, &base, &num);
		if (c == 1) {
			cs = realloc(cs, (nc + 1) * sizeof(*cs));
			oom(cs);
			cs[nc].base = mk(name.p, base);
			cs[nc].num = num;
			cs[nc].v = val;
			cs[nc].enc = name.p[name.n - 1] == '*';
			nc++;
			free(name.p);
			continue;
		}
		/* '"%s"' % quote(value), unquoted again by get_params */
		push(o, name, unquote(quoted(val)));
	}
	/* the RFC 2231 ones, by name in order of first appearance */
	for (i = 0; i < nc; i++) {
		struct cont *g;
		size_t m = 0, j, tot = 0;
		int extended = 0, has_none = 0, has_num = 0;
		struct s joined;

		if (cs[i].base.p == NULL)
			continue;
		g = malloc(nc * sizeof(*g));
		oom(g);
		for (j = i; j < nc; j++)
			if (cs[j].base.p != NULL && cs[j].base.n == cs[i].base.n &&
			    memcmp(cs[j].base.p, cs[i].base.p, cs[i].base.n) == 0) {
				g[m++] = cs[j];
				if (j != i) {
					free(cs[j].base.p);
					cs[j].base.p = NULL;
				}
			}
		for (j = 0; j < m; j++) {
			has_none |= g[j].num < 0;
			has_num |= g[j].num >= 0;
		}
		if (has_none && has_num && m > 1)
			rc = -1;   /* TypeError: None < int */
		qsort(g, m, sizeof(*g), cont_cmp);
		for (j = 0; j < m; j++) {
			if (g[j].enc) {
				g[j].v = pct_decode(g[j].v);
				extended = 1;
			}
			tot += g[j].v.n;
		}
		joined.p = malloc(tot + 1);
		oom(joined.p);
		joined.n = 0;
		for (j = 0; j < m; j++) {
			memcpy(joined.p + joined.n, g[j].v.p, g[j].v.n);
			joined.n += g[j].v.n;
			free(g[j].v.p);
		}
		joined.p[joined.n] = '\0';
		/* value = quote(joined); decode_rfc2231 splits it at "'" twice */
		pr = replace(replace(joined, "\\", "\\\\"), "\"", "\\\"");
		if (extended) {
			char *t1 = memchr(pr.p, '\'', pr.n), *t2 = t1 ? memchr(t1 + 1,
			    '\'', pr.n - (size_t)(t1 + 1 - pr.p)) : NULL;

			if (t2 != NULL) {
				struct s third = mk(t2 + 1, pr.n - (size_t)(t2 + 1 - pr.p));

				free(pr.p);
				pr = third;
			}
		}
		/* '"%s"' % value, unquoted by get_params */
		{
			struct s w = { malloc(pr.n + 3), pr.n + 2 };

			oom(w.p);
			w.p[0] = '"';
			memcpy(w.p + 1, pr.p, pr.n);
			w.p[pr.n + 1] = '"';
			w.p[pr.n + 2] = '\0';
			free(pr.p);
			push(o, cs[i].base, unquote(w));
			cs[i].base.p = NULL;
		}
		free(g);
	}
	for (i = 0; i < np; i++)
		free(plist[i].p);
	free(plist);
	for (i = 0; i < nc; i++)
		free(cs[i].base.p);
	free(cs);
	return rc;
}

static int
tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	    (c >= '0' && c <= '9') || (c != 0 && strchr("!#$%&'*+-.^_`|~", c));
}

int
form_ref_read(const char *ctype, size_t ctlen, const char *body, size_t len,
    struct form_ref *out)
{
	struct opts co, po;
	const struct s *bd;
	char *delim = NULL;
	size_t dl, i = 0;
	int rc = -1;

	memset(out, 0, sizeof(*out));
	if (parse_options(ctype, ctlen, &co) < 0)
		goto done_co;
	if (!(co.main.n == 19 && memcmp(co.main.p, "multipart/form-data", 19) == 0)) {
		rc = 0;   /* not a form to the runner */
		goto done_co;
	}
	out->is_form = 1;
	if ((bd = opt(&co, "charset")) != NULL && !((bd->n == 5 &&
	    strncasecmp(bd->p, "utf-8", 5) == 0) || (bd->n == 8 &&
	    strncasecmp(bd->p, "us-ascii", 8) == 0)))
		out->charset_other = 1;
	if ((bd = opt(&co, "boundary")) == NULL)
		goto done_co;
	dl = 4 + bd->n;
	delim = malloc(dl);
	oom(delim);
	memcpy(delim, "\r\n--", 4);
	memcpy(delim + 4, bd->p, bd->n);
	while (i < len && (body[i] == '\r' || body[i] == '\n'))
		i++;
	if (len - i < dl - 2 || memcmp(body + i, delim + 2, dl - 2) != 0)
		goto done_co;
	i += dl - 2;
	if (i < len && body[i] == '-') {
		rc = 0;
		goto done_co;
	}
	if (len - i < 2 || body[i] != '\r' || body[i + 1] != '\n')
		goto done_co;
	i += 2;
	for (;;) {
		size_t cds = 0, cde = 0, s, k;
		int has_cd = 0;
		const char *q;

		/* headers */
		for (;;) {
			if (i >= len)
				goto complete;
			if (body[i] == '\r') {
				if (i + 1 < len && body[i + 1] != '\n')
					goto done_co;
				i += 2;
				break;
			}
			for (s = i; i < len && body[i] != ':'; i++)
				if (!tchar((unsigned char)body[i]))
					goto done_co;
			if (i >= len)
				goto complete;
			if (i == s)
				goto done_co;
			k = i++;
			while (i < len && body[i] == ' ')
				i++;
			q = memchr(body + i, '\r', len - i);
			if (q == NULL)
				goto complete;
			if (k - s == 19 && strncasecmp(body + s, "content-disposition",
			    19) == 0) {
				has_cd = 1;
				cds = i;
				cde = (size_t)(q - body);
			}
			i = (size_t)(q - body);
			if (i + 1 < len && body[i + 1] != '\n')
				goto done_co;
			i += 2;
		}
		/* data */
		s = i;
		for (;;) {
			const char *a;

			if (i > len || (q = memmem(body + i, len - i, delim, dl)) == NULL)
				goto complete;
			k = (size_t)(q - body) + dl;
			if (len - k < 2)
				goto complete;
			a = body + k;
			if ((a[0] == '\r' && a[1] == '\n') || (a[0] == '-' && a[1] == '-'))
				break;
			i = (size_t)(q - body) + 1;
		}
		/* the part is complete: Starlette's on_headers_finished, on_part_end */
		{
			const struct s *nm;

			if (parse_options(has_cd ? body + cds : "", has_cd ? cde - cds :
			    0, &po) < 0 || (nm = opt(&po, "name")) == NULL) {
				opts_free(&po);
				goto done_co;
			}
			if (nm->n == 5 && memcmp(nm->p, "model", 5) == 0) {
				out->found = 1;
				out->file = opt(&po, "filename") != NULL;
				out->vs = s;
				out->ve = (size_t)(q - body);
			}
			opts_free(&po);
		}
		i = k;
		if (body[i] == '-')
			break;
		i += 2;
	}
complete:
	rc = 0;
done_co:
	free(delim);
	opts_free(&co);
	return rc;
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Routing by model: read the model a request body names, route it
 * through models:, rewrite the body for the chosen target, list the
 * models a tenant may use, fall back. See include/sl_model.h for the
 * rules; the exchange calls sl_model_route() once per request. Setting
 * the answer's "model" back is model_rewrite.c's.
 */
#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sl_buf.h"
#include "sl_http.h"
#include "sl_model.h"

/* ---- reading the model ------------------------------------------------ */

struct name_sink {
	struct sl_model_req *r;
};

static int
name_sink(void *arg, const unsigned char *b, size_t n)
{
	struct sl_model_req *r = ((struct name_sink *)arg)->r;

	if (r->len + n > SL_MODEL_NAME_MAX) {
		memcpy(r->name + r->len, b, SL_MODEL_NAME_MAX - r->len);
		r->len = SL_MODEL_NAME_MAX;
		r->too_long = 1;
		return 1;   /* stop: no model is that long */
	}
	memcpy(r->name + r->len, b, n);
	r->len += n;
	return 0;
}

/* Refuse: the body cannot be read the one way every reader would. */
static void
ambiguous(struct sl_model_req *r, const char *why)
{
	r->kind = SL_MODEL_AMBIGUOUS;
	r->why = why;
}

static void
read_json(const char *body, size_t len, struct sl_model_req *r)
{
	struct sl_json_first f = { "model", { 0, 0 }, 0 };
	struct name_sink s = { r };

	if (sl_json_object_first(body, len, &f) < 0) {
		/*
		 * json.loads(bytes) reads UTF-16 and UTF-32 too (a Python
		 * runner would find the model sluice cannot): refused.
		 */
		if (sl_json_wide(body, len))
			ambiguous(r, "a JSON body in UTF-16 or UTF-32 (sluice "
			    "reads UTF-8, as RFC 8259 requires)");
		else
			r->kind = SL_MODEL_BAD_JSON;
		return;
	}
	r->count = f.count;
	if (f.count == 0)
		return;
	r->v = f.v;
	if (body[f.v.vs] != '"') {
		r->kind = SL_MODEL_NOT_STRING;
		return;
	}
	r->kind = SL_MODEL_NAMED;
	(void)sl_json_decode(body, f.v.vs, f.v.ve, name_sink, &s);
	r->name[r->len] = '\0';
}

static size_t
ows(const char *v, size_t n, size_t i)
{
	while (i < n && (v[i] == ' ' || v[i] == '\t'))
		i++;
	return i;
}

/*
 * Does s[0..n), percent-decoded ('+' as a space too when plus), without
 * the whitespace around it, read "model" in any case? Some reader may take
 * such a field name for "model": sluice refuses it rather than read it as
 * another field.
 */
static int
decodes_to_model(const char *s, size_t n, int plus)
{
	char d[32];
	size_t i, o = 0, a = 0;
	int hi, lo;

	for (i = 0; i < n; i++) {
		char ch = s[i];

		if (ch == '+' && plus)
			ch = ' ';
		else if (ch == '%' && n - i >= 3 &&
		    (hi = sl_json_hexval(s[i + 1])) >= 0 &&
		    (lo = sl_json_hexval(s[i + 2])) >= 0) {
			ch = (char)(hi << 4 | lo);
			i += 2;
		}
		if (o == sizeof(d))
			return 0;
		d[o++] = ch;
	}
	while (a < o && (d[a] == ' ' || d[a] == '\t'))
		a++;
	while (o > a && (d[o - 1] == ' ' || d[o - 1] == '\t'))
		o--;
	return sl_http_name_is(d + a, o - a, "model");
}

/*
 * A header value's main part (before its parameters) is `type`, compared
 * case-insensitively?
 */
static int
media_type_is(const char *v, size_t n, const char *type)
{
	size_t l = strlen(type), i = ows(v, n, 0);

	if (n - i < l || strncasecmp(v + i, type, l) != 0)
		return 0;
	i = ows(v, n, i + l);
	return i == n || v[i] == ';';
}

/*
 * One parameter of a header value (Content-Type, a part's
 * Content-Disposition): name=value after a ';'.
 */
struct hparam {
	size_t ns, ne;          /* its name */
	size_t vs, ve;          /* its value, without quotes */
	int escapes;            /* a backslash in a quoted value */
};

/*
 * The next parameter of v from *i (0 at the start: the main value is
 * skipped). 1 with *p set, 0 at the end, -1 when the value cannot be read
 * unambiguously. Python runners (python-multipart's parse_options_header,
 * the email package) drop whitespace around names, '=' and values, keep
 * the last of a repeated name and decode RFC 2231's name*=; RFC 9110 reads
 * quoted-pairs. What those readings could disagree on is refused: a value
 * that is neither a token nor one quoted-string, an escaped quote or
 * backslash (the email package counts quotes, RFC 9110 unescapes), a
 * parameter without '=', a comma or quote in the main value.
 */
static int
next_param(const char *v, size_t n, size_t *i, struct hparam *p)
{
	size_t k = *i;

	if (k == 0)
		for (; k < n && v[k] != ';'; k++)
			if (v[k] == '"' || v[k] == ',')
				return -1;
	k = ows(v, n, k);
	if (k >= n)
		return 0;
	if (v[k] != ';')
		return -1;
	k = ows(v, n, k + 1);
	if (k >= n)
		return 0;   /* a trailing ';' */
	memset(p, 0, sizeof(*p));
	p->ns = k;
	while (k < n && sl_http_is_tchar((unsigned char)v[k]))
		k++;
	p->ne = k;
	k = ows(v, n, k);
	if (p->ne == p->ns || k >= n || v[k] != '=')
		return -1;
	k = ows(v, n, k + 1);
	if (k < n && v[k] == '"') {
		p->vs = ++k;
		for (; k < n && v[k] != '"'; k++) {
			if (v[k] != '\\')
				continue;
			p->escapes = 1;
			if (k + 1 < n && (v[k + 1] == '"' || v[k + 1] == '\\'))
				return -1;
		}
		if (k >= n)
			return -1;   /* no closing quote */
		p->ve = k++;
	} else {
		p->vs = k;
		while (k < n && sl_http_is_tchar((unsigned char)v[k]))
			k++;
		if ((p->ve = k) == p->vs)
			return -1;
	}
	k = ows(v, n, k);
	if (k < n && v[k] != ';')
		return -1;
	*i = k;
	return 1;
}

/* Is the parameter's name `name` (case-insensitive)? */
static int
param_is(const char *v, const struct hparam *p, const char *name)
{
	return sl_http_name_is(v + p->ns, p->ne - p->ns, name);
}

/* `name*`, `name*0`, `name*0*`: RFC 2231 / 8187, which sluice does not decode. */
static int
param_starred(const char *v, const struct hparam *p, const char *name)
{
	size_t l = strlen(name);

	return p->ne - p->ns > l && strncasecmp(v + p->ns, name, l) == 0 &&
	    v[p->ns + l] == '*';
}

/*
 * A part's head, b[hs..he) (lines that each end in CRLF): *is_model when
 * its Content-Disposition names the field "model". 0, or -1 with r set to
 * SL_MODEL_AMBIGUOUS.
 */
static int
read_part_head(const char *b, size_t hs, size_t he, int *is_model,
    struct sl_model_req *r)
{
	size_t k = hs;
	int cd = 0, coded = 0;

	*is_model = 0;
	while (k < he) {
		const char *line = b + k, *v;
		size_t ll = (size_t)((const char *)memmem(line, he - k, "\r\n", 2) -
		    line), c, vl, i;
		struct hparam p;
		int rc, names = 0;

		k += ll + 2;
		if (memchr(line, '\r', ll) != NULL || memchr(line, '\n', ll) != NULL) {
			ambiguous(r, "a part header with a bare CR or LF");
			return -1;
		}
		for (c = 0; c < ll && sl_http_is_tchar((unsigned char)line[c]); c++)
			;
		if (c == 0 || c == ll || line[c] != ':') {
			ambiguous(r, ll > 0 && (line[0] == ' ' || line[0] == '\t') ?
			    "a folded part header" : "a part header that is not "
			    "name: value");
			return -1;
		}
		v = line + c + 1;
		vl = ll - c - 1;
		if (sl_http_name_is(line, c, "content-transfer-encoding")) {
			i = ows(v, vl, 0);
			coded |= !(media_type_is(v + i, vl - i, "7bit") ||
			    media_type_is(v + i, vl - i, "8bit") ||
			    media_type_is(v + i, vl - i, "binary"));
			continue;
		}
		if (!sl_http_name_is(line, c, "content-disposition"))
			continue;
		if (cd++) {
			ambiguous(r, "a part with two Content-Disposition headers");
			return -1;
		}
		for (i = 0; (rc = next_param(v, vl, &i, &p)) == 1;) {
			if (param_starred(v, &p, "name")) {
				ambiguous(r, "an encoded form field name (name*=), "
				    "which sluice does not decode");
				return -1;
			}
			if (!param_is(v, &p, "name"))
				continue;
			if (names++) {
				ambiguous(r, "a part that names its field twice");
				return -1;
			}
			if (p.escapes) {
				ambiguous(r, "a form field name with a backslash");
				return -1;
			}
			if (p.ve - p.vs == 5 && memcmp(v + p.vs, "model", 5) == 0)
				*is_model = 1;
			else if (decodes_to_model(v + p.vs, p.ve - p.vs, 0)) {
				ambiguous(r, "a form field name that is 'model' "
				    "only when decoded, trimmed or case-folded");
				return -1;
			}
		}
		if (rc < 0) {
			ambiguous(r, "a Content-Disposition sluice cannot read "
			    "unambiguously");
			return -1;
		}
	}
	if (*is_model && coded) {
		ambiguous(r, "a 'model' field with a Content-Transfer-Encoding");
		return -1;
	}
	return 0;
}

/*
 * multipart/form-data (RFC 7578), read strictly: the body opens with its
 * boundary, every "CRLF--boundary" in it is a delimiter followed by CRLF
 * or "--", every part head is "name: value" lines, and the field "model"
 * appears at most once. python-multipart (vLLM's transcriptions, through
 * Starlette) keeps the last field of a name and its own reading of the
 * rest; whatever it or another reader could read otherwise is refused.
 */
static void
read_form(const char *body, size_t len, const char *ctype, size_t ctlen,
    struct sl_model_req *r)
{
	char delim[4 + 70];
	size_t bs = 0, be = 0, dl, i = 0, ms = 0, me = 0, n;
	struct hparam p;
	int rc, nb = 0, nmodel = 0;

	while ((rc = next_param(ctype, ctlen, &i, &p)) == 1) {
		if (param_starred(ctype, &p, "boundary")) {
			ambiguous(r, "an encoded boundary (boundary*=)");
			return;
		}
		if (param_starred(ctype, &p, "charset") || (param_is(ctype, &p,
		    "charset") && !sl_http_name_is(ctype + p.vs, p.ve - p.vs,
		    "utf-8") && !sl_http_name_is(ctype + p.vs, p.ve - p.vs,
		    "us-ascii"))) {
			/* Starlette decodes names and values by it (UTF-16...) */
			ambiguous(r, "a form charset other than UTF-8");
			return;
		}
		if (!param_is(ctype, &p, "boundary"))
			continue;
		if (nb++) {
			ambiguous(r, "a Content-Type with two boundary parameters");
			return;
		}
		if (p.escapes) {
			ambiguous(r, "a boundary with a backslash");
			return;
		}
		bs = p.vs;
		be = p.ve;
	}
	if (rc < 0) {
		ambiguous(r, "a Content-Type sluice cannot read unambiguously");
		return;
	}
	if (nb == 0 || be - bs < 1 || be - bs > 70) {
		ambiguous(r, "a multipart/form-data body without a boundary of "
		    "1 to 70 characters");
		return;
	}
	dl = 4 + (be - bs);
	memcpy(delim, "\r\n--", 4);
	memcpy(delim + 4, ctype + bs, be - bs);
	/* No preamble: readers differ on one (python-multipart refuses it). */
	if (len >= dl && memcmp(body, delim, dl) == 0)
		i = dl;
	else if (len >= dl - 2 && memcmp(body, delim + 2, dl - 2) == 0)
		i = dl - 2;
	else {
		ambiguous(r, "a multipart body that does not open with its "
		    "boundary");
		return;
	}
	for (;;) {
		size_t hs, he, cs;
		const char *q;
		int is_model;

		if (len - i >= 2 && body[i] == '-' && body[i + 1] == '-')
			break;   /* the close delimiter; the epilogue is no part */
		if (len - i < 2 || body[i] != '\r' || body[i + 1] != '\n') {
			ambiguous(r, len - i < 2 ? "a multipart body that ends "
			    "without its close delimiter" : body[i] == '\n' ?
			    "a line that ends in LF alone, not CRLF" : "a "
			    "boundary followed by more than CRLF or '--'");
			return;
		}
		hs = i + 2;
		if (len - hs >= 2 && body[hs] == '\r' && body[hs + 1] == '\n')
			he = hs;   /* no header lines */
		else if ((q = memmem(body + hs, len - hs, "\r\n\r\n", 4)) != NULL)
			he = (size_t)(q - body) + 2;
		else {
			ambiguous(r, "a part whose head does not end");
			return;
		}
		if (read_part_head(body, hs, he, &is_model, r) < 0)
			return;
		cs = he + 2;
		if ((q = memmem(body + cs, len - cs, delim, dl)) == NULL) {
			ambiguous(r, "a part that does not end with the boundary");
			return;
		}
		if (is_model) {
			if (nmodel++) {
				ambiguous(r, "more than one 'model' form field");
				return;
			}
			ms = cs;
			me = (size_t)(q - body);
		}
		i = (size_t)(q - body) + dl;
	}
	if (nmodel == 0)
		return;
	r->kind = SL_MODEL_NAMED;
	r->form = 1;
	r->v.vs = ms;
	r->v.ve = me;
	if ((n = me - ms) > SL_MODEL_NAME_MAX) {
		n = SL_MODEL_NAME_MAX;
		r->too_long = 1;
	}
	memcpy(r->name, body + ms, n);
	r->name[n] = '\0';
	r->len = n;
}

/*
 * application/x-www-form-urlencoded: sluice reads no model from it, and a
 * runner's form reader (Starlette) would; a key that decodes to "model"
 * (in any case) is refused.
 */
static void
read_urlencoded(const char *b, size_t len, struct sl_model_req *r)
{
	size_t i = 0, s, k;

	while (i < len) {
		for (s = i; i < len && b[i] != '&' && b[i] != ';'; i++)
			;
		for (k = s; k < i && b[k] != '='; k++)
			;
		if (decodes_to_model(b + s, k - s, 1)) {
			ambiguous(r, "a 'model' in an application/"
			    "x-www-form-urlencoded body, which sluice does not read");
			return;
		}
		i++;
	}
}

/* Does p[0..n) hold lit, in any case? */
static int
contains_ci(const char *p, size_t n, const char *lit)
{
	size_t l = strlen(lit), i;

	for (i = 0; i + l <= n; i++)
		if (strncasecmp(p + i, lit, l) == 0)
			return 1;
	return 0;
}

void
sl_model_read(const char *body, size_t len, const char *ctype, size_t ctlen,
    struct sl_model_req *out)
{
	memset(out, 0, sizeof(*out));
	if (len == 0 || body == NULL)
		return;
	/*
	 * A form type anywhere but as the plain main type: the email package
	 * reads "multipart/form-data=x; boundary=b" as a form, say.
	 */
	if (ctype != NULL && !media_type_is(ctype, ctlen, "multipart/form-data") &&
	    !media_type_is(ctype, ctlen, "application/x-www-form-urlencoded") &&
	    (contains_ci(ctype, ctlen, "multipart/form-data") ||
	    contains_ci(ctype, ctlen, "x-www-form-urlencoded"))) {
		ambiguous(out, "a Content-Type sluice cannot read unambiguously");
		return;
	}
	if (ctype != NULL && media_type_is(ctype, ctlen, "multipart/form-data")) {
		read_form(body, len, ctype, ctlen, out);
		return;
	}
	if (ctype != NULL && media_type_is(ctype, ctlen,
	    "application/x-www-form-urlencoded")) {
		read_urlencoded(body, len, out);
		return;
	}
	read_json(body, len, out);
}

/* ---- rewriting -------------------------------------------------------- */

/* `to` as a JSON string (config names hold no control characters). */
static size_t
quoted_len(const char *to)
{
	size_t n = 2;

	for (; *to != '\0'; to++)
		n += *to == '"' || *to == '\\' ? 2 : 1;
	return n;
}

static char *
put_quoted(char *o, const char *to)
{
	*o++ = '"';
	for (; *to != '\0'; to++) {
		if (*to == '"' || *to == '\\')
			*o++ = '\\';
		*o++ = *to;
	}
	*o++ = '"';
	return o;
}

/*
 * Walk the top-level members of a validated JSON object: call with *i at
 * the opening brace (first call: *i = SIZE_MAX starts it); returns 1 with
 * the value span of the next member named "model", 0 at the end.
 */
static int
next_model_member(const char *p, size_t len, size_t *i, struct sl_json_span *v)
{
	size_t k = *i;

	if (k == SIZE_MAX) {
		k = len >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0 ? 3 : 0;
		k = sl_json_ws(p, len, k) + 1;   /* past '{' */
	}
	for (;;) {
		size_t ks, ke, vs;

		k = sl_json_ws(p, len, k);
		if (k >= len || p[k] == '}')
			return 0;
		if (p[k] == ',')
			k = sl_json_ws(p, len, k + 1);
		ks = k;
		if (sl_json_skip(p, len, &k) < 0)
			return 0;
		ke = k;
		k = sl_json_ws(p, len, k);
		if (k >= len || p[k] != ':')
			return 0;
		k = vs = sl_json_ws(p, len, k + 1);
		if (sl_json_skip(p, len, &k) < 0)
			return 0;
		if (sl_json_key_is(p, ks, ke, "model")) {
			v->vs = vs;
			v->ve = k;
			*i = k;
			return 1;
		}
	}
}

int
sl_model_rewrite(const char *body, size_t len, const struct sl_model_req *r,
    const char *to, char **out, size_t *out_len)
{
	size_t tl = strlen(to), n, i, from;
	struct sl_json_span v;
	char *o, *w;

	*out = NULL;
	*out_len = 0;
	if (r->kind != SL_MODEL_NAMED)
		return 0;
	/*
	 * Several top-level "model" members: the first routed, but a runner
	 * (Python's json) reads the last. All of them are set to the target's,
	 * so what the runner serves is what the allow-list allowed.
	 */
	if (!r->too_long && r->len == tl && memcmp(r->name, to, tl) == 0 &&
	    (r->form || r->count == 1))
		return 0;
	if (r->form) {
		n = len - (r->v.ve - r->v.vs) + tl;
		if ((o = malloc(n ? n : 1)) == NULL)
			return -1;
		memcpy(o, body, r->v.vs);
		memcpy(o + r->v.vs, to, tl);
		memcpy(o + r->v.vs + tl, body + r->v.ve, len - r->v.ve);
		*out = o;
		*out_len = n;
		return 1;
	}
	n = len;
	for (i = SIZE_MAX; next_model_member(body, len, &i, &v);)
		n = n - (v.ve - v.vs) + quoted_len(to);
	if ((o = malloc(n ? n : 1)) == NULL)
		return -1;
	w = o;
	from = 0;
	for (i = SIZE_MAX; next_model_member(body, len, &i, &v);) {
		memcpy(w, body + from, v.vs - from);
		w = put_quoted(w + (v.vs - from), to);
		from = v.ve;
	}
	memcpy(w, body + from, len - from);
	w += len - from;
	*out = o;
	*out_len = (size_t)(w - o);
	return 1;
}

/* ---- choosing a target ------------------------------------------------ */

struct sl_models {
	const struct sl_config *cfg;
	size_t *first;          /* per model: its first entry in cur */
	int64_t *cur;           /* per target: its current weight */
};

struct sl_models *
sl_models_new(const struct sl_config *cfg)
{
	struct sl_models *s = calloc(1, sizeof(*s));
	size_t m, n = 0;

	if (s == NULL)
		return NULL;
	s->cfg = cfg;
	for (m = 0; m < cfg->nmodels; m++)
		n += cfg->models[m].ntargets;
	s->first = calloc(cfg->nmodels ? cfg->nmodels : 1, sizeof(*s->first));
	s->cur = calloc(n ? n : 1, sizeof(*s->cur));
	if (s->first == NULL || s->cur == NULL) {
		sl_models_free(s);
		return NULL;
	}
	for (n = 0, m = 0; m < cfg->nmodels; m++) {
		s->first[m] = n;
		n += cfg->models[m].ntargets;
	}
	return s;
}

void
sl_models_free(struct sl_models *s)
{
	if (s == NULL)
		return;
	free(s->first);
	free(s->cur);
	free(s);
}

/*
 * nginx's smooth weighted round robin: every target gains its weight, the
 * one ahead is chosen and loses the total. Weights 90 and 10 give exactly
 * 9 and 1 in every 10 requests, spread out rather than in runs.
 */
size_t
sl_models_pick(struct sl_models *s, size_t m)
{
	const struct sl_model_conf *mc = &s->cfg->models[m];
	int64_t *cur = s->cur + s->first[m], total = 0;
	size_t t, best = 0;

	for (t = 0; t < mc->ntargets; t++) {
		cur[t] += mc->targets[t].weight;
		total += mc->targets[t].weight;
		if (cur[t] > cur[best])
			best = t;
	}
	cur[best] -= total;
	return best;
}

/* ---- routing ---------------------------------------------------------- */

/* JSON-escape n bytes of s into dst (always terminated, cut to fit). */
static void
escape_name(char *dst, size_t dlen, const char *s, size_t n)
{
	size_t i, o = 0;

	for (i = 0; i < n && o + 7 < dlen; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch == '"' || ch == '\\') {
			dst[o++] = '\\';
			dst[o++] = (char)ch;
		} else if (ch < 0x20 || ch == 0x7f)
			o += (size_t)snprintf(dst + o, dlen - o, "\\u%04x", ch);
		else
			dst[o++] = (char)ch;
	}
	dst[o] = '\0';
}

static void
refuse(struct sl_route *out, int status, const char *code, const char *msg)
{
	out->status = status;
	out->code = code;
	snprintf(out->message, sizeof(out->message), "%s", msg);
}

int
sl_model_route(struct sl_models *s, const struct sl_config *cfg, size_t t,
    const char *body, size_t len, const char *ctype, size_t ctlen,
    struct sl_route *out)
{
	const struct sl_tenant_conf *tc = &cfg->tenants[t];
	const struct sl_model_target *tg;
	struct sl_model_req r;
	int m;

	memset(out, 0, sizeof(*out));
	out->model = -1;
	sl_model_read(body, len, ctype, ctlen, &r);
	switch (r.kind) {
	case SL_MODEL_NOT_STRING:
		refuse(out, 400, "bad_request", "'model' must be a string");
		return 0;
	case SL_MODEL_AMBIGUOUS:
		/* Whatever the tenant's upstream: unread is unchecked. */
		snprintf(out->message, sizeof(out->message), "%s%s",
		    SL_MODEL_AMBIGUOUS_MSG, r.why);
		out->status = 400;
		out->code = "bad_request";
		return 0;
	case SL_MODEL_BAD_JSON:
	case SL_MODEL_NONE:
		if (tc->has_upstream) {
			out->upstream = tc->upstream_idx;
			return 0;
		}
		refuse(out, 400, "bad_request", r.kind == SL_MODEL_BAD_JSON ?
		    "the request body is not valid JSON" :
		    "you must provide a model parameter");
		return 0;
	case SL_MODEL_NAMED:
		break;
	}
	memcpy(out->client, r.name, r.len + 1);
	out->client_len = r.len;
	m = r.too_long ? -1 : sl_config_model_find(cfg, r.name, r.len);
	/* The same answer for both: a key cannot probe which models exist. */
	if (m < 0 || (!sl_tenant_allows(tc, (size_t)m))) {
		char name[300];

		escape_name(name, sizeof(name), r.name, r.len);
		out->status = 404;
		out->code = "model_not_found";
		snprintf(out->message, sizeof(out->message), "The model '%s' does "
		    "not exist or you do not have access to it.", name);
		return 0;
	}
	out->target = sl_models_pick(s, (size_t)m);
	tg = &cfg->models[m].targets[out->target];
	out->model = m;
	out->upstream = tg->upstream_idx;
	out->sent = tg->model;
	if (sl_model_rewrite(body, len, &r, tg->model, &out->body,
	    &out->body_len) < 0)
		return -1;
	if (r.form) {
		out->span.form = 1;
		out->span.vs = r.v.vs;
		out->span.ve = out->body != NULL ? r.v.vs + strlen(tg->model) :
		    r.v.ve;
	}
	return 0;
}

/* ---- GET /v1/models --------------------------------------------------- */

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One entry of the list, s JSON-escaped; o NULL: only its length. */
static size_t
put_entry(char *o, const char *s, long long created)
{
	char tail[96];
	size_t n = (size_t)snprintf(tail, sizeof(tail), ",\"object\":\"model\","
	    "\"created\":%lld,\"owned_by\":\"sluice\"}", created);
	size_t q = quoted_len(s);

	if (o != NULL) {
		memcpy(o, "{\"id\":", 6);
		put_quoted(o + 6, s);
		memcpy(o + 6 + q, tail, n);
	}
	return 6 + q + n;
}

/*
 * The path, percent-decoded, into d (cap bytes); its length, or cap + 1
 * when it does not fit (or a '%' is not followed by two hex digits: the
 * runners would not take it either).
 */
static size_t
path_decode(const char *p, size_t len, char *d, size_t cap)
{
	size_t i, o = 0;

	for (i = 0; i < len; i++) {
		int hi, lo;
		char ch = p[i];

		if (ch == '%') {
			if (len - i < 3 || (hi = sl_json_hexval(p[i + 1])) < 0 ||
			    (lo = sl_json_hexval(p[i + 2])) < 0)
				return cap + 1;
			ch = (char)(hi << 4 | lo);
			i += 2;
		}
		if (o == cap)
			return cap + 1;
		d[o++] = ch;
	}
	return o;
}

int
sl_model_list(const struct sl_config *cfg, size_t t, const char *path,
    size_t plen, char **body, size_t *blen, char *msg, size_t msglen)
{
	static const char pre[] = "/v1/models";
	const struct sl_tenant_conf *tc = &cfg->tenants[t];
	char d[sizeof(pre) + SL_MODEL_NAME_MAX + 1], name[300];
	const char **ids;
	size_t dl, n = 0, m, j, len;
	char *o, *w;

	*body = NULL;
	*blen = 0;
	dl = path_decode(path, plen, d, sizeof(d) - 1);
	if (dl < sizeof(pre) - 1 || memcmp(d, pre, sizeof(pre) - 1) != 0 ||
	    (dl > sizeof(pre) - 1 && d[sizeof(pre) - 1] != '/'))
		return 0;
	if (dl > sizeof(pre) - 1) {
		/* /v1/models/NAME: one model, by a name the tenant may use. */
		const char *nm = d + sizeof(pre);
		size_t nl = dl >= sizeof(d) ? SL_MODEL_NAME_MAX + 1 :
		    dl - sizeof(pre);
		int mi = nl > SL_MODEL_NAME_MAX ? -1 :
		    sl_config_model_find(cfg, nm, nl);

		if (mi < 0 || (!sl_tenant_allows(tc, (size_t)mi))) {
			escape_name(name, sizeof(name), nm,
			    nl > SL_MODEL_NAME_MAX ? SL_MODEL_NAME_MAX : nl);
			snprintf(msg, msglen, "The model '%s' does not exist or "
			    "you do not have access to it.", name);
			return 404;
		}
		d[sizeof(pre) + nl] = '\0';
		len = put_entry(NULL, nm, (long long)cfg->loaded_at);
		if ((o = malloc(len)) == NULL)
			return -1;
		put_entry(o, nm, (long long)cfg->loaded_at);
		*body = o;
		*blen = len;
		return 200;
	}
	for (m = 0; m < cfg->nmodels; m++)
		n += 1 + cfg->models[m].naliases;
	if ((ids = calloc(n ? n : 1, sizeof(*ids))) == NULL)
		return -1;
	for (n = 0, m = 0; m < cfg->nmodels; m++) {
		if (!sl_tenant_allows(tc, (size_t)m))
			continue;
		ids[n++] = cfg->models[m].name;
		for (j = 0; j < cfg->models[m].naliases; j++)
			ids[n++] = cfg->models[m].aliases[j];
	}
	qsort(ids, n, sizeof(*ids), cmp_str);
	len = sizeof("{\"object\":\"list\",\"data\":[]}") - 1;
	for (j = 0; j < n; j++)
		len += (j > 0) + put_entry(NULL, ids[j], (long long)cfg->loaded_at);
	if ((o = malloc(len)) == NULL) {
		free(ids);
		return -1;
	}
	w = o;
	memcpy(w, "{\"object\":\"list\",\"data\":[", 25);
	w += 25;
	for (j = 0; j < n; j++) {
		if (j > 0)
			*w++ = ',';
		w += put_entry(w, ids[j], (long long)cfg->loaded_at);
	}
	memcpy(w, "]}", 2);
	w += 2;
	free(ids);
	*body = o;
	*blen = (size_t)(w - o);
	return 200;
}

/* ---- fallback ---------------------------------------------------------- */

/* Append model m's targets but `skip`, by decreasing weight, ties in order. */
static void
chain_targets(const struct sl_model_conf *mc, size_t m, size_t skip,
    struct sl_model_pick *out, size_t *n)
{
	size_t done = 0, t;
	int32_t w = INT32_MAX, next;

	/* Weights are 1..1000: walk them from the largest down. */
	while (done < mc->ntargets) {
		next = 0;
		for (t = 0; t < mc->ntargets; t++)
			if (mc->targets[t].weight < w &&
			    mc->targets[t].weight > next)
				next = mc->targets[t].weight;
		if (next == 0)
			break;
		for (t = 0; t < mc->ntargets; t++)
			if (mc->targets[t].weight == next) {
				done++;
				if (t != skip) {
					out[*n].model = m;
					out[(*n)++].target = t;
				}
			}
		w = next;
	}
}

int
sl_model_chain(const struct sl_config *cfg, size_t tenant, size_t m0,
    size_t t0, struct sl_model_pick **out, size_t *n)
{
	const struct sl_tenant_conf *tc = &cfg->tenants[tenant];
	struct sl_model_pick *p;
	size_t total = 0, m, *queue, qh = 0, qt = 0, j;
	unsigned char *seen;

	*out = NULL;
	*n = 0;
	for (m = 0; m < cfg->nmodels; m++)
		total += cfg->models[m].ntargets;
	p = calloc(total ? total : 1, sizeof(*p));
	queue = calloc(cfg->nmodels, sizeof(*queue));
	seen = calloc(cfg->nmodels, 1);
	if (p == NULL || queue == NULL || seen == NULL) {
		free(p);
		free(queue);
		free(seen);
		return -1;
	}
	chain_targets(&cfg->models[m0], m0, t0, p, n);
	seen[m0] = 1;
	queue[qt++] = m0;
	/* Breadth first: a model's own list before its fallbacks' lists. */
	while (qh < qt) {
		const struct sl_model_conf *mc = &cfg->models[queue[qh++]];

		for (j = 0; j < mc->nfallback; j++) {
			size_t f = mc->fallback[j];

			if (seen[f])
				continue;
			seen[f] = 1;
			if (!sl_tenant_allows(tc, (size_t)f))
				continue;   /* skipped, and its own fallbacks */
			chain_targets(&cfg->models[f], f, SIZE_MAX, p, n);
			queue[qt++] = f;
		}
	}
	free(queue);
	free(seen);
	*out = p;
	return 0;
}

int
sl_model_may_fall_back(int routed, int answered, enum sl_fb_cause why)
{
	if (!routed || answered)
		return 0;
	switch (why) {
	case SL_FB_NO_REPLICA:
	case SL_FB_CONNECT:
	case SL_FB_BUSY:
		return 1;
	case SL_FB_STARTED:
		break;
	}
	return 0;
}

int
sl_model_retarget(char **body, size_t *len, struct sl_model_span *sp,
    const char *to)
{
	struct sl_model_req r;
	char *out;
	size_t olen;

	memset(&r, 0, sizeof(r));
	if (sp->form) {
		r.kind = SL_MODEL_NAMED;
		r.form = 1;
		r.v.vs = sp->vs;
		r.v.ve = sp->ve;
		r.too_long = 1;   /* always rewrite */
	} else
		read_json(*body, *len, &r);
	if (r.kind != SL_MODEL_NAMED)
		return 0;
	r.count = r.count ? r.count : 1;
	r.too_long = 1;
	if (sl_model_rewrite(*body, *len, &r, to, &out, &olen) < 0)
		return -1;
	if (out == NULL)
		return 0;
	if (sp->form)
		sp->ve = sp->vs + strlen(to);
	free(*body);
	*body = out;
	*len = olen;
	return 0;
}

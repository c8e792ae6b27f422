/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * libFuzzer target for src/model.c (issue 23): where a request's model is
 * read, and the body rewritten for a target.
 *
 * Input: byte 0 picks the mode (bit 0: a multipart/form-data body with
 * boundary "b", else JSON); the rest is the body.
 * JSON:
 *   - a body jansson reads as an object (duplicates allowed) is never
 *     BAD_JSON; one jansson refuses is BAD_JSON or uses a documented
 *     Python extension (a BOM, NaN, Infinity, lone surrogates, huge numbers);
 *   - with one top-level "model": NAMED iff jansson's is a string, and then
 *     the decoded name is jansson's (cut to SL_MODEL_NAME_MAX, too_long
 *     set past it); no top-level "model" in jansson: NONE;
 *   - the rewrite to a target parses whenever the input did, its top-level
 *     "model" is the target, and with the model set in the input's tree
 *     both trees are equal; it has the length the spans say.
 * Multipart (bit 0; with bit 2 the Content-Type is the input up to its
 * first LF, else "multipart/form-data; boundary=b"): sluice refuses the
 * body (AMBIGUOUS, with a reason), or the model it checked is the one a
 * last-wins reader (tests/ref/form_ref.c: python-multipart and Starlette)
 * serves - the same bytes, or none when sluice read none - under a charset
 * that reader decodes as sluice does; a NAMED field's bytes are the name
 * (or its first SL_MODEL_NAME_MAX), inside the body; the rewrite is the
 * body with those bytes replaced.
 * Answers (sl_mrw, every input; bit 1 of byte 0: an event stream): the
 * output is the same fed whole, one byte per read, split at any byte
 * (every one, for short inputs) or fed twice with the state restored in
 * between (a pause); a JSON input without line ends, sent as two data
 * lines of an event stream, comes out as two lines of its JSON output
 * (or unchanged, when its top-level "type" names an event that carries no
 * model: exempt from the model being set, see mrw_lines_expect); a
 * JSON answer jansson reads as an object still reads as one with the same
 * members, and so do its top-level "response" and "message" objects, each
 * "model" there either as it was or the name set back, and only one set
 * (always the name when the text has no escape and one "model" key, a
 * string at the top level or directly in such an object).
 */
#include "config.h"

#include <jansson.h>

#include "form_ref.h"
#include "fuzz.h"
#include "sl_model.h"

#define FLAGS (JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL)
#define TARGET "meta/\"L\\3"

/*
 * Does the text use what Python's json takes and jansson does not: a BOM,
 * NaN, Infinity, a lone surrogate escape, a NUL escape (in a key), or a
 * number jansson cannot hold (an exponent, or many digits)?
 */
static int
python_extension(const char *in, size_t len)
{
	size_t i, run = 0;

	if ((len >= 3 && memcmp(in, "\xef\xbb\xbf", 3) == 0) ||
	    memmem(in, len, "NaN", 3) != NULL ||
	    memmem(in, len, "Infinity", 8) != NULL ||
	    memmem(in, len, "\\u0000", 6) != NULL)   /* jansson: not in keys */
		return 1;
	for (i = 0; i < len; i++) {
		run = in[i] >= '0' && in[i] <= '9' ? run + 1 : 0;
		if (run >= 16)
			return 1;
		if ((in[i] == 'e' || in[i] == 'E') && i > 0 && in[i - 1] >= '0' &&
		    in[i - 1] <= '9')
			return 1;
		if (in[i] == '\\' && i + 2 < len && in[i + 1] == 'u' &&
		    (in[i + 2] == 'd' || in[i + 2] == 'D'))
			return 1;
		/*
		 * A UTF-8-encoded surrogate (ED A0..BF): json.loads(bytes)
		 * decodes it (surrogatepass) and so does json.c since the
		 * tokens change; jansson refuses it.
		 */
		if ((unsigned char)in[i] == 0xed && i + 1 < len &&
		    (unsigned char)in[i + 1] >= 0xa0 && (unsigned char)in[i + 1] <= 0xbf)
			return 1;
	}
	return 0;
}

static void
check_json(const char *in, size_t len)
{
	struct sl_model_req r;
	json_error_t err;
	json_t *root, *m, *nroot;
	char *out;
	size_t olen;
	int rc;

	sl_model_read(in, len, "application/json", 16, &r);
	fz_check(r.len <= SL_MODEL_NAME_MAX, "name-bound", "%zu bytes", r.len);
	/* jansson takes a raw NUL byte where Python's json does not. */
	root = memchr(in, '\0', len) == NULL ? json_loadb(in, len, FLAGS, &err) :
	    NULL;
	if (root == NULL && len > 0 && memchr(in, '\0', len) != NULL)
		return;
	if (root != NULL && !json_is_object(root)) {
		fz_check(r.kind == SL_MODEL_BAD_JSON, "bad-json", "a non-object read");
		json_decref(root);
		return;
	}
	if (root == NULL) {
		if (len == 0)   /* no body: no model */
			fz_check(r.kind == SL_MODEL_NONE, "none", "kind %d for no body",
			    (int)r.kind);
		else if (r.kind == SL_MODEL_AMBIGUOUS)
			fz_check(sl_json_wide(in, len), "wide",
			    "refused as ambiguous, but not UTF-16 or UTF-32");
		else if (r.kind != SL_MODEL_BAD_JSON)
			fz_check(python_extension(in, len), "bad-json",
			    "read a body jansson refuses, with no Python extension");
		return;
	}
	fz_check(r.kind != SL_MODEL_BAD_JSON, "bad-json", "jansson reads it");
	m = json_object_get(root, "model");
	if (m == NULL)
		fz_check(r.kind == SL_MODEL_NONE && r.count == 0, "none",
		    "kind %d count %zu, jansson has no model", (int)r.kind, r.count);
	else if (r.count == 1) {
		fz_check((r.kind == SL_MODEL_NAMED) == json_is_string(m), "string",
		    "kind %d", (int)r.kind);
		if (json_is_string(m)) {
			size_t jl = json_string_length(m);

			fz_check(r.too_long == (jl > SL_MODEL_NAME_MAX) &&
			    r.len == (jl > SL_MODEL_NAME_MAX ? SL_MODEL_NAME_MAX : jl) &&
			    memcmp(r.name, json_string_value(m), r.len) == 0,
			    "name", "decoded name differs from jansson's");
		}
	}
	rc = sl_model_rewrite(in, len, &r, TARGET, &out, &olen);
	if (rc == 1) {
		nroot = json_loadb(out, olen, FLAGS, &err);
		fz_check(nroot != NULL, "rewrite-parses", "%s", err.text);
		if (nroot != NULL) {
			fz_check(json_is_string(json_object_get(nroot, "model")) &&
			    strcmp(json_string_value(json_object_get(nroot, "model")),
			    TARGET) == 0, "rewrite-model", "not the target");
			json_object_set_new(root, "model", json_string(TARGET));
			fz_check(json_equal(root, nroot), "rewrite-equal",
			    "more than the model changed");
			json_decref(nroot);
		}
		free(out);
	} else if (rc == 0 && r.kind == SL_MODEL_NAMED)
		fz_check(r.count == 1 && !r.too_long && json_is_string(m) &&
		    strcmp(json_string_value(m), TARGET) == 0, "rewrite-needed",
		    "not rewritten");
	json_decref(root);
}

/*
 * A form under Content-Type ct: sluice refuses it, or the model it checks
 * is the model a last-wins reader (tests/ref/form_ref.c: python-multipart
 * and Starlette) serves, and the rewrite replaces exactly its bytes.
 */
static void
check_form(const char *ct, size_t ctlen, const char *in, size_t len)
{
	struct sl_model_req r;
	struct form_ref f;
	char *out;
	size_t olen;
	int ref;

	sl_model_read(in, len, ct, ctlen, &r);
	if (r.kind == SL_MODEL_AMBIGUOUS) {
		fz_check(r.why != NULL && *r.why != '\0', "form-why", "no reason");
		return;
	}
	ref = form_ref_read(ct, ctlen, in, len, &f);
	if (ref == 0 && f.is_form) {
		fz_check(!f.charset_other, "form-charset",
		    "read under a charset Starlette decodes otherwise");
		if (r.kind == SL_MODEL_NAMED)
			fz_check(f.found && (f.file || (f.vs == r.v.vs &&
			    f.ve == r.v.ve)), "form-last-wins", "sluice checked "
			    "%zu..%zu, the runner serves %s %zu..%zu", r.v.vs, r.v.ve,
			    f.found ? "the field at" : "none", f.vs, f.ve);
		else
			fz_check(!f.found, "form-unread", "sluice read no model "
			    "(kind %d), the runner serves %zu..%zu", (int)r.kind,
			    f.vs, f.ve);
	}
	if (r.kind != SL_MODEL_NAMED || !r.form)
		return;
	fz_check(r.v.vs <= r.v.ve && r.v.ve <= len, "form-span", "%zu..%zu of %zu",
	    r.v.vs, r.v.ve, len);
	fz_check(r.len == (r.v.ve - r.v.vs > SL_MODEL_NAME_MAX ? SL_MODEL_NAME_MAX :
	    r.v.ve - r.v.vs) && memcmp(r.name, in + r.v.vs, r.len) == 0,
	    "form-name", "the name is not the field's bytes");
	if (sl_model_rewrite(in, len, &r, TARGET, &out, &olen) == 1) {
		size_t tl = strlen(TARGET);

		fz_check(olen == len - (r.v.ve - r.v.vs) + tl &&
		    memcmp(out, in, r.v.vs) == 0 &&
		    memcmp(out + r.v.vs, TARGET, tl) == 0 &&
		    memcmp(out + r.v.vs + tl, in + r.v.ve, len - r.v.ve) == 0,
		    "form-rewrite", "not the body with the field replaced");
		free(out);
	}
}

#define SHOWN "gpt-4o \"x\""

/* in fed in pieces ending at cuts[] (then the rest); malloc'd output. */
static char *
mrw_pieces(const char *in, size_t len, int sse, const char *lit, size_t litlen,
    const size_t *cuts, size_t ncuts, int twice, size_t *olen)
{
	struct sl_mrw m, saved;
	struct sl_mrw_buf b = { NULL, 0, 0 };
	char *out = NULL;
	size_t at = 0, i, n = 0;
	int k;

	sl_mrw_init(&m, sse, lit, litlen);
	for (i = 0; i <= ncuts; i++) {
		size_t end = i < ncuts ? cuts[i] : len;
		const char *src;
		size_t sl;
		char *no;

		if (twice) {
			saved = m;
			fz_check(sl_mrw_feed(&m, in + at, end - at, &b) != -1, "mrw-mem",
			    "no memory");
			m = saved;
		}
		k = sl_mrw_feed(&m, in + at, end - at, &b);
		fz_check(k != -1, "mrw-mem", "no memory");
		src = k == 0 ? in + at : b.p;
		sl = k == 0 ? end - at : b.len;
		if ((no = realloc(out, n + sl + 1)) == NULL)
			abort();
		out = no;
		if (sl > 0)
			memcpy(out + n, src, sl);
		n += sl;
		at = end;
	}
	free(b.p);
	if (out == NULL && (out = malloc(1)) == NULL)
		abort();
	*olen = n;
	return out;
}

/*
 * b is a (jansson object): the same members, "model" either as it was or
 * the name shown; 1 when it is the name (and was not).
 */
static int
mrw_same_but_model(json_t *a, json_t *b, const char *what)
{
	const char *key;
	json_t *v;
	int set = 0;

	fz_check(json_object_size(a) == json_object_size(b), "mrw-members",
	    "%s: members differ", what);
	json_object_foreach(a, key, v) {
		json_t *w = json_object_get(b, key);

		if (strcmp(key, "model") != 0) {
			fz_check(w != NULL && json_equal(v, w), "mrw-others",
			    "%s: member %s changed", what, key);
			continue;
		}
		fz_check(w != NULL && (json_equal(v, w) || (json_is_string(w) &&
		    strcmp(json_string_value(w), SHOWN) == 0)), "mrw-model",
		    "%s: model is neither", what);
		set = w != NULL && !json_equal(v, w);
	}
	return set;
}

static size_t mrw_count(const char *, size_t, const char *);

/*
 * A top-level "type" string v (n bytes) that names an event carrying no
 * model (sl_model.h): any "response." type but the six that carry the
 * response object; the listed Messages types.
 */
static int
mrw_type_listed(const char *v, size_t n)
{
	static const char *const keep[] = { "created", "in_progress", "queued",
	    "completed", "incomplete", "failed" };
	static const char *const skip[] = { "content_block_start",
	    "content_block_delta", "content_block_stop", "message_delta",
	    "message_stop", "ping" };
	size_t i;

	if (n > 9 && memcmp(v, "response.", 9) == 0) {
		for (i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
			if (n - 9 == strlen(keep[i]) && memcmp(v + 9, keep[i], n - 9) == 0)
				return 0;
		return 1;
	}
	for (i = 0; i < sizeof(skip) / sizeof(skip[0]); i++)
		if (n == strlen(skip[i]) && memcmp(v, skip[i], n) == 0)
			return 1;
	return 0;
}

/*
 * The input fed as an event stream: two data lines of it. Each comes out
 * as the JSON output (whole), or unchanged when its top-level "type" names
 * an event with no model (sl_model.h): expect 0 the JSON output, 1 the
 * input, -1 either (the oracle cannot say which: that type is exempt from
 * the model being set).
 */
static void
check_mrw_as_lines(const char *in, size_t len, const char *lit, size_t litlen,
    const char *whole, size_t wlen, int expect)
{
	size_t sl = 2 * (len + 8), olen, cut, i;
	size_t wl = 2 * (wlen + 8);
	char *s, *w, *o;

	if (memchr(in, '\n', len) != NULL || memchr(in, '\r', len) != NULL)
		return;
	if ((s = malloc(sl)) == NULL || (w = malloc(wl)) == NULL)
		abort();
	for (i = 0; i < 2; i++) {
		memcpy(s + i * (len + 8), "data: ", 6);
		memcpy(s + i * (len + 8) + 6, in, len);
		memcpy(s + i * (len + 8) + 6 + len, "\n\n", 2);
		memcpy(w + i * (wlen + 8), "data: ", 6);
		memcpy(w + i * (wlen + 8) + 6, whole, wlen);
		memcpy(w + i * (wlen + 8) + 6 + wlen, "\n\n", 2);
	}
	for (i = 0; i < 2; i++) {
		/* whole; then the second line cut: the first read by the fast path */
		cut = len + 8 + 6 + len / 2;
		o = mrw_pieces(s, sl, 1, lit, litlen, &cut, i, 0, &olen);
		if (expect == 1 || (expect == -1 && !(olen == wl && memcmp(o, w, wl) == 0)))
			fz_check(olen == sl && memcmp(o, s, sl) == 0, "mrw-sse-json",
			    "%s data line is neither the JSON answer nor, its type "
			    "naming an event with no model, the input", i ? "a cut" : "a");
		else
			fz_check(olen == wl && memcmp(o, w, wl) == 0, "mrw-sse-json",
			    "%s data line differs from the JSON answer",
			    i ? "a cut" : "a");
		free(o);
	}
	free(s);
	free(w);
}

/*
 * What check_mrw_as_lines expects of in (see there): 0 when no "type" key
 * can name such an event (none in the text, or jansson's top-level "type"
 * is no such name and the text has one "type"); 1 or 0 by their order when
 * the text has no escape, one "type" (jansson's: such a name) and at most
 * one "model"; else -1.
 */
static int
mrw_lines_expect(const char *in, size_t len)
{
	size_t nt = mrw_count(in, len, "\"type\""), nm;
	json_error_t err;
	json_t *a, *t, *where;
	int r = -1, listed;

	if (nt == 0)
		return 0;
	if (nt > 1 || memchr(in, '\0', len) != NULL ||
	    (a = json_loadb(in, len, FLAGS, &err)) == NULL)
		return -1;
	if (!json_is_object(a)) {
		json_decref(a);
		return 0;   /* a top-level array: no key at all */
	}
	t = json_object_get(a, "type");
	listed = json_is_string(t) &&
	    mrw_type_listed(json_string_value(t), json_string_length(t));
	if (!listed)
		r = 0;
	else if (memchr(in, '\\', len) == NULL &&
	    (nm = mrw_count(in, len, "\"model\"")) <= 1) {
		/* the model that decides: top-level, or in a response / message */
		where = json_object_get(a, "model");
		if (where == NULL && json_is_object(json_object_get(a, "response")))
			where = json_object_get(json_object_get(a, "response"), "model");
		if (where == NULL && json_is_object(json_object_get(a, "message")))
			where = json_object_get(json_object_get(a, "message"), "model");
		r = where == NULL || nm == 0 ||
		    (char *)memmem(in, len, "\"type\"", 6) <
		    (char *)memmem(in, len, "\"model\"", 7);
	}
	json_decref(a);
	return r;
}

/* How many times w occurs in p. */
static size_t
mrw_count(const char *p, size_t n, const char *w)
{
	size_t c = 0, wl = strlen(w);
	const char *q;

	while (n >= wl && (q = memmem(p, n, w, wl)) != NULL) {
		c++;
		n -= (size_t)(q - p) + 1;
		p = q + 1;
	}
	return c;
}

static void
check_mrw(const char *in, size_t len, int sse)
{
	size_t litlen, wlen, olen, i, cuts[3], *every;
	char *lit = sl_mrw_literal(SHOWN, strlen(SHOWN), &litlen), *whole, *o;
	json_error_t err;
	json_t *a, *b;

	if (lit == NULL)
		abort();
	whole = mrw_pieces(in, len, sse, lit, litlen, NULL, 0, 0, &wlen);
	for (i = 0; i <= len; i += len <= 256 ? 1 : len / 61 + 1) {
		cuts[0] = i;
		o = mrw_pieces(in, len, sse, lit, litlen, cuts, 1, (i & 1) != 0,
		    &olen);
		fz_check(olen == wlen && memcmp(o, whole, wlen) == 0, "mrw-split",
		    "split at %zu differs", i);
		free(o);
	}
	cuts[0] = len / 4;
	cuts[1] = len / 2;
	cuts[2] = len - len / 5;
	o = mrw_pieces(in, len, sse, lit, litlen, cuts, 3, 1, &olen);
	fz_check(olen == wlen && memcmp(o, whole, wlen) == 0, "mrw-split",
	    "three splits differ");
	free(o);
	if (len > 1) {
		if ((every = malloc((len - 1) * sizeof(*every))) == NULL)
			abort();
		for (i = 1; i < len; i++)
			every[i - 1] = i;
		o = mrw_pieces(in, len, sse, lit, litlen, every, len - 1, 0, &olen);
		fz_check(olen == wlen && memcmp(o, whole, wlen) == 0, "mrw-split",
		    "one byte per read differs");
		free(o);
		free(every);
	}
	if (!sse)
		check_mrw_as_lines(in, len, lit, litlen, whole, wlen,
		    mrw_lines_expect(in, len));
	if (!sse && memchr(in, '\0', len) == NULL &&
	    (a = json_loadb(in, len, FLAGS, &err)) != NULL) {
		if (json_is_object(a)) {
			static const char *const subs[] = { "response", "message" };
			json_t *ac, *bc, *where = json_object_get(a, "model"), *w;
			int nset = 0;

			b = json_loadb(whole, wlen, FLAGS, &err);
			fz_check(b != NULL && json_is_object(b), "mrw-parses", "%s",
			    b == NULL ? err.text : "not an object");
			/*
			 * A top-level response / message object: compared inside;
			 * the rest as the top level, those two left out.
			 */
			ac = json_copy(a);
			bc = json_copy(b);
			if (ac == NULL || bc == NULL)
				abort();
			for (i = 0; i < 2; i++) {
				json_t *av = json_object_get(a, subs[i]);

				if (!json_is_object(av))
					continue;
				w = json_object_get(b, subs[i]);
				fz_check(json_is_object(w), "mrw-sub", "%s is no "
				    "longer an object", subs[i]);
				nset += mrw_same_but_model(av, w, subs[i]);
				if (where == NULL)
					where = json_object_get(av, "model");
				json_object_set_new(ac, subs[i], json_null());
				json_object_set_new(bc, subs[i], json_null());
			}
			nset += mrw_same_but_model(ac, bc, "top");
			fz_check(nset <= 1, "mrw-one", "%d models set", nset);
			json_decref(ac);
			json_decref(bc);
			/*
			 * No escape, and the only "model" in the text a string at
			 * the top level or directly in a top-level response or
			 * message object: it is set (unless already the name).
			 */
			if (json_is_string(where) && memchr(in, '\\', len) == NULL &&
			    mrw_count(in, len, "\"model\"") == 1 &&
			    strcmp(json_string_value(where), SHOWN) != 0)
				fz_check(nset == 1, "mrw-set",
				    "the model was not set back");
			json_decref(b);
		}
		json_decref(a);
	}
	free(whole);
	free(lit);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if ((data[0] & 5) == 5) {
		/* The Content-Type too: up to the first LF, the body after it. */
		const char *in = (const char *)data + 1, *nl = memchr(in, '\n',
		    size - 1);
		size_t cl = nl != NULL ? (size_t)(nl - in) : size - 1;

		check_form(in, cl, nl != NULL ? nl + 1 : in + cl,
		    size - 1 - cl - (nl != NULL));
	} else if (data[0] & 1) {
		static const char ct[] = "multipart/form-data; boundary=b";

		check_form(ct, sizeof(ct) - 1, (const char *)data + 1, size - 1);
	} else
		check_json((const char *)data + 1, size - 1);
	check_mrw((const char *)data + 1, size - 1, (data[0] & 2) != 0);
	return 0;
}

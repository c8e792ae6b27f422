/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The request editor declared in sl_usage.h: reads what a chat or
 * completion request body says about streaming and usage, estimates its
 * prompt, and asks for usage (stream_options.include_usage) where the
 * client did not.
 *
 * It validates the body in one pass that builds nothing (what a Python
 * runner accepts: JSON plus a BOM, NaN, Infinity, big numbers and lone
 * surrogates), finds the top-level members it needs on the way, and makes
 * its one edit at a member boundary found on the way.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "sl_json.h"
#include "sl_usage.h"

void
sl_usage_req_free(struct sl_usage_req *r)
{
	free(r->body);
	memset(r, 0, sizeof(*r));
}

/* A decoded string's first bytes (a bool's spelling is at most 5 of them). */
struct short_str {
	char b[8];
	size_t n;            /* all its bytes; more than sizeof(b): too long */
};

static int
short_sink(void *arg, const unsigned char *b, size_t n)
{
	struct short_str *s = arg;

	if (s->n + n <= sizeof(s->b))
		memcpy(s->b + s->n, b, n);
	s->n += n;
	return s->n > sizeof(s->b);   /* stop: too long to be a bool */
}

/* ASCII case-insensitive: the decoded s is the lowercase word w. */
static int
word_is(const struct short_str *s, const char *w)
{
	size_t i, n = strlen(w);

	if (s->n != n)
		return 0;
	for (i = 0; i < n; i++) {
		char c = s->b[i];

		if ((c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c) != w[i])
			return 0;
	}
	return 1;
}

/*
 * The value at v (validated) read as a bool the way a Python runner reads
 * one: vLLM and SGLang validate the request with pydantic in lax mode, which
 * takes true/false, the integers 1/0, the floats 1.0/0.0 (any spelling that
 * json.loads rounds to them: 1e0, 0.1e1, 0e5, -0.0) and the strings "1",
 * "0" and, in any ASCII case, "t" "y" "on" "yes" "true" / "f" "n" "no" "off"
 * "false" (after JSON unescaping). null is the field's default, false for
 * both fields read here. 1 true, 0 false, -1 anything else (the runner
 * refuses the request).
 */
static int
lax_bool(const char *p, struct sl_json_span v)
{
	static const char *const yes[] = { "t", "y", "on", "yes", "true" };
	static const char *const no[] = { "f", "n", "no", "off", "false" };
	struct short_str s;
	size_t i, n = v.ve - v.vs;
	char c = p[v.vs], buf[64], *t;
	double d;
	int frac = 0;

	if (sl_json_span_is(p, v, "true"))
		return 1;
	if (sl_json_span_is(p, v, "false") || sl_json_span_is(p, v, "null"))
		return 0;
	if (c == '"') {
		memset(&s, 0, sizeof(s));
		if (sl_json_decode(p, v.vs, v.ve, short_sink, &s) != 0 || s.n > sizeof(s.b))
			return -1;
		if (s.n == 1 && (s.b[0] == '1' || s.b[0] == '0'))
			return s.b[0] == '1';
		for (i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
			if (word_is(&s, yes[i]))
				return 1;
			if (word_is(&s, no[i]))
				return 0;
		}
		return -1;
	}
	if (c != '-' && (c < '0' || c > '9'))
		return -1;           /* an object, an array, NaN, Infinity */
	for (i = v.vs; i < v.ve; i++)
		if (p[i] == '.' || p[i] == 'e' || p[i] == 'E')
			frac = 1;
		else if (p[i] == 'I')
			return -1;       /* -Infinity */
	if (!frac)
		/* Python's int: 0, -0 and 1 (a validated integer has no leading zero) */
		return sl_json_span_is(p, v, "1") ? 1 : sl_json_span_is(p, v, "0") ||
		    sl_json_span_is(p, v, "-0") ? 0 : -1;
	/* Python's float(): correctly rounded, as glibc's strtod is */
	if (n < sizeof(buf))
		t = buf;
	else if ((t = malloc(n + 1)) == NULL)
		return -1;
	memcpy(t, p + v.vs, n);
	t[n] = '\0';
	d = strtod(t, NULL);
	if (t != buf)
		free(t);
	return d == 1.0 ? 1 : d == 0.0 ? 0 : -1;
}

int
sl_usage_json_bool(const char *v, size_t len)
{
	if (len == 0)
		return -1;
	return lax_bool(v, (struct sl_json_span){ 0, len });
}

/* Bytes of the decoded string at v, if it is one. */
static int
count_sink(void *arg, const unsigned char *b, size_t n)
{
	(void)b;
	*(uint64_t *)arg += n;
	return 0;
}

static uint64_t
text_bytes(const char *p, struct sl_json_span v)
{
	uint64_t n = 0;

	if (p[v.vs] == '"')
		(void)sl_json_decode(p, v.vs, v.ve, count_sink, &n);
	return n;
}

/*
 * The prompt of a validated body, estimated: ceil(bytes / 4) of its text
 * (the UTF-8 bytes of messages[].content strings, of the "text" string of
 * each part of a content array, of "prompt" as a string or the strings of
 * a "prompt" array), plus one token per token id ("prompt" as an array of
 * integers, or of arrays of them, as /v1/completions takes it).
 */
static uint64_t
prompt_estimate(const char *p, size_t len, const struct sl_json_member *msgs,
    const struct sl_json_member *prompt)
{
	struct sl_json_span v, t;
	uint64_t bytes = 0, ids = 0;
	size_t i, k, e, cl, nn;
	int more, more2, found;

	if (msgs->found && p[msgs->v.vs] == '[') {
		i = msgs->v.vs;
		for (more = sl_json_first(p, len, &i); more; more = sl_json_after(p, len, &i)) {
			if (p[i] == '{' && sl_json_find(p, len, i, "content", &v, &found, &cl,
			    &nn) == 0 && found) {
				bytes += text_bytes(p, v);
				if (p[v.vs] == '[') {
					k = v.vs;
					for (more2 = sl_json_first(p, len, &k); more2;
					    more2 = sl_json_after(p, len, &k)) {
						if (p[k] == '{' && sl_json_find(p, len, k, "text",
						    &t, &found, &cl, &nn) == 0 && found)
							bytes += text_bytes(p, t);
						if (sl_json_skip(p, len, &k) < 0)
							break;
					}
				}
			}
			if (sl_json_skip(p, len, &i) < 0)
				break;
		}
	}
	if (prompt->found) {
		v = prompt->v;
		bytes += text_bytes(p, v);
		if (p[v.vs] == '[') {
			i = v.vs;
			for (more = sl_json_first(p, len, &i); more; more = sl_json_after(p, len, &i)) {
				e = i;
				if (sl_json_skip(p, len, &e) < 0)
					break;
				if (p[i] == '"')
					bytes += text_bytes(p, (struct sl_json_span){ i, e });
				else if (p[i] == '[') {
					k = i;
					for (more2 = sl_json_first(p, len, &k); more2;
					    more2 = sl_json_after(p, len, &k)) {
						ids++;
						if (sl_json_skip(p, len, &k) < 0)
							break;
					}
				} else
					ids++;
				i = e;
			}
		}
	}
	return sl_usage_estimate(bytes) + ids;
}

/* The facts of a validated body: stream, and stream_options' kind and member. */
struct req_facts {
	int stream;
	int so;              /* 0 absent, 'n' null, '{' object, 'x' another type */
	struct sl_json_span sov;     /* its value */
	int iu;              /* in the object: 0 absent, 't' true, 'f' false|null, 'x' other */
	struct sl_json_span iuv;     /* its value */
	size_t so_close, so_n;
	uint64_t prompt_est;
};

static int
req_facts(const char *p, size_t len, struct req_facts *f, size_t *close, size_t *n)
{
	struct sl_json_member m[4] = { { "stream", { 0, 0 }, 0 },
	    { "stream_options", { 0, 0 }, 0 }, { "messages", { 0, 0 }, 0 },
	    { "prompt", { 0, 0 }, 0 } };
	size_t open;
	int found, b;

	memset(f, 0, sizeof(*f));
	if (sl_json_object(p, len, m, 4, &open, close, n) < 0)
		return -1;
	f->prompt_est = prompt_estimate(p, len, &m[2], &m[3]);
	f->stream = m[0].found && lax_bool(p, m[0].v) == 1;
	if (!m[1].found)
		return 0;
	f->sov = m[1].v;
	f->so = p[f->sov.vs] == '{' ? '{' : sl_json_span_is(p, f->sov, "null") ? 'n' : 'x';
	if (f->so != '{')
		return 0;
	/* validated above, so the walk cannot fail */
	if (sl_json_find(p, len, f->sov.vs, "include_usage", &f->iuv, &found, &f->so_close,
	    &f->so_n) < 0)
		return -1;
	if (found)
		f->iu = (b = lax_bool(p, f->iuv)) == 1 ? 't' : b == 0 ? 'f' : 'x';
	return 0;
}

int
sl_usage_request(const char *body, size_t len, int inject, struct sl_usage_req *out)
{
	static const char so_c[] = ",\"stream_options\":{\"include_usage\":true}";
	static const char iu_c[] = ",\"include_usage\":true";
	struct req_facts f;
	size_t close, n, off, del, il;
	const char *ins;
	char *nb = NULL;

	memset(out, 0, sizeof(*out));
	if (body == NULL || len == 0 || req_facts(body, len, &f, &close, &n) < 0)
		return 0;
	out->counted = 1;
	out->prompt_est = f.prompt_est;
	out->stream = f.stream;
	out->client_asked = f.iu == 't';
	if (!inject || !f.stream || out->client_asked)
		return 0;
	switch (f.so) {
	case 0:
		off = close;
		del = 0;
		ins = n ? so_c : so_c + 1;
		break;
	case 'n':
		off = f.sov.vs;
		del = f.sov.ve - f.sov.vs;
		ins = so_c + 18;    /* {"include_usage":true} */
		break;
	case '{':
		if (f.iu == 0) {
			off = f.so_close;
			del = 0;
			ins = f.so_n ? iu_c : iu_c + 1;
		} else if (f.iu == 'f') {
			off = f.iuv.vs;
			del = f.iuv.ve - f.iuv.vs;
			ins = "true";
		} else
			return 0;   /* include_usage of another type: the runner's call */
		break;
	default:
		return 0;           /* stream_options of another type: likewise */
	}

	il = strlen(ins);
	if ((nb = malloc(len - del + il + 1)) == NULL)
		return -1;
	memcpy(nb, body, off);
	memcpy(nb + off, ins, il);
	memcpy(nb + off + il, body + off + del, len - off - del);
	nb[len - del + il] = '\0';

	/*
	 * No second pass to prove the edit: the body was validated, the edit
	 * lands at a member boundary found on the way, and fuzz_usage checks
	 * the result against jansson for every body it makes.
	 */
	out->injected = 1;
	out->body = nb;
	out->body_len = len - del + il;
	out->edit_off = off;
	out->edit_del = del;
	return 0;
}

/* ---- the other APIs' requests (never edited) ----------------------------- */

/* A string's bytes, or those of the "text" strings of an array's objects. */
static uint64_t
content_text(const char *p, size_t len, struct sl_json_span v)
{
	struct sl_json_span t;
	uint64_t bytes = text_bytes(p, v);
	size_t k, cl, nn;
	int more, found;

	if (p[v.vs] != '[')
		return bytes;
	k = v.vs;
	for (more = sl_json_first(p, len, &k); more; more = sl_json_after(p, len, &k)) {
		if (p[k] == '{' && sl_json_find(p, len, k, "text", &t, &found, &cl,
		    &nn) == 0 && found)
			bytes += text_bytes(p, t);
		if (sl_json_skip(p, len, &k) < 0)
			break;
	}
	return bytes;
}

/*
 * A string's bytes, or an array's: each element a string, or an object
 * whose "content" is read by content_text() (Responses' input items,
 * Messages' messages).
 */
static uint64_t
items_text(const char *p, size_t len, struct sl_json_span v)
{
	struct sl_json_span c;
	uint64_t bytes = text_bytes(p, v);
	size_t i, e, cl, nn;
	int more, found;

	if (p[v.vs] != '[')
		return bytes;
	i = v.vs;
	for (more = sl_json_first(p, len, &i); more; more = sl_json_after(p, len, &i)) {
		e = i;
		if (sl_json_skip(p, len, &e) < 0)
			break;
		if (p[i] == '"')
			bytes += text_bytes(p, (struct sl_json_span){ i, e });
		else if (p[i] == '{' && sl_json_find(p, len, i, "content", &c,
		    &found, &cl, &nn) == 0 && found)
			bytes += content_text(p, len, c);
		i = e;
	}
	return bytes;
}

int
sl_usage_request_api(enum sl_api api, const char *body, size_t len,
    struct sl_usage_req *out)
{
	struct sl_json_member m[3] = { { "stream", { 0, 0 }, 0 },
	    { NULL, { 0, 0 }, 0 }, { NULL, { 0, 0 }, 0 } };
	struct sl_json_member none = { "messages", { 0, 0 }, 0 };
	size_t open, close, n, nm = 3;
	uint64_t bytes = 0;

	if (api == SL_API_CHAT || api == SL_API_COMPLETIONS)
		return sl_usage_request(body, len, 0, out);
	memset(out, 0, sizeof(*out));
	switch (api) {
	case SL_API_RESPONSES:
		m[1].name = "input";
		m[2].name = "instructions";
		break;
	case SL_API_MESSAGES:
		m[1].name = "messages";
		m[2].name = "system";
		break;
	case SL_API_EMBEDDINGS:
		m[1].name = "input";
		nm = 2;
		break;
	default:
		return 0;
	}
	if (body == NULL || len == 0 ||
	    sl_json_object(body, len, m, nm, &open, &close, &n) < 0)
		return 0;
	out->counted = 1;
	if (api == SL_API_EMBEDDINGS) {
		/* "input" as completions' "prompt": text and token ids */
		out->prompt_est = m[1].found ? prompt_estimate(body, len, &none, &m[1]) : 0;
		return 0;
	}
	out->stream = m[0].found && lax_bool(body, m[0].v) == 1;
	if (m[1].found)
		bytes += items_text(body, len, m[1].v);
	if (m[2].found)
		bytes += content_text(body, len, m[2].v);
	out->prompt_est = sl_usage_estimate(bytes);
	return 0;
}

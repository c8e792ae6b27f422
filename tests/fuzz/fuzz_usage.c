/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * libFuzzer target for src/usage*.c.
 *
 * Input: bytes 0-1 seed the read sizes; the rest is both an upstream SSE
 * body (fed to the scanner) and a request body (fed to the editor).
 *
 * Scanner: fed as the relay would (until each read is consumed), in random
 * reads, one byte per read, the whole input in one read and one event per
 * read, with drop off and on, with and without its event template kept
 * across reads (sl_usage_scan_keep; turned on and off between random reads).
 *   - the same output, usage, content bytes and drop as the reference
 *     scanner (tests/ref: the byte-at-a-time scanner the fast one replaced,
 *     plus a look-ahead that lists the "usage" members drop mode
 *     cuts) given the whole input (each read all that is left);
 *   - drop off: the client gets the input exactly, always as one range;
 *   - drop on: the client gets the input, or the input minus whole SSE
 *     events (per an independent splitter below) that hold "usage", and the
 *     same bytes whatever the reads; when "usage":null members are cut,
 *     exactly the reference's output with its listed members cut;
 *   - usage and content bytes do not depend on the reads or on drop;
 *   - the hold buffer never passes SL_USAGE_MAX_EVENT.
 * Editor, against the reference reader tests/ref/json_ref.c (what a Python
 * runner reads: json.loads(bytes), then pydantic's lax bool), and that
 * reader against jansson wherever jansson reads the body:
 *   - counted iff the reference reads an object (both ways);
 *   - stream, client_asked, and the member injected exactly when needed,
 *     as the reference reads "stream" and "include_usage";
 *   - an injected body is the input with exactly one of the documented
 *     edits at edit_off, and the reference reads it as the input plus the
 *     member;
 *   - the prompt estimate is the reference's.
 * The other APIs' scanners (responses, messages: usage_api.c), the same
 * bytes as their stream, in one read, a read an event, random reads and a
 * byte per read:
 *   - every read passes whole as one range, nothing held or dropped;
 *   - usage and content bytes do not depend on the reads;
 *   - the usage is what an independent reader finds (SSE split into
 *     events, each event's data parsed by jansson, sl_usage.h's rules
 *     applied) wherever that reader can say (every event's data parses,
 *     no duplicate keys, no backslash in the input);
 * and their request readers against the reference tree: counted iff an
 * object, never edited, stream as the reference reads it, the prompt
 * estimate the reference's; the JSON answer readers do not crash.
 */
#include "config.h"

#include <jansson.h>

#include "fuzz.h"
#include "sl_usage.h"
#include "json_ref.h"
#include "usage_ref.h"

struct result {
	struct fz_buf out;
	struct sl_usage u;
	uint64_t content;
	int dropped;
};

/* memcmp that accepts NULL for zero bytes (an empty fz_buf has p NULL). */
static int
eq(const void *a, const void *b, size_t n)
{
	return n == 0 || memcmp(a, b, n) == 0;
}

static void
take(struct result *r, const struct sl_usage_out *o, const char *in)
{
	size_t k;

	if (o->held_len > 0)
		fz_add(&r->out, o->held, o->held_len);
	for (k = 0; k < o->n; k++) {
		fz_check(k == 0 || o->range[k].off >= o->range[k - 1].off + o->range[k - 1].len,
		    "ranges", "ranges out of order");
		fz_add(&r->out, in + o->range[k].off, o->range[k].len);
	}
}

/* Read sizes other than random (seed): */
#define READ_BYTE 0             /* one byte per read */
#define READ_ALL 2              /* the whole input in one read */
#define READ_EVENT 4            /* through each LF LF, CR CR or CR LF CR LF */

/* Bytes of the next read at off (READ_EVENT). */
static size_t
event_read(const char *in, size_t len, size_t off)
{
	size_t k;

	for (k = off; k + 1 < len; k++)
		if ((in[k] == '\n' || in[k] == '\r') && in[k + 1] == in[k])
			return k + 2 - off;
	return len - off;
}

/*
 * Scan in, read sizes from seed (odd; or READ_*); keep: the event template
 * is kept across reads (sl_usage_scan_keep), toggled at random reads when
 * keep is 2 (as the relay turns it off and on with the pace of events).
 */
static void
scan(struct result *r, const char *in, size_t len, int drop, uint32_t seed, int keep)
{
	struct sl_usage_scan s;
	struct sl_usage_out o;
	size_t off = 0, want, used, k;
	uint32_t ks = seed ^ 0x9e3779b9u;

	memset(r, 0, sizeof(*r));
	sl_usage_scan_init(&s, drop);
	sl_usage_scan_keep(&s, keep);
	while (off < len) {
		want = 1;
		if (seed == READ_ALL)
			want = len - off;
		else if (seed == READ_EVENT)
			want = event_read(in, len, off);
		else if (seed != READ_BYTE)
			want = (fz_rand(&seed) & 7) == 0 ? 1 + fz_rand(&seed) % 4096 :
			    1 + fz_rand(&seed) % 48;
		if (keep == 2)
			sl_usage_scan_keep(&s, (fz_rand(&ks) & 3) != 0);
		if (want > len - off)
			want = len - off;
		while (want > 0) {
			used = sl_usage_scan_feed(&s, in + off, want, &o);
			fz_check(used > 0 && used <= want, "consumed", "%zu of %zu", used, want);
			for (k = 0; k < o.n; k++)
				fz_check(o.range[k].off + o.range[k].len <= used, "ranges",
				    "range past the consumed bytes");
			if (!drop)
				fz_check(used == want && o.held_len == 0 && o.n == 1 &&
				    o.range[0].off == 0 && o.range[0].len == want,
				    "no-drop-passthrough", "drop off: not one range of everything");
			fz_check(s.hold_len <= SL_USAGE_MAX_EVENT, "hold-bound", "%u held",
			    (unsigned)s.hold_len);
			take(r, &o, in + off);
			off += used;
			want -= used;
		}
	}
	sl_usage_scan_finish(&s, &o);
	take(r, &o, NULL);
	sl_usage_scan_result(&s, &r->u, &r->content);
	r->dropped = sl_usage_scan_dropped(&s);
	sl_usage_scan_free(&s);
}

/*
 * The reference scanner, the whole input in one read (as often as it
 * consumes): what it keeps, less the "usage":null members it lists.
 */
static void
scan_ref(struct result *r, const char *in, size_t len, int drop, size_t *nstrips)
{
	struct ref_scan s;
	struct ref_out o;
	size_t off = 0, used, k, j;
	unsigned char *keep = calloc(len + 1, 1);

	if (keep == NULL)
		abort();
	memset(r, 0, sizeof(*r));
	ref_scan_init(&s, drop);
	while (off < len) {
		used = ref_scan_feed(&s, in + off, len - off, &o);
		fz_check(o.held_len == 0, "ref", "the reference held bytes of the one read");
		for (k = 0; k < o.n; k++)
			memset(keep + off + o.range[k].off, 1, o.range[k].len);
		off += used;
	}
	ref_scan_finish(&s, &o);
	if (o.held_len > 0)
		memset(keep + len - o.held_len, 1, o.held_len);   /* the held tail */
	for (k = 0; k < s.nspans; k++) {
		for (j = 0; j < s.spans[k].len; j++)
			fz_check(keep[s.spans[k].off + j], "ref", "a member to cut was not kept");
		memset(keep + s.spans[k].off, 0, s.spans[k].len);
	}
	for (k = 0; k < len; k++)
		if (keep[k])
			fz_add(&r->out, in + k, 1);
	*nstrips = s.nspans;
	ref_scan_result(&s, &r->u, &r->content);
	r->dropped = ref_scan_dropped(&s);
	ref_scan_free(&s);
	free(keep);
}

/* Everything the client and the accounting see is the reference's. */
static void
check_ref(const struct result *got, const struct result *want, const char *what)
{
	fz_check(got->u.have == want->u.have && got->u.prompt_tokens == want->u.prompt_tokens &&
	    got->u.completion_tokens == want->u.completion_tokens &&
	    got->u.total_tokens == want->u.total_tokens, "ref-usage", "%s: usage differs", what);
	fz_check(got->content == want->content, "ref-content", "%s: %llu content bytes, ref %llu",
	    what, (unsigned long long)got->content, (unsigned long long)want->content);
	fz_check(got->dropped == want->dropped, "ref-dropped", "%s: dropped %d, ref %d", what,
	    got->dropped, want->dropped);
	fz_check(got->out.len == want->out.len && eq(got->out.p, want->out.p, got->out.len),
	    "ref-output", "%s: output differs from the reference (%zu bytes, ref %zu)", what,
	    got->out.len, want->out.len);
}

static int
same_result(const struct result *a, const struct result *b)
{
	return a->u.have == b->u.have && a->u.prompt_tokens == b->u.prompt_tokens &&
	    a->u.completion_tokens == b->u.completion_tokens &&
	    a->u.total_tokens == b->u.total_tokens && a->content == b->content;
}

/*
 * 1 if out is in minus one or more whole events, each holding "usage".
 * Events, per the SSE spec: lines end in CRLF, LF or CR; a blank line ends
 * an event, and the event's bytes run to the end of that blank line's
 * terminator. Greedy: an event that matches the output where it stands is
 * kept (a dropped event equal to a kept one leaves the same output).
 */
static int
minus_usage_events(const char *in, size_t len, const unsigned char *out, size_t olen)
{
	size_t i = 0, start = 0, line = 0, end, o = 0;
	int ndropped = 0;

	if (olen >= len)
		return 0;
	if (out == NULL)
		out = (const unsigned char *)"";
	while (i < len) {
		if (in[i] != '\r' && in[i] != '\n') {
			i++;
			continue;
		}
		end = i + 1;
		if (in[i] == '\r' && end < len && in[end] == '\n')
			end++;
		if (i == line) {
			/* blank line: the event is [start, end) */
			if (olen - o >= end - start && eq(out + o, in + start, end - start))
				o += end - start;
			else if (memmem(in + start, end - start, "\"usage\"", 7) != NULL)
				ndropped++;
			else
				return 0;
			start = end;
		}
		i = line = end;
	}
	/* the unfinished tail is never dropped */
	return ndropped > 0 && olen - o == len - start && eq(out + o, in + start, len - start);
}

/* Both drops read as seed says, with keep, against the reference. */
static void
check_variant(const char *in, size_t len, const struct result *ref_off,
    const struct result *ref_on, uint32_t seed, int keep, const char *what)
{
	struct result r;
	char w[64];

	scan(&r, in, len, 0, seed, keep);
	snprintf(w, sizeof(w), "drop off, %s", what);
	check_ref(&r, ref_off, w);
	fz_free(&r.out);
	scan(&r, in, len, 1, seed, keep);
	snprintf(w, sizeof(w), "drop on, %s", what);
	check_ref(&r, ref_on, w);
	fz_free(&r.out);
}

static void
check_scanner(const char *in, size_t len, uint32_t seed)
{
	struct result off, off1, on, on1, ref_off, ref_on;
	size_t strips_off, strips_on;

	scan_ref(&ref_off, in, len, 0, &strips_off);
	scan_ref(&ref_on, in, len, 1, &strips_on);
	fz_check(strips_off == 0, "ref", "members cut with drop off");
	scan(&off, in, len, 0, seed | 1, 0);
	check_ref(&off, &ref_off, "drop off");
	fz_check(off.out.len == len && eq(off.out.p, in, len), "passthrough",
	    "drop off: the client did not get the input");
	fz_check(off.content <= len, "content-bound", "%llu content bytes of %zu",
	    (unsigned long long)off.content, len);
	fz_check(!off.dropped, "passthrough", "dropped with drop off");

	scan(&on, in, len, 1, (seed * 2654435761u) | 1, 0);
	check_ref(&on, &ref_on, "drop on");
	/* event templates: within one read, and kept across reads */
	check_variant(in, len, &ref_off, &ref_on, READ_ALL, 0, "one read");
	check_variant(in, len, &ref_off, &ref_on, READ_EVENT, 1, "a read an event, kept");
	check_variant(in, len, &ref_off, &ref_on, (seed * 40503u) | 1, 2,
	    "random reads, kept on and off");
	fz_check(same_result(&off, &on), "drop-independent", "usage/content differ with drop");
	/* (with members cut, the reference's output is the whole check) */
	if (on.dropped && strips_on == 0)
		fz_check(minus_usage_events(in, len, on.out.p, on.out.len), "drop-one-event",
		    "drop on: output is not the input minus whole usage events");
	else if (strips_on == 0)
		fz_check(on.out.len == len && eq(on.out.p, in, len), "drop-one-event",
		    "drop on, nothing dropped, yet the output differs");

	if (len <= 4096) {
		scan(&off1, in, len, 0, READ_BYTE, 1);
		scan(&on1, in, len, 1, READ_BYTE, 1);
		check_ref(&off1, &ref_off, "drop off, one byte per read");
		check_ref(&on1, &ref_on, "drop on, one byte per read");
		fz_check(same_result(&off, &off1) && same_result(&off, &on1),
		    "split-independent", "usage/content depend on the reads");
		fz_check(on1.dropped == on.dropped && on1.out.len == on.out.len &&
		    eq(on1.out.p, on.out.p, on.out.len), "split-independent",
		    "drop on: output depends on the reads");
		fz_free(&off1.out);
		fz_free(&on1.out);
	}
	fz_free(&off.out);
	fz_free(&on.out);
	fz_free(&ref_off.out);
	fz_free(&ref_on.out);
}

#define REQ_FLAGS (JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL)

/* UTF-8 bytes of the string value v, if it is one (the estimate's unit). */
static uint64_t
ref_text(const struct rj *v)
{
	return v != NULL && v->t == RJ_STR ? v->len : 0;
}

/* The prompt estimate of sl_usage.h, from the reference tree. */
static uint64_t
ref_prompt_estimate(const struct rj *root)
{
	const struct rj *msgs = rj_get(root, "messages"), *pr = rj_get(root, "prompt"), *c;
	uint64_t bytes = 0, ids = 0;
	size_t i, k;

	if (msgs != NULL && msgs->t == RJ_ARR)
		for (i = 0; i < msgs->n; i++) {
			if ((c = rj_get(msgs->kid[i], "content")) == NULL)
				continue;
			bytes += ref_text(c);
			if (c->t == RJ_ARR)
				for (k = 0; k < c->n; k++)
					bytes += ref_text(rj_get(c->kid[k], "text"));
		}
	if (pr != NULL) {
		bytes += ref_text(pr);
		if (pr->t == RJ_ARR)
			for (i = 0; i < pr->n; i++) {
				if (pr->kid[i]->t == RJ_STR)
					bytes += ref_text(pr->kid[i]);
				else if (pr->kid[i]->t == RJ_ARR)
					ids += pr->kid[i]->n;
				else
					ids++;
			}
	}
	return bytes / 4 + (bytes % 4 != 0) + ids;
}

/*
 * The editor against the reference reader (tests/ref/json_ref.h: what a
 * Python runner reads, decided independently): counted iff it reads an
 * object, both ways; "stream" and "include_usage" read as its pydantic
 * reads a bool; the member injected exactly when needed; the new body the
 * input with one documented edit at edit_off, read by the reference as the
 * input plus the member; the prompt estimated from the same tree. And the
 * reference against jansson where jansson reads the body (the reference is
 * not let off by being wrong the same way as the editor).
 */
static void
check_request(const char *in, size_t len)
{
	static const char *const edits[] = {
		",\"stream_options\":{\"include_usage\":true}",
		"\"stream_options\":{\"include_usage\":true}",
		"{\"include_usage\":true}",
		",\"include_usage\":true",
		"\"include_usage\":true",
		"true",
	};
	struct sl_usage_req r;
	struct rj *ref, *nref, *so_new;
	const struct rj *so, *iu;
	json_t *root;
	json_error_t err;
	int need = 0, ok = 0, obj, stream, asked;
	size_t k, el;
	struct sl_usage u;

	(void)sl_usage_from_json(in, len, &u);
	if (sl_usage_request(in, len, 1, &r) < 0)
		return;   /* out of memory */
	ref = rj_parse(in, len);
	obj = ref != NULL && ref->t == RJ_OBJ;
	fz_check(r.counted == obj, "counted", "counted %d, the reference reads %s", r.counted,
	    ref == NULL ? "nothing" : obj ? "an object" : "a non-object");

	/* jansson's reading is the reference's, where jansson has one */
	root = json_loadb(in, len, REQ_FLAGS, &err);
	if (root != NULL && memchr(in, '\0', len) == NULL)
		fz_check(ref != NULL && json_is_object(root) == obj, "ref-jansson",
		    "jansson reads a%s object, the reference %s", json_is_object(root) ? "n" : " non-",
		    ref == NULL ? "nothing" : obj ? "an object" : "a non-object");
	if (!obj) {
		fz_check(!r.injected, "inject", "injected an uncounted body");
		goto out;
	}

	so = rj_get(ref, "stream_options");
	iu = so != NULL && so->t == RJ_OBJ ? rj_get(so, "include_usage") : NULL;
	stream = rj_bool(rj_get(ref, "stream")) == 1;
	asked = iu != NULL && rj_bool(iu) == 1;
	need = stream && !asked && (so == NULL || so->t == RJ_NULL ||
	    (so->t == RJ_OBJ && (iu == NULL || rj_bool(iu) == 0)));
	fz_check(r.stream == stream && r.client_asked == asked, "facts",
	    "stream %d asked %d, the reference %d %d", r.stream, r.client_asked, stream, asked);
	fz_check(r.injected == need, "inject", "injected %d, needed %d", r.injected, need);
	fz_check(r.prompt_est == ref_prompt_estimate(ref), "prompt-estimate",
	    "prompt estimated %llu, the reference %llu", (unsigned long long)r.prompt_est,
	    (unsigned long long)ref_prompt_estimate(ref));
	if (r.injected) {
		for (k = 0; k < sizeof(edits) / sizeof(edits[0]) && !ok; k++) {
			el = strlen(edits[k]);
			ok = r.edit_off + r.edit_del <= len &&
			    r.body_len == len - r.edit_del + el &&
			    memcmp(r.body, in, r.edit_off) == 0 &&
			    memcmp(r.body + r.edit_off, edits[k], el) == 0 &&
			    memcmp(r.body + r.edit_off + el, in + r.edit_off + r.edit_del,
			    len - r.edit_off - r.edit_del) == 0;
		}
		fz_check(ok, "edit-bytes", "the new body is not the input with one edit");
		nref = rj_parse(r.body, r.body_len);
		fz_check(nref != NULL && nref->t == RJ_OBJ, "edit-parses",
		    "injected body is not an object to the reference");
		/* the input plus the member, as the runner reads both */
		if (so != NULL && so->t == RJ_OBJ)
			fz_check(rj_set((struct rj *)so, "include_usage", rj_new_true()) == 0,
			    "ref", "out of memory");
		else if ((so_new = rj_new_usage_option()) == NULL ||
		    rj_set(ref, "stream_options", so_new) < 0)
			fz_check(0, "ref", "out of memory");
		fz_check(rj_equal(ref, nref) && rj_equal(nref, ref), "edit-equal",
		    "injected body is not the input plus the member");
		rj_free(nref);
	}
out:
	json_decref(root);
	rj_free(ref);
	sl_usage_req_free(&r);
}

/* ---- the other APIs: responses, messages (usage_api.c) ------------------ */

struct api_result {
	struct sl_usage u;
	uint64_t content;
};

/* A stream of api through its scanner in reads from seed (or READ_*). */
static void
scan_api(struct api_result *r, enum sl_api api, const char *in, size_t len,
    uint32_t seed)
{
	struct sl_usage_scan s;
	struct sl_usage_out o;
	size_t off = 0, want, used;

	sl_usage_scan_init_api(&s, api);
	fz_check(s.api == api, "api-init", "api %d, asked %d", s.api, (int)api);
	while (off < len) {
		want = 1;
		if (seed == READ_ALL)
			want = len - off;
		else if (seed == READ_EVENT)
			want = event_read(in, len, off);
		else if (seed != READ_BYTE)
			want = (fz_rand(&seed) & 7) == 0 ? 1 + fz_rand(&seed) % 4096 :
			    1 + fz_rand(&seed) % 48;
		if (want > len - off)
			want = len - off;
		used = sl_usage_scan_feed(&s, in + off, want, &o);
		fz_check(used == want && o.held_len == 0 && o.n == 1 &&
		    o.range[0].off == 0 && o.range[0].len == want, "api-passthrough",
		    "api %d: not one range of everything", (int)api);
		fz_check(s.hold == NULL && s.hold_len == 0, "api-passthrough", "held bytes");
		fz_check(s.cap_len <= SL_USAGE_MAX_EVENT, "hold-bound", "%u copied",
		    (unsigned)s.cap_len);
		fz_check(sl_usage_scan_content(&s) == s.content_bytes, "api-content",
		    "sl_usage_scan_content");
		off += used;
	}
	sl_usage_scan_finish(&s, &o);
	fz_check(o.held_len == 0 && o.n == 0, "api-passthrough", "held at the end");
	sl_usage_scan_result(&s, &r->u, &r->content);
	fz_check(!sl_usage_scan_dropped(&s), "api-passthrough", "dropped");
	sl_usage_scan_free(&s);
}

static int
same_api(const struct api_result *a, const struct api_result *b)
{
	return a->u.have == b->u.have && a->content == b->content &&
	    (!a->u.have || (a->u.prompt_tokens == b->u.prompt_tokens &&
	    a->u.completion_tokens == b->u.completion_tokens &&
	    a->u.total_tokens == b->u.total_tokens));
}

/* A count as sl_usage.h reads it: 1 with *v, 0 absent or null, -1 other. */
static int
ref_count(const json_t *o, const char *name, uint64_t *v)
{
	const json_t *x = json_object_get(o, name);

	*v = 0;
	if (x == NULL || json_is_null(x))
		return 0;
	if (!json_is_integer(x) || json_integer_value(x) < 0)
		return -1;
	*v = (uint64_t)json_integer_value(x);
	if (*v > SL_USAGE_MAX_TOKENS)
		*v = SL_USAGE_MAX_TOKENS + 1;
	return 1;
}

/*
 * The usage of an api stream, read independently: SSE split into events
 * (lines end at CR LF, LF or CR; a blank line ends an event; "data" fields
 * joined by LF), each event's data parsed by jansson, the rules of
 * sl_usage.h applied to the trees. Returns 0 when it cannot say (an event
 * whose data jansson refuses, or with duplicate keys, or a backslash in
 * the input: escaped keys, which the scanner does not decode), else 1
 * with *u.
 */
static int
ref_api_usage(enum sl_api api, const char *in, size_t len, struct sl_usage *u)
{
	struct fz_buf data;
	size_t i = 0, ls, le, k;
	int have_data = 0, ok = 1, hp = 0, hc = 0;
	uint64_t prompt = 0, completion = 0;

	memset(u, 0, sizeof(*u));
	memset(&data, 0, sizeof(data));
	if (memchr(in, '\\', len) != NULL || len > SL_USAGE_MAX_EVENT)
		return 0;
	while (i < len && ok) {
		ls = i;
		while (i < len && in[i] != '\n' && in[i] != '\r')
			i++;
		if (i == len)
			break;          /* an unfinished line: the event never ends */
		le = i;
		i += in[i] == '\r' && i + 1 < len && in[i + 1] == '\n' ? 2 : 1;
		if (le == ls) {
			/* dispatch */
			json_t *root, *o, *us;
			json_error_t err;
			const char *type;
			uint64_t in_t, out_t, cc, cr, t;
			int ri, ro, rt, rcc, rcr;

			if (!have_data)
				continue;
			have_data = 0;
			root = json_loadb(data.p != NULL ? (const char *)data.p : "",
			    data.len > 0 ? data.len - 1 : 0, JSON_REJECT_DUPLICATES, &err);
			data.len = 0;
			if (root == NULL) {
				ok = 0;
				break;
			}
			type = json_string_value(json_object_get(root, "type"));
			if (!json_is_object(root) || type == NULL) {
				json_decref(root);
				continue;
			}
			if (api == SL_API_RESPONSES) {
				if (strcmp(type, "response.completed") == 0 ||
				    strcmp(type, "response.incomplete") == 0 ||
				    strcmp(type, "response.failed") == 0) {
					us = json_object_get(json_object_get(root, "response"), "usage");
					ri = ref_count(us, "input_tokens", &in_t);
					ro = ref_count(us, "output_tokens", &out_t);
					rt = ref_count(us, "total_tokens", &t);
					if (json_is_object(us) && ri == 1 && ro == 1 && rt >= 0) {
						u->have = 1;
						u->prompt_tokens = in_t;
						u->completion_tokens = out_t;
						u->total_tokens = rt == 1 ? t : in_t + out_t;
					}
				}
			} else {
				int start = strcmp(type, "message_start") == 0;
				int delta = strcmp(type, "message_delta") == 0;

				o = start ? json_object_get(json_object_get(root, "message"), "usage") :
				    delta ? json_object_get(root, "usage") : NULL;
				if (json_is_object(o)) {
					ri = ref_count(o, "input_tokens", &in_t);
					ro = ref_count(o, "output_tokens", &out_t);
					rcc = ref_count(o, "cache_creation_input_tokens", &cc);
					rcr = ref_count(o, "cache_read_input_tokens", &cr);
					if (ri == 1 && rcc >= 0 && rcr >= 0) {
						in_t += cc + cr;
						if (in_t > SL_USAGE_MAX_TOKENS)
							in_t = SL_USAGE_MAX_TOKENS + 1;
					} else
						ri = 0;
					if (start && ri == 1) {
						prompt = in_t;
						hp = 1;
					}
					if (delta && ro == 1) {
						completion = out_t;
						hc = 1;
						if (ri == 1 && !hp) {
							prompt = in_t;
							hp = 1;
						}
					}
					if (hp && hc) {
						u->have = 1;
						u->prompt_tokens = prompt;
						u->completion_tokens = completion;
						u->total_tokens = prompt + completion;
					}
				}
			}
			json_decref(root);
			continue;
		}
		/* a field: data only (no colon: the whole line is the name) */
		for (k = ls; k < le && in[k] != ':'; k++)
			;
		if (k - ls != 4 || memcmp(in + ls, "data", 4) != 0)
			continue;
		have_data = 1;
		if (k < le) {
			k++;
			if (k < le && in[k] == ' ')
				k++;
			fz_add(&data, in + k, le - k);
		}
		fz_add(&data, "\n", 1);
	}
	fz_free(&data);
	return ok;
}

static void
check_api_scanner(const char *in, size_t len, uint32_t seed)
{
	static const enum sl_api apis[2] = { SL_API_RESPONSES, SL_API_MESSAGES };
	struct api_result all, one, ev, rnd;
	struct sl_usage ru;
	int a;

	for (a = 0; a < 2; a++) {
		scan_api(&all, apis[a], in, len, READ_ALL);
		scan_api(&ev, apis[a], in, len, READ_EVENT);
		scan_api(&rnd, apis[a], in, len, (seed * 2246822519u) | 1);
		fz_check(same_api(&all, &ev) && same_api(&all, &rnd), "api-split-independent",
		    "api %d: usage/content depend on the reads", (int)apis[a]);
		if (len <= 4096) {
			scan_api(&one, apis[a], in, len, READ_BYTE);
			fz_check(same_api(&all, &one), "api-split-independent",
			    "api %d: one byte per read differs", (int)apis[a]);
		}
		fz_check(all.content <= len, "content-bound", "%llu content bytes of %zu",
		    (unsigned long long)all.content, len);
		fz_check(!all.u.have || all.u.total_tokens == all.u.prompt_tokens +
		    all.u.completion_tokens || apis[a] == SL_API_RESPONSES, "api-total",
		    "messages' total is not the sum");
		if (ref_api_usage(apis[a], in, len, &ru))
			fz_check(ru.have == all.u.have && (!ru.have ||
			    (ru.prompt_tokens == all.u.prompt_tokens &&
			    ru.completion_tokens == all.u.completion_tokens &&
			    ru.total_tokens == all.u.total_tokens)), "api-usage-ref",
			    "api %d: have %d %llu/%llu/%llu, the reference %d %llu/%llu/%llu",
			    (int)apis[a], all.u.have, (unsigned long long)all.u.prompt_tokens,
			    (unsigned long long)all.u.completion_tokens,
			    (unsigned long long)all.u.total_tokens, ru.have,
			    (unsigned long long)ru.prompt_tokens,
			    (unsigned long long)ru.completion_tokens,
			    (unsigned long long)ru.total_tokens);
	}
}

/* A string's bytes, or those of the "text" strings of an array's objects. */
static uint64_t
ref_content_text(const struct rj *v)
{
	uint64_t n = ref_text(v);
	size_t k;

	if (v != NULL && v->t == RJ_ARR)
		for (k = 0; k < v->n; k++)
			if (v->kid[k]->t == RJ_OBJ)
				n += ref_text(rj_get(v->kid[k], "text"));
	return n;
}

/* A string's bytes, or an array's: strings, objects' "content". */
static uint64_t
ref_items_text(const struct rj *v)
{
	uint64_t n = ref_text(v);
	size_t k;

	if (v != NULL && v->t == RJ_ARR)
		for (k = 0; k < v->n; k++) {
			if (v->kid[k]->t == RJ_STR)
				n += ref_text(v->kid[k]);
			else if (v->kid[k]->t == RJ_OBJ)
				n += ref_content_text(rj_get(v->kid[k], "content"));
		}
	return n;
}

/* The request readers of the other APIs against the reference tree. */
static void
check_request_api(const char *in, size_t len)
{
	static const enum sl_api apis[3] = { SL_API_RESPONSES, SL_API_MESSAGES,
	    SL_API_EMBEDDINGS };
	struct sl_usage_req r, chat;
	struct rj *ref;
	uint64_t want, bytes, ids;
	const struct rj *pr;
	size_t i;
	int a, obj;

	ref = rj_parse(in, len);
	obj = ref != NULL && ref->t == RJ_OBJ;
	for (a = 0; a < 3; a++) {
		fz_check(sl_usage_request_api(apis[a], in, len, &r) == 0, "api-req",
		    "returned -1");
		fz_check(r.counted == obj, "counted", "api %d: counted %d, the reference %d",
		    (int)apis[a], r.counted, obj);
		fz_check(!r.injected && r.body == NULL, "inject", "api %d: edited",
		    (int)apis[a]);
		if (!obj) {
			sl_usage_req_free(&r);
			continue;
		}
		fz_check(r.stream == (apis[a] != SL_API_EMBEDDINGS &&
		    rj_bool(rj_get(ref, "stream")) == 1), "facts", "api %d: stream %d",
		    (int)apis[a], r.stream);
		bytes = ids = 0;
		if (apis[a] == SL_API_RESPONSES)
			bytes = ref_items_text(rj_get(ref, "input")) +
			    ref_content_text(rj_get(ref, "instructions"));
		else if (apis[a] == SL_API_MESSAGES)
			bytes = ref_items_text(rj_get(ref, "messages")) +
			    ref_content_text(rj_get(ref, "system"));
		else if ((pr = rj_get(ref, "input")) != NULL) {
			bytes = ref_text(pr);
			if (pr->t == RJ_ARR)
				for (i = 0; i < pr->n; i++) {
					if (pr->kid[i]->t == RJ_STR)
						bytes += ref_text(pr->kid[i]);
					else if (pr->kid[i]->t == RJ_ARR)
						ids += pr->kid[i]->n;
					else
						ids++;
				}
		}
		want = bytes / 4 + (bytes % 4 != 0) + ids;
		fz_check(r.prompt_est == want, "prompt-estimate",
		    "api %d: prompt estimated %llu, the reference %llu", (int)apis[a],
		    (unsigned long long)r.prompt_est, (unsigned long long)want);
		sl_usage_req_free(&r);
	}
	/* chat through the same entry: sl_usage_request without injection */
	fz_check(sl_usage_request_api(SL_API_CHAT, in, len, &chat) == 0 && !chat.injected &&
	    chat.counted == obj, "api-req", "chat through sl_usage_request_api");
	sl_usage_req_free(&chat);
	rj_free(ref);
	/* the JSON answers: no crash, and usage read implies believable shape */
	for (a = 0; a < 3; a++) {
		struct sl_usage u;

		if (sl_usage_from_json_api(apis[a], in, len, &u) == 0)
			fz_check(u.have && u.prompt_tokens <= SL_USAGE_MAX_TOKENS + 1 &&
			    u.completion_tokens <= SL_USAGE_MAX_TOKENS + 1, "api-json",
			    "api %d: usage out of range", (int)apis[a]);
		else
			fz_check(!u.have, "api-json", "have without usage");
		(void)sl_usage_json_content_api(apis[a], in, len);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *in;
	size_t len;
	uint32_t seed;

	if (size < 2)
		return 0;
	seed = ((uint32_t)data[0] << 8 | data[1]) + 1;
	in = (const char *)data + 2;
	len = size - 2;
	check_scanner(in, len, seed);
	check_request(in, len);
	check_api_scanner(in, len, seed);
	check_request_api(in, len);
	return 0;
}

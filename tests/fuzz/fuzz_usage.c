/*
 * libFuzzer target for src/usage.c.
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
 * Editor: an injected body is the input with exactly one of the documented
 * edits at edit_off, parses, and equals the input plus the member; a body
 * that needs the member always gets it (the offset scanner never loses
 * track where jansson did not).
 */
#include "config.h"

#include <jansson.h>

#include "fuzz.h"
#include "sl_usage.h"
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

/*
 * 1 if in has something json.loads takes and jansson refuses: a leading BOM,
 * NaN or Infinity, a surrogate escape, or a number that may overflow a
 * double (an exponent or 300 digits in a row). A loose test, but a body the
 * editor counts while jansson refuses must pass it. (The other way round:
 * jansson skips a raw NUL byte between tokens, json.loads and the editor
 * refuse it.)
 */
static int
python_extension(const char *in, size_t len)
{
	size_t k, run = 0;

	if (len >= 3 && memcmp(in, "\xef\xbb\xbf", 3) == 0)
		return 1;
	for (k = 0; k < len; k++) {
		if (in[k] >= '0' && in[k] <= '9') {
			if (++run >= 300)
				return 1;
			continue;
		}
		run = 0;
		if ((in[k] == 'e' || in[k] == 'E') && k > 0 && in[k - 1] >= '0' &&
		    in[k - 1] <= '9')
			return 1;
		if (len - k >= 3 && (memcmp(in + k, "NaN", 3) == 0 ||
		    (len - k >= 8 && memcmp(in + k, "Infinity", 8) == 0)))
			return 1;
		if (in[k] == '\\' && len - k >= 4 && in[k + 1] == 'u' &&
		    (in[k + 2] == 'd' || in[k + 2] == 'D'))
			return 1;
	}
	return 0;
}

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
	json_t *root, *so, *iu, *nroot;
	json_error_t err;
	int need = 0, ok = 0;
	size_t k, el;
	struct sl_usage u;

	(void)sl_usage_from_json(in, len, &u);
	if (sl_usage_request(in, len, 1, &r) < 0)
		return;   /* out of memory */
	root = json_loadb(in, len, REQ_FLAGS, &err);
	/*
	 * Every object jansson takes is counted. The editor also takes what a
	 * Python runner does and jansson does not (a BOM, NaN, Infinity, huge
	 * numbers, lone surrogates): for those only the edit's shape is checked.
	 */
	if (root != NULL && json_is_object(root) && memchr(in, '\0', len) == NULL)
		fz_check(r.counted, "counted", "jansson parses an object, not counted");
	else if (root != NULL)
		fz_check(!r.counted, "counted", "counted a %s", "non-object");
	if (r.counted && root == NULL) {
		fz_check(python_extension(in, len), "counted",
		    "counted a body jansson refuses with none of the Python extensions");
		if (r.injected)
			fz_check(r.edit_off + r.edit_del <= len && r.body_len > len - r.edit_del &&
			    memcmp(r.body, in, r.edit_off) == 0, "edit-bytes",
			    "the new body does not start as the input");
		sl_usage_req_free(&r);
		return;
	}
	if (r.counted) {
		so = json_object_get(root, "stream_options");
		iu = json_is_object(so) ? json_object_get(so, "include_usage") : NULL;
		need = json_is_true(json_object_get(root, "stream")) && !json_is_true(iu) &&
		    (so == NULL || json_is_null(so) ||
		    (json_is_object(so) && (iu == NULL || json_is_false(iu) || json_is_null(iu))));
	}
	fz_check(r.injected == need, "inject", "injected %d, needed %d", r.injected, need);
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
		nroot = json_loadb(r.body, r.body_len, REQ_FLAGS, &err);
		fz_check(nroot != NULL, "edit-parses", "injected body does not parse");
		so = json_object_get(root, "stream_options");
		if (json_is_object(so))
			json_object_set_new(so, "include_usage", json_true());
		else
			json_object_set_new(root, "stream_options",
			    json_pack("{s:b}", "include_usage", 1));
		fz_check(json_equal(root, nroot), "edit-equal",
		    "injected body is not the input plus the member");
		json_decref(nroot);
	}
	json_decref(root);
	sl_usage_req_free(&r);
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
	return 0;
}

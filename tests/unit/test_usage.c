/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for src/usage*.c: the request editor (exact bytes out), the
 * non-streamed usage reader, and the SSE scanner fed at every split point
 * and one byte at a time, with the usage event dropped and kept.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "sl_http.h"
#include "sl_json.h"
#include "sl_meter.h"
#include "sl_shm.h"
#include "sl_usage.h"

/* ------------------------------------------------------------------ helpers */

/* What the client received, and what the scanner concluded. */
struct run {
	char *out;
	size_t len, cap;
	struct sl_usage u;
	uint64_t content;
	int dropped;
	size_t max_hold;        /* largest hold_len seen between calls */
};

static void
add(struct run *r, const char *p, size_t n)
{
	if (r->len + n + 1 > r->cap) {
		r->cap = (r->len + n + 1) * 2;
		r->out = realloc(r->out, r->cap);
		assert_non_null(r->out);
	}
	memcpy(r->out + r->len, p, n);
	r->len += n;
	r->out[r->len] = '\0';
}

static void
take(struct run *r, const struct sl_usage_out *o, const char *in)
{
	size_t k;

	if (o->held_len > 0)
		add(r, o->held, o->held_len);
	for (k = 0; k < o->n; k++)
		add(r, in + o->range[k].off, o->range[k].len);
}

/* Feed one piece the way the relay would: until the scanner has taken it all. */
static void
feed(struct sl_usage_scan *s, struct run *r, const char *p, size_t n, int drop)
{
	struct sl_usage_out o;
	size_t used;

	while (n > 0) {
		used = sl_usage_scan_feed(s, p, n, &o);
		assert_true(used > 0 && used <= n);
		if (!drop) {
			/* nothing is ever held: one range, everything taken */
			assert_int_equal(used, n);
			assert_int_equal(o.held_len, 0);
			assert_int_equal(o.n, 1);
			assert_int_equal(o.range[0].off, 0);
			assert_int_equal(o.range[0].len, n);
		}
		take(r, &o, p);
		if (s->hold_len > r->max_hold)
			r->max_hold = s->hold_len;
		p += used;
		n -= used;
	}
}

static void
finish(struct sl_usage_scan *s, struct run *r)
{
	struct sl_usage_out o;

	sl_usage_scan_finish(s, &o);
	take(r, &o, NULL);
	sl_usage_scan_result(s, &r->u, &r->content);
	r->dropped = sl_usage_scan_dropped(s);
	sl_usage_scan_free(s);
}

/* in in two reads split at k (k == len: one read). */
static void
run_split(struct run *r, const char *in, size_t len, size_t k, int drop)
{
	struct sl_usage_scan s;

	memset(r, 0, sizeof(*r));
	add(r, "", 0);
	sl_usage_scan_init(&s, drop);
	feed(&s, r, in, k, drop);
	feed(&s, r, in + k, len - k, drop);
	finish(&s, r);
}

/* in one byte per read. */
static void
run_bytes(struct run *r, const char *in, size_t len, int drop)
{
	struct sl_usage_scan s;
	size_t i;

	memset(r, 0, sizeof(*r));
	add(r, "", 0);
	sl_usage_scan_init(&s, drop);
	for (i = 0; i < len; i++)
		feed(&s, r, in + i, 1, drop);
	finish(&s, r);
}

/* in without the bytes of cut (a substring of in, found once). */
static char *
without(const char *in, const char *cut)
{
	const char *at = strstr(in, cut);
	char *o;

	assert_non_null(at);
	assert_null(strstr(at + 1, cut));
	o = malloc(strlen(in) + 1);
	assert_non_null(o);
	memcpy(o, in, (size_t)(at - in));
	strcpy(o + (at - in), at + strlen(cut));
	return o;
}

/* in without every occurrence of cut (malloc'd). */
static char *
without_all(const char *in, const char *cut)
{
	size_t cl = strlen(cut), n = 0;
	const char *p = in, *at;
	char *o = malloc(strlen(in) + 1);

	assert_non_null(o);
	while ((at = strstr(p, cut)) != NULL) {
		memcpy(o + n, p, (size_t)(at - p));
		n += (size_t)(at - p);
		p = at + cl;
	}
	strcpy(o + n, p);
	return o;
}

/* The member runners add to every chunk once asked (vLLM, OpenAI). */
#define NULL_MEMBER ",\"usage\":null"

/* w without its NULL_MEMBERs, in place: what a client that did not ask gets. */
static void
cut_nulls(char *w)
{
	char *c = without_all(w, NULL_MEMBER);

	strcpy(w, c);
	free(c);
}

/*
 * Every split point and one byte at a time: the client gets exactly want,
 * the usage event was dropped or not, the scanner reports usage (p, c, t)
 * or none (p < 0) and content bytes.
 */
static void
check_stream(const char *in, int drop, const char *want, int dropped, long p, long c,
    long t, uint64_t content)
{
	size_t len = strlen(in), k;
	struct run r;

	for (k = 0; k <= len + 1; k++) {
		if (k <= len)
			run_split(&r, in, len, k, drop);
		else
			run_bytes(&r, in, len, drop);
		if (r.len != strlen(want) || memcmp(r.out, want, r.len) != 0)
			fail_msg("split %zu (drop %d): got\n%s\nwant\n%s", k, drop, r.out, want);
		assert_int_equal(r.u.have, p >= 0);
		if (p >= 0) {
			assert_int_equal(r.u.prompt_tokens, p);
			assert_int_equal(r.u.completion_tokens, c);
			assert_int_equal(r.u.total_tokens, t);
		}
		assert_int_equal(r.content, content);
		assert_int_equal(r.dropped, dropped);
		free(r.out);
	}
}

/* ------------------------------------------------------------------ streams */

#define CHUNK(content) \
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":" \
	"[{\"index\":0,\"delta\":{\"content\":\"" content "\"},\"finish_reason\":null}]," \
	"\"usage\":null}\n\n"
#define USAGE_EV \
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[]," \
	"\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7,\"total_tokens\":19}}\n\n"
#define DONE "data: [DONE]\n\n"

static const char stream_lf[] =
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"," \
	"\"content\":\"\"}}],\"usage\":null}\n\n"
	CHUNK("Hello") CHUNK(", world") USAGE_EV DONE;

static void
test_scan_usage_found_at_every_split_kept_byte_identical(void **state)
{
	(void)state;
	check_stream(stream_lf, 0, stream_lf, 0, 12, 7, 19, 12);
}

static void
test_scan_drop_removes_exactly_the_usage_event_at_every_split(void **state)
{
	char *ev = without(stream_lf, USAGE_EV), *want = without_all(ev, NULL_MEMBER);

	(void)state;
	/* and the "usage":null members the runner added once asked */
	check_stream(stream_lf, 1, want, 1, 12, 7, 19, 12);
	free(ev);
	free(want);
}

/* The same stream with CRLF line ends, and with bare CR (both SSE). */
static char *
relined(const char *in, const char *eol)
{
	size_t n = 0, el = strlen(eol);
	char *o = malloc(strlen(in) * el + 1);
	const char *p;

	assert_non_null(o);
	for (p = in; *p; p++) {
		if (*p == '\n') {
			memcpy(o + n, eol, el);
			n += el;
		} else
			o[n++] = *p;
	}
	o[n] = '\0';
	return o;
}

static void
test_scan_crlf_and_cr_line_ends(void **state)
{
	const char *eols[] = { "\r\n", "\r" };
	char *in, *ev, *want;
	size_t i;

	(void)state;
	for (i = 0; i < 2; i++) {
		in = relined(stream_lf, eols[i]);
		ev = relined(USAGE_EV, eols[i]);
		want = without(in, ev);
		cut_nulls(want);
		check_stream(in, 0, in, 0, 12, 7, 19, 12);
		check_stream(in, 1, want, 1, 12, 7, 19, 12);
		free(in);
		free(ev);
		free(want);
	}
}

static void
test_scan_usage_null_events_ignored_estimate_from_content(void **state)
{
	static const char in[] = CHUNK("abcd") CHUNK("efghi") DONE;
	char *cut = without_all(in, NULL_MEMBER);
	struct run r;

	(void)state;
	check_stream(in, 0, in, 0, -1, 0, 0, 9);
	check_stream(in, 1, cut, 0, -1, 0, 0, 9);
	free(cut);
	run_split(&r, in, strlen(in), 3, 1);
	assert_int_equal(sl_usage_estimate(r.content), 3);   /* ceil(9 / 4) */
	free(r.out);
	assert_int_equal(sl_usage_estimate(0), 0);
	assert_int_equal(sl_usage_estimate(8), 2);
}

static void
test_scan_malformed_usage_event_gives_no_usage(void **state)
{
	static const char *bad[] = {
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,,\"completion_tokens\":7}}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":\"12\",\"completion_tokens\":7}}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":-1,\"completion_tokens\":7}}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12}}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7}}}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7}} x\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1e3,\"completion_tokens\":7}}\n\n",
	};
	char in[512], *want;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(in, sizeof(in), "%s%s%s", CHUNK("ab"), bad[i], DONE);
		check_stream(in, 0, in, 0, -1, 0, 0, 2);
	}
	/* well-formed, but the stream is cut inside it: no usage, held bytes released */
	snprintf(in, sizeof(in), "%s%s", CHUNK("ab"),
	    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7}}\n");
	check_stream(in, 0, in, 0, -1, 0, 0, 2);
	want = without_all(in, NULL_MEMBER);
	check_stream(in, 1, want, 0, -1, 0, 0, 2);
	free(want);
}

static void
test_scan_data_without_space_comments_and_other_fields(void **state)
{
	static const char in[] =
		": keep-alive\n\n"
		"data:{\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n"
		": a comment inside an event\n\n"
		"id: 7\nevent: message\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
		"data:{\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n"
		"id: 8\n\n"
		DONE;
	char *want = without(in, "data:{\"choices\":[],\"usage\":{\"prompt_tokens\":3,"
	    "\"completion_tokens\":2}}\nid: 8\n\n");

	(void)state;
	check_stream(in, 0, in, 0, 3, 2, 5, 3);
	check_stream(in, 1, want, 1, 3, 2, 5, 3);
	free(want);
}

static void
test_scan_escapes_count_one_byte_and_quotes_do_not_confuse(void **state)
{
	/*
	 * Decoded: a " b \u00e9 \\ \n = 6 (an escape is one); "usage":{"prompt_tokens":1}
	 * inside a string is 27 bytes of text, not a key; "h\xc3\xa9" is 3 bytes.
	 */
	static const char in[] =
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\\\"b\\u00e9\\\\\\n\"}}]}\n\n"
		"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":1}\"}}]}\n\n"
		"data: {\"choices\":[{\"delta\":{\"content\":\"h\xc3\xa9\"}}]}\n\n"
		DONE;

	(void)state;
	check_stream(in, 1, in, 0, -1, 0, 0, 6 + 27 + 3);
}

/*
 * The fast path takes a data line 64 bytes at a time: every token of an
 * event at every offset from a block's start (a pad string of 0..130
 * bytes moves them), with backslash runs, a \u escape and "usage":null
 * members, in every split and a byte at a time, drop on and off.
 */
static void
test_scan_tokens_at_every_block_offset(void **state)
{
	static const char head[] = "data: {\"id\":\"";
	static const char tail[] =
		"\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
		"\"a\\\"b\\\\\\\\c\\\\\\\"\\u00e9d\\\\\"}}],\"usage\":null}\n\n"
		"data: {\"usage\":null, \"choices\":[{\"text\":\"xy\"}] ,\"x\":[1,{\"y\":\"}\"}]}\n\n"
		USAGE_EV DONE;
	char in[512], want[512];
	size_t pad;

	(void)state;
	for (pad = 0; pad <= 130; pad++) {
		char *ev, *w;

		snprintf(in, sizeof(in), "%s%.*s%s", head, (int)pad,
		    "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp"
		    "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp"
		    "pppppppppppppppppppp", tail);
		/* a \" b \\ \\ c \\ \" \u00e9 d \\: 11 (an escape is one), xy: 2 */
		check_stream(in, 0, in, 0, 12, 7, 19, 13);
		ev = without(in, USAGE_EV);
		w = without_all(ev, NULL_MEMBER);
		snprintf(want, sizeof(want), "%s", w);
		free(w);
		w = without(want, "\"usage\":null,");
		check_stream(in, 1, w, 1, 12, 7, 19, 13);
		free(ev);
		free(w);
	}
}

/*
 * The usage object is read without jansson when it is simple: every shape
 * gives what jansson and usage_from_obj() give (sl_usage_from_json() is
 * that reading, of {"usage": X}).
 */
static void
test_scan_usage_object_read_as_jansson_reads_it(void **state)
{
	static const char *const objs[] = {
		"{\"prompt_tokens\":27,\"total_tokens\":411,\"completion_tokens\":384}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2}",
		" { \"prompt_tokens\" : 1 ,\t\"completion_tokens\":2 , \"total_tokens\":9 } ",
		"{\"prompt_tokens\":5,\"completion_tokens\":6,\"total_tokens\":11,"
		"\"prompt_tokens_details\":{\"cached_tokens\":0,\"audio_tokens\":null},"
		"\"completion_tokens_details\":{\"reasoning_tokens\":0,\"x\":true,\"y\":false}}",
		"{\"prompt_tokens\":5,\"completion_tokens\":6,\"prompt_tokens_details\":null}",
		"{\"prompt_tokens\":5,\"completion_tokens\":6,\"d\":{}}",
		"{\"prompt_tokens\":{},\"completion_tokens\":6}",
		"{\"prompt_tokens\":{\"a\":1},\"completion_tokens\":6,\"prompt_tokens\":3}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"prompt_tokens\":7}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"prompt_tokens\":null}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":null}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":true}",
		"{\"prompt_tokens\":1}",
		"{}",
		"{\"prompt_tokens\":0,\"completion_tokens\":0,\"total_tokens\":0}",
		"{\"prompt_tokens\":01,\"completion_tokens\":2}",
		"{\"prompt_tokens\":-0,\"completion_tokens\":2}",
		"{\"prompt_tokens\":-1,\"completion_tokens\":2}",
		"{\"prompt_tokens\":1.0,\"completion_tokens\":2}",
		"{\"prompt_tokens\":1e3,\"completion_tokens\":2}",
		"{\"prompt_tokens\":123456789012345678,\"completion_tokens\":2}",
		"{\"prompt_tokens\":1234567890123456789,\"completion_tokens\":2}",
		"{\"prompt_tokens\":9223372036854775807,\"completion_tokens\":2}",
		"{\"prompt_tokens\":9223372036854775808,\"completion_tokens\":2}",
		"{\"prompt_tokens\":99999999999999999999,\"completion_tokens\":2}",
		"{\"prompt\\u005ftokens\":1,\"completion_tokens\":2}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"n\\u00e9\":1}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"n\xc3\xa9\":1}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"n\xff\":1}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"s\":\"x\"}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"a\":[1]}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"a\":{\"b\":{\"c\":1}}}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,}",
		"{\"prompt_tokens\":1,,\"completion_tokens\":2}",
		"{\"prompt_tokens\":1 \"completion_tokens\":2}",
		"{\"prompt_tokens\":nul,\"completion_tokens\":2}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2a}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"d\":{\"x\":1,}}",
		"{\"prompt_tokens\":1,\"completion_tokens\":2,\"d\":{\"x\":1}",
	};
	char in[512], body[256];
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(objs) / sizeof(objs[0]); i++) {
		struct sl_usage want;
		struct run r;

		snprintf(body, sizeof(body), "{\"usage\":%s}", objs[i]);
		(void)sl_usage_from_json(body, strlen(body), &want);
		snprintf(in, sizeof(in), "data: {\"choices\":[],\"usage\":%s}\n\n" DONE, objs[i]);
		run_split(&r, in, strlen(in), strlen(in), 0);
		if (r.u.have != want.have || r.u.prompt_tokens != want.prompt_tokens ||
		    r.u.completion_tokens != want.completion_tokens ||
		    r.u.total_tokens != want.total_tokens)
			fail_msg("%s: have %d %llu/%llu/%llu, jansson %d %llu/%llu/%llu", objs[i],
			    r.u.have, (unsigned long long)r.u.prompt_tokens,
			    (unsigned long long)r.u.completion_tokens,
			    (unsigned long long)r.u.total_tokens, want.have,
			    (unsigned long long)want.prompt_tokens,
			    (unsigned long long)want.completion_tokens,
			    (unsigned long long)want.total_tokens);
		free(r.out);
	}
}

static void
test_scan_completions_text_counted(void **state)
{
	static const char in[] =
		"data: {\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"four\","
		"\"index\":0,\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n"
		"data: {\"choices\":[{\"text\":\" more\",\"index\":0}]}\n\n"
		USAGE_EV DONE;
	char *ev = without(in, USAGE_EV), *want = without_all(ev, NULL_MEMBER);

	(void)state;
	check_stream(in, 1, want, 1, 12, 7, 19, 9);
	free(ev);
	free(want);
}

/*
 * llama.cpp (older): usage rides on the last content chunk: counted, the
 * event never dropped; in drop mode its usage member is cut when the
 * choices come first (as a "usage":null member is), kept when they follow.
 */
static void
test_scan_usage_with_nonempty_choices_counted_not_dropped(void **state)
{
	static const char in[] =
		CHUNK("ab")
		"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],"
		"\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1,\"total_tokens\":5}}\n\n"
		DONE;
	static const char after[] =
		"data: {\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1},"
		"\"choices\":[{\"delta\":{\"content\":\"z\"}}]}\n\n";

	char *want = without_all(in, NULL_MEMBER), *cut;

	(void)state;
	cut = without(want, ",\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1,"
	    "\"total_tokens\":5}");
	check_stream(in, 1, cut, 0, 4, 1, 5, 2);
	check_stream(in, 0, in, 0, 4, 1, 5, 2);
	free(want);
	free(cut);
	/* choices after usage: still known before the event ends */
	check_stream(after, 1, after, 0, 4, 1, 5, 1);
}

static void
test_scan_usage_split_over_two_data_lines(void **state)
{
	static const char ev[] =
		"data: {\"choices\":[],\n"
		"data: \"usage\":{\"prompt_tokens\":1,\n"
		"data: \"completion_tokens\":2,\"total_tokens\":3}}\n\n";
	char in[512], *want;

	(void)state;
	snprintf(in, sizeof(in), "%s%s%s", CHUNK("abc"), ev, DONE);
	want = without(in, ev);
	cut_nulls(want);
	check_stream(in, 0, in, 0, 1, 2, 3, 3);
	check_stream(in, 1, want, 1, 1, 2, 3, 3);
	free(want);
}

/* A runner that sends two usage events: neither reaches the client; the last counts. */
static void
test_scan_every_usage_event_is_dropped_last_usage_counts(void **state)
{
	static const char second[] =
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":9,"
		"\"total_tokens\":29}}\n\n";
	char in[1024], *want, *crlf, *crlf_want;

	(void)state;
	snprintf(in, sizeof(in), "%s%s%s%s%s", CHUNK("ab"), USAGE_EV, second, second, DONE);
	want = without_all(in, second);
	cut_nulls(want);
	{
		char *w = without(want, USAGE_EV);

		free(want);
		want = w;
	}
	assert_string_equal(want, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\","
	    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ab\"},\"finish_reason\":null}]}"
	    "\n\n" DONE);
	check_stream(in, 1, want, 1, 20, 9, 29, 2);
	/* back to back, CRLF: each usage event's LF goes with it */
	crlf = relined(in, "\r\n");
	crlf_want = relined(want, "\r\n");
	check_stream(crlf, 1, crlf_want, 1, 20, 9, 29, 2);
	check_stream(in, 0, in, 0, 20, 9, 29, 2);
	/* more drops than one call's ranges hold: the call ends early, none is missed */
	{
		char many[8192];
		size_t n, k;

		n = (size_t)snprintf(many, sizeof(many), "%s", CHUNK("ab"));
		for (k = 0; k < 24; k++)
			n += (size_t)snprintf(many + n, sizeof(many) - n, "%s%s",
			    k % 2 ? ": ping\n\n" : "", second);
		snprintf(many + n, sizeof(many) - n, "%s", DONE);
		free(want);
		want = without_all(many, second);
		cut_nulls(want);
		check_stream(many, 1, want, 1, 20, 9, 29, 2);
	}
	free(want);
	free(crlf);
	free(crlf_want);
}

/*
 * vLLM's continuous_usage_stats once include_usage is injected: a usage
 * object in every content chunk. In drop mode each is cut (from the comma
 * to its closing brace, blanks allowed, any nesting, strings with braces),
 * the usage chunk dropped whole, and the last usage counts; one that spans
 * two data lines or is the first member stays.
 */
static void
test_scan_drop_cuts_continuous_usage_objects(void **state)
{
	static const char in[] =
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0\"}}],"
		"\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"total_tokens\":6}}\n\n"
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t1\"}}] , \"usage\" : "
		"{\"prompt_tokens\":5,\"completion_tokens\":2,\"x\":{\"s\":\"}]\\\"{\"},"
		"\"total_tokens\":7} ,\"id\":\"a\"}\n\n"
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t2\"}}],\"usage\":\n"
		"data: {\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n"
		"data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3},"
		"\"choices\":[{\"delta\":{\"content\":\"t3\"}}]}\n\n"
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":4,"
		"\"total_tokens\":9}}\n\n"
		DONE;
	static const char want[] =
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0\"}}]}\n\n"
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t1\"}}]  ,\"id\":\"a\"}\n\n"
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t2\"}}],\"usage\":\n"
		"data: {\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n"
		"data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3},"
		"\"choices\":[{\"delta\":{\"content\":\"t3\"}}]}\n\n"
		DONE;
	char *crlf, *crlf_want;

	(void)state;
	check_stream(in, 1, want, 1, 5, 4, 9, 8);
	check_stream(in, 0, in, 0, 5, 4, 9, 8);
	crlf = relined(in, "\r\n");
	crlf_want = relined(want, "\r\n");
	check_stream(crlf, 1, crlf_want, 1, 5, 4, 9, 8);
	free(crlf);
	free(crlf_want);
}

/*
 * The estimate counts tool calls' arguments and reasoning as well as text:
 * every string value of content, text, arguments, reasoning_content and
 * reasoning; not the tool's name or id, nor keys that merely start alike.
 */
static void
test_scan_estimate_counts_tool_call_arguments_and_reasoning(void **state)
{
	static const char in[] =
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
		"\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get\","
		"\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]}}]}\n\n"      /* 16 */
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm \"}}]}\n\n" /* 4 */
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"ok\"}}]}\n\n"  /* 2 */
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"abc\"}}]}\n\n"  /* 3 */
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_contents\":\"xx\","
		"\"argument\":\"xx\",\"reasonin\":\"xx\",\"arguments\":1}}]}\n\n"
		DONE;
	struct run r;

	(void)state;
	check_stream(in, 0, in, 0, -1, 0, 0, 25);
	check_stream(in, 1, in, 0, -1, 0, 0, 25);
	run_split(&r, in, strlen(in), 7, 1);
	assert_int_equal(sl_usage_estimate(r.content), 7);
	free(r.out);
}

static void
test_json_content_counts_tool_call_arguments_and_reasoning(void **state)
{
	static const char body[] =
		"{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
		"\"content\":\"abc\",\"reasoning_content\":\"hmm \",\"reasoning\":\"ok\","
		"\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"get\","
		"\"arguments\":\"{}\"}},{\"function\":{\"arguments\":\"[1]\"}}]}},"
		"{\"index\":1,\"text\":\"z\"}]}";

	(void)state;
	assert_int_equal(sl_usage_json_content(body, strlen(body)), 3 + 4 + 2 + 2 + 3 + 1);
}

/*
 * A usage event with id:, event:, retry: or comment lines before its data
 * is dropped whole (no dangling field lines); a content event so framed
 * passes untouched, as does an event whose first data line is not an object.
 */
static void
test_scan_usage_event_with_other_fields_first_is_dropped_whole(void **state)
{
	static const char usage[] =
		"id: 2\nevent: message\n: note\nretry: 10\n"
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":6,"
		"\"completion_tokens\":2,\"total_tokens\":8}}\n\n";
	static const char keep[] =
		"id: 1\nevent: message\ndata: {\"choices\":[{\"delta\":{\"content\":\"abcd\"}}]}\n\n"
		"id: 3\ndata: [DONE]\n\n"
		"id: 4\ndata\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,"
		"\"completion_tokens\":1}}\n\n"
		"datax: 1\nd\n\n";
	char in[1024], *crlf, *crlf_want;

	(void)state;
	snprintf(in, sizeof(in), "%s%s", keep, usage);
	check_stream(in, 1, keep, 1, 6, 2, 8, 4);
	check_stream(in, 0, in, 0, 6, 2, 8, 4);
	crlf = relined(in, "\r\n");
	crlf_want = relined(keep, "\r\n");
	check_stream(crlf, 1, crlf_want, 1, 6, 2, 8, 4);
	free(crlf);
	free(crlf_want);
	crlf = relined(in, "\r");
	crlf_want = relined(keep, "\r");
	check_stream(crlf, 1, crlf_want, 1, 6, 2, 8, 4);
	free(crlf);
	free(crlf_want);
}

/*
 * Drop mode: a "usage":null member at the top level of an event's data
 * object is cut, the rest byte for byte; a client that asked gets it all.
 */
static void
test_scan_drop_cuts_usage_null_members_at_every_split(void **state)
{
	static const struct {
		const char *in, *want;
		uint64_t content;
	} cases[] = {
		{ "data: {\"id\":\"a\",\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":null}\n\n",
		  "data: {\"id\":\"a\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", 1 },
		/* the first member: through the comma after it */
		{ "data: {\"usage\":null,\"id\":\"a\",\"choices\":[]}\n\n",
		  "data: {\"id\":\"a\",\"choices\":[]}\n\n", 0 },
		/* the only member */
		{ "data: {\"usage\":null}\n\n", "data: {}\n\n", 0 },
		/* blanks: from the comma to the end of null; around, they stay */
		{ "data: {\"a\":1 , \"usage\" : null , \"b\":2}\n\n",
		  "data: {\"a\":1  , \"b\":2}\n\n", 0 },
		{ "data: { \"usage\"\t: null\t, \"a\":1}\n\n", "data: {  \"a\":1}\n\n", 0 },
		{ "data: {\"a\":1,\"usage\":null,\"b\":[2]}\n\n", "data: {\"a\":1,\"b\":[2]}\n\n", 0 },
		{ "data: {\"usage\":null,\"a\":1,\"usage\":null}\n\n", "data: {\"a\":1}\n\n", 0 },
		/* the first member on the object's second data line */
		{ "data: {\ndata: \"usage\":null,\"a\":1}\n\n", "data: {\ndata: \"a\":1}\n\n", 0 },
		/* after a string value, a number, an object, an array */
		{ "data: {\"a\":\"s\",\"usage\":null,\"b\":2.5e3,\"usage\":null,\"c\":{},"
		  "\"usage\":null,\"d\":[],\"usage\":null}\n\n",
		  "data: {\"a\":\"s\",\"b\":2.5e3,\"c\":{},\"d\":[]}\n\n", 0 },
		/* kept: nested, in a string, not null, not followed by , or }, escaped key */
		{ "data: {\"choices\":[{\"usage\":null,\"delta\":{\"usage\":null}}]}\n\n", NULL, 0 },
		{ "data: {\"choices\":[{\"delta\":{\"content\":\",\\\"usage\\\":null\"}}]}\n\n", NULL, 13 },
		{ "data: {\"a\":1,\"usage\":nullx}\n\n", NULL, 0 },
		{ "data: {\"a\":1,\"usage\":\"null\"}\n\n", NULL, 0 },
		{ "data: {\"a\":1,\"usage\":nul}\n\n", NULL, 0 },
		{ "data: {\"a\":1,\"Usage\":null}\n\n", NULL, 0 },
		{ "data: {\"a\":1,\"usage\":null \"b\":2}\n\n", NULL, 0 },
		{ "data: {\"a\":1,\"usag\\u0065\":null}\n\n", NULL, 0 },
		/* kept: across data lines, data that is not one object, not data */
		{ "data: {\"a\":1,\ndata: \"usage\":null}\n\n", NULL, 0 },
		{ "data: {\"a\":1\ndata: ,\"usage\":null}\n\n",
		  "data: {\"a\":1\ndata: }\n\n", 0 },
		{ "data: [1,\"usage\":null]\n\n", NULL, 0 },
		{ "data: x{\"a\":1,\"usage\":null}\n\n", NULL, 0 },
		{ "data: {\"a\":1} {\"b\":1,\"usage\":null}\n\n", NULL, 0 },
		{ ": {\"a\":1,\"usage\":null}\n\nevent: {\"a\":1,\"usage\":null}\n\n", NULL, 0 },
	};
	char in[1024], want[1024];
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(in, sizeof(in), "%s" DONE, cases[i].in);
		snprintf(want, sizeof(want), "%s" DONE,
		    cases[i].want != NULL ? cases[i].want : cases[i].in);
		check_stream(in, 0, in, 0, -1, 0, 0, cases[i].content);
		check_stream(in, 1, want, 0, -1, 0, 0, cases[i].content);
	}
}

/* Also with CRLF and CR line ends, before and after the usage event is dropped. */
static void
test_scan_drop_cuts_usage_null_around_the_dropped_usage_event(void **state)
{
	static const char lf[] =
		CHUNK("a") "data: {\"usage\":null,\"choices\":[{\"delta\":{\"content\":\"bc\"}}]}\n\n"
		USAGE_EV CHUNK("d") DONE;
	const char *eols[] = { "\n", "\r\n", "\r" };
	char *in, *ev, *want, *tmp;
	size_t i;

	(void)state;
	for (i = 0; i < 3; i++) {
		in = relined(lf, eols[i]);
		ev = relined(USAGE_EV, eols[i]);
		tmp = without(in, ev);
		want = without_all(tmp, NULL_MEMBER);
		free(tmp);
		tmp = without(want, "\"usage\":null,");
		check_stream(in, 0, in, 0, 12, 7, 19, 4);
		check_stream(in, 1, tmp, 1, 12, 7, 19, 4);
		free(in);
		free(ev);
		free(want);
		free(tmp);
	}
}

/* Many members in one read: more than SL_USAGE_MAX_RANGES ranges' worth. */
static void
test_scan_drop_cuts_more_members_than_ranges_in_one_read(void **state)
{
	size_t n = 4 * SL_USAGE_MAX_RANGES, k, len;
	char *in, *want, *tmp;
	struct run r;

	(void)state;
	in = calloc(n + 3, sizeof(CHUNK("tok")) + sizeof(USAGE_EV));
	assert_non_null(in);
	for (k = 0; k < n; k++) {
		strcat(in, CHUNK("tok"));
		if (k == n / 2)
			strcat(in, USAGE_EV);
	}
	strcat(in, DONE);
	len = strlen(in);
	tmp = without(in, USAGE_EV);
	want = without_all(tmp, NULL_MEMBER);
	for (k = 0; k <= 1; k++) {
		if (k == 0)
			run_split(&r, in, len, len, 1);     /* one read */
		else
			run_split(&r, in, len, len / 2, 1);
		assert_int_equal(r.len, strlen(want));
		assert_memory_equal(r.out, want, r.len);
		assert_int_equal(r.dropped, 1);
		assert_int_equal(r.content, 3 * n);
		free(r.out);
	}
	free(tmp);
	free(want);
	free(in);
}

/* A member longer than the hold bound (blanks) is let through, held no further. */
static void
test_scan_member_longer_than_the_hold_bound_is_kept(void **state)
{
	size_t nb = SL_USAGE_MAX_EVENT + 100, len;
	const size_t splits[] = { 1, 4096, 100000 };
	char *in;
	size_t k, off;

	(void)state;
	in = malloc(nb + 256);
	assert_non_null(in);
	strcpy(in, "data: {\"choices\":[{\"delta\":{}}],\"usage\":");
	len = strlen(in);
	memset(in + len, ' ', nb);
	strcpy(in + len + nb, "null}\n\n" DONE);
	len = strlen(in);
	for (k = 0; k < sizeof(splits) / sizeof(splits[0]); k++) {
		struct sl_usage_scan s;
		struct run r;

		memset(&r, 0, sizeof(r));
		add(&r, "", 0);
		sl_usage_scan_init(&s, 1);
		for (off = 0; off < len; off += splits[k])
			feed(&s, &r, in + off, len - off < splits[k] ? len - off : splits[k], 1);
		finish(&s, &r);
		assert_int_equal(r.len, len);
		assert_memory_equal(r.out, in, len);
		assert_true(r.max_hold <= SL_USAGE_MAX_EVENT);
		free(r.out);
	}
	free(in);
}

/* An event over SL_USAGE_MAX_EVENT is flushed through; the hold never passes the cap. */
static void
test_scan_big_event_is_flushed_hold_bounded(void **state)
{
	size_t n = SL_USAGE_MAX_EVENT + 1000, len, k;
	const size_t splits[] = { 1, 7, 4096, 65536 };
	struct sl_usage_scan s;
	struct run r;
	char *in;

	(void)state;
	in = malloc(n + 256);
	assert_non_null(in);
	strcpy(in, "data: {\"choices\":[],\"pad\":\"");
	len = strlen(in);
	memset(in + len, 'x', n);
	len += n;
	strcpy(in + len, "\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n" DONE);
	len = strlen(in);
	for (k = 0; k < sizeof(splits) / sizeof(splits[0]); k++) {
		size_t off;

		memset(&r, 0, sizeof(r));
		add(&r, "", 0);
		sl_usage_scan_init(&s, 1);
		for (off = 0; off < len; off += splits[k])
			feed(&s, &r, in + off, len - off < splits[k] ? len - off : splits[k], 1);
		finish(&s, &r);
		assert_int_equal(r.len, len);
		assert_memory_equal(r.out, in, len);
		assert_true(r.max_hold <= SL_USAGE_MAX_EVENT);
		/* not dropped, but its usage still counts */
		assert_int_equal(r.dropped, 0);
		assert_int_equal(r.u.have, 1);
		free(r.out);
	}
	free(in);
}

/* A slow consumer: the relay sends held bytes before the next feed; no growth. */
static void
test_scan_hold_is_released_before_next_event_is_held(void **state)
{
	/* One feed holding a partial event, then the rest plus a new partial event. */
	static const char a[] = "data: {\"id\":\"c1\",\"cho";
	static const char b[] = "ices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"choices\":[],\"usa";
	static const char b1[] = "ices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";
	static const char c[] = "ge\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n" DONE;
	struct sl_usage_scan s;
	struct sl_usage_out o;
	size_t used;

	(void)state;
	sl_usage_scan_init(&s, 1);
	used = sl_usage_scan_feed(&s, a, strlen(a), &o);
	assert_int_equal(used, strlen(a));
	assert_int_equal(o.held_len + o.n, 0);           /* all held */
	used = sl_usage_scan_feed(&s, b, strlen(b), &o);
	assert_int_equal(used, strlen(b1));              /* stops before the next event */
	assert_int_equal(o.held_len, strlen(a));
	assert_memory_equal(o.held, a, strlen(a));
	assert_int_equal(o.n, 1);
	assert_int_equal(o.range[0].off, 0);
	assert_int_equal(o.range[0].len, strlen(b1));
	used = sl_usage_scan_feed(&s, b + strlen(b1), strlen(b) - strlen(b1), &o);
	assert_int_equal(used, strlen(b) - strlen(b1));
	assert_int_equal(o.held_len + o.n, 0);
	used = sl_usage_scan_feed(&s, c, strlen(c), &o);
	assert_int_equal(used, strlen(c));
	assert_int_equal(o.held_len, 0);
	assert_int_equal(o.n, 1);
	assert_int_equal(o.range[0].len, strlen(DONE));
	assert_memory_equal(c + o.range[0].off, DONE, strlen(DONE));
	assert_int_equal(sl_usage_scan_dropped(&s), 1);
	sl_usage_scan_free(&s);
}

/*
 * Event templates (a next event that differs from the last only in its token
 * and numbers is taken in one compare): whatever the reads and whether the
 * template is kept across them, the client gets what one byte per read
 * gives (where no template can apply) and the counts are the same. Tokens
 * chosen to break a careless template: escapes (a \u over a quote, a
 * backslash last), key names as tokens, a line end, digits that change
 * length, a usage:null member, a usage object on a content chunk, another
 * shape in between.
 */
static void
test_scan_event_templates_take_what_a_scan_takes(void **state)
{
	static const char *const tok[] = {
		"Hello", " wor", "ld", "usage", "content", "choices", "", " 12", "\\\"q\\\"",
		"\\n", "\\u00e9", "x\\u\"}]1y", "\\\\", "a\\\\\\\"b", "tok9", "tok10",
	};
	static const size_t reads[] = { 0, 1, 7, 64, 100000 };   /* 0: an event a read */
	char *in = malloc(64 * 1024);
	size_t n = 0, len, i, k, off, rd;
	int drop, keep, v;
	struct sl_usage_scan s;
	struct run base, r;

	(void)state;
	assert_non_null(in);
	for (v = 0; v < 3; v++)
		for (i = 0; i < sizeof(tok) / sizeof(tok[0]); i++) {
			n += (size_t)snprintf(in + n, 64 * 1024 - n,
			    "data: {\"id\":\"c1\",\"created\":%zu,\"seq\":%zu,\"choices\":[{\"index\":0,"
			    "\"delta\":{\"content\":\"%s\"}}]%s}\n\n", 1733097600 + i / 4, i * 7 + v,
			    i == 11 && v == 1 ? "a\nb" : tok[i],
			    v == 1 ? NULL_MEMBER : v == 2 && i == 5 ?
			    ",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}" : "");
			if (i == 9)
				n += (size_t)snprintf(in + n, 64 * 1024 - n,
				    ": other\ndata: {\"choices\":[{\"text\":\"abc\"}]}\n\n");
		}
	n += (size_t)snprintf(in + n, 64 * 1024 - n, USAGE_EV DONE);
	len = n;
	for (drop = 0; drop < 2; drop++) {
		run_bytes(&base, in, len, drop);
		/*
		 * By hand: an escape is one byte; "a\nb" counts its a; "abc"
		 * three times.
		 */
		assert_int_equal(base.content, 3 * (5 + 4 + 2 + 5 + 7 + 7 + 0 + 3 + 3 + 1 + 1 + 3 +
		    1 + 4 + 4 + 5) - 2 + 3 * 3);
		for (keep = 0; keep < 2; keep++)
			for (k = 0; k < sizeof(reads) / sizeof(reads[0]); k++) {
				memset(&r, 0, sizeof(r));
				add(&r, "", 0);
				sl_usage_scan_init(&s, drop);
				sl_usage_scan_keep(&s, keep);
				for (off = 0; off < len; off += rd) {
					rd = reads[k];
					if (rd == 0) {
						const char *e = strstr(in + off, "\n\n");

						rd = e != NULL ? (size_t)(e + 2 - (in + off)) : len - off;
					}
					if (rd > len - off)
						rd = len - off;
					feed(&s, &r, in + off, rd, drop);
				}
				finish(&s, &r);
				if (r.len != base.len || memcmp(r.out, base.out, r.len) != 0)
					fail_msg("drop %d keep %d reads %zu: output differs", drop, keep,
					    reads[k]);
				assert_int_equal(r.content, base.content);
				assert_int_equal(r.u.have, 1);
				assert_int_equal(r.u.completion_tokens, 7);
				assert_int_equal(r.dropped, drop);
				free(r.out);
			}
		free(base.out);
	}
	free(in);
}

static void
test_scan_struct_is_small(void **state)
{
	(void)state;
	assert_true(sizeof(struct sl_usage_scan) <= 136);   /* one 144-byte malloc chunk */
}

/* ------------------------------------------------------------------ requests */

/* The body sent upstream for in (inject on), and the flags. */
static void
check_req(const char *in, const char *want, int counted, int stream, int asked)
{
	struct sl_usage_req r;

	assert_int_equal(sl_usage_request(in, strlen(in), 1, &r), 0);
	assert_int_equal(r.counted, counted);
	assert_int_equal(r.stream, stream);
	assert_int_equal(r.client_asked, asked);
	if (want == NULL) {
		assert_int_equal(r.injected, 0);
		assert_null(r.body);
	} else {
		assert_int_equal(r.injected, 1);
		if (r.body_len != strlen(want) || memcmp(r.body, want, r.body_len) != 0)
			fail_msg("in\n%s\ngot\n%s\nwant\n%s", in, r.body, want);
		assert_int_equal(r.body[r.body_len], '\0');
	}
	sl_usage_req_free(&r);
	/* inject off: never a new body, same facts */
	assert_int_equal(sl_usage_request(in, strlen(in), 0, &r), 0);
	assert_int_equal(r.injected, 0);
	assert_int_equal(r.counted, counted);
	assert_int_equal(r.stream, stream);
	sl_usage_req_free(&r);
}

static void
test_req_inject_without_stream_options(void **state)
{
	(void)state;
	check_req("{\"model\":\"m\",\"stream\":true}",
	    "{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
	    1, 1, 0);
	check_req(" {\n\t\"stream\" : true \n}\r\n",
	    " {\n\t\"stream\" : true \n,\"stream_options\":{\"include_usage\":true}}\r\n",
	    1, 1, 0);
}

static void
test_req_inject_inside_stream_options(void **state)
{
	(void)state;
	check_req("{\"stream\":true,\"stream_options\":{}}",
	    "{\"stream\":true,\"stream_options\":{\"include_usage\":true}}", 1, 1, 0);
	check_req("{\"stream_options\": { } ,\"stream\":true}",
	    "{\"stream_options\": { \"include_usage\":true} ,\"stream\":true}", 1, 1, 0);
	check_req("{\"stream\":true,\"stream_options\":{\"continuous_usage_stats\":false},\"n\":1}",
	    "{\"stream\":true,\"stream_options\":{\"continuous_usage_stats\":false,"
	    "\"include_usage\":true},\"n\":1}", 1, 1, 0);
}

static void
test_req_include_usage_false_or_null_replaced(void **state)
{
	(void)state;
	check_req("{\"stream\":true,\"stream_options\":{\"include_usage\":false}}",
	    "{\"stream\":true,\"stream_options\":{\"include_usage\":true}}", 1, 1, 0);
	check_req("{\"stream\":true,\"stream_options\":{\"include_usage\" :  null ,\"x\":[]}}",
	    "{\"stream\":true,\"stream_options\":{\"include_usage\" :  true ,\"x\":[]}}", 1, 1, 0);
	check_req("{\"stream_options\":null,\"stream\":true}",
	    "{\"stream_options\":{\"include_usage\":true},\"stream\":true}", 1, 1, 0);
}

static void
test_req_untouched_when_asked_not_streamed_or_odd_types(void **state)
{
	(void)state;
	check_req("{\"stream\":true,\"stream_options\":{\"include_usage\":true}}", NULL, 1, 1, 1);
	check_req("{\"stream\":false}", NULL, 1, 0, 0);
	check_req("{\"model\":\"m\"}", NULL, 1, 0, 0);
	check_req("{\"stream\":0}", NULL, 1, 0, 0);
	check_req("{\"stream\":\"no\"}", NULL, 1, 0, 0);
	check_req("{\"stream\":null}", NULL, 1, 0, 0);
	check_req("{}", NULL, 1, 0, 0);
	/* a client that asked with any value a runner reads as true */
	check_req("{\"stream\":1,\"stream_options\":{\"include_usage\":1}}", NULL, 1, 1, 1);
	check_req("{\"stream\":\"on\",\"stream_options\":{\"include_usage\":\"Yes\"}}", NULL,
	    1, 1, 1);
	/* values the runner refuses: its call */
	check_req("{\"stream\":true,\"stream_options\":\"x\"}", NULL, 1, 1, 0);
	check_req("{\"stream\":true,\"stream_options\":{\"include_usage\":2}}", NULL, 1, 1, 0);
	check_req("{\"stream\":true,\"stream_options\":{\"include_usage\":\"maybe\"}}", NULL,
	    1, 1, 0);
	check_req("{\"stream\":true,\"stream_options\":{\"include_usage\":[]}}", NULL, 1, 1, 0);
	check_req("{\"stream\":2}", NULL, 1, 0, 0);
	check_req("{\"stream\":\"true \"}", NULL, 1, 0, 0);
	check_req("{\"stream\":[true]}", NULL, 1, 0, 0);
}

/*
 * Issue 22: a runner streams for any "stream" its pydantic reads as true
 * and takes any include_usage it reads as false for false; sluice must
 * read them alike, or such a stream's prompt escapes the budget.
 */
static void
test_req_stream_and_include_usage_read_as_a_python_runner_reads_them(void **state)
{
	static const char *const streams[] = {
		"1", "1.0", "1e0", "0.1e1", "10E-1", "\"1\"", "\"t\"", "\"T\"", "\"y\"",
		"\"on\"", "\"ON\"", "\"yes\"", "\"True\"", "\"TRUE\"", "\"\\u0074rue\"",
	};
	static const char *const falses[] = {
		"false", "null", "0", "-0", "0.0", "-0.0", "0e9", "\"0\"", "\"f\"", "\"n\"",
		"\"no\"", "\"NO\"", "\"off\"", "\"false\"", "\"False\"",
	};
	char in[256], want[256];
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(streams) / sizeof(streams[0]); i++) {
		snprintf(in, sizeof(in), "{\"stream\":%s}", streams[i]);
		snprintf(want, sizeof(want), "{\"stream\":%s,\"stream_options\":"
		    "{\"include_usage\":true}}", streams[i]);
		check_req(in, want, 1, 1, 0);
		assert_int_equal(sl_usage_json_bool(streams[i], strlen(streams[i])), 1);
	}
	for (i = 0; i < sizeof(falses) / sizeof(falses[0]); i++) {
		snprintf(in, sizeof(in), "{\"stream\":true,\"stream_options\":{\"include_usage\":%s}}",
		    falses[i]);
		check_req(in, "{\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
		    1, 1, 0);
		assert_int_equal(sl_usage_json_bool(falses[i], strlen(falses[i])), 0);
	}
	/* refused by the runner: neither */
	assert_int_equal(sl_usage_json_bool("2", 1), -1);
	assert_int_equal(sl_usage_json_bool("-1", 2), -1);
	assert_int_equal(sl_usage_json_bool("1.5", 3), -1);
	assert_int_equal(sl_usage_json_bool("NaN", 3), -1);
	assert_int_equal(sl_usage_json_bool("-Infinity", 9), -1);
	assert_int_equal(sl_usage_json_bool("\"yes \"", 6), -1);
	assert_int_equal(sl_usage_json_bool("\"truest\"", 8), -1);
	assert_int_equal(sl_usage_json_bool("\"\"", 2), -1);
	assert_int_equal(sl_usage_json_bool("{}", 2), -1);
	assert_int_equal(sl_usage_json_bool("", 0), -1);
	/* rounded as Python's float() rounds: 1 + 2^-60 is 1.0 */
	assert_int_equal(sl_usage_json_bool("1.000000000000000000867", 23), 1);
}

/* The prompt, estimated: ceil(text bytes / 4) + token ids. */
static void
test_req_prompt_estimated_from_the_body(void **state)
{
	static const struct {
		const char *body;
		uint64_t est;
	} cases[] = {
		{ "{\"messages\":[{\"role\":\"user\",\"content\":\"12345678\"}]}", 2 },
		{ "{\"messages\":[{\"content\":\"123\"},{\"content\":\"45678\"}]}", 2 },
		/* parts: each object's "text" string; images are not text */
		{ "{\"messages\":[{\"content\":[{\"type\":\"text\",\"text\":\"abcd\"},"
		  "{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x/yyyyyyyy\"}},"
		  "{\"type\":\"text\",\"text\":\"e\"}]}]}", 2 },
		/* decoded UTF-8 bytes: \u00e9 is 2, \ud83d\ude00 4, \n 1 */
		{ "{\"messages\":[{\"content\":\"\\u00e9\\ud83d\\ude00\\n\"}]}", 2 },
		{ "{\"messages\":[{\"content\":null,\"tool_calls\":[]}]}", 0 },
		{ "{\"messages\":\"not an array\"}", 0 },
		{ "{\"prompt\":\"123456789\"}", 3 },
		{ "{\"prompt\":[\"1234\",\"5\"]}", 2 },
		{ "{\"prompt\":[1,2,3]}", 3 },
		{ "{\"prompt\":[[1,2],[3],[]]}", 3 },
		{ "{\"prompt\":\"1234\",\"messages\":[{\"content\":\"5678\"}]}", 2 },
		/* the last of duplicates, as the runner reads it */
		{ "{\"prompt\":\"123456789012\",\"prompt\":\"1\"}", 1 },
		{ "{\"model\":\"m\"}", 0 },
	};
	struct sl_usage_req r;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(sl_usage_request(cases[i].body, strlen(cases[i].body), 1, &r), 0);
		assert_int_equal(r.counted, 1);
		if (r.prompt_est != cases[i].est)
			fail_msg("%s: prompt estimated %llu, want %llu", cases[i].body,
			    (unsigned long long)r.prompt_est, (unsigned long long)cases[i].est);
		sl_usage_req_free(&r);
	}
}

/* Issue 22: a usage above the bound is not believed. */
static void
test_usage_sane_bound(void **state)
{
	struct sl_usage u = { 1, SL_USAGE_MAX_TOKENS, SL_USAGE_MAX_TOKENS, UINT64_MAX };

	(void)state;
	assert_int_equal(SL_USAGE_MAX_TOKENS, 100000000);
	assert_true(sl_usage_sane(&u));
	u.prompt_tokens++;
	assert_false(sl_usage_sane(&u));
	u.prompt_tokens = 0;
	u.completion_tokens = (uint64_t)INT64_MAX;
	assert_false(sl_usage_sane(&u));
	u.completion_tokens = 0;
	u.have = 0;
	assert_false(sl_usage_sane(&u));
}

static void
test_req_non_objects_not_counted(void **state)
{
	static const char *bodies[] = {
		"[{\"stream\":true}]", "\"stream\"", "garbage", "", " ", "{\"stream\":true",
		"{\"stream\":true} x", "{\"stream\":true}{}", "null", "42",
		"{\"stream\":true,\"s\":\"\xff\"}",     /* not UTF-8 */
		"{\"stream\":true,}",
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
		check_req(bodies[i], NULL, 0, 0, 0);
}

static void
test_req_strings_mentioning_stream_options_do_not_confuse(void **state)
{
	(void)state;
	/* the text "stream_options" inside values, with escapes, braces and unicode */
	check_req("{\"messages\":[{\"role\":\"user\",\"content\":\"\\\"stream_options\\\":"
	    "{\\\"include_usage\\\":false} }\\\\\"}],\"stream\":true,\"x\":\"\\u00e9 \xc3\xa9 {\"}",
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"\\\"stream_options\\\":"
	    "{\\\"include_usage\\\":false} }\\\\\"}],\"stream\":true,\"x\":\"\\u00e9 \xc3\xa9 {\""
	    ",\"stream_options\":{\"include_usage\":true}}", 1, 1, 0);
	/* a key spelled with an escape is the same key to jansson and to the runner */
	check_req("{\"stream\":true,\"stream\\u005foptions\":{\"a\":{\"include_usage\":false}}}",
	    "{\"stream\":true,\"stream\\u005foptions\":{\"a\":{\"include_usage\":false},"
	    "\"include_usage\":true}}", 1, 1, 0);
	/* a nested stream_options is not the top-level one */
	check_req("{\"stream\":true,\"tools\":[{\"stream_options\":{}}]}",
	    "{\"stream\":true,\"tools\":[{\"stream_options\":{}}],"
	    "\"stream_options\":{\"include_usage\":true}}", 1, 1, 0);
	/* NUL inside a string value */
	check_req("{\"stream\":true,\"s\":\"a\\u0000b\"}",
	    "{\"stream\":true,\"s\":\"a\\u0000b\",\"stream_options\":{\"include_usage\":true}}",
	    1, 1, 0);
}

/* Duplicate keys: the last wins (jansson, Python, serde, nlohmann); we edit that one. */
static void
test_req_duplicate_keys_last_wins(void **state)
{
	(void)state;
	check_req("{\"stream\":true,\"stream_options\":{\"include_usage\":true},"
	    "\"stream_options\":{}}",
	    "{\"stream\":true,\"stream_options\":{\"include_usage\":true},"
	    "\"stream_options\":{\"include_usage\":true}}", 1, 1, 0);
	check_req("{\"stream\":true,\"stream_options\":{},\"stream_options\":{\"include_usage\":true}}",
	    NULL, 1, 1, 1);
	check_req("{\"stream\":true,\"stream\":false}", NULL, 1, 0, 0);
	check_req("{\"stream\":false,\"stream\":true}",
	    "{\"stream\":false,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
	    1, 1, 0);
	check_req("{\"stream\":true,\"stream_options\":{\"include_usage\":false,"
	    "\"include_usage\":null}}",
	    "{\"stream\":true,\"stream_options\":{\"include_usage\":false,"
	    "\"include_usage\":true}}", 1, 1, 0);
}

static void
test_req_deep_nesting_refused_without_crash(void **state)
{
	size_t n = 100000, i;
	char *b = malloc(2 * n + 32);

	(void)state;
	assert_non_null(b);
	strcpy(b, "{\"stream\":true,\"a\":");
	i = strlen(b);
	memset(b + i, '[', n);
	memset(b + i + n, ']', n);
	strcpy(b + i + 2 * n, "}");
	check_req(b, NULL, 0, 0, 0);
	free(b);
}

/* What a Python runner's json.loads takes is counted (vLLM would serve it). */
static void
test_req_python_extensions_counted(void **state)
{
	(void)state;
	check_req("\xef\xbb\xbf{\"stream\":true}",
	    "\xef\xbb\xbf{\"stream\":true,\"stream_options\":{\"include_usage\":true}}", 1, 1, 0);
	check_req("{\"stream\":true,\"t\":NaN,\"a\":[Infinity,-Infinity,1e999,-0.5E-3]}",
	    "{\"stream\":true,\"t\":NaN,\"a\":[Infinity,-Infinity,1e999,-0.5E-3],"
	    "\"stream_options\":{\"include_usage\":true}}", 1, 1, 0);
	check_req("{\"m\":\"\\ud800 \\udfff\",\"stream\":true}",
	    "{\"m\":\"\\ud800 \\udfff\",\"stream\":true,"
	    "\"stream_options\":{\"include_usage\":true}}", 1, 1, 0);
	check_req("{\"s\":\"\xf4\x8f\xbf\xbf \xe0\xa0\x80 \xc2\x80\",\"n\":0}", NULL, 1, 0, 0);
	/* encoded surrogates: json.loads(bytes) decodes with "surrogatepass" */
	check_req("{\"a\":\"\xed\xa0\x80\xed\xbf\xbf\"}", NULL, 1, 0, 0);
}

/* ... and what it refuses is not. */
static void
test_req_invalid_json_not_counted(void **state)
{
	static const char *bodies[] = {
		"{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":-}", "{\"a\":1e}",
		"{\"a\":+1}", "{\"a\":tru}", "{\"a\":nan}", "{\"a\":\"\x01\"}",
		"{\"a\":\"\\x\"}", "{\"a\":\"\\u12g4\"}", "{\"a\":\"\\u12\"}",
		"{\"a\":\"\xc0\x80\"}", "{\"a\":\"\xe0\x9f\xbf\"}", "{\"a\":\"\xf5\x80\x80\x80\"}",
		"{\"a\":\"\xf4\x90\x80\x80\"}", "{\"a\":\"\xed\xa0\"}",
		"{\"a\":\"\xe2\x82\"}", "{\"a\":\"\xe2\x82", "{\"a\" 1}", "{\"a\":1 \"b\":2}",
		"{\"a\":[1,]}", "{\"a\":[1}", "{\"a\":{]}", "{1:2}", "{\"a\":1}]",
		"\xef\xbb{\"a\":1}", "\xef\xbb\xbf\xef\xbb\xbf{}",
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
		check_req(bodies[i], NULL, 0, 0, 0);
}

/* 2048 levels of nesting are a body (jansson's limit too); 2049 are not. */
static void
test_req_nesting_limit(void **state)
{
	size_t d, i;
	char *b = malloc(2 * 2048 + 64);

	(void)state;
	assert_non_null(b);
	for (d = 2047; d <= 2048; d++) {    /* + the top-level object */
		strcpy(b, "{\"a\":");
		i = strlen(b);
		memset(b + i, '[', d);
		memset(b + i + d, ']', d);
		strcpy(b + i + 2 * d, "}");
		check_req(b, NULL, d == 2047, 0, 0);
	}
	free(b);
}

/* ------------------------------------------------------------------ non-streamed */

static void
test_from_json_reads_usage(void **state)
{
	static const char ok[] =
		"{\"id\":\"x\",\"choices\":[{\"message\":{\"content\":\"hi\"}}],"
		"\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,\"total_tokens\":12,"
		"\"prompt_tokens_details\":{\"cached_tokens\":0}}}";
	static const char no_total[] = "{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}";
	static const char *bad[] = {
		"{\"usage\":null}", "{\"usage\":{\"prompt_tokens\":3}}", "[]", "",
		"{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":-4}}",
		"{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":\"7\"}}",
		"{\"usage\":{\"prompt_tokens\":3.0,\"completion_tokens\":4}}",
		"{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}", "{\"x\":1}",
	};
	struct sl_usage u;
	size_t i;
	char *big;

	(void)state;
	assert_int_equal(sl_usage_from_json(ok, strlen(ok), &u), 0);
	assert_int_equal(u.have, 1);
	assert_int_equal(u.prompt_tokens, 10);
	assert_int_equal(u.completion_tokens, 2);
	assert_int_equal(u.total_tokens, 12);
	assert_int_equal(sl_usage_from_json(no_total, strlen(no_total), &u), 0);
	assert_int_equal(u.total_tokens, 7);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(sl_usage_from_json(bad[i], strlen(bad[i]), &u), -1);
		assert_int_equal(u.have, 0);
	}
	/* over the cap: not parsed even though it is valid */
	big = malloc(SL_USAGE_MAX_JSON + 64);
	assert_non_null(big);
	memset(big, ' ', SL_USAGE_MAX_JSON + 64);
	memcpy(big, no_total, strlen(no_total));
	assert_int_equal(sl_usage_from_json(big, SL_USAGE_MAX_JSON, &u), 0);
	assert_int_equal(sl_usage_from_json(big, SL_USAGE_MAX_JSON + 1, &u), -1);
	free(big);
}

/*
 * sl_json_wide() against Python's json.detect_encoding(), which
 * json.loads(bytes) applies: 1 where it answers utf-16* or utf-32*.
 */
static void
test_json_wide_is_what_python_decodes_as_utf16_or_utf32(void **state)
{
	static const struct {
		const char *b;
		size_t n;
		int wide;
	} c[] = {
		{ "", 0, 0 }, { "{", 1, 0 }, { "{}", 2, 0 },
		{ "\0{", 2, 1 }, { "{\0", 2, 1 }, { "{\0}", 3, 0 },
		{ "\0\0\0{", 4, 1 }, { "{\0\0\0", 4, 1 }, { "{\0\"\0", 4, 1 },
		{ "\0{\0\"", 4, 1 }, { "\xff\xfe", 2, 1 }, { "\xfe\xff", 2, 1 },
		{ "\xff\xfe\0\0", 4, 1 }, { "\0\0\xfe\xff", 4, 1 },
		{ "\xef\xbb\xbf{}", 5, 0 }, { "{\"a\":1}", 7, 0 },
		{ "{}\0\0", 4, 0 }, { "\xff\xfe{", 3, 1 },
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		if (sl_json_wide(c[i].b, c[i].n) != c[i].wide)
			fail_msg("case %zu: sl_json_wide %d, want %d", i,
			    sl_json_wide(c[i].b, c[i].n), c[i].wide);
	}
}

/* ------------------------------------------------------------------ other APIs */

/* Bytes from in[i] through the next blank line (LF LF), or to len. */
static size_t
api_event_len(const char *in, size_t len, size_t i)
{
	size_t j;

	for (j = i; j + 1 < len; j++)
		if (in[j] == '\n' && in[j + 1] == '\n')
			return j + 2 - i;
	return len - i;
}

/*
 * A stream of api fed in two reads split at k (bytes 0), a byte at a
 * time (bytes 1) or an event per read (bytes 2, as libcurl hands them;
 * with keep, the event template kept across reads): never held or cut,
 * one range of all of each read.
 */
static void
api_run_keep(enum sl_api api, const char *in, size_t len, size_t k, int bytes,
    int keep, struct sl_usage *u, uint64_t *content)
{
	struct sl_usage_scan s;
	struct sl_usage_out o;
	size_t i, n;

	sl_usage_scan_init_api(&s, api);
	sl_usage_scan_keep(&s, keep);
	for (i = 0; i < len; i += n) {
		n = bytes == 2 ? api_event_len(in, len, i) : bytes ? 1 :
		    i < k ? k - i : len - i;
		assert_int_equal(sl_usage_scan_feed(&s, in + i, n, &o), n);
		assert_int_equal(o.held_len, 0);
		assert_int_equal(o.n, 1);
		assert_int_equal(o.range[0].off, 0);
		assert_int_equal(o.range[0].len, n);
		assert_true(sl_usage_scan_content(&s) == s.content_bytes);
	}
	sl_usage_scan_finish(&s, &o);
	assert_int_equal(o.held_len, 0);
	assert_int_equal(o.n, 0);
	sl_usage_scan_result(&s, u, content);
	assert_int_equal(sl_usage_scan_dropped(&s), 0);
	sl_usage_scan_free(&s);
}

static void
api_run(enum sl_api api, const char *in, size_t len, size_t k, int bytes,
    struct sl_usage *u, uint64_t *content)
{
	api_run_keep(api, in, len, k, bytes, 0, u, content);
}

/*
 * Every 2-way split and 1-byte reads give exactly these numbers, and so
 * do an event per read and every 2-way split with the template kept.
 */
static void
check_api(enum sl_api api, const char *in, int have, uint64_t prompt,
    uint64_t completion, uint64_t content)
{
	size_t len = strlen(in), k;
	struct sl_usage u;
	uint64_t cb;

	for (k = 0; k <= 2 * len + 4; k++) {
		if (k <= len)
			api_run(api, in, len, k, 0, &u, &cb);
		else if (k == len + 1)
			api_run(api, in, len, 0, 1, &u, &cb);
		else if (k == len + 2)
			api_run_keep(api, in, len, 0, 2, 0, &u, &cb);
		else if (k == len + 3)
			api_run_keep(api, in, len, 0, 2, 1, &u, &cb);
		else
			api_run_keep(api, in, len, k - len - 4, 0, 1, &u, &cb);
		if (u.have != have || cb != content ||
		    (have && (u.prompt_tokens != prompt ||
		    u.completion_tokens != completion ||
		    u.total_tokens != prompt + completion)))
			fail_msg("split %zu of %zu: have %d %llu/%llu/%llu content %llu, "
			    "want %d %llu/%llu content %llu", k, len, u.have,
			    (unsigned long long)u.prompt_tokens,
			    (unsigned long long)u.completion_tokens,
			    (unsigned long long)u.total_tokens, (unsigned long long)cb,
			    have, (unsigned long long)prompt,
			    (unsigned long long)completion, (unsigned long long)content);
	}
}

#define R_RESP "\"id\":\"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654\"," \
	"\"object\":\"response\",\"created_at\":1741290958,\"error\":null," \
	"\"incomplete_details\":null,\"instructions\":\"You are a helpful assistant.\"," \
	"\"max_output_tokens\":null,\"model\":\"gpt-4.1-2025-04-14\"," \
	"\"parallel_tool_calls\":true,\"previous_response_id\":null," \
	"\"reasoning\":{\"effort\":null,\"summary\":null},\"store\":true," \
	"\"temperature\":1.0,\"text\":{\"format\":{\"type\":\"text\"}}," \
	"\"tool_choice\":\"auto\",\"tools\":[],\"top_p\":1.0,\"truncation\":\"disabled\""
#define R_ITEM "\"item_id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\"," \
	"\"output_index\":0,\"content_index\":0"
#define R_TEXT "Hi there! \\\"ok\\\""

/* What OpenAI sends for a streamed response (content: 2 + 6 + 6 + 5 + 7 + 3 = 29). */
static const char resp_head[] =
    "event: response.created\n"
    "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{" R_RESP
    ",\"status\":\"in_progress\",\"output\":[],\"usage\":null,\"user\":null,\"metadata\":{}}}\n\n"
    "event: response.in_progress\n"
    "data: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{" R_RESP
    ",\"status\":\"in_progress\",\"output\":[],\"usage\":null,\"user\":null,\"metadata\":{}}}\n\n"
    "event: response.output_item.added\n"
    "data: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,"
    "\"item\":{\"id\":\"msg_67c9\",\"type\":\"message\",\"status\":\"in_progress\","
    "\"role\":\"assistant\",\"content\":[]}}\n\n"
    "event: response.content_part.added\n"
    "data: {\"type\":\"response.content_part.added\",\"sequence_number\":3," R_ITEM
    ",\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n"
    "event: response.output_text.delta\n"
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4," R_ITEM
    ",\"delta\":\"Hi\",\"logprobs\":[]}\n\n"
    "event: response.output_text.delta\n"
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":5," R_ITEM
    ",\"delta\":\" there\",\"logprobs\":[]}\n\n"
    "event: response.output_text.delta\n"
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":6," R_ITEM
    ",\"delta\":\"! \\\"ok\\\"\",\"logprobs\":[]}\n\n"
    "event: response.reasoning_summary_text.delta\n"
    "data: {\"type\":\"response.reasoning_summary_text.delta\",\"sequence_number\":7,"
    "\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"delta\":\"Think\"}\n\n"
    "event: response.function_call_arguments.delta\n"
    "data: {\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":8,"
    "\"item_id\":\"fc_1\",\"output_index\":1,\"delta\":\"{\\\"a\\\":1}\"}\n\n"
    /* the delta before the type: counted once the type is known */
    "data: {\"delta\":\"xyz\",\"sequence_number\":9,\"type\":\"response.output_text.delta\"}\n\n"
    /* deltas of other types are not text */
    "event: response.audio.delta\n"
    "data: {\"type\":\"response.audio.delta\",\"sequence_number\":10,\"delta\":\"AAAAAAAA\"}\n\n"
    "data: {\"delta\":\"BBBB\",\"type\":\"response.audio.delta\"}\n\n"
    ": keep-alive\n\n"
    "event: response.output_text.done\n"
    "data: {\"type\":\"response.output_text.done\",\"sequence_number\":11," R_ITEM
    ",\"text\":\"" R_TEXT "\",\"logprobs\":[]}\n\n"
    "event: response.content_part.done\n"
    "data: {\"type\":\"response.content_part.done\",\"sequence_number\":12," R_ITEM
    ",\"part\":{\"type\":\"output_text\",\"text\":\"" R_TEXT "\",\"annotations\":[]}}\n\n";

#define R_DONE(type, status, usage) \
    "event: " type "\n" \
    "data: {\"type\":\"" type "\",\"sequence_number\":13,\"response\":{" R_RESP \
    ",\"status\":\"" status "\",\"output\":[{\"id\":\"msg_67c9\",\"type\":\"message\"," \
    "\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\"," \
    "\"text\":\"" R_TEXT "\",\"annotations\":[]}]}],\"usage\":" usage \
    ",\"user\":null,\"metadata\":{}}}\n\n"
#define R_USAGE "{\"input_tokens\":37,\"input_tokens_details\":{\"cached_tokens\":0}," \
    "\"output_tokens\":11,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":48}"

static char *
cat2(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	char *s = malloc(la + lb + 1);

	assert_non_null(s);
	memcpy(s, a, la);
	memcpy(s + la, b, lb + 1);
	return s;
}

static void
test_api_responses_usage_at_every_split(void **state)
{
	char *s;

	(void)state;
	s = cat2(resp_head, R_DONE("response.completed", "completed", R_USAGE));
	check_api(SL_API_RESPONSES, s, 1, 37, 11, 29);
	free(s);
	s = cat2(resp_head, R_DONE("response.incomplete", "incomplete", R_USAGE));
	check_api(SL_API_RESPONSES, s, 1, 37, 11, 29);
	free(s);
	s = cat2(resp_head, R_DONE("response.failed", "failed", R_USAGE));
	check_api(SL_API_RESPONSES, s, 1, 37, 11, 29);
	free(s);
	/* failed without usage: estimate */
	s = cat2(resp_head, R_DONE("response.failed", "failed", "null"));
	check_api(SL_API_RESPONSES, s, 0, 0, 0, 29);
	free(s);
	/* the same usage in another event type is not the response's */
	s = cat2(resp_head, R_DONE("response.in_progress", "in_progress", R_USAGE));
	check_api(SL_API_RESPONSES, s, 0, 0, 0, 29);
	free(s);
	/* no usage at all: the content for the estimate */
	check_api(SL_API_RESPONSES, resp_head, 0, 0, 0, 29);
}

static void
test_api_responses_cut_or_odd_streams(void **state)
{
	char *s, *t;
	size_t len;
	struct sl_usage u;
	uint64_t cb;

	(void)state;
	/* cut inside the completed event (no blank line): no usage */
	s = cat2(resp_head, R_DONE("response.completed", "completed", R_USAGE));
	len = strlen(s);
	api_run(SL_API_RESPONSES, s, len - 1, len - 1, 0, &u, &cb);
	assert_int_equal(u.have, 0);
	assert_int_equal(cb, 29);
	api_run(SL_API_RESPONSES, s, len - 30, len - 30, 0, &u, &cb);
	assert_int_equal(u.have, 0);
	/* CRLF line ends */
	{
		size_t i, n = 0;

		t = malloc(2 * len + 1);
		assert_non_null(t);
		for (i = 0; i < len; i++) {
			if (s[i] == '\n')
				t[n++] = '\r';
			t[n++] = s[i];
		}
		t[n] = '\0';
		check_api(SL_API_RESPONSES, t, 1, 37, 11, 29);
		/* CR alone */
		for (i = 0; i <= len; i++)
			t[i] = s[i] == '\n' ? '\r' : s[i];
		check_api(SL_API_RESPONSES, t, 1, 37, 11, 29);
		free(t);
	}
	free(s);
	/* the usage over two data lines; an absurd count reads as one past the bound */
	check_api(SL_API_RESPONSES,
	    "data: {\"type\":\"response.completed\",\"response\":{\"usage\":\n"
	    "data: {\"input_tokens\":5,\n"
	    "data: \"output_tokens\":200000000}}}\n\n", 1, 5, SL_USAGE_MAX_TOKENS + 1, 0);
	/* a string cut by a line end: not JSON, no usage */
	check_api(SL_API_RESPONSES,
	    "data: {\"type\":\"response.completed\",\"x\":\"a\n"
	    "data: b\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":6}}}\n\n",
	    0, 0, 0, 0);
	/* usage without output_tokens, or not an object */
	check_api(SL_API_RESPONSES,
	    "data: {\"type\":\"response.completed\",\"response\":{\"usage\":"
	    "{\"input_tokens\":5}}}\n\n", 0, 0, 0, 0);
	check_api(SL_API_RESPONSES,
	    "data: {\"type\":\"response.completed\",\"response\":{\"usage\":[1,2]}}\n\n",
	    0, 0, 0, 0);
	/* a later completed event wins; escaped keys are not ours */
	check_api(SL_API_RESPONSES,
	    "data: {\"type\":\"response.completed\",\"response\":{\"usage\":"
	    "{\"input_tokens\":1,\"output_tokens\":2}}}\n\n"
	    "data: {\"type\":\"response.completed\",\"response\":{\"usage\":"
	    "{\"input_tokens\":3,\"output_tokens\":4}}}\n\n"
	    "data: {\"type\":\"response.completed\",\"response\":{\"us\\u0061ge\":"
	    "{\"input_tokens\":5,\"output_tokens\":6}}}\n\n", 1, 3, 4, 0);
	/* nesting past the depth counter: that event is not read, the next one is */
	{
		static const char head[] = "data: {\"type\":\"response.completed\",\"x\":";
		static const char tail[] = "\n\ndata: {\"type\":\"response.completed\","
		    "\"response\":{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}\n\n";
		size_t deep = 70000, hl = sizeof(head) - 1, tl = sizeof(tail) - 1;
		char *d = malloc(hl + deep + tl + 1);

		assert_non_null(d);
		memcpy(d, head, hl);
		memset(d + hl, '[', deep);
		memcpy(d + hl + deep, tail, tl + 1);
		api_run(SL_API_RESPONSES, d, hl + deep + tl, hl + deep / 2, 0, &u, &cb);
		assert_int_equal(u.have, 1);
		assert_int_equal(u.prompt_tokens, 1);
		assert_int_equal(u.completion_tokens, 2);
		free(d);
	}
	/* a usage deeper down (an output item's) is not the response's */
	check_api(SL_API_RESPONSES,
	    "data: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"usage\":"
	    "{\"input_tokens\":5,\"output_tokens\":6}}]}}\n\n", 0, 0, 0, 0);
}

static void
test_api_responses_completed_event_larger_than_64k(void **state)
{
	size_t big = 200 * 1024, n, len;
	char *s, *text;
	struct sl_usage u;
	uint64_t cb;
	struct sl_usage_scan sc;
	struct sl_usage_out o;
	size_t i;

	(void)state;
	text = malloc(big + 1);
	assert_non_null(text);
	for (i = 0; i < big; i++)
		text[i] = "abc\\\"de"[i % 7] == '\\' ? 'x' : "abcxyde"[i % 7];
	text[big] = '\0';
	s = malloc(2 * big + 4096);
	assert_non_null(s);
	len = (size_t)snprintf(s, 2 * big + 4096,
	    "event: response.output_text.delta\n"
	    "data: {\"type\":\"response.output_text.delta\",\"delta\":\"%s\"}\n\n"
	    "event: response.completed\n"
	    "data: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":"
	    "{\"id\":\"resp_1\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":"
	    "\"output_text\",\"text\":\"%s\"}]}],\"usage\":{\"input_tokens\":123,"
	    "\"output_tokens\":51200,\"total_tokens\":51323}}}\n\n", text, text);
	assert_true(len > 2 * big);
	api_run(SL_API_RESPONSES, s, len, len / 3, 0, &u, &cb);
	assert_int_equal(u.have, 1);
	assert_int_equal(u.prompt_tokens, 123);
	assert_int_equal(u.completion_tokens, 51200);
	assert_int_equal(cb, big);
	/* in reads of 1000: the copy holds the usage object only */
	sl_usage_scan_init_api(&sc, SL_API_RESPONSES);
	for (i = 0; i < len; i += n) {
		n = len - i < 1000 ? len - i : 1000;
		assert_int_equal(sl_usage_scan_feed(&sc, s + i, n, &o), n);
		assert_true(sc.cap_alloc <= 4096);
		assert_true(sc.hold == NULL);
	}
	sl_usage_scan_finish(&sc, &o);
	assert_int_equal(sl_usage_scan_result(&sc, &u, &cb), 1);
	assert_int_equal(u.total_tokens, 51323);
	assert_int_equal(cb, big);
	sl_usage_scan_free(&sc);
	free(s);
	free(text);
}

#define M_START(usage) \
    "event: message_start\n" \
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY\"," \
    "\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\"," \
    "\"stop_reason\":null,\"stop_sequence\":null,\"usage\":" usage "}}\n\n"
#define M_DELTA(out) \
    "event: message_delta\n" \
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"," \
    "\"stop_sequence\":null},\"usage\":{\"output_tokens\":" out "}}\n\n"

/* content: 12 + 5 + 3 + 21 = 41 */
static const char msg_body[] =
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":"
    "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n"
    "event: ping\n"
    "data: {\"type\": \"ping\"}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":"
    "{\"type\":\"thinking_delta\",\"thinking\":\"Let me think\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":"
    "{\"type\":\"signature_delta\",\"signature\":\"EqQBCgIYAhIM\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":"
    "{\"type\":\"text\",\"text\":\"not counted\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":"
    "{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"index\":1,\"delta\":{\"text\":\" \\u00e9!\",\"type\":\"text_delta\"},"
    "\"type\":\"content_block_delta\"}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":"
    "\"tool_use\",\"id\":\"toolu_01\",\"name\":\"get_weather\",\"input\":{}}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":"
    "\"input_json_delta\",\"partial_json\":\"{\\\"location\\\": \\\"Paris\\\"}\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":2}\n\n";

static void
test_api_messages_usage_at_every_split(void **state)
{
	char *a, *b;

	(void)state;
	/* cache tokens summed into the prompt; the last message_delta wins */
	a = cat2(M_START("{\"input_tokens\":25,\"cache_creation_input_tokens\":100,"
	    "\"cache_read_input_tokens\":7,\"output_tokens\":1}"), msg_body);
	b = cat2(a, M_DELTA("10") M_DELTA("15") "event: message_stop\n"
	    "data: {\"type\":\"message_stop\"}\n\n");
	check_api(SL_API_MESSAGES, b, 1, 132, 15, 41);
	free(b);
	/* no message_delta (cut): estimate */
	check_api(SL_API_MESSAGES, a, 0, 0, 0, 41);
	free(a);
	/* cache fields null or absent */
	a = cat2(M_START("{\"input_tokens\":25,\"cache_creation_input_tokens\":null,"
	    "\"output_tokens\":1}"), M_DELTA("3"));
	check_api(SL_API_MESSAGES, a, 1, 25, 3, 0);
	free(a);
	/* no message_start usage: message_delta's input_tokens (newer API) */
	check_api(SL_API_MESSAGES, "event: message_delta\ndata: {\"type\":\"message_delta\","
	    "\"delta\":{},\"usage\":{\"input_tokens\":4,\"cache_read_input_tokens\":2,"
	    "\"output_tokens\":9}}\n\n", 1, 6, 9, 0);
	/* message_delta alone: no prompt, no usage */
	check_api(SL_API_MESSAGES, M_DELTA("3"), 0, 0, 0, 0);
	/* cut mid-event: the delta is not complete */
	a = cat2(M_START("{\"input_tokens\":25,\"output_tokens\":1}"),
	    "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":"
	    "{\"output_tokens\":15}}");
	check_api(SL_API_MESSAGES, a, 0, 0, 0, 0);
	free(a);
	/* a bad cache count makes the usage unread */
	a = cat2(M_START("{\"input_tokens\":25,\"cache_read_input_tokens\":-1}"), M_DELTA("3"));
	check_api(SL_API_MESSAGES, a, 0, 0, 0, 0);
	free(a);
	/* each event's own usage: message_start's top-level usage and
	 * message_delta's message.usage are not read */
	check_api(SL_API_MESSAGES, "data: {\"type\":\"message_start\",\"message\":{\"usage\":"
	    "{\"input_tokens\":5}},\"usage\":{\"input_tokens\":9,\"output_tokens\":8}}\n\n"
	    "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3},\"message\":"
	    "{\"usage\":{\"input_tokens\":7,\"output_tokens\":6}}}\n\n", 1, 5, 3, 0);
	/* usage inside the delta or a content block is not the message's */
	check_api(SL_API_MESSAGES, "data: {\"type\":\"message_start\",\"message\":{\"content\":"
	    "[{\"usage\":{\"input_tokens\":1}}]}}\n\n" M_DELTA("3"), 0, 0, 0, 0);
}

/* A fake request as h1.c parses one. */
static void
fake_req(struct sl_req *r, int method, const char *url, const char *body)
{
	memset(r, 0, sizeof(*r));
	r->arena = strdup(url);
	assert_non_null(r->arena);
	r->url_off = 0;
	r->url_len = (uint32_t)strlen(url);
	r->method = method;
	if (body != NULL) {
		r->body = strdup(body);
		assert_non_null(r->body);
		r->body_len = r->body_cap = strlen(body);
	}
}

static void
free_req(struct sl_req *r)
{
	free(r->arena);
	free(r->body);
}

/*
 * sl_meter from the request to its cost: the body's answer fed as the
 * relay feeds it (an event stream through the scanner, else kept).
 * Returns what sl_meter_end returned; n the cost, *m its state after.
 */
static int
meter_run(struct sl_meter *m, const char *url, const char *req, int sse,
    const char *resp, size_t rlen, uint64_t n[SL_TOKENS_KINDS])
{
	struct sl_req r;
	struct sl_usage_out o;
	size_t off = 0;
	int rc;

	memset(m, 0, sizeof(*m));
	fake_req(&r, HTTP_POST, url, req);
	sl_meter_request(m, 1, 1, &r);
	sl_meter_head(m, 200, 1, sse, !sse);
	if (m->on && m->scan != NULL) {
		while (off < rlen)
			off += sl_usage_scan_feed(m->scan, resp + off, rlen - off, &o);
		sl_usage_scan_finish(m->scan, &o);
	}
	if (m->on && m->keep_json) {
		for (off = 0; off < rlen; off += 4096)
			sl_meter_keep(m, resp + off, rlen - off < 4096 ? rlen - off : 4096);
	}
	n[0] = n[1] = n[2] = 7777;
	rc = sl_meter_end(m, 200, n);
	sl_meter_free(m);
	free_req(&r);
	return rc;
}

static void
check_cost(const uint64_t n[SL_TOKENS_KINDS], uint64_t p, uint64_t c, uint64_t e)
{
	if (n[SL_TOKENS_PROMPT] != p || n[SL_TOKENS_COMPLETION] != c ||
	    n[SL_TOKENS_ESTIMATED] != e)
		fail_msg("cost %llu/%llu/%llu, want %llu/%llu/%llu",
		    (unsigned long long)n[0], (unsigned long long)n[1],
		    (unsigned long long)n[2], (unsigned long long)p,
		    (unsigned long long)c, (unsigned long long)e);
}

/*
 * Token events as a runner streams them, one per read with the template
 * kept (sl_usage_scan_keep): the numbers of the plain scan, whether an
 * event is taken as the template (the same shape, other digits and text)
 * or not (a number one digit longer, a text with an escape, another key,
 * the text before the type).
 */
static void
test_api_token_events_with_the_template_kept(void **state)
{
	char *in = malloc(64 * 1024), *p;
	size_t i;
	uint64_t content = 0;

	(void)state;
	assert_non_null(in);
	p = in;
	for (i = 0; i < 40; i++) {
		const char *t = i == 20 ? "a\\\"b" : i % 3 ? "tok " : "token ";

		p += sprintf(p, "event: response.output_text.delta\ndata: {\"type\":"
		    "\"response.output_text.delta\",\"sequence_number\":%zu,"
		    "\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,"
		    "\"%s\":\"%s\",\"logprobs\":[]}\n\n", i + 4,
		    i == 30 ? "delt4" : "delta", t);
		if (i != 30)
			content += strlen(t) - (i == 20 ? 1 : 0);
	}
	p += sprintf(p, "data: {\"delta\":\"xy\",\"type\":\"response.output_text.delta\"}\n\n");
	content += 2;
	p += sprintf(p, "data: {\"type\":\"response.completed\",\"response\":{\"usage\":"
	    "{\"input_tokens\":7,\"output_tokens\":40,\"total_tokens\":47}}}\n\n");
	check_api(SL_API_RESPONSES, in, 1, 7, 40, content);

	p = in;
	content = 0;
	p += sprintf(p, "event: message_start\ndata: {\"type\":\"message_start\","
	    "\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n");
	for (i = 0; i < 40; i++) {
		const char *t = i == 11 ? "x\\ny" : i % 2 ? "tok " : "t ";

		p += sprintf(p, "event: content_block_delta\ndata: {\"type\":"
		    "\"content_block_delta\",\"index\":%zu,\"delta\":{\"type\":"
		    "\"text_delta\",\"text\":\"%s\"}}\n\n", i / 7, t);
		content += strlen(t) - (i == 11 ? 1 : 0);
	}
	p += sprintf(p, "event: message_delta\ndata: {\"type\":\"message_delta\","
	    "\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":40}}\n\n");
	check_api(SL_API_MESSAGES, in, 1, 9, 40, content);
	free(in);
}

static void
test_meter_each_api_end_to_end(void **state)
{
	struct sl_meter m;
	uint64_t n[SL_TOKENS_KINDS];
	char *s;
	static const char rq[] = "{\"model\":\"m\",\"stream\":true,\"input\":\"abcdefgh\","
	    "\"instructions\":\"xyz\"}";   /* 11 bytes: 3 tokens */
	static const char mq[] = "{\"model\":\"m\",\"stream\":true,\"max_tokens\":9,"
	    "\"system\":\"abcd\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}";

	(void)state;
	/* responses, streamed: exact */
	s = cat2(resp_head, R_DONE("response.completed", "completed", R_USAGE));
	assert_int_equal(meter_run(&m, "/v1/responses", rq, 1, s, strlen(s), n), 1);
	assert_int_equal(m.api, SL_API_RESPONSES);
	assert_string_equal(m.kind, "exact");
	check_cost(n, 37, 11, 0);
	/* the body went upstream untouched (no injection) */
	/* cut before the completed event: estimated, 3 + ceil(29 / 4) */
	assert_int_equal(meter_run(&m, "/v1/responses", rq, 1, s,
	    strlen(resp_head) + 50, n), 1);
	assert_string_equal(m.kind, "estimated");
	check_cost(n, 0, 0, 3 + 8);
	free(s);
	/* messages, streamed: exact; prompt 4 + 5 = 9 bytes: 3 tokens */
	s = cat2(M_START("{\"input_tokens\":25,\"cache_creation_input_tokens\":100,"
	    "\"cache_read_input_tokens\":7,\"output_tokens\":1}"), msg_body);
	assert_int_equal(meter_run(&m, "/v1/messages", mq, 1, s, strlen(s), n), 1);
	assert_string_equal(m.kind, "estimated");
	check_cost(n, 0, 0, 3 + 11);      /* no message_delta: ceil(41 / 4) */
	free(s);
	s = cat2(M_START("{\"input_tokens\":25,\"cache_creation_input_tokens\":100,"
	    "\"cache_read_input_tokens\":7,\"output_tokens\":1}"), M_DELTA("15"));
	assert_int_equal(meter_run(&m, "/v1/messages?beta=true", mq, 1, s, strlen(s), n), 1);
	assert_int_equal(m.api, SL_API_MESSAGES);
	check_cost(n, 132, 15, 0);
	free(s);
	/* absurd counts: estimated */
	s = cat2(M_START("{\"input_tokens\":25}"), M_DELTA("200000000"));
	assert_int_equal(meter_run(&m, "/v1/messages", mq, 1, s, strlen(s), n), 1);
	check_cost(n, 0, 0, 3 + 0);
	free(s);
	/* responses, one JSON body */
	s = "{\"id\":\"resp_1\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":"
	    "\"output_text\",\"text\":\"Hello there\"}]}],\"usage\":{\"input_tokens\":12,"
	    "\"output_tokens\":34,\"total_tokens\":46}}";
	assert_int_equal(meter_run(&m, "/v1/responses", "{\"input\":\"abcd\"}", 0, s,
	    strlen(s), n), 1);
	check_cost(n, 12, 34, 0);
	/* messages, one JSON body */
	s = "{\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}],\"usage\":{\"input_tokens\":10,"
	    "\"cache_creation_input_tokens\":5,\"cache_read_input_tokens\":null,"
	    "\"output_tokens\":7}}";
	assert_int_equal(meter_run(&m, "/v1/messages", mq, 0, s, strlen(s), n), 1);
	check_cost(n, 15, 7, 0);
	/* without usage: the prompt estimated, the content of the answer */
	s = "{\"content\":[{\"type\":\"text\",\"text\":\"Hi there you\"}]}";
	assert_int_equal(meter_run(&m, "/v1/messages", mq, 0, s, strlen(s), n), 1);
	check_cost(n, 0, 0, 3 + 3);
	/* embeddings: prompt_tokens, no completion */
	s = "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
	    "\"embedding\":[0.1,0.2]}],\"model\":\"e\",\"usage\":{\"prompt_tokens\":8,"
	    "\"total_tokens\":8}}";
	assert_int_equal(meter_run(&m, "/v1/embeddings", "{\"input\":[\"abcd\",\"efgh\"],"
	    "\"model\":\"e\"}", 0, s, strlen(s), n), 1);
	assert_int_equal(m.api, SL_API_EMBEDDINGS);
	check_cost(n, 8, 0, 0);
	s = "{\"object\":\"list\",\"data\":[]}";
	assert_int_equal(meter_run(&m, "/v1/embeddings", "{\"input\":[[1,2,3],[4]]}", 0, s,
	    strlen(s), n), 1);
	check_cost(n, 0, 0, 4);
	/* percent-encoded paths are the API */
	s = "{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}";
	assert_int_equal(meter_run(&m, "/v1/%72esponses", "{}", 0, s, strlen(s), n), 1);
	check_cost(n, 1, 2, 0);
	/* not metered: stored responses, count_tokens, non-objects */
	assert_int_equal(meter_run(&m, "/v1/responses/resp_1/cancel", "{}", 0, s,
	    strlen(s), n), 0);
	assert_int_equal(m.on, 0);
	assert_int_equal(meter_run(&m, "/v1/messages/count_tokens", "{\"messages\":[]}", 0,
	    s, strlen(s), n), 0);
	assert_int_equal(meter_run(&m, "/v1/responses", "[1]", 0, s, strlen(s), n), 0);
	/* chat as before: the usage chunk asked for, read, and the cost */
	s = "data: {\"choices\":[{\"delta\":{\"content\":\"abcdefgh\"}}]}\n\n"
	    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n"
	    "data: [DONE]\n\n";
	assert_int_equal(meter_run(&m, "/v1/chat/completions", "{\"stream\":true,"
	    "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 1, s, strlen(s), n), 1);
	assert_int_equal(m.api, SL_API_CHAT);
	check_cost(n, 4, 2, 0);
}

static void
test_meter_requests_of_each_api_relayed_untouched(void **state)
{
	struct sl_meter m;
	struct sl_req r;
	static const char *const url[] = { "/v1/responses", "/v1/messages" };
	static const char body[] = "{\"stream\":true,\"input\":\"x\",\"messages\":[]}";
	size_t i;

	(void)state;
	for (i = 0; i < 2; i++) {
		memset(&m, 0, sizeof(m));
		fake_req(&r, HTTP_POST, url[i], body);
		sl_meter_request(&m, 1, 1, &r);
		assert_int_equal(m.on, 1);
		assert_non_null(m.scan);
		assert_int_equal(m.scan->drop, 0);
		assert_int_equal(m.scan->api, i == 0 ? SL_API_RESPONSES : SL_API_MESSAGES);
		assert_int_equal(r.body_len, strlen(body));
		assert_memory_equal(r.body, body, r.body_len);
		sl_meter_free(&m);
		free_req(&r);
	}
	/* usage off, or not a POST: nothing */
	memset(&m, 0, sizeof(m));
	fake_req(&r, HTTP_POST, "/v1/responses", body);
	sl_meter_request(&m, 0, 1, &r);
	assert_int_equal(m.on, 0);
	free_req(&r);
	fake_req(&r, HTTP_GET, "/v1/responses", body);
	sl_meter_request(&m, 1, 1, &r);
	assert_int_equal(m.on, 0);
	free_req(&r);
}

static void
test_meter_json_answer_too_large_is_estimated(void **state)
{
	struct sl_meter m;
	uint64_t n[SL_TOKENS_KINDS];
	size_t len = SL_USAGE_MAX_JSON + 100;
	char *s = malloc(len + 1);

	(void)state;
	assert_non_null(s);
	memset(s, ' ', len);
	memcpy(s, "{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}", 46);
	s[len - 1] = '}';
	s[len] = '\0';
	assert_int_equal(meter_run(&m, "/v1/responses", "{\"input\":\"abcd\"}", 0, s, len,
	    n), 1);
	check_cost(n, 0, 0, 1 + (len + 3) / 4);
	free(s);
}

static void
check_json_api(enum sl_api api, const char *b, int rc, uint64_t p, uint64_t c,
    uint64_t content)
{
	struct sl_usage u;

	assert_int_equal(sl_usage_from_json_api(api, b, strlen(b), &u), rc);
	assert_int_equal(u.have, rc == 0);
	assert_int_equal(u.prompt_tokens, p);
	assert_int_equal(u.completion_tokens, c);
	assert_int_equal(sl_usage_json_content_api(api, b, strlen(b)), content);
}

static void
test_api_json_bodies(void **state)
{
	(void)state;
	check_json_api(SL_API_RESPONSES, "{\"id\":\"resp_1\",\"output\":[{\"type\":"
	    "\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"abc\"}]},"
	    "{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":"
	    "\"Hello there\"},{\"type\":\"refusal\",\"refusal\":\"no\"}]},{\"type\":"
	    "\"function_call\",\"arguments\":\"{\\\"x\\\":1}\"}],\"usage\":{\"input_tokens\":"
	    "12,\"output_tokens\":34,\"total_tokens\":46}}", 0, 12, 34, 3 + 11 + 2 + 7);
	check_json_api(SL_API_RESPONSES, "{\"usage\":{\"input_tokens\":12}}", -1, 0, 0, 0);
	check_json_api(SL_API_RESPONSES, "{\"usage\":{\"prompt_tokens\":1,"
	    "\"completion_tokens\":2}}", -1, 0, 0, 0);
	check_json_api(SL_API_MESSAGES, "{\"content\":[{\"type\":\"text\",\"text\":\"Hi\"},"
	    "{\"type\":\"thinking\",\"thinking\":\"hmm\"},{\"type\":\"tool_use\",\"input\":"
	    "{\"a\":1}}],\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":5,"
	    "\"cache_read_input_tokens\":2,\"output_tokens\":7}}", 0, 17, 7, 2 + 3 + 7);
	check_json_api(SL_API_MESSAGES, "{\"usage\":{\"input_tokens\":10}}", -1, 0, 0, 0);
	check_json_api(SL_API_MESSAGES, "{\"usage\":{\"input_tokens\":1,"
	    "\"output_tokens\":200000000}}", 0, 1, SL_USAGE_MAX_TOKENS + 1, 0);
	check_json_api(SL_API_EMBEDDINGS, "{\"data\":[],\"usage\":{\"prompt_tokens\":8,"
	    "\"total_tokens\":8}}", 0, 8, 0, 0);
	check_json_api(SL_API_EMBEDDINGS, "{\"data\":[],\"usage\":{\"prompt_tokens\":-1}}",
	    -1, 0, 0, 0);
	/* chat through the same entry points */
	check_json_api(SL_API_CHAT, "{\"choices\":[{\"message\":{\"content\":\"abc\"}}],"
	    "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}", 0, 1, 2, 3);
}

static void
check_req_api(enum sl_api api, const char *b, int counted, int stream, uint64_t est)
{
	struct sl_usage_req r;

	assert_int_equal(sl_usage_request_api(api, b, strlen(b), &r), 0);
	if (r.counted != counted || r.stream != stream || r.prompt_est != est ||
	    r.injected || r.body != NULL)
		fail_msg("%s: counted %d stream %d est %llu injected %d", b, r.counted,
		    r.stream, (unsigned long long)r.prompt_est, r.injected);
	sl_usage_req_free(&r);
}

static void
test_api_prompt_estimates(void **state)
{
	(void)state;
	/* responses: 8 + 3 = 11 bytes */
	check_req_api(SL_API_RESPONSES, "{\"model\":\"m\",\"input\":\"abcdefgh\","
	    "\"instructions\":\"xyz\"}", 1, 0, 3);
	/* items: content strings, parts' text, a bare string: 4 + 4 + 2 + 1 */
	check_req_api(SL_API_RESPONSES, "{\"stream\":true,\"input\":[{\"role\":\"user\","
	    "\"content\":\"abcd\"},{\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
	    "\"text\":\"efgh\"},{\"type\":\"input_image\",\"image_url\":\"http://x/abcdefgh\"}]},"
	    "\"ij\",{\"type\":\"function_call_output\",\"call_id\":\"c\"}],"
	    "\"instructions\":\"\\u00e9\"}", 1, 1, 3);
	check_req_api(SL_API_RESPONSES, "{\"input\":\"abcd\",\"stream\":\"yes\"}", 1, 1, 1);
	check_req_api(SL_API_RESPONSES, "{\"input\":\"abcd\",\"stream\":false}", 1, 0, 1);
	check_req_api(SL_API_RESPONSES, "[\"abcd\"]", 0, 0, 0);
	check_req_api(SL_API_RESPONSES, "{\"input\":", 0, 0, 0);
	/* messages: system blocks 4, content string 5, blocks 3 */
	check_req_api(SL_API_MESSAGES, "{\"system\":[{\"type\":\"text\",\"text\":\"abcd\"}],"
	    "\"messages\":[{\"role\":\"user\",\"content\":\"hello\"},{\"role\":\"assistant\","
	    "\"content\":[{\"type\":\"text\",\"text\":\"abc\"},{\"type\":\"image\"}]}],"
	    "\"stream\":\"true\"}", 1, 1, 3);
	check_req_api(SL_API_MESSAGES, "{\"system\":\"abcdefghi\",\"messages\":[]}", 1, 0, 3);
	/* embeddings: text, strings, token ids; never streamed */
	check_req_api(SL_API_EMBEDDINGS, "{\"input\":\"abcde\",\"stream\":true}", 1, 0, 2);
	check_req_api(SL_API_EMBEDDINGS, "{\"input\":[\"abcd\",\"efgh\"]}", 1, 0, 2);
	check_req_api(SL_API_EMBEDDINGS, "{\"input\":[1,2,3]}", 1, 0, 3);
	check_req_api(SL_API_EMBEDDINGS, "{\"input\":[[1,2],[3]]}", 1, 0, 3);
	check_req_api(SL_API_EMBEDDINGS, "{\"model\":\"e\"}", 1, 0, 0);
	/* chat and completions: sl_usage_request, without injection */
	check_req_api(SL_API_COMPLETIONS, "{\"prompt\":\"abcdefgh\",\"stream\":true}", 1, 1, 2);
}

static void
test_api_scanner_other_apis_are_chat(void **state)
{
	struct sl_usage_scan s;

	(void)state;
	sl_usage_scan_init_api(&s, SL_API_EMBEDDINGS);
	assert_int_equal(s.api, 0);
	assert_int_equal(s.drop, 0);
	sl_usage_scan_free(&s);
	sl_usage_scan_init_api(&s, SL_API_CHAT);
	assert_int_equal(s.api, 0);
	sl_usage_scan_free(&s);
	/* chat's stream through init_api: as sl_usage_scan_init(s, 0) */
	check_api(SL_API_CHAT, "data: {\"choices\":[{\"delta\":{\"content\":\"abcd\"}}]}\n\n"
	    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n",
	    1, 3, 1, 4);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scan_usage_found_at_every_split_kept_byte_identical),
		cmocka_unit_test(test_json_wide_is_what_python_decodes_as_utf16_or_utf32),
		cmocka_unit_test(test_scan_drop_removes_exactly_the_usage_event_at_every_split),
		cmocka_unit_test(test_scan_crlf_and_cr_line_ends),
		cmocka_unit_test(test_scan_usage_null_events_ignored_estimate_from_content),
		cmocka_unit_test(test_scan_malformed_usage_event_gives_no_usage),
		cmocka_unit_test(test_scan_data_without_space_comments_and_other_fields),
		cmocka_unit_test(test_scan_escapes_count_one_byte_and_quotes_do_not_confuse),
		cmocka_unit_test(test_scan_tokens_at_every_block_offset),
		cmocka_unit_test(test_scan_usage_object_read_as_jansson_reads_it),
		cmocka_unit_test(test_scan_completions_text_counted),
		cmocka_unit_test(test_scan_usage_with_nonempty_choices_counted_not_dropped),
		cmocka_unit_test(test_scan_usage_split_over_two_data_lines),
		cmocka_unit_test(test_scan_every_usage_event_is_dropped_last_usage_counts),
		cmocka_unit_test(test_scan_usage_event_with_other_fields_first_is_dropped_whole),
		cmocka_unit_test(test_scan_estimate_counts_tool_call_arguments_and_reasoning),
		cmocka_unit_test(test_json_content_counts_tool_call_arguments_and_reasoning),
		cmocka_unit_test(test_scan_drop_cuts_continuous_usage_objects),
		cmocka_unit_test(test_scan_drop_cuts_usage_null_members_at_every_split),
		cmocka_unit_test(test_scan_drop_cuts_usage_null_around_the_dropped_usage_event),
		cmocka_unit_test(test_scan_drop_cuts_more_members_than_ranges_in_one_read),
		cmocka_unit_test(test_scan_member_longer_than_the_hold_bound_is_kept),
		cmocka_unit_test(test_scan_big_event_is_flushed_hold_bounded),
		cmocka_unit_test(test_scan_hold_is_released_before_next_event_is_held),
		cmocka_unit_test(test_scan_event_templates_take_what_a_scan_takes),
		cmocka_unit_test(test_scan_struct_is_small),
		cmocka_unit_test(test_req_inject_without_stream_options),
		cmocka_unit_test(test_req_inject_inside_stream_options),
		cmocka_unit_test(test_req_include_usage_false_or_null_replaced),
		cmocka_unit_test(test_req_untouched_when_asked_not_streamed_or_odd_types),
		cmocka_unit_test(test_req_stream_and_include_usage_read_as_a_python_runner_reads_them),
		cmocka_unit_test(test_req_prompt_estimated_from_the_body),
		cmocka_unit_test(test_usage_sane_bound),
		cmocka_unit_test(test_req_non_objects_not_counted),
		cmocka_unit_test(test_req_strings_mentioning_stream_options_do_not_confuse),
		cmocka_unit_test(test_req_duplicate_keys_last_wins),
		cmocka_unit_test(test_req_deep_nesting_refused_without_crash),
		cmocka_unit_test(test_req_python_extensions_counted),
		cmocka_unit_test(test_req_invalid_json_not_counted),
		cmocka_unit_test(test_req_nesting_limit),
		cmocka_unit_test(test_from_json_reads_usage),
		cmocka_unit_test(test_api_responses_usage_at_every_split),
		cmocka_unit_test(test_api_responses_cut_or_odd_streams),
		cmocka_unit_test(test_api_responses_completed_event_larger_than_64k),
		cmocka_unit_test(test_api_messages_usage_at_every_split),
		cmocka_unit_test(test_api_token_events_with_the_template_kept),
		cmocka_unit_test(test_api_json_bodies),
		cmocka_unit_test(test_api_prompt_estimates),
		cmocka_unit_test(test_api_scanner_other_apis_are_chat),
		cmocka_unit_test(test_meter_each_api_end_to_end),
		cmocka_unit_test(test_meter_requests_of_each_api_relayed_untouched),
		cmocka_unit_test(test_meter_json_answer_too_large_is_estimated),
	};

	return sl_unit_run(tests);
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for the upstream HTTP/1.1 framing (src/upframe.c): the
 * response parser over every case issue 35 lists, each answer fed whole,
 * a byte at a time, in 7-byte reads, and with a sink that pauses after
 * every piece (the caller then feeds the rest later); all four must end
 * the same. Then the field store, the request head writer, the upstream
 * fields built from a client request, and the chunk framer.
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
#include "sl_upframe.h"

#define MAX_HEAD 256

/* What one run made of an answer. */
struct run {
	char body[8192];
	size_t body_len;
	int pause;             /* the sink pauses after every piece */
	int fail_at;           /* the sink fails on this piece (1-based) */
	int pieces;
	size_t pauses;
};

static int
sink(void *arg, const char *p, size_t n)
{
	struct run *g = arg;

	assert_true(n > 0);
	g->pieces++;
	if (g->fail_at != 0 && g->pieces == g->fail_at)
		return -1;
	assert_true(g->body_len + n <= sizeof(g->body));
	memcpy(g->body + g->body_len, p, n);
	g->body_len += n;
	if (g->pause) {
		g->pauses++;
		return SL_UPF_PAUSE;
	}
	return SL_UPF_GO;
}

/*
 * Drive r the way a connection does: bytes arrive `step` at a time (0: all
 * at once); unconsumed ones are kept and fed again first; at HEAD_DONE the
 * caller continues; after DONE what still arrives is fed (and counted as
 * extra). eof: the runner closes after its last byte.
 */
static void
drive(struct sl_upf_resp *r, const char *in, size_t len, size_t step, int eof)
{
	size_t pos = 0, have = 0, n, spins = 0;

	for (;;) {
		if (pos == have || (r->state == SL_UPF_DONE && have < len)) {
			if (have == len)
				break;
			have = step == 0 || have + step > len ? len : have + step;
			if (r->state == SL_UPF_DONE) {
				/* The extra bytes: fed as they come. */
				n = sl_upf_resp_feed(r, in + pos, have - pos);
				assert_int_equal(n, 0);
				pos = have;
				continue;
			}
		}
		n = sl_upf_resp_feed(r, in + pos, have - pos);
		pos += n;
		if (r->state == SL_UPF_HEAD_DONE) {
			sl_upf_resp_continue(r);
			continue;
		}
		if (r->state == SL_UPF_ERROR || r->state == SL_UPF_DONE) {
			if (r->state == SL_UPF_DONE)
				pos = have;   /* counted as extra by the feed */
			if (r->state == SL_UPF_ERROR)
				return;
			continue;
		}
		assert_true(++spins < 100000);
	}
	if (eof)
		sl_upf_resp_eof(r);
}

/* The fields as "Name: value\n" lines. */
static void
fields_text(const struct sl_upf_fields *fs, char *out, size_t cap)
{
	const char *name, *value;
	size_t nl, vl, i, o = 0;

	out[0] = '\0';
	for (i = 0; sl_upf_fields_at(fs, i, &name, &nl, &value, &vl) == 0; i++) {
		assert_true(o + nl + vl + 4 < cap);
		memcpy(out + o, name, nl);
		o += nl;
		memcpy(out + o, ": ", 2);
		o += 2;
		memcpy(out + o, value, vl);
		o += vl;
		out[o++] = '\n';
		out[o] = '\0';
	}
}

struct want {
	enum sl_upf_state state;
	enum sl_upf_error error;
	int status;
	const char *reason;        /* NULL: not checked */
	const char *fields;        /* NULL: not checked */
	const char *body;
	int reusable;
	uint64_t extra;
	enum sl_upf_framing framing;
	unsigned interim;
};

/* One answer, four ways of feeding it; each must give w exactly. */
static void
expect_answer(const char *in, size_t len, int head_request, int eof,
    const struct want *w)
{
	static const struct { size_t step; int pause; } modes[] = {
		{ 0, 0 }, { 1, 0 }, { 7, 0 }, { 1, 1 }, { 0, 1 },
	};
	size_t m;

	for (m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		struct sl_upf_resp r;
		struct run g;
		char ftext[4096];

		memset(&g, 0, sizeof(g));
		g.pause = modes[m].pause;
		sl_upf_resp_init(&r, MAX_HEAD, head_request, sink, &g);
		drive(&r, in, len, modes[m].step, eof);
		if (r.state != w->state || r.error != w->error)
			fail_msg("mode %zu: state %d error %d (%s), want %d/%d",
			    m, r.state, r.error, r.why ? r.why : "-",
			    w->state, w->error);
		if (w->state != SL_UPF_ERROR || w->status != 0)
			assert_int_equal(r.status, w->status);
		if (w->reason != NULL)
			assert_string_equal(r.reason, w->reason);
		if (w->fields != NULL) {
			fields_text(&r.fields, ftext, sizeof(ftext));
			assert_string_equal(ftext, w->fields);
		}
		assert_int_equal(g.body_len, strlen(w->body));
		assert_memory_equal(g.body, w->body, g.body_len);
		assert_int_equal(r.body_bytes, g.body_len);
		if (w->state == SL_UPF_DONE) {
			assert_int_equal(r.reusable, w->reusable);
			assert_int_equal(r.extra, w->extra);
		}
		if (w->state != SL_UPF_ERROR) {
			assert_int_equal(r.framing, w->framing);
			assert_int_equal(r.interim, w->interim);
		}
		if (r.state == SL_UPF_ERROR)
			assert_non_null(r.why);
		sl_upf_resp_free(&r);
	}
}

#define S(lit) lit, sizeof(lit) - 1

#define DONE_OK(st, rsn, flds, bdy, reuse, xtra, frm, intr) \
	(&(const struct want){ SL_UPF_DONE, SL_UPF_E_NONE, st, rsn, flds, bdy, \
	    reuse, xtra, frm, intr })
#define FAILS(err, bdy) \
	(&(const struct want){ SL_UPF_ERROR, err, 0, NULL, NULL, bdy, 0, 0, 0, 0 })

/* ---- response: lengths ---- */

static void
test_content_length_body_is_exact_and_reusable(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
	    "Content-Length: 5\r\n\r\nhello"), 0, 0,
	    DONE_OK(200, "OK", "Content-Type: application/json\n", "hello", 1,
	    0, SL_UPF_LENGTH, 0));
}

static void
test_content_length_zero_has_no_body(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), 0, 0,
	    DONE_OK(200, "OK", "", "", 1, 0, SL_UPF_NO_BODY, 0));
}

static void
test_body_past_content_length_is_extra_and_not_reusable(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiEXTRA"),
	    0, 0, DONE_OK(200, "OK", "", "hi", 0, 5, SL_UPF_LENGTH, 0));
}

static void
test_bytes_after_done_in_a_later_feed_count_as_extra(void **state)
{
	struct sl_upf_resp r;
	struct run g;
	static const char a[] = "HTTP/1.1 204 No Content\r\n\r\n";

	(void)state;
	memset(&g, 0, sizeof(g));
	sl_upf_resp_init(&r, MAX_HEAD, 0, sink, &g);
	drive(&r, a, sizeof(a) - 1, 0, 0);
	assert_int_equal(r.state, SL_UPF_DONE);
	assert_int_equal(r.reusable, 1);
	assert_int_equal(sl_upf_resp_feed(&r, "X", 1), 0);
	assert_int_equal(r.extra, 1);
	assert_int_equal(r.reusable, 0);
	sl_upf_resp_free(&r);
}

static void
test_eof_before_content_length_is_truncation(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello"),
	    0, 1, FAILS(SL_UPF_E_TRUNCATED, "hello"));
}

static void
test_runner_lying_about_length_then_closing_is_truncation(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"), 0, 1,
	    FAILS(SL_UPF_E_TRUNCATED, ""));
}

static void
test_eof_after_a_complete_answer_only_forbids_reuse(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"), 0, 1,
	    DONE_OK(200, "OK", "", "hi", 0, 0, SL_UPF_LENGTH, 0));
}

/* ---- response: read until close ---- */

static void
test_body_without_length_runs_until_close(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
	    "\r\ndata: 1\n\ndata: 2\n\n"), 0, 1,
	    DONE_OK(200, "OK", "Content-Type: text/event-stream\n",
	    "data: 1\n\ndata: 2\n\n", 0, 0, SL_UPF_UNTIL_CLOSE, 0));
}

static void
test_body_without_length_is_not_done_before_close(void **state)
{
	struct sl_upf_resp r;
	struct run g;
	static const char a[] = "HTTP/1.1 200 OK\r\n\r\nabc";

	(void)state;
	memset(&g, 0, sizeof(g));
	sl_upf_resp_init(&r, MAX_HEAD, 0, sink, &g);
	drive(&r, a, sizeof(a) - 1, 1, 0);
	assert_int_equal(r.state, SL_UPF_BODY);
	assert_int_equal(g.body_len, 3);
	sl_upf_resp_eof(&r);
	assert_int_equal(r.state, SL_UPF_DONE);
	assert_int_equal(r.reusable, 0);
	assert_true(r.meta.is_sse == 0);
	sl_upf_resp_free(&r);
}

static void
test_eof_with_no_byte_is_closed_not_truncated(void **state)
{
	struct sl_upf_resp r;

	(void)state;
	sl_upf_resp_init(&r, MAX_HEAD, 0, NULL, NULL);
	sl_upf_resp_eof(&r);
	assert_int_equal(r.state, SL_UPF_ERROR);
	assert_int_equal(r.error, SL_UPF_E_CLOSED);
	sl_upf_resp_free(&r);
}

static void
test_eof_inside_a_head_is_truncation(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Le"), 0, 1,
	    FAILS(SL_UPF_E_TRUNCATED, ""));
	expect_answer(S("\r\n"), 0, 1, FAILS(SL_UPF_E_TRUNCATED, ""));
}

/* ---- response: chunked ---- */

static void
test_chunked_with_extensions_and_trailers(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
	    "X-A: 1\r\n\r\n"
	    "5;name=val\r\nhello\r\n6 ; x=\"q\"\r\n world\r\n"
	    "0;last\r\nX-Trailer: t\r\nServer-Timing: a;dur=1\r\n\r\n"), 0, 0,
	    DONE_OK(200, "OK", "X-A: 1\n", "hello world", 1, 0, SL_UPF_CHUNKED,
	    0));
}

static void
test_chunked_sizes_in_any_case_and_leading_zeros(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "00A\r\n0123456789\r\na\r\nabcdefghij\r\n000\r\n\r\n"), 0, 0,
	    DONE_OK(200, "OK", "", "0123456789abcdefghij", 1, 0,
	    SL_UPF_CHUNKED, 0));
}

static void
test_bytes_after_the_last_chunk_are_extra(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\r\nhi\r\n0\r\n\r\nHTTP/1.1 200"), 0, 0,
	    DONE_OK(200, "OK", "", "hi", 0, 12, SL_UPF_CHUNKED, 0));
}

static void
test_eof_inside_chunked_is_truncation(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "5\r\nhel"), 0, 1, FAILS(SL_UPF_E_TRUNCATED, "hel"));
	/* Whole chunks but no last chunk: cut, not complete. */
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "5\r\nhello\r\n"), 0, 1, FAILS(SL_UPF_E_TRUNCATED, "hello"));
	/* In the trailer. */
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "5\r\nhello\r\n0\r\nX: 1\r\n"), 0, 1,
	    FAILS(SL_UPF_E_TRUNCATED, "hello"));
}

static void
test_anything_but_crlf_after_chunk_data_is_refused(void **state)
{
	(void)state;
	/* http-parser alone takes any two bytes here for CRLF. */
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "5\r\nhelloXY0\r\n\r\n"), 0, 0, FAILS(SL_UPF_E_MALFORMED, "hello"));
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "5\r\nhello\rX0\r\n\r\n"), 0, 0, FAILS(SL_UPF_E_MALFORMED, "hello"));
}

static void
test_bad_chunk_size_lines_are_refused(void **state)
{
	char big[SL_UPF_CHUNK_LINE_MAX + 200];
	size_t n;

	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "5\nhello\r\n0\r\n\r\n"), 0, 0, FAILS(SL_UPF_E_MALFORMED, ""));
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "5\rXhello\r\n0\r\n\r\n"), 0, 0, FAILS(SL_UPF_E_MALFORMED, ""));
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "g\r\n"), 0, 0, FAILS(SL_UPF_E_MALFORMED, ""));
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "5;a\x01\r\nhello\r\n0\r\n\r\n"), 0, 0,
	    FAILS(SL_UPF_E_MALFORMED, ""));
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "fffffffffffffffff\r\n"), 0, 0, FAILS(SL_UPF_E_MALFORMED, ""));
	/* An endless chunk extension. */
	n = (size_t)snprintf(big, sizeof(big),
	    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;");
	memset(big + n, 'x', sizeof(big) - n);
	expect_answer(big, sizeof(big), 0, 0, FAILS(SL_UPF_E_MALFORMED, ""));
}

static void
test_trailer_framing_fields_forbid_reuse(void **state)
{
	(void)state;
	/* http-parser reads Connection and Transfer-Encoding in trailers. */
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\r\nhi\r\n0\r\nConnection: close\r\n\r\n"), 0, 0,
	    DONE_OK(200, "OK", "", "hi", 0, 0, SL_UPF_CHUNKED, 0));
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\r\nhi\r\n0\r\nTransfer-Encoding-X: 1\r\n\r\n"), 0, 0,
	    DONE_OK(200, "OK", "", "hi", 0, 0, SL_UPF_CHUNKED, 0));
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\r\nhi\r\n0\r\nContent-Length: x\r\n\r\n"), 0, 0,
	    FAILS(SL_UPF_E_MALFORMED, "hi"));
}

static void
test_interim_connection_close_is_not_the_answers(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 100 Continue\r\nConnection: close\r\n\r\n"
	    "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"), 0, 0,
	    DONE_OK(200, "OK", "", "x", 1, 0, SL_UPF_LENGTH, 1));
}

static void
test_trailer_is_checked_like_a_head_and_bounded(void **state)
{
	char big[MAX_HEAD + 300];
	size_t n;

	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\r\nhi\r\n0\r\nX: a\r\n b\r\n\r\n"), 0, 0,
	    FAILS(SL_UPF_E_MALFORMED, "hi"));
	n = (size_t)snprintf(big, sizeof(big),
	    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\r\nhi\r\n0\r\nX: ");
	memset(big + n, 'v', sizeof(big) - n);
	expect_answer(big, sizeof(big), 0, 0,
	    FAILS(SL_UPF_E_HEAD_TOO_LARGE, "hi"));
}

/* ---- response: answers without a body ---- */

static void
test_head_answer_has_no_body_whatever_the_head_says(void **state)
{
	struct sl_upf_resp r;

	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"), 1, 0,
	    DONE_OK(200, "OK", "", "", 1, 0, SL_UPF_NO_BODY, 0));
	expect_answer(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
	    1, 0, DONE_OK(200, "OK", "", "", 1, 0, SL_UPF_NO_BODY, 0));
	/* A runner that sends the body anyway: the connection is spent. */
	expect_answer(S("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
	    "0123456789"), 1, 0,
	    DONE_OK(200, "OK", "", "", 0, 10, SL_UPF_NO_BODY, 0));
	/* The declared length stays readable. */
	sl_upf_resp_init(&r, MAX_HEAD, 1, NULL, NULL);
	drive(&r, S("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"), 0, 0);
	assert_int_equal(r.content_length, 10);
	sl_upf_resp_free(&r);
}

static void
test_204_and_304_have_no_body(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 204 No Content\r\n\r\n"), 0, 0,
	    DONE_OK(204, "No Content", "", "", 1, 0, SL_UPF_NO_BODY, 0));
	expect_answer(S("HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n"
	    "abc"), 0, 0,
	    DONE_OK(204, "No Content", "", "", 0, 3, SL_UPF_NO_BODY, 0));
	expect_answer(S("HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n"
	    "Transfer-Encoding: chunked\r\n\r\n"), 0, 0,
	    DONE_OK(304, "Not Modified", "ETag: \"x\"\n", "", 1, 0,
	    SL_UPF_NO_BODY, 0));
}

/* ---- response: interim answers ---- */

static void
test_100_continue_is_skipped(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 100 Continue\r\n\r\n"
	    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"), 0, 0,
	    DONE_OK(200, "OK", "", "hi", 1, 0, SL_UPF_LENGTH, 1));
}

static void
test_other_interim_heads_are_dropped_with_their_fields(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 102 Processing\r\n\r\n"
	    "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
	    "HTTP/1.1 200 OK\r\nX-B: 2\r\nContent-Length: 1\r\n\r\nz"), 0, 0,
	    DONE_OK(200, "OK", "X-B: 2\n", "z", 1, 0, SL_UPF_LENGTH, 2));
}

static void
test_interim_heads_are_checked_too(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 103 Early Hints\r\nContent-Length: x\r\n\r\n"
	    "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), 0, 0,
	    FAILS(SL_UPF_E_MALFORMED, ""));
}

static void
test_101_and_endless_interim_heads_are_refused(void **state)
{
	char many[64 * (SL_UPF_MAX_INTERIM + 1) + 64];
	size_t n = 0, i;

	(void)state;
	expect_answer(S("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
	    "Connection: upgrade\r\n\r\n"), 0, 0,
	    FAILS(SL_UPF_E_UNSUPPORTED, ""));
	for (i = 0; i <= SL_UPF_MAX_INTERIM; i++)
		n += (size_t)snprintf(many + n, sizeof(many) - n,
		    "HTTP/1.1 100 Continue\r\n\r\n");
	n += (size_t)snprintf(many + n, sizeof(many) - n,
	    "HTTP/1.1 204 No Content\r\n\r\n");
	expect_answer(many, n, 0, 0, FAILS(SL_UPF_E_UNSUPPORTED, ""));
}

/* ---- response: keep-alive verdict ---- */

static void
test_connection_close_is_not_reusable_and_not_relayed(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nConnection: close\r\n"
	    "Content-Length: 2\r\n\r\nhi"), 0, 0,
	    DONE_OK(200, "OK", "", "hi", 0, 0, SL_UPF_LENGTH, 0));
	expect_answer(S("HTTP/1.1 200 OK\r\nConnection: x-a, Close\r\n"
	    "Content-Length: 2\r\n\r\nhi"), 0, 0,
	    DONE_OK(200, "OK", "", "hi", 0, 0, SL_UPF_LENGTH, 0));
}

static void
test_http10_answers_are_never_reusable(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi"), 0, 0,
	    DONE_OK(200, "OK", "", "hi", 0, 0, SL_UPF_LENGTH, 0));
	expect_answer(S("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n"
	    "Content-Length: 2\r\n\r\nhi"), 0, 0,
	    DONE_OK(200, "OK", "", "hi", 0, 0, SL_UPF_LENGTH, 0));
	expect_answer(S("HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nhi"), 0, 0,
	    FAILS(SL_UPF_E_UNSUPPORTED, ""));
}

static void
test_reset_reads_a_second_answer_on_the_same_connection(void **state)
{
	struct sl_upf_resp r;
	struct run g;

	(void)state;
	memset(&g, 0, sizeof(g));
	sl_upf_resp_init(&r, MAX_HEAD, 0, sink, &g);
	drive(&r, S("HTTP/1.1 200 OK\r\nX-One: 1\r\nContent-Length: 1\r\n\r\na"),
	    1, 0);
	assert_int_equal(r.state, SL_UPF_DONE);
	assert_int_equal(r.reusable, 1);
	sl_upf_resp_reset(&r, 0);
	drive(&r, S("HTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nb"), 0, 0);
	assert_int_equal(r.state, SL_UPF_DONE);
	assert_int_equal(r.status, 201);
	assert_int_equal(r.fields.n, 0);
	assert_memory_equal(g.body, "ab", 2);
	sl_upf_resp_free(&r);
}

/* ---- response: the head's fields ---- */

static void
test_hop_by_hop_and_connection_named_fields_are_dropped(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 200 OK\r\nX-Secret: 1\r\n"
	    "Connection: keep-alive, X-Secret\r\nKeep-Alive: timeout=5\r\n"
	    "X-Accel-Buffering: no\r\nX-Ok: 2  \r\nTE: trailers\r\n"
	    "Upgrade: h2\r\nProxy-Authenticate: Basic\r\nTrailer: X\r\n"
	    "Proxy-Connection: x\r\nContent-Length: 0\r\n\r\n"), 0, 0,
	    DONE_OK(200, "OK", "X-Ok: 2\n", "", 1, 0, SL_UPF_NO_BODY, 0));
}

static void
test_fields_keep_order_case_and_duplicates(void **state)
{
	(void)state;
	expect_answer(S("HTTP/1.1 429 Too Many Requests\n"
	    "set-cookie: a=1\nX-Empty:\nSet-Cookie: b=2\nRetry-After: 7\n\n"),
	    0, 1,
	    DONE_OK(429, "Too Many Requests",
	    "set-cookie: a=1\nX-Empty: \nSet-Cookie: b=2\nRetry-After: 7\n", "",
	    0, 0, SL_UPF_UNTIL_CLOSE, 0));
}

static void
test_meta_records_what_the_exchange_asks(void **state)
{
	struct sl_upf_resp r;
	size_t vl;
	const char *v;

	(void)state;
	sl_upf_resp_init(&r, MAX_HEAD, 0, NULL, NULL);
	drive(&r, S("HTTP/1.1 503 Busy\r\nRetry-After: 12\r\n"
	    "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
	    "Content-Encoding: gzip\r\nContent-Length: 0\r\n\r\n"), 1, 0);
	assert_int_equal(r.state, SL_UPF_DONE);
	assert_int_equal(r.meta.retry_after, 12);
	assert_int_equal(r.meta.is_sse, 1);
	assert_int_equal(r.meta.is_json, 0);
	assert_int_equal(r.meta.has_cache_control, 1);
	assert_int_equal(r.meta.encoded, 1);
	assert_int_equal(r.meta.content_length, 0);
	v = sl_upf_fields_get(&r.fields, "content-type", &vl);
	assert_non_null(v);
	assert_int_equal(vl, 17);
	assert_memory_equal(v, "text/event-stream", 17);
	assert_null(sl_upf_fields_get(&r.fields, "content-length", &vl));
	sl_upf_resp_free(&r);
}

static void
test_reason_is_kept_like_today(void **state)
{
	char line[300];
	size_t n;

	(void)state;
	expect_answer(S("HTTP/1.1 200   Fine \x80 day\r\nContent-Length: 0\r\n\r\n"),
	    0, 0, DONE_OK(200, "Fine   day", "", "", 1, 0, SL_UPF_NO_BODY, 0));
	expect_answer(S("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n"), 0, 0,
	    DONE_OK(200, "", "", "", 1, 0, SL_UPF_NO_BODY, 0));
	n = (size_t)snprintf(line, sizeof(line), "HTTP/1.1 200 %0100d\r\n"
	    "Content-Length: 0\r\n\r\n", 0);
	expect_answer(line, n, 0, 0, DONE_OK(200,
	    "000000000000000000000000000000000000000000000000000000000000000",
	    "", "", 1, 0, SL_UPF_NO_BODY, 0));
}

static void
test_head_over_max_header_bytes_is_refused(void **state)
{
	char h[MAX_HEAD + 64];
	size_t n, pre;

	(void)state;
	/* Exactly the limit: accepted. */
	pre = (size_t)snprintf(h, sizeof(h), "HTTP/1.1 204 No Content\r\nX: ");
	n = MAX_HEAD - pre - 4;
	memset(h + pre, 'v', n);
	memcpy(h + pre + n, "\r\n\r\n", 4);
	expect_answer(h, MAX_HEAD, 0, 0,
	    DONE_OK(204, "No Content", NULL, "", 1, 0, SL_UPF_NO_BODY, 0));
	/* One byte more. */
	memset(h + pre, 'v', n + 1);
	memcpy(h + pre + n + 1, "\r\n\r\n", 4);
	expect_answer(h, MAX_HEAD + 1, 0, 0,
	    FAILS(SL_UPF_E_HEAD_TOO_LARGE, ""));
	/* An endless head, never ended. */
	memset(h, 'a', sizeof(h));
	memcpy(h, "HTTP/1.1 200 OK\r\nX: ", 20);
	expect_answer(h, sizeof(h), 0, 0, FAILS(SL_UPF_E_HEAD_TOO_LARGE, ""));
}

static void
test_malformed_heads_are_refused(void **state)
{
	static const char *const bad[] = {
		"XYZ 200 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\x01" "b\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX : a\r\n\r\n",
		"HTTP/1.1 200 OK\r\nBad Name: a\r\n\r\n",
		"HTTP/1.1 200 OK\r\n: a\r\n\r\n",
		"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
		"HTTP/1.1 20 OK\r\n\r\n",
		"HTTP/1.1 0200 OK\r\n\r\n",
		"HTTP/1.1  200 OK\r\n\r\n",
		"HTTP/1.1 099 Low\r\n\r\n",
		"HTTP/1.1\r\n\r\n",
		"HTTP/1.1 2x0 OK\r\n\r\n",
		"HTTP/11 200 OK\r\n\r\n",
		"HTP/T1.1 200 OK\r\n\r\n",   /* http-parser takes it */
		"HXXX/1.1 200 OK\r\n\r\n",
		"http/1.1 200 OK\r\n\r\n",
		"HTTP/1.1 200 O\x7fK\r\n\r\n",
		"\rHTTP/1.1 200 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: \0\r\n\r\n",
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size_t len = strlen(bad[i]);

		if (i == sizeof(bad) / sizeof(bad[0]) - 1)
			len = 25;   /* the NUL is part of it */
		expect_answer(bad[i], len, 0, 0, FAILS(SL_UPF_E_MALFORMED, ""));
	}
}

static void
test_leading_empty_lines_before_the_status_are_skipped(void **state)
{
	(void)state;
	expect_answer(S("\r\n\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"),
	    0, 0, DONE_OK(200, "OK", "", "x", 1, 0, SL_UPF_LENGTH, 0));
}

static void
test_framing_conflicts_are_refused(void **state)
{
	static const char *const bad[] = {
		/* duplicate, even equal: http-parser refuses both */
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi",
		"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nhi",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
		    "Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
		    "Content-Length: 2\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhi",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
		    "2\r\nhi\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
		    "Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1234567890123456789\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\t\r\n\r\nhi",
		/* http-parser reads it as chunked-less; the rule as chunked */
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\t\r\n\r\n"
		    "2\r\nhi\r\n0\r\n\r\n",
		/* any name starting so is a Transfer-Encoding to http-parser */
		"HTTP/1.1 200 OK\r\nTransfer-Encodingx: y\r\n"
		    "Content-Length: 2\r\n\r\nhi",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
		    "Transfer-Encodingx: y\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_answer(bad[i], strlen(bad[i]), 0, 0,
		    FAILS(SL_UPF_E_MALFORMED, ""));
}

/* ---- response: pausing ---- */

static void
test_a_paused_sink_stops_the_feed_and_the_rest_comes_later(void **state)
{
	static const char a[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"
	    "\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n";
	struct sl_upf_resp r;
	struct run g;
	size_t pos = 0, n;

	(void)state;
	memset(&g, 0, sizeof(g));
	g.pause = 1;
	sl_upf_resp_init(&r, MAX_HEAD, 0, sink, &g);
	n = sl_upf_resp_feed(&r, a, sizeof(a) - 1);
	assert_int_equal(r.state, SL_UPF_HEAD_DONE);
	pos += n;
	sl_upf_resp_continue(&r);
	n = sl_upf_resp_feed(&r, a + pos, sizeof(a) - 1 - pos);
	pos += n;
	/* One piece delivered, the rest left with the caller. */
	assert_int_equal(r.state, SL_UPF_BODY);
	assert_int_equal(g.body_len, 3);
	assert_true(pos < sizeof(a) - 1);
	/* Later: the same bytes again. */
	n = sl_upf_resp_feed(&r, a + pos, sizeof(a) - 1 - pos);
	pos += n;
	assert_int_equal(g.body_len, 6);
	assert_memory_equal(g.body, "abcdef", 6);
	n = sl_upf_resp_feed(&r, a + pos, sizeof(a) - 1 - pos);
	pos += n;
	assert_int_equal(r.state, SL_UPF_DONE);
	assert_int_equal(pos, sizeof(a) - 1);
	assert_int_equal(r.reusable, 1);
	assert_int_equal(r.extra, 0);
	sl_upf_resp_free(&r);
}

static void
test_a_pause_on_the_last_length_byte_completes_on_the_next_feed(void **state)
{
	static const char a[] = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc";
	struct sl_upf_resp r;
	struct run g;
	size_t pos = 0;

	(void)state;
	memset(&g, 0, sizeof(g));
	g.pause = 1;
	sl_upf_resp_init(&r, MAX_HEAD, 0, sink, &g);
	pos += sl_upf_resp_feed(&r, a, sizeof(a) - 1);
	sl_upf_resp_continue(&r);
	pos += sl_upf_resp_feed(&r, a + pos, sizeof(a) - 1 - pos);
	assert_int_equal(g.body_len, 3);
	assert_int_equal(r.state, SL_UPF_BODY);
	pos += sl_upf_resp_feed(&r, a + pos, sizeof(a) - 1 - pos);
	assert_int_equal(r.state, SL_UPF_DONE);
	assert_int_equal(pos, sizeof(a) - 1);
	assert_int_equal(g.body_len, 3);   /* nothing given twice */
	assert_int_equal(r.reusable, 1);
	sl_upf_resp_free(&r);
}

static void
test_a_failing_sink_fails_the_answer(void **state)
{
	static const char a[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"
	    "\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n";
	struct sl_upf_resp r;
	struct run g;

	(void)state;
	memset(&g, 0, sizeof(g));
	g.fail_at = 2;
	sl_upf_resp_init(&r, MAX_HEAD, 0, sink, &g);
	drive(&r, a, sizeof(a) - 1, 0, 0);
	assert_int_equal(r.state, SL_UPF_ERROR);
	assert_int_equal(r.error, SL_UPF_E_SINK);
	assert_int_equal(g.body_len, 3);
	assert_int_equal(sl_upf_resp_feed(&r, "x", 1), 0);
	sl_upf_resp_free(&r);
}

/* ---- field store ---- */

static void
test_field_store_adds_finds_and_caps(void **state)
{
	struct sl_upf_fields fs;
	const char *n, *v;
	size_t nl, vl;

	(void)state;
	sl_upf_fields_init(&fs, 16);
	assert_int_equal(sl_upf_fields_add(&fs, "Ab", 2, "123", 3), 0);
	assert_int_equal(sl_upf_fields_add(&fs, "cd", 2, "", 0), 0);
	assert_int_equal(sl_upf_fields_add(&fs, "toolong", 7, "xxxxx", 5), -1);
	assert_int_equal(fs.n, 2);
	assert_int_equal(sl_upf_fields_add(&fs, "e", 1, "f", 1), 0);
	v = sl_upf_fields_get(&fs, "ab", &vl);
	assert_non_null(v);
	assert_int_equal(vl, 3);
	assert_memory_equal(v, "123", 3);
	assert_null(sl_upf_fields_get(&fs, "zz", &vl));
	assert_int_equal(sl_upf_fields_at(&fs, 2, &n, &nl, &v, &vl), 0);
	assert_int_equal(nl, 1);
	assert_memory_equal(n, "e", 1);
	assert_int_equal(sl_upf_fields_at(&fs, 3, &n, &nl, &v, &vl), -1);
	sl_upf_fields_clear(&fs);
	assert_int_equal(fs.n, 0);
	assert_int_equal(sl_upf_fields_add(&fs, "0123456789", 10, "abcdef", 6),
	    0);
	sl_upf_fields_free(&fs);
}

/* ---- request writer ---- */

static void
test_request_head_with_length_is_exact(void **state)
{
	struct sl_upf_fields fs;
	struct sl_upf_req_spec s = { 0 };
	const char *why = NULL;
	char *h;
	size_t len;
	static const char want[] =
	    "POST /v1/chat/completions HTTP/1.1\r\n"
	    "Host: 127.0.0.1:8000\r\n"
	    "Content-Type: application/json\r\n"
	    "X-Empty:\r\n"
	    "Content-Length: 1234\r\n"
	    "\r\n";

	(void)state;
	sl_upf_fields_init(&fs, 4096);
	assert_int_equal(sl_upf_fields_add(&fs, "Content-Type", 12,
	    "application/json", 16), 0);
	/* Framing and hop-by-hop fields never pass, whoever added them. */
	assert_int_equal(sl_upf_fields_add(&fs, "Content-Length", 14, "9", 1), 0);
	assert_int_equal(sl_upf_fields_add(&fs, "Connection", 10, "close", 5), 0);
	assert_int_equal(sl_upf_fields_add(&fs, "Transfer-Encoding", 17,
	    "chunked", 7), 0);
	assert_int_equal(sl_upf_fields_add(&fs, "host", 4, "evil", 4), 0);
	assert_int_equal(sl_upf_fields_add(&fs, "Expect", 6, "100-continue",
	    12), 0);
	assert_int_equal(sl_upf_fields_add(&fs, "X-Empty", 7, "", 0), 0);
	s.method = "POST";
	s.target = "/v1/chat/completions";
	s.target_len = strlen(s.target);
	s.host = "127.0.0.1:8000";
	s.fields = &fs;
	s.body = SL_UPF_BODY_LENGTH;
	s.content_length = 1234;
	h = sl_upf_req_head(&s, &len, &why);
	assert_non_null(h);
	assert_int_equal(len, sizeof(want) - 1);
	assert_memory_equal(h, want, len);
	free(h);
	sl_upf_fields_free(&fs);
}

static void
test_request_head_chunked_get_and_close(void **state)
{
	struct sl_upf_req_spec s = { 0 };
	const char *why = NULL;
	char *h;
	size_t len;

	(void)state;
	s.method = "PUT";
	s.target = "/x?a=1";
	s.target_len = 6;
	s.host = "runner";
	s.body = SL_UPF_BODY_CHUNKED;
	h = sl_upf_req_head(&s, &len, &why);
	assert_non_null(h);
	assert_string_equal(h, "PUT /x?a=1 HTTP/1.1\r\nHost: runner\r\n"
	    "Transfer-Encoding: chunked\r\n\r\n");
	free(h);
	s.method = "GET";
	s.body = SL_UPF_BODY_NONE;
	s.close = 1;
	h = sl_upf_req_head(&s, &len, &why);
	assert_non_null(h);
	assert_string_equal(h, "GET /x?a=1 HTTP/1.1\r\nHost: runner\r\n"
	    "Connection: close\r\n\r\n");
	free(h);
	s.body = SL_UPF_BODY_LENGTH;
	s.content_length = 0;
	s.close = 0;
	h = sl_upf_req_head(&s, &len, &why);
	assert_non_null(h);
	assert_string_equal(h, "GET /x?a=1 HTTP/1.1\r\nHost: runner\r\n"
	    "Content-Length: 0\r\n\r\n");
	free(h);
}

static void
test_request_head_refuses_injection(void **state)
{
	struct sl_upf_fields fs;
	struct sl_upf_req_spec s = { 0 };
	const char *why;
	size_t len;

	(void)state;
	sl_upf_fields_init(&fs, 4096);
	s.method = "POST";
	s.target = "/a";
	s.target_len = 2;
	s.host = "h";
	s.fields = &fs;
	assert_int_equal(sl_upf_fields_add(&fs, "X", 1, "a\r\nEvil: 1", 10), 0);
	why = NULL;
	assert_null(sl_upf_req_head(&s, &len, &why));
	assert_non_null(why);
	sl_upf_fields_clear(&fs);
	assert_int_equal(sl_upf_fields_add(&fs, "X Y", 3, "a", 1), 0);
	assert_null(sl_upf_req_head(&s, &len, &why));
	sl_upf_fields_clear(&fs);
	assert_int_equal(sl_upf_fields_add(&fs, "X", 1, "a\0b", 3), 0);
	assert_null(sl_upf_req_head(&s, &len, &why));
	sl_upf_fields_clear(&fs);
	s.target = "/a b";
	s.target_len = 4;
	assert_null(sl_upf_req_head(&s, &len, &why));
	s.target = "http://x/";
	s.target_len = 9;
	assert_null(sl_upf_req_head(&s, &len, &why));
	s.target = "/a";
	s.target_len = 2;
	s.host = "h\r\nX: 1";
	assert_null(sl_upf_req_head(&s, &len, &why));
	s.host = "h";
	s.method = "PO ST";
	assert_null(sl_upf_req_head(&s, &len, &why));
	s.method = "";
	assert_null(sl_upf_req_head(&s, &len, &why));
	sl_upf_fields_free(&fs);
}

/* The client request, parsed as the exchange parses it. */
static void
parse_req(struct sl_req *r, const char *text)
{
	size_t len = strlen(text), n;

	sl_req_init(r, 8192, 8192);
	n = sl_req_feed(r, text, len);
	assert_int_equal(r->state, SL_REQ_HEAD_DONE);
	sl_req_continue(r);
	n += sl_req_feed(r, text + n, len - n);
	assert_int_equal(r->state, SL_REQ_DONE);
	assert_int_equal(n, len);
}

static void
test_upstream_fields_follow_the_transfer_rules(void **state)
{
	struct sl_req r;
	struct sl_upf_fields fs;
	char text[2048];

	(void)state;
	parse_req(&r, "POST /v1/chat/completions HTTP/1.1\r\n"
	    "Host: gw\r\n"
	    "Authorization: Bearer client-key\r\n"
	    "X-Api-Key: other\r\n"
	    "Content-Type: application/json\r\n"
	    "X-Forwarded-For: 10.0.0.1\r\n"
	    "Connection: keep-alive, X-Hop\r\n"
	    "X-Hop: 1\r\n"
	    "Keep-Alive: timeout=5\r\n"
	    "Expect: 100-continue\r\n"
	    "Accept-Encoding: gzip\r\n"
	    "TE: trailers\r\n"
	    "X-Forwarded-For: 10.0.0.2\r\n"
	    "Accept: text/event-stream\r\n"
	    "Content-Length: 2\r\n"
	    "\r\n{}");
	sl_upf_fields_init(&fs, 8192);
	assert_int_equal(sl_upf_fields_from_req(&fs, &r, "127.0.0.9", 1,
	    "runner-key"), 0);
	fields_text(&fs, text, sizeof(text));
	assert_string_equal(text,
	    "Content-Type: application/json\n"
	    "Accept: text/event-stream\n"
	    "Accept-Encoding: identity\n"
	    "X-Forwarded-For: 10.0.0.1, 10.0.0.2, 127.0.0.9\n"
	    "Authorization: Bearer runner-key\n");
	/* Not identity, no key, no hops. */
	sl_req_free(&r);
	parse_req(&r, "GET /v1/models HTTP/1.1\r\nHost: gw\r\n"
	    "Accept-Encoding: gzip\r\n\r\n");
	assert_int_equal(sl_upf_fields_from_req(&fs, &r, "127.0.0.9", 0, NULL),
	    0);
	fields_text(&fs, text, sizeof(text));
	assert_string_equal(text, "Accept-Encoding: gzip\n"
	    "X-Forwarded-For: 127.0.0.9\n");
	assert_int_equal(sl_upf_req_framing(&r), SL_UPF_BODY_NONE);
	/* No peer and no hops: no X-Forwarded-For. */
	assert_int_equal(sl_upf_fields_from_req(&fs, &r, "", 0, NULL), 0);
	fields_text(&fs, text, sizeof(text));
	assert_string_equal(text, "Accept-Encoding: gzip\n");
	sl_req_free(&r);
	parse_req(&r, "POST /v1/x HTTP/1.1\r\nHost: gw\r\n"
	    "Content-Length: 0\r\n\r\n");
	assert_int_equal(sl_upf_req_framing(&r), SL_UPF_BODY_LENGTH);
	sl_req_free(&r);
	sl_upf_fields_free(&fs);
}

static void
test_chunk_framer_frames_pieces_and_the_end(void **state)
{
	char line[SL_UPF_CHUNK_LINE];
	struct iovec iov[3];

	(void)state;
	assert_int_equal(sl_upf_chunk(line, "hello", 5, iov), 3);
	assert_int_equal(iov[0].iov_len, 3);
	assert_memory_equal(iov[0].iov_base, "5\r\n", 3);
	assert_int_equal(iov[1].iov_len, 5);
	assert_memory_equal(iov[2].iov_base, "\r\n", 2);
	assert_int_equal(sl_upf_chunk(line, "x", 300, iov), 3);
	assert_memory_equal(iov[0].iov_base, "12c\r\n", 5);
	assert_int_equal(sl_upf_chunk(line, NULL, 0, iov), 1);
	assert_int_equal(iov[0].iov_len, 5);
	assert_memory_equal(iov[0].iov_base, "0\r\n\r\n", 5);
}

/* What the writer frames, the parser reads back (a runner's view aside). */
static void
test_writer_output_parses_as_a_request(void **state)
{
	struct sl_upf_fields fs;
	struct sl_upf_req_spec s = { 0 };
	struct sl_req r;
	const char *why, *v;
	char *h, buf[512], line[SL_UPF_CHUNK_LINE];
	struct iovec iov[3];
	size_t len, o, vl;
	int k, i;

	(void)state;
	sl_upf_fields_init(&fs, 4096);
	assert_int_equal(sl_upf_fields_add(&fs, "X-A", 3, "1", 1), 0);
	s.method = "POST";
	s.target = "/p";
	s.target_len = 2;
	s.host = "r:1";
	s.fields = &fs;
	s.body = SL_UPF_BODY_CHUNKED;
	h = sl_upf_req_head(&s, &len, &why);
	assert_non_null(h);
	memcpy(buf, h, len);
	o = len;
	free(h);
	k = sl_upf_chunk(line, "abc", 3, iov);
	for (i = 0; i < k; i++) {
		memcpy(buf + o, iov[i].iov_base, iov[i].iov_len);
		o += iov[i].iov_len;
	}
	k = sl_upf_chunk(line, NULL, 0, iov);
	memcpy(buf + o, iov[0].iov_base, iov[0].iov_len);
	o += iov[0].iov_len;
	buf[o] = '\0';
	parse_req(&r, buf);
	assert_int_equal(r.body_len, 3);
	assert_memory_equal(r.body, "abc", 3);
	v = sl_req_header(&r, "x-a", &vl);
	assert_non_null(v);
	assert_int_equal(vl, 1);
	v = sl_req_header(&r, "host", &vl);
	assert_int_equal(vl, 3);
	assert_memory_equal(v, "r:1", 3);
	sl_req_free(&r);
	sl_upf_fields_free(&fs);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_content_length_body_is_exact_and_reusable),
		cmocka_unit_test(test_content_length_zero_has_no_body),
		cmocka_unit_test(test_body_past_content_length_is_extra_and_not_reusable),
		cmocka_unit_test(test_bytes_after_done_in_a_later_feed_count_as_extra),
		cmocka_unit_test(test_eof_before_content_length_is_truncation),
		cmocka_unit_test(test_runner_lying_about_length_then_closing_is_truncation),
		cmocka_unit_test(test_eof_after_a_complete_answer_only_forbids_reuse),
		cmocka_unit_test(test_body_without_length_runs_until_close),
		cmocka_unit_test(test_body_without_length_is_not_done_before_close),
		cmocka_unit_test(test_eof_with_no_byte_is_closed_not_truncated),
		cmocka_unit_test(test_eof_inside_a_head_is_truncation),
		cmocka_unit_test(test_chunked_with_extensions_and_trailers),
		cmocka_unit_test(test_chunked_sizes_in_any_case_and_leading_zeros),
		cmocka_unit_test(test_bytes_after_the_last_chunk_are_extra),
		cmocka_unit_test(test_eof_inside_chunked_is_truncation),
		cmocka_unit_test(test_anything_but_crlf_after_chunk_data_is_refused),
		cmocka_unit_test(test_bad_chunk_size_lines_are_refused),
		cmocka_unit_test(test_trailer_is_checked_like_a_head_and_bounded),
		cmocka_unit_test(test_trailer_framing_fields_forbid_reuse),
		cmocka_unit_test(test_interim_connection_close_is_not_the_answers),
		cmocka_unit_test(test_head_answer_has_no_body_whatever_the_head_says),
		cmocka_unit_test(test_204_and_304_have_no_body),
		cmocka_unit_test(test_100_continue_is_skipped),
		cmocka_unit_test(test_other_interim_heads_are_dropped_with_their_fields),
		cmocka_unit_test(test_interim_heads_are_checked_too),
		cmocka_unit_test(test_101_and_endless_interim_heads_are_refused),
		cmocka_unit_test(test_connection_close_is_not_reusable_and_not_relayed),
		cmocka_unit_test(test_http10_answers_are_never_reusable),
		cmocka_unit_test(test_reset_reads_a_second_answer_on_the_same_connection),
		cmocka_unit_test(test_hop_by_hop_and_connection_named_fields_are_dropped),
		cmocka_unit_test(test_fields_keep_order_case_and_duplicates),
		cmocka_unit_test(test_meta_records_what_the_exchange_asks),
		cmocka_unit_test(test_reason_is_kept_like_today),
		cmocka_unit_test(test_head_over_max_header_bytes_is_refused),
		cmocka_unit_test(test_malformed_heads_are_refused),
		cmocka_unit_test(test_leading_empty_lines_before_the_status_are_skipped),
		cmocka_unit_test(test_framing_conflicts_are_refused),
		cmocka_unit_test(test_a_paused_sink_stops_the_feed_and_the_rest_comes_later),
		cmocka_unit_test(test_a_pause_on_the_last_length_byte_completes_on_the_next_feed),
		cmocka_unit_test(test_a_failing_sink_fails_the_answer),
		cmocka_unit_test(test_field_store_adds_finds_and_caps),
		cmocka_unit_test(test_request_head_with_length_is_exact),
		cmocka_unit_test(test_request_head_chunked_get_and_close),
		cmocka_unit_test(test_request_head_refuses_injection),
		cmocka_unit_test(test_upstream_fields_follow_the_transfer_rules),
		cmocka_unit_test(test_chunk_framer_frames_pieces_and_the_end),
		cmocka_unit_test(test_writer_output_parses_as_a_request),
	};

	return sl_unit_run(tests);
}

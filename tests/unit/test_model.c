/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for routing by model (src/model.c, issue 23): where the model
 * is read, how the body is rewritten, how targets are chosen and how a
 * request is routed.
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

#include "sl_config.h"
#include "sl_model.h"

static void
read_json(const char *body, struct sl_model_req *r)
{
	sl_model_read(body, strlen(body), "application/json", 16, r);
}

static void
test_read_first_top_level_member(void **state)
{
	struct sl_model_req r;

	(void)state;
	read_json("{\"messages\":[{\"model\":\"nested\"}],\"model\":\"a\","
	    "\"x\":{\"model\":\"b\"},\"model\":\"c\"}", &r);
	assert_int_equal(r.kind, SL_MODEL_NAMED);
	assert_int_equal(r.len, 1);
	assert_string_equal(r.name, "a");
	assert_int_equal(r.count, 2);
	/* Only nested ones: no model. */
	read_json("{\"x\":{\"model\":\"b\"},\"y\":[\"model\"]}", &r);
	assert_int_equal(r.kind, SL_MODEL_NONE);
	assert_int_equal(r.count, 0);
}

static void
test_read_decodes_escapes_in_key_and_value(void **state)
{
	struct sl_model_req r;

	(void)state;
	read_json("{\"mo\\u0064el\":\"g\\u0070t-4o\\/x\"}", &r);
	assert_int_equal(r.kind, SL_MODEL_NAMED);
	assert_string_equal(r.name, "gpt-4o/x");
	assert_int_equal(r.len, 8);
	/* A NUL inside the name is kept, and counted. */
	read_json("{\"model\":\"a\\u0000b\"}", &r);
	assert_int_equal(r.len, 3);
	assert_memory_equal(r.name, "a\0b", 3);
	/* "model " is another key. */
	read_json("{\"model \":\"a\"}", &r);
	assert_int_equal(r.kind, SL_MODEL_NONE);
}

static void
test_read_non_string_bad_json_and_no_body(void **state)
{
	struct sl_model_req r;

	(void)state;
	read_json("{\"model\":42}", &r);
	assert_int_equal(r.kind, SL_MODEL_NOT_STRING);
	read_json("{\"model\":null}", &r);
	assert_int_equal(r.kind, SL_MODEL_NOT_STRING);
	read_json("{\"model\":[\"a\"]}", &r);
	assert_int_equal(r.kind, SL_MODEL_NOT_STRING);
	/* The first counts, even when a later one is a string. */
	read_json("{\"model\":{},\"model\":\"a\"}", &r);
	assert_int_equal(r.kind, SL_MODEL_NOT_STRING);
	read_json("{\"model\":\"a\"", &r);
	assert_int_equal(r.kind, SL_MODEL_BAD_JSON);
	read_json("[{\"model\":\"a\"}]", &r);
	assert_int_equal(r.kind, SL_MODEL_BAD_JSON);
	read_json("{\"model\":\"a\"} x", &r);
	assert_int_equal(r.kind, SL_MODEL_BAD_JSON);
	sl_model_read(NULL, 0, NULL, 0, &r);
	assert_int_equal(r.kind, SL_MODEL_NONE);
}

static void
test_read_too_long_name(void **state)
{
	char body[SL_MODEL_NAME_MAX + 64];
	struct sl_model_req r;
	int n;

	(void)state;
	n = snprintf(body, sizeof(body), "{\"model\":\"");
	memset(body + n, 'x', SL_MODEL_NAME_MAX + 1);
	strcpy(body + n + SL_MODEL_NAME_MAX + 1, "\"}");
	read_json(body, &r);
	assert_int_equal(r.kind, SL_MODEL_NAMED);
	assert_int_equal(r.too_long, 1);
	assert_int_equal(r.len, SL_MODEL_NAME_MAX);
	body[n + SL_MODEL_NAME_MAX] = '"';
	body[n + SL_MODEL_NAME_MAX + 1] = '}';
	body[n + SL_MODEL_NAME_MAX + 2] = '\0';
	read_json(body, &r);
	assert_int_equal(r.too_long, 0);
	assert_int_equal(r.len, SL_MODEL_NAME_MAX);
}

#define CT "multipart/form-data; boundary=XyZ"

static void
test_read_multipart_model_field(void **state)
{
	static const char body[] =
	    "--XyZ\r\n"
	    "Content-Disposition: form-data; name=\"file\"; filename=\"model\"\r\n"
	    "Content-Type: audio/wav\r\n\r\n"
	    "RIFF....\r\n"
	    "--XyZ\r\n"
	    "content-disposition: form-data; name=\"model\"\r\n\r\n"
	    "whisper-1\r\n"
	    "--XyZ\r\n"
	    "Content-Disposition: form-data; name=\"language\"\r\n\r\n"
	    "en\r\n"
	    "--XyZ--\r\n";
	struct sl_model_req r;
	char *out;
	size_t olen;

	(void)state;
	sl_model_read(body, sizeof(body) - 1, CT, strlen(CT), &r);
	assert_int_equal(r.kind, SL_MODEL_NAMED);
	assert_int_equal(r.form, 1);
	assert_string_equal(r.name, "whisper-1");
	assert_int_equal(sl_model_rewrite(body, sizeof(body) - 1, &r,
	    "openai/whisper-large-v3", &out, &olen), 1);
	assert_int_equal(olen, sizeof(body) - 1 - 9 + 23);
	assert_non_null(strstr(out, "name=\"model\"\r\n\r\nopenai/whisper-large-v3\r\n"
	    "--XyZ\r\n"));
	assert_memory_equal(out, body, r.v.vs);
	free(out);
	/* A quoted boundary, spaces around '=' (Python drops them); no model. */
#define READ_S(b, ct) sl_model_read(b, sizeof(b) - 1, ct, sizeof(ct) - 1, &r)
	READ_S("--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n"
	    "1\r\n--b--\r\n", "Multipart/Form-Data; boundary = \"b\"");
	assert_int_equal(r.kind, SL_MODEL_NONE);
	/* name = "model", as the email package reads it; an epilogue. */
	READ_S("\r\n--b\r\nContent-Disposition: form-data; name = \"model\""
	    "\r\n\r\ntiny\r\n--b--\r\nepilogue --b\r\n",
	    "multipart/form-data; boundary=b");
	assert_int_equal(r.kind, SL_MODEL_NAMED);
	assert_string_equal(r.name, "tiny");
	/* A part without headers, an empty form. */
	READ_S("--b\r\n\r\nx\r\n--b--", "multipart/form-data;boundary=b");
	assert_int_equal(r.kind, SL_MODEL_NONE);
	READ_S("--b--\r\n", "multipart/form-data; boundary=b");
	assert_int_equal(r.kind, SL_MODEL_NONE);
#undef READ_S
}

/*
 * Issue 31: every multipart body a runner could read another way than
 * sluice is refused, whatever the tenant (SL_MODEL_AMBIGUOUS).
 */
static void
test_read_multipart_refuses_what_readers_read_differently(void **state)
{
	static const struct {
		const char *ct, *body, *why;
	} cases[] = {
		/* the black-box report: a second field, last wins in Python */
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
		  "whisper-small\r\n--b\r\nContent-Disposition: form-data; "
		  "name=\"model\"\r\n\r\nwhisper-large-private\r\n--b--\r\n",
		  "more than one 'model' form field" },
		{ "multipart/form-data; boundary=XX; boundary=YY",
		  "--YY\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
		  "p\r\n--YY--\r\n", "a Content-Type with two boundary parameters" },
		{ "multipart/form-data; boundary=b; BOUNDARY=c", "--b--",
		  "a Content-Type with two boundary parameters" },
		{ "multipart/form-data; boundary*=utf-8''b", "--b--",
		  "an encoded boundary (boundary*=)" },
		{ "multipart/form-data", "--b--",
		  "a multipart/form-data body without a boundary of 1 to 70 "
		  "characters" },
		{ "multipart/form-data; boundary=\"b", "--b--",
		  "a Content-Type sluice cannot read unambiguously" },
		{ "multipart/form-data; boundary=\"b\\\"c\"", "--b--",
		  "a Content-Type sluice cannot read unambiguously" },
		{ "multipart/form-data; boundary", "--b--",
		  "a Content-Type sluice cannot read unambiguously" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name*=utf-8''model\r\n\r\n"
		  "p\r\n--b--\r\n", "an encoded form field name (name*=), which "
		  "sluice does not decode" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name*0=\"mo\"; "
		  "name*1=\"del\"\r\n\r\np\r\n--b--\r\n", "an encoded form field "
		  "name (name*=), which sluice does not decode" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"x\"; name=\"model\""
		  "\r\n\r\np\r\n--b--\r\n", "a part that names its field twice" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"x\"\r\n"
		  "Content-Disposition: form-data; name=\"model\"\r\n\r\np\r\n--b--",
		  "a part with two Content-Disposition headers" },
		{ "multipart/form-data; boundary=b",
		  "--b\nContent-Disposition: form-data; name=\"model\"\n\np\n--b--\n",
		  "a line that ends in LF alone, not CRLF" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"model\"\n\np\r\n"
		  "--b--\r\n", "a part whose head does not end" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nX: 1\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
		  "p\r\n--b--\r\n", "a part header with a bare CR or LF" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data;\r\n name=\"model\"\r\n\r\n"
		  "p\r\n--b--\r\n", "a folded part header" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition : form-data; name=\"model\"\r\n\r\n"
		  "p\r\n--b--\r\n", "a part header that is not name: value" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"Model\"\r\n\r\n"
		  "p\r\n--b--\r\n", "a form field name that is 'model' only when "
		  "decoded, trimmed or case-folded" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"mod%65l\"\r\n\r\n"
		  "p\r\n--b--\r\n", "a form field name that is 'model' only when "
		  "decoded, trimmed or case-folded" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\" model\"\r\n\r\n"
		  "p\r\n--b--\r\n", "a form field name that is 'model' only when "
		  "decoded, trimmed or case-folded" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"mo\\del\"\r\n\r\n"
		  "p\r\n--b--\r\n", "a form field name with a backslash" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=<model>\r\n\r\n"
		  "p\r\n--b--\r\n", "a Content-Disposition sluice cannot read "
		  "unambiguously" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"model\"x\r\n\r\n"
		  "p\r\n--b--\r\n", "a Content-Disposition sluice cannot read "
		  "unambiguously" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n"
		  "Content-Transfer-Encoding: base64\r\n\r\ncA==\r\n--b--\r\n",
		  "a 'model' field with a Content-Transfer-Encoding" },
		/* a delimiter followed by something else: data to Python */
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n"
		  "x\r\n--bX\r\n--b\r\nContent-Disposition: form-data; "
		  "name=\"model\"\r\n\r\np\r\n--b--", "a boundary followed by more "
		  "than CRLF or '--'" },
		{ "multipart/form-data; boundary=b",
		  "preamble\r\n--b\r\nContent-Disposition: form-data; "
		  "name=\"model\"\r\n\r\np\r\n--b--", "a multipart body that does "
		  "not open with its boundary" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\np",
		  "a part that does not end with the boundary" },
		{ "multipart/form-data; boundary=b",
		  "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\np\r\n--b",
		  "a multipart body that ends without its close delimiter" },
		{ "application/x-www-form-urlencoded", "a=1&mod%65l=p",
		  "a 'model' in an application/x-www-form-urlencoded body, which "
		  "sluice does not read" },
		{ "application/x-www-form-urlencoded", "a=1;+MODEL+=p",
		  "a 'model' in an application/x-www-form-urlencoded body, which "
		  "sluice does not read" },
		{ "application/json", "\xff\xfe{\0\"\0m\0\"\0:\0\"\0p\0\"\0}\0",
		  "a JSON body in UTF-16 or UTF-32 (sluice reads UTF-8, as RFC "
		  "8259 requires)" },
	};
	struct sl_model_req r;
	size_t i, bl;

	(void)state;
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		bl = strlen(cases[i].body);
		if (cases[i].why[0] == 'a' && strstr(cases[i].why, "UTF-16"))
			bl = 20;
		sl_model_read(cases[i].body, bl, cases[i].ct, strlen(cases[i].ct),
		    &r);
		if (r.kind != SL_MODEL_AMBIGUOUS)
			fail_msg("case %zu: kind %d", i, (int)r.kind);
		assert_string_equal(r.why, cases[i].why);
	}
	/* A urlencoded body without a model key names none. */
	sl_model_read("a=1&models=2", 12, "application/x-www-form-urlencoded",
	    33, &r);
	assert_int_equal(r.kind, SL_MODEL_NONE);
}

static void
test_rewrite_sets_every_top_level_model(void **state)
{
	static const char one[] = "{ \"model\" : \"gpt-4o\", \"x\":{\"model\":\"k\"}}";
	static const char two[] = "{\"model\":\"a\",\"mo\\u0064el\":\"b\",\"n\":1}";
	struct sl_model_req r;
	char *out;
	size_t olen;

	(void)state;
	read_json(one, &r);
	assert_int_equal(sl_model_rewrite(one, strlen(one), &r, "meta/L\"3\\",
	    &out, &olen), 1);
	assert_int_equal(olen, strlen(
	    "{ \"model\" : \"meta/L\\\"3\\\\\", \"x\":{\"model\":\"k\"}}"));
	assert_memory_equal(out,
	    "{ \"model\" : \"meta/L\\\"3\\\\\", \"x\":{\"model\":\"k\"}}", olen);
	free(out);
	/* The name the client sent, once: nothing to do. */
	assert_int_equal(sl_model_rewrite(one, strlen(one), &r, "gpt-4o", &out,
	    &olen), 0);
	assert_null(out);
	/* Escaped as sent but the same name: still nothing. */
	read_json("{\"model\":\"gpt\\u002d4o\"}", &r);
	assert_int_equal(sl_model_rewrite("{\"model\":\"gpt\\u002d4o\"}", 23, &r,
	    "gpt-4o", &out, &olen), 0);
	/* Two members: both set, even to the same name. */
	read_json(two, &r);
	assert_int_equal(sl_model_rewrite(two, strlen(two), &r, "a", &out,
	    &olen), 1);
	assert_int_equal(olen, strlen("{\"model\":\"a\",\"mo\\u0064el\":\"a\",\"n\":1}"));
	assert_memory_equal(out, "{\"model\":\"a\",\"mo\\u0064el\":\"a\",\"n\":1}",
	    olen);
	free(out);
}

static const char yaml[] =
    "listen: \"127.0.0.1:8080\"\n"
    "upstreams:\n"
    "  big: {url: \"http://127.0.0.1:9000\"}\n"
    "  next: {url: \"http://127.0.0.1:9001\"}\n"
    "  small: {url: \"http://127.0.0.1:9002\"}\n"
    "models:\n"
    "  llama-70b:\n"
    "    aliases: [gpt-4o]\n"
    "    targets:\n"
    "      - {upstream: big, model: \"meta/70b\", weight: 90}\n"
    "      - {upstream: next, weight: 10}\n"
    "  llama-8b:\n"
    "    aliases: [small]\n"
    "    targets: [{upstream: small}]\n"
    "tenants:\n"
    "  acme: {keys: [k1], max_streams: 1, models: [llama-70b]}\n"
    "  open: {keys: [k2], max_streams: 1, upstream: small}\n";

struct fx {
	struct sl_config *cfg;
	struct sl_models *s;
};

static int
setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	struct sl_errors e = { NULL, 0 };

	if (f == NULL || sl_config_load_buffer("t", yaml, strlen(yaml), &f->cfg,
	    &e) != 0) {
		sl_errors_print(&e, stderr);
		sl_errors_free(&e);
		free(f);
		return -1;
	}
	f->s = sl_models_new(f->cfg);
	*state = f;
	return f->s == NULL ? -1 : 0;
}

static int
teardown(void **state)
{
	struct fx *f = *state;

	sl_models_free(f->s);
	sl_config_free(f->cfg);
	free(f);
	return 0;
}

static void
test_pick_splits_by_weight_smoothly(void **state)
{
	struct fx *f = *state;
	int n[2] = { 0, 0 }, i, run = 0, longest = 0, last = -1;

	for (i = 0; i < 1000; i++) {
		int t = (int)sl_models_pick(f->s, 0);

		n[t]++;
		run = t == last ? run + 1 : 1;
		last = t;
		if (t == 1 && run > longest)
			longest = run;
	}
	assert_int_equal(n[0], 900);
	assert_int_equal(n[1], 100);
	assert_int_equal(longest, 1);   /* spread, never two in a row */
	assert_int_equal(sl_models_pick(f->s, 1), 0);
}

static void
route(struct fx *f, size_t t, const char *body, struct sl_route *r)
{
	assert_int_equal(sl_model_route(f->s, f->cfg, t, body,
	    body ? strlen(body) : 0, "application/json", 16, r), 0);
}

static void
test_route_alias_allow_list_and_rewrite(void **state)
{
	struct fx *f = *state;
	struct sl_route r;

	/* An alias resolves; the first pick goes to big, rewritten. */
	route(f, 0, "{\"model\":\"gpt-4o\",\"stream\":true}", &r);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.model, 0);
	assert_int_equal(r.upstream, 0);
	assert_string_equal(r.sent, "meta/70b");
	assert_string_equal(r.client, "gpt-4o");
	assert_non_null(r.body);
	assert_int_equal(r.body_len, strlen("{\"model\":\"meta/70b\",\"stream\":true}"));
	assert_memory_equal(r.body, "{\"model\":\"meta/70b\",\"stream\":true}",
	    r.body_len);
	free(r.body);
	/* A model outside acme's list, by its name or its alias: 404. */
	route(f, 0, "{\"model\":\"small\"}", &r);
	assert_int_equal(r.status, 404);
	assert_string_equal(r.code, "model_not_found");
	assert_string_equal(r.message, "The model 'small' does not exist or you "
	    "do not have access to it.");
	assert_null(r.body);
	route(f, 0, "{\"model\":\"llama-8b\"}", &r);
	assert_int_equal(r.status, 404);
	/* Unknown: the same answer, the name escaped. */
	route(f, 1, "{\"model\":\"a\\\"b\\u0001\"}", &r);
	assert_int_equal(r.status, 404);
	assert_string_equal(r.message, "The model 'a\\\"b\\u0001' does not "
	    "exist or you do not have access to it.");
	/* Without a list: every model; the name as sent, not rewritten. */
	route(f, 1, "{\"model\":\"llama-8b\"}", &r);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.model, 1);
	assert_int_equal(r.upstream, 2);
	assert_null(r.body);
}

static void
test_route_without_a_model(void **state)
{
	struct fx *f = *state;
	struct sl_route r;

	/* acme has no upstream: 400. */
	route(f, 0, "{\"messages\":[]}", &r);
	assert_int_equal(r.status, 400);
	assert_string_equal(r.code, "bad_request");
	assert_string_equal(r.message, "you must provide a model parameter");
	route(f, 0, NULL, &r);
	assert_int_equal(r.status, 400);
	assert_string_equal(r.message, "you must provide a model parameter");
	route(f, 0, "not json", &r);
	assert_int_equal(r.status, 400);
	assert_string_equal(r.message, "the request body is not valid JSON");
	/* open has one: it serves them. */
	route(f, 1, "not json", &r);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.model, -1);
	assert_int_equal(r.upstream, 2);
	route(f, 1, NULL, &r);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.model, -1);
	/* A model that is not a string: 400 for everyone. */
	route(f, 1, "{\"model\":1}", &r);
	assert_int_equal(r.status, 400);
	assert_string_equal(r.message, "'model' must be a string");
}

static void
test_list_per_tenant_sorted(void **state)
{
	struct fx *f = *state;
	char *body, msg[400], want[512];
	size_t blen;
	long long t = (long long)f->cfg->loaded_at;

	assert_int_equal(sl_model_list(f->cfg, 0, "/v1/models", 10, &body, &blen,
	    msg, sizeof(msg)), 200);
	snprintf(want, sizeof(want), "{\"object\":\"list\",\"data\":["
	    "{\"id\":\"gpt-4o\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"sluice\"},"
	    "{\"id\":\"llama-70b\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"sluice\"}]}",
	    t, t);
	assert_int_equal(blen, strlen(want));
	assert_memory_equal(body, want, blen);
	free(body);
	assert_int_equal(sl_model_list(f->cfg, 1, "/v1/models", 10, &body, &blen,
	    msg, sizeof(msg)), 200);
	assert_non_null(memmem(body, blen, "\"id\":\"small\"", 12));
	free(body);
	assert_int_equal(sl_model_list(f->cfg, 0, "/v1/models/sm%61ll", 18, &body,
	    &blen, msg, sizeof(msg)), 404);
	assert_null(body);
	assert_string_equal(msg, "The model 'small' does not exist or you do "
	    "not have access to it.");
	assert_int_equal(sl_model_list(f->cfg, 1, "/v1/models/small", 16, &body,
	    &blen, msg, sizeof(msg)), 200);
	snprintf(want, sizeof(want), "{\"id\":\"small\",\"object\":\"model\","
	    "\"created\":%lld,\"owned_by\":\"sluice\"}", t);
	assert_int_equal(blen, strlen(want));
	assert_memory_equal(body, want, blen);
	free(body);
	/* Not these paths: nothing. */
	assert_int_equal(sl_model_list(f->cfg, 1, "/v1/modelsx", 11, &body,
	    &blen, msg, sizeof(msg)), 0);
	assert_int_equal(sl_model_list(f->cfg, 1, "/v1/chat/completions", 20,
	    &body, &blen, msg, sizeof(msg)), 0);
}

static const char fb_yaml[] =
    "listen: \"127.0.0.1:8080\"\n"
    "upstreams:\n"
    "  u0: {url: \"http://127.0.0.1:9000\"}\n"
    "  u1: {url: \"http://127.0.0.1:9001\"}\n"
    "  u2: {url: \"http://127.0.0.1:9002\"}\n"
    "models:\n"
    "  a:\n"
    "    targets:\n"
    "      - {upstream: u0, weight: 1}\n"
    "      - {upstream: u1, weight: 5}\n"
    "      - {upstream: u2, weight: 5}\n"
    "    fallback: [b, c]\n"
    "  b:\n"
    "    targets: [{upstream: u1}]\n"
    "    fallback: [d]\n"
    "  c:\n"
    "    targets: [{upstream: u2, weight: 2}, {upstream: u0, weight: 3}]\n"
    "  d:\n"
    "    targets: [{upstream: u0}]\n"
    "tenants:\n"
    "  all: {keys: [k1], max_streams: 1}\n"
    "  nob: {keys: [k2], max_streams: 1, models: [a, c, d]}\n";

static void
test_fallback_chain_order(void **state)
{
	struct sl_config *cfg;
	struct sl_errors e = { NULL, 0 };
	struct sl_model_pick *p;
	size_t n;

	(void)state;
	if (sl_config_load_buffer("t", fb_yaml, strlen(fb_yaml), &cfg, &e) != 0) {
		sl_errors_print(&e, stderr);
		fail();
	}
	/* From a's target 1: its others by weight (2, then 0), then b, c, d. */
	assert_int_equal(sl_model_chain(cfg, 0, 0, 1, &p, &n), 0);
	assert_int_equal(n, 6);
	assert_int_equal(p[0].model, 0);
	assert_int_equal(p[0].target, 2);
	assert_int_equal(p[1].model, 0);
	assert_int_equal(p[1].target, 0);
	assert_int_equal(p[2].model, 1);   /* b */
	assert_int_equal(p[3].model, 2);   /* c: weight 3 first */
	assert_int_equal(p[3].target, 1);
	assert_int_equal(p[4].model, 2);
	assert_int_equal(p[4].target, 0);
	assert_int_equal(p[5].model, 3);   /* d, through b */
	free(p);
	/* b is not allowed: skipped, and d, which only b names, with it. */
	assert_int_equal(sl_model_chain(cfg, 1, 0, 0, &p, &n), 0);
	assert_int_equal(n, 4);
	assert_int_equal(p[2].model, 2);
	assert_int_equal(p[3].model, 2);
	free(p);
	sl_config_free(cfg);
}

/*
 * The fallback rule (sluice.8, Fallback): a request moves to another
 * target only before the first byte of an answer went to its client, and
 * only when no runner can have started on it. exchange_tries.c asks
 * sl_model_may_fall_back before every fallback; what follows pins it.
 */
static const enum sl_fb_cause fb_causes[] = {
	SL_FB_NO_REPLICA, SL_FB_CONNECT, SL_FB_BUSY, SL_FB_STARTED
};

static void
test_fallback_never_after_the_first_byte_of_an_answer(void **state)
{
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(fb_causes) / sizeof(fb_causes[0]); i++)
		assert_int_equal(sl_model_may_fall_back(1, 1, fb_causes[i]), 0);
}

static void
test_fallback_only_where_no_runner_can_have_started(void **state)
{
	(void)state;
	assert_int_equal(sl_model_may_fall_back(1, 0, SL_FB_NO_REPLICA), 1);
	assert_int_equal(sl_model_may_fall_back(1, 0, SL_FB_CONNECT), 1);
	assert_int_equal(sl_model_may_fall_back(1, 0, SL_FB_BUSY), 1);
	assert_int_equal(sl_model_may_fall_back(1, 0, SL_FB_STARTED), 0);
}

static void
test_fallback_only_for_a_request_routed_by_model(void **state)
{
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(fb_causes) / sizeof(fb_causes[0]); i++) {
		assert_int_equal(sl_model_may_fall_back(0, 0, fb_causes[i]), 0);
		assert_int_equal(sl_model_may_fall_back(0, 1, fb_causes[i]), 0);
	}
}

static void
test_retarget_json_and_form(void **state)
{
	static const char form[] = "--b\r\nContent-Disposition: form-data; "
	    "name=\"model\"\r\n\r\nsmall\r\n--b--\r\n";
	char *body = strdup("{\"model\":\"x\",\"model\":\"y\",\"n\":{\"model\":1}}");
	size_t len = strlen(body);
	struct sl_model_span sp = { 0, 0, 0 };
	const char *at;

	(void)state;
	assert_int_equal(sl_model_retarget(&body, &len, &sp, "z/z"), 0);
	assert_int_equal(len, strlen("{\"model\":\"z/z\",\"model\":\"z/z\",\"n\":{\"model\":1}}"));
	assert_memory_equal(body, "{\"model\":\"z/z\",\"model\":\"z/z\",\"n\":{\"model\":1}}", len);
	free(body);
	body = strdup(form);
	len = strlen(form);
	at = strstr(form, "small");
	sp.form = 1;
	sp.vs = (size_t)(at - form);
	sp.ve = sp.vs + 5;
	assert_int_equal(sl_model_retarget(&body, &len, &sp, "big-one"), 0);
	assert_int_equal(len, strlen(form) + 2);
	assert_int_equal(sp.ve - sp.vs, 7);
	assert_memory_equal(body + sp.vs, "big-one\r\n--b--", 14);
	assert_int_equal(sl_model_retarget(&body, &len, &sp, "s"), 0);
	assert_memory_equal(body + sp.vs, "s\r\n--b--", 8);
	assert_int_equal(len, strlen(form) - 4);
	free(body);
}

/* ---- responses: the model set back (sl_mrw) ---------------------------- */

/* Feed in whole, or split at the given points; the concatenated output. */
static char *
mrw_run(int sse, const char *lit, const char *in, const size_t *cuts,
    size_t ncuts)
{
	struct sl_mrw m;
	struct sl_mrw_buf b = { NULL, 0, 0 };
	size_t n = strlen(in), at = 0, i, cap = n * 8 + 64, olen = 0;
	char *out = malloc(cap);
	int k;

	assert_non_null(out);
	sl_mrw_init(&m, sse, lit, strlen(lit));
	for (i = 0; i <= ncuts; i++) {
		size_t end = i < ncuts ? cuts[i] : n;
		struct sl_mrw saved = m;

		/* A pause undoes a feed: feeding twice after a restore is one. */
		k = sl_mrw_feed(&m, in + at, end - at, &b);
		assert_int_not_equal(k, -1);
		m = saved;
		k = sl_mrw_feed(&m, in + at, end - at, &b);
		assert_int_not_equal(k, -1);
		if (k == 0) {
			memcpy(out + olen, in + at, end - at);
			olen += end - at;
		} else {
			assert_true(olen + b.len < cap);
			memcpy(out + olen, b.p, b.len);
			olen += b.len;
		}
		at = end;
	}
	out[olen] = '\0';
	free(b.p);
	return out;
}

/* Whole, and split at every byte and at every pair of bytes: the same. */
static void
mrw_check(int sse, const char *lit, const char *in, const char *want)
{
	size_t n = strlen(in), i, j, cuts[2];
	char *o;

	o = mrw_run(sse, lit, in, NULL, 0);
	assert_string_equal(o, want);
	free(o);
	for (i = 0; i <= n; i++) {
		cuts[0] = i;
		o = mrw_run(sse, lit, in, cuts, 1);
		assert_string_equal(o, want);
		free(o);
		for (j = i; j <= n; j++) {
			cuts[1] = j;
			o = mrw_run(sse, lit, in, cuts, 2);
			assert_string_equal(o, want);
			free(o);
		}
	}
}

static void
test_mrw_json_top_level_only(void **state)
{
	(void)state;
	mrw_check(0, "\"llama\"",
	    "{\"id\":\"x\",\"model\":\"meta/Llama-3\",\"choices\":[{\"model\":"
	    "\"keep\",\"text\":\"\\\"model\\\": \\\"no\\\"\"}],\"x\":{\"model\":"
	    "\"inner\"}}",
	    "{\"id\":\"x\",\"model\":\"llama\",\"choices\":[{\"model\":"
	    "\"keep\",\"text\":\"\\\"model\\\": \\\"no\\\"\"}],\"x\":{\"model\":"
	    "\"inner\"}}");
	/*
	 * Spaces, an escaped quote in the value; the first member only (the
	 * rest of the answer passes unread).
	 */
	mrw_check(0, "\"a\\\"b\"",
	    " { \"modelx\":\"y\",\"mode\":\"y\", \"model\" : \"p\\\"q\\\\\" , "
	    "\"n\":1, \"model\":\"z\" }\n{\"model\":\"w\"}",
	    " { \"modelx\":\"y\",\"mode\":\"y\", \"model\" : \"a\\\"b\" , "
	    "\"n\":1, \"model\":\"z\" }\n{\"model\":\"w\"}");
	/* A first member that is not a string: left, and so is the rest. */
	mrw_check(0, "\"L\"", "{\"model\":null,\"model\":\"m\"}",
	    "{\"model\":null,\"model\":\"m\"}");
	mrw_check(0, "\"L\"", "{\"model\":{\"a\":1},\"model\":\"m\"}",
	    "{\"model\":{\"a\":1},\"model\":\"m\"}");
	/* A value that is a key elsewhere; a top-level array is not an object. */
	mrw_check(0, "\"L\"",
	    "[{\"model\":\"in-array\"}]{\"a\":\"model\",\"model\":\"m\"}",
	    "[{\"model\":\"in-array\"}]{\"a\":\"model\",\"model\":\"L\"}");
	/* A raw line end in a string (not JSON, but it must not hang). */
	mrw_check(0, "\"L\"", "{\"a\":\"x\ny\",\"model\":\"m\nn\",\"b\":\"\n\"}",
	    "{\"a\":\"x\ny\",\"model\":\"L\",\"b\":\"\n\"}");
	/* An escaped key is not matched (runners write keys plain). */
	mrw_check(0, "\"L\"", "{\"mo\\u0064el\":\"m\"}", "{\"mo\\u0064el\":\"m\"}");
}

static void
test_mrw_sse_data_lines(void **state)
{
	(void)state;
	mrw_check(1, "\"gpt-4o\"",
	    ": ping\n\nevent: x\r\ndata: {\"model\":\"meta/L\",\"choices\":[]}"
	    "\r\n\r\ndata:{\"model\":\"meta/L\"}\n\n"
	    "id: {\"model\":\"no\"}\ndata: [DONE]\n\n",
	    ": ping\n\nevent: x\r\ndata: {\"model\":\"gpt-4o\",\"choices\":[]}"
	    "\r\n\r\ndata:{\"model\":\"gpt-4o\"}\n\n"
	    "id: {\"model\":\"no\"}\ndata: [DONE]\n\n");
	/* A value cut by the line's end: the line ends, the next is read. */
	mrw_check(1, "\"n\"",
	    "data: {\"model\":\"unterminated\ndata: {\"model\":\"b\"}\n",
	    "data: {\"model\":\"n\"\ndata: {\"model\":\"n\"}\n");
	/* Each line's first member; a non-data line is not read. */
	mrw_check(1, "\"L\"",
	    "data: {\"model\":1,\"model\":\"a\"}\ndata: {\"model\":\"a\","
	    "\"model\":\"b\"}\r\nretry: {\"model\":\"c\"}\rdata:{\"model\":\"d\"}",
	    "data: {\"model\":1,\"model\":\"a\"}\ndata: {\"model\":\"L\","
	    "\"model\":\"b\"}\r\nretry: {\"model\":\"c\"}\rdata:{\"model\":\"L\"}");
	/* Shorter and longer names: lengths change, nothing else does. */
	mrw_check(1, "\"a-much-longer-alias-name\"",
	    "data: {\"model\":\"m\",\"usage\":{\"model\":\"m\"}}\n\n",
	    "data: {\"model\":\"a-much-longer-alias-name\",\"usage\":"
	    "{\"model\":\"m\"}}\n\n");
}

/* Fed one byte per read: the same. */
static void
mrw_check_bytewise(int sse, const char *lit, const char *in, const char *want)
{
	size_t n = strlen(in), i, *cuts;
	char *o;

	cuts = malloc((n + 1) * sizeof(*cuts));
	assert_non_null(cuts);
	for (i = 1; i < n; i++)
		cuts[i - 1] = i;
	o = mrw_run(sse, lit, in, cuts, n > 1 ? n - 1 : 0);
	assert_string_equal(o, want);
	free(o);
	free(cuts);
}

/*
 * A long answer: whole, one byte per read, and split in two at every
 * byte (every 3-way split too would be cubic in its length).
 */
static void
mrw_check_long(int sse, const char *lit, const char *in, const char *want)
{
	size_t n = strlen(in), i, cut;
	char *o;

	o = mrw_run(sse, lit, in, NULL, 0);
	assert_string_equal(o, want);
	free(o);
	mrw_check_bytewise(sse, lit, in, want);
	for (i = 0; i <= n; i++) {
		cut = i;
		o = mrw_run(sse, lit, in, &cut, 1);
		assert_string_equal(o, want);
		free(o);
	}
}

/* A short one: every 2-way and 3-way split, and one byte per read. */
static void
mrw_check_all(int sse, const char *lit, const char *in, const char *want)
{
	mrw_check(sse, lit, in, want);
	mrw_check_bytewise(sse, lit, in, want);
}

#define INTERNAL "meta-llama/Llama-3.1-8B-Instruct"
#define ALIAS "gpt-5"

/*
 * tmpl with every "@M@" replaced by model and "@T@" by text: an answer
 * as the runner sent it (model INTERNAL) and as the client must get it
 * (ALIAS), byte for byte the same elsewhere. malloc'd.
 */
static char *
mrw_subst(const char *tmpl, const char *model, const char *text)
{
	size_t cap = strlen(tmpl) + 1, ml = strlen(model), tl = strlen(text), n = 0;
	const char *p;
	char *o;

	for (p = tmpl; (p = strchr(p, '@')) != NULL; p++)
		cap += ml + tl;
	o = malloc(cap);
	assert_non_null(o);
	for (p = tmpl; *p != '\0'; p++) {
		if (strncmp(p, "@M@", 3) == 0 || strncmp(p, "@T@", 3) == 0) {
			const char *s = p[1] == 'M' ? model : text;
			size_t l = p[1] == 'M' ? ml : tl;

			memcpy(o + n, s, l);
			n += l;
			p += 2;
		} else
			o[n++] = *p;
	}
	o[n] = '\0';
	return o;
}

/*
 * A long answer's text, as a runner escapes it in JSON: quotes, line
 * ends, a backslash, UTF-8, and text that looks like the members set
 * back. malloc'd.
 */
static char *
mrw_long_text(void)
{
	static const char para[] = "Sure! Here is the config you asked for:\\n"
	    "\\n```json\\n{\\\"model\\\": \\\"" INTERNAL "\\\", \\\"response\\\": "
	    "{\\\"model\\\": \\\"x\\\"}, \\\"message\\\": {\\\"model\\\": \\\"y\\\"}}"
	    "\\n```\\nPaths use a backslash (C:\\\\models\\\\llama) \xe2\x80\x94 "
	    "caf\xc3\xa9, \\u00e9t\\u00e9. data: {\\\"model\\\":\\\"z\\\"}\\n\\n";
	size_t i, n = 0, cap = 12 * sizeof(para);
	char *o = malloc(cap);

	assert_non_null(o);
	for (i = 0; i < 10; i++) {
		memcpy(o + n, para, sizeof(para) - 1);
		n += sizeof(para) - 1;
	}
	o[n] = '\0';
	return o;
}

/* The response object as OpenAI sends it; @S@-less, status given. */
#define RESP_OBJ(status, output, usage) \
	"{\"id\":\"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b\"," \
	"\"object\":\"response\",\"created_at\":1741476542,\"status\":\"" status \
	"\",\"background\":false,\"error\":null,\"incomplete_details\":null," \
	"\"instructions\":\"You are a helpful assistant. Always say \\\"model" \
	"\\\": first.\",\"max_output_tokens\":null,\"model\":\"@M@\",\"output\":" \
	output ",\"parallel_tool_calls\":true,\"previous_response_id\":null," \
	"\"reasoning\":{\"effort\":null,\"summary\":null},\"service_tier\":" \
	"\"auto\",\"store\":true,\"temperature\":1.0,\"text\":{\"format\":{" \
	"\"type\":\"text\"}},\"tool_choice\":\"auto\",\"tools\":[],\"top_p\":1.0," \
	"\"truncation\":\"disabled\",\"usage\":" usage ",\"user\":null," \
	"\"metadata\":{}}"

#define MSG_ID "msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b"

static const char responses_stream[] =
    "event: response.created\n"
    "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":"
    RESP_OBJ("in_progress", "[]", "null") "}\n\n"
    "event: response.in_progress\n"
    "data: {\"type\":\"response.in_progress\",\"sequence_number\":1,"
    "\"response\":" RESP_OBJ("in_progress", "[]", "null") "}\n\n"
    "event: response.output_item.added\n"
    "data: {\"type\":\"response.output_item.added\",\"sequence_number\":2,"
    "\"output_index\":0,\"item\":{\"id\":\"" MSG_ID "\",\"type\":\"message\","
    "\"status\":\"in_progress\",\"content\":[],\"role\":\"assistant\"}}\n\n"
    "event: response.content_part.added\n"
    "data: {\"type\":\"response.content_part.added\",\"sequence_number\":3,"
    "\"item_id\":\"" MSG_ID "\",\"output_index\":0,\"content_index\":0,"
    "\"part\":{\"type\":\"output_text\",\"annotations\":[],\"text\":\"\"}}\n\n"
    "event: response.output_text.delta\n"
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,"
    "\"item_id\":\"" MSG_ID "\",\"output_index\":0,\"content_index\":0,"
    "\"delta\":\"Sure! {\\\"model\\\":\\\"" INTERNAL "\\\"}\"}\n\n"
    "event: response.output_text.done\n"
    "data: {\"type\":\"response.output_text.done\",\"sequence_number\":5,"
    "\"item_id\":\"" MSG_ID "\",\"output_index\":0,\"content_index\":0,"
    "\"text\":\"@T@\"}\n\n"
    "event: response.output_item.done\n"
    "data: {\"type\":\"response.output_item.done\",\"sequence_number\":6,"
    "\"output_index\":0,\"item\":{\"id\":\"" MSG_ID "\",\"type\":\"message\","
    "\"status\":\"completed\",\"content\":[{\"type\":\"output_text\","
    "\"annotations\":[],\"text\":\"@T@\"}],\"role\":\"assistant\"}}\n\n"
    "event: response.completed\n"
    "data: {\"type\":\"response.completed\",\"sequence_number\":7,"
    "\"response\":" RESP_OBJ("completed", "[{\"id\":\"" MSG_ID "\",\"type\":"
    "\"message\",\"status\":\"completed\",\"content\":[{\"type\":"
    "\"output_text\",\"annotations\":[],\"text\":\"@T@\"}],\"role\":"
    "\"assistant\"}]", "{\"input_tokens\":37,\"input_tokens_details\":{"
    "\"cached_tokens\":0},\"output_tokens\":412,\"output_tokens_details\":{"
    "\"reasoning_tokens\":0},\"total_tokens\":449}") "}\n\n";

static void
test_mrw_responses_stream(void **state)
{
	char *text = mrw_long_text();
	char *in = mrw_subst(responses_stream, INTERNAL, text);
	char *want = mrw_subst(responses_stream, ALIAS, text);

	(void)state;
	/* created, in_progress and completed name the model; no other event */
	assert_non_null(strstr(want, "\"model\":\"" ALIAS "\",\"output\":[{"));
	mrw_check_long(1, "\"" ALIAS "\"", in, want);
	free(in);
	free(want);
	free(text);
}

/*
 * vLLM's order (model before the object's other members, the output
 * before the model in .incomplete and .failed here) and CRLF line ends:
 * the response object streams through, its model set where it comes.
 */
static void
test_mrw_responses_incomplete_and_failed(void **state)
{
	static const char tmpl[] =
	    "event: response.incomplete\r\n"
	    "data: {\"type\":\"response.incomplete\",\"sequence_number\":9,"
	    "\"response\":{\"id\":\"resp_a1\",\"created_at\":1741476542,"
	    "\"output\":[{\"type\":\"message\",\"role\":\"assistant\","
	    "\"content\":[{\"type\":\"output_text\",\"text\":\"@T@\","
	    "\"model\":\"no\"}]}],\"incomplete_details\":{\"reason\":"
	    "\"max_output_tokens\"},\"metadata\":{\"model\":\"no\"},"
	    "\"model\":\"@M@\",\"object\":\"response\",\"status\":\"incomplete\","
	    "\"usage\":{\"input_tokens\":5,\"output_tokens\":16}}}\r\n\r\n"
	    "event: response.failed\r\n"
	    "data: {\"type\":\"response.failed\",\"sequence_number\":10,"
	    "\"response\":{\"id\":\"resp_a2\",\"status\":\"failed\",\"error\":{"
	    "\"code\":\"server_error\",\"message\":\"model overloaded\"},"
	    "\"model\":\"@M@\",\"output\":[]}}\r\n\r\n"
	    "event: error\r\n"
	    "data: {\"type\":\"error\",\"sequence_number\":11,\"code\":null,"
	    "\"message\":\"x\",\"param\":null}\r\n\r\n";
	char *text = mrw_long_text();
	char *in = mrw_subst(tmpl, INTERNAL, text);
	char *want = mrw_subst(tmpl, ALIAS, text);

	(void)state;
	mrw_check_long(1, "\"" ALIAS "\"", in, want);
	free(in);
	free(want);
	free(text);
}

static const char messages_stream[] =
    "event: message_start\n"
    "data: {\"type\":\"message_start\",\"message\":{\"id\":"
    "\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":"
    "\"assistant\",\"content\":[],\"model\":\"@M@\",\"stop_reason\":null,"
    "\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,"
    "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,"
    "\"output_tokens\":1}}}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":"
    "{\"type\":\"text\",\"text\":\"\"}}\n\n"
    "event: ping\n"
    "data: {\"type\": \"ping\"}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
    "\"text_delta\",\"text\":\"Hello, \\\"message\\\": {\\\"model\\\": \"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
    "\"text_delta\",\"text\":\"@T@\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
    "event: message_delta\n"
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\","
    "\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n"
    "event: message_stop\n"
    "data: {\"type\":\"message_stop\"}\n\n";

static void
test_mrw_messages_stream(void **state)
{
	char *text = mrw_long_text();
	char *in = mrw_subst(messages_stream, INTERNAL, text);
	char *want = mrw_subst(messages_stream, ALIAS, text);

	(void)state;
	assert_non_null(strstr(want, "\"content\":[],\"model\":\"" ALIAS "\""));
	mrw_check_long(1, "\"" ALIAS "\"", in, want);
	free(in);
	free(want);
	free(text);
}

/* A short message_start: every 2- and 3-way split. */
static void
test_mrw_message_start_every_split(void **state)
{
	(void)state;
	mrw_check_all(1, "\"" ALIAS "\"",
	    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":"
	    "{\"id\":\"m\",\"model\":\"L/8B\",\"x\":1}}\n\n"
	    "data: {\"response\":{\"model\":\"L\"}}\n",
	    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":"
	    "{\"id\":\"m\",\"model\":\"" ALIAS "\",\"x\":1}}\n\n"
	    "data: {\"response\":{\"model\":\"" ALIAS "\"}}\n");
}

/* The non-stream bodies of both APIs: the top-level "model". */
static void
test_mrw_responses_and_messages_bodies(void **state)
{
	static const char resp[] = RESP_OBJ("completed", "[{\"id\":\"" MSG_ID
	    "\",\"type\":\"message\",\"status\":\"completed\",\"content\":[{"
	    "\"type\":\"output_text\",\"annotations\":[],\"text\":\"@T@\"}],"
	    "\"role\":\"assistant\"}]", "{\"input_tokens\":36,"
	    "\"output_tokens\":87,\"total_tokens\":123}") "\n";
	static const char msg[] =
	    "{\"id\":\"msg_013Zva2CMHLNnXjNJJKqJ2EF\",\"type\":\"message\","
	    "\"role\":\"assistant\",\"model\":\"@M@\",\"content\":[{\"type\":"
	    "\"text\",\"text\":\"@T@\"}],\"stop_reason\":\"end_turn\","
	    "\"stop_sequence\":null,\"usage\":{\"input_tokens\":2095,"
	    "\"output_tokens\":503}}";
	char *text = mrw_long_text(), *in, *want;

	(void)state;
	in = mrw_subst(resp, INTERNAL, text);
	want = mrw_subst(resp, ALIAS, text);
	mrw_check_long(0, "\"" ALIAS "\"", in, want);
	free(in);
	free(want);
	in = mrw_subst(msg, INTERNAL, text);
	want = mrw_subst(msg, ALIAS, text);
	mrw_check_long(0, "\"" ALIAS "\"", in, want);
	free(in);
	free(want);
	free(text);
}

/*
 * A chat body's "message" is in "choices": not a top-level member, so a
 * "model" in it is never touched (only the top-level one).
 */
static void
test_mrw_chat_body_nested_message_untouched(void **state)
{
	static const char nested[] =
	    "{\"id\":\"chatcmpl-9\",\"object\":\"chat.completion\",\"created\":1,"
	    "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
	    "\"model\":\"keep\",\"content\":\"hi\"},\"finish_reason\":\"stop\"}],"
	    "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}";

	(void)state;
	mrw_check_all(0, "\"L\"", nested, nested);
	mrw_check_all(1, "\"L\"", "data: {\"choices\":[{\"message\":{\"model\":"
	    "\"keep\"}}],\"model\":\"m\"}\n",
	    "data: {\"choices\":[{\"message\":{\"model\":\"keep\"}}],\"model\":"
	    "\"L\"}\n");
	mrw_check_all(0, "\"L\"", "{\"choices\":[{\"message\":{\"model\":"
	    "\"keep\"}}],\"model\":\"m\"}",
	    "{\"choices\":[{\"message\":{\"model\":\"keep\"}}],\"model\":\"L\"}");
}

/* "response" / "message" that is not an object: passed over. */
static void
test_mrw_sub_key_not_an_object(void **state)
{
	(void)state;
	mrw_check_all(0, "\"L\"", "{\"response\":\"model\",\"model\":\"m\"}",
	    "{\"response\":\"model\",\"model\":\"L\"}");
	mrw_check_all(0, "\"L\"",
	    "{\"response\":[{\"model\":\"k\"}],\"message\":null,\"model\":\"m\"}",
	    "{\"response\":[{\"model\":\"k\"}],\"message\":null,\"model\":\"L\"}");
	mrw_check_all(1, "\"L\"",
	    "data: {\"message\":3,\"response\":{\"model\":\"m\"}}\n",
	    "data: {\"message\":3,\"response\":{\"model\":\"L\"}}\n");
	/* An array of objects is not one either. */
	mrw_check_all(1, "\"L\"", "data: {\"message\":[{\"model\":\"k\"}]}\n",
	    "data: {\"message\":[{\"model\":\"k\"}]}\n");
	/* Nor a value named so, nor a top level that is an array. */
	mrw_check_all(0, "\"L\"",
	    "[{\"response\":{\"model\":\"k\"}}]{\"type\":\"message\"}",
	    "[{\"response\":{\"model\":\"k\"}}]{\"type\":\"message\"}");
}

/* Only depth 2, directly in the object: not deeper. */
static void
test_mrw_sub_deeper_untouched(void **state)
{
	(void)state;
	mrw_check_all(1, "\"L\"",
	    "data: {\"response\":{\"output\":[{\"model\":\"k\"}],\"metadata\":"
	    "{\"model\":\"k\"},\"response\":{\"model\":\"k\"},\"model\":\"m\"}}\n",
	    "data: {\"response\":{\"output\":[{\"model\":\"k\"}],\"metadata\":"
	    "{\"model\":\"k\"},\"response\":{\"model\":\"k\"},\"model\":\"L\"}}\n");
	mrw_check_all(0, "\"L\"",
	    "{\"x\":{\"response\":{\"model\":\"k\"}},\"message\":{\"a\":{"
	    "\"model\":\"k\"}}}",
	    "{\"x\":{\"response\":{\"model\":\"k\"}},\"message\":{\"a\":{"
	    "\"model\":\"k\"}}}");
}

/*
 * The first "model" met decides, at either place: one per JSON value (no
 * API names both), set when a string, and the rest passes.
 */
static void
test_mrw_first_model_met_decides(void **state)
{
	(void)state;
	mrw_check_all(0, "\"L\"", "{\"model\":\"a\",\"response\":{\"model\":\"b\"}}",
	    "{\"model\":\"L\",\"response\":{\"model\":\"b\"}}");
	mrw_check_all(0, "\"L\"", "{\"message\":{\"model\":\"b\"},\"model\":\"a\"}",
	    "{\"message\":{\"model\":\"L\"},\"model\":\"a\"}");
	/* An object with no model decides nothing. */
	mrw_check_all(1, "\"L\"",
	    "data: {\"response\":{\"id\":1},\"message\":{\"model\":\"b\"}}\n"
	    "data: {\"message\":{},\"model\":\"a\"}\n",
	    "data: {\"response\":{\"id\":1},\"message\":{\"model\":\"L\"}}\n"
	    "data: {\"message\":{},\"model\":\"L\"}\n");
	/* Not a string: left, and so is the rest. */
	mrw_check_all(0, "\"L\"", "{\"response\":{\"model\":null},\"model\":\"a\"}",
	    "{\"response\":{\"model\":null},\"model\":\"a\"}");
	mrw_check_all(1, "\"L\"",
	    "data: {\"message\":{\"model\":{\"model\":\"x\"},\"model\":\"y\"}}\n",
	    "data: {\"message\":{\"model\":{\"model\":\"x\"},\"model\":\"y\"}}\n");
	/* In the object only "model" is looked for. */
	mrw_check_all(0, "\"L\"",
	    "{\"response\":{\"message\":{\"model\":\"k\"},\"model\":\"m\"}}",
	    "{\"response\":{\"message\":{\"model\":\"k\"},\"model\":\"L\"}}");
}

/* Escapes: keys as written; strings holding the key text are strings. */
static void
test_mrw_sub_escapes(void **state)
{
	(void)state;
	mrw_check_all(0, "\"L\"",
	    "{\"respons\\u0065\":{\"model\":\"k\"},\"mess\\u0061ge\":{\"model\":\"k\"}}",
	    "{\"respons\\u0065\":{\"model\":\"k\"},\"mess\\u0061ge\":{\"model\":\"k\"}}");
	mrw_check_all(1, "\"L\"",
	    "data: {\"a\":\"\\\"response\\\":{\\\"model\\\":\\\"k\\\"}\","
	    "\"response\":{\"i\":\"\\\\\",\"model\":\"m\\\"\\\\\"}}\n",
	    "data: {\"a\":\"\\\"response\\\":{\\\"model\\\":\\\"k\\\"}\","
	    "\"response\":{\"i\":\"\\\\\",\"model\":\"L\"}}\n");
	/* Keys that start like the ones looked for. */
	mrw_check_all(0, "\"L\"",
	    "{\"responses\":{\"model\":\"k\"},\"messag\":{\"model\":\"k\"},"
	    "\"r\":{\"model\":\"k\"}}",
	    "{\"responses\":{\"model\":\"k\"},\"messag\":{\"model\":\"k\"},"
	    "\"r\":{\"model\":\"k\"}}");
}

/*
 * An event whose top-level "type" names one that carries no model (a
 * delta): the rest of its data line passes unread, so a "model" after it
 * is left; the events that carry the response or message still are set.
 */
static void
test_mrw_type_no_model_events(void **state)
{
	(void)state;
	/* Responses: a delta with a (made-up) top-level model after its type. */
	mrw_check_all(1, "\"L\"",
	    "event: response.output_text.delta\n"
	    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,"
	    "\"delta\":\"tok5 \",\"model\":\"m\"}\n\n"
	    "data: {\"type\":\"response.completed\",\"response\":{\"model\":\"m\"}}\n\n"
	    "data: {\"type\":\"response.created\",\"model\":\"m\"}\n\n",
	    "event: response.output_text.delta\n"
	    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,"
	    "\"delta\":\"tok5 \",\"model\":\"m\"}\n\n"
	    "data: {\"type\":\"response.completed\",\"response\":{\"model\":\"L\"}}\n\n"
	    "data: {\"type\":\"response.created\",\"model\":\"L\"}\n\n");
	/* The six that carry the response, and one "response." not listed. */
	mrw_check_all(1, "\"L\"",
	    "data: {\"type\":\"response.in_progress\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.queued\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.incomplete\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.failed\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.x\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.completedx\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.complete\",\"model\":\"m\"}\n",
	    "data: {\"type\":\"response.in_progress\",\"model\":\"L\"}\n"
	    "data: {\"type\":\"response.queued\",\"model\":\"L\"}\n"
	    "data: {\"type\":\"response.incomplete\",\"model\":\"L\"}\n"
	    "data: {\"type\":\"response.failed\",\"model\":\"L\"}\n"
	    "data: {\"type\":\"response.x\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.\",\"model\":\"L\"}\n"
	    "data: {\"type\":\"response.completedx\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.complete\",\"model\":\"m\"}\n");
	/* Messages: the listed ones skip; message_start is set. */
	mrw_check_all(1, "\"L\"",
	    "data: {\"type\":\"content_block_delta\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"content_block_start\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"content_block_stop\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"message_delta\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"message_stop\",\"model\":\"m\"}\n"
	    "data: {\"type\": \"ping\" , \"model\":\"m\"}\n"
	    "data: {\"type\":\"message_start\",\"message\":{\"type\":\"message\","
	    "\"model\":\"m\"}}\n"
	    "data: {\"type\":\"pin\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"pingg\",\"model\":\"m\"}\n",
	    "data: {\"type\":\"content_block_delta\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"content_block_start\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"content_block_stop\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"message_delta\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"message_stop\",\"model\":\"m\"}\n"
	    "data: {\"type\": \"ping\" , \"model\":\"m\"}\n"
	    "data: {\"type\":\"message_start\",\"message\":{\"type\":\"message\","
	    "\"model\":\"L\"}}\n"
	    "data: {\"type\":\"pin\",\"model\":\"L\"}\n"
	    "data: {\"type\":\"pingg\",\"model\":\"L\"}\n");
	/*
	 * Not skipped: the model before the type; a type with an escape, not
	 * a string, or not at the top level; the next line is read anew.
	 */
	mrw_check_all(1, "\"L\"",
	    "data: {\"model\":\"m\",\"type\":\"ping\"}\n"
	    "data: {\"type\":\"pin\\u0067\",\"model\":\"m\"}\n"
	    "data: {\"typ\\u0065\":\"ping\",\"model\":\"m\"}\n"
	    "data: {\"type\":1,\"model\":\"m\"}\n"
	    "data: {\"message\":{\"type\":\"ping\",\"model\":\"m\"}}\n"
	    "data: {\"a\":{\"type\":\"ping\"},\"model\":\"m\"}\n"
	    "data: {\"a\":\"\\\"type\\\":\\\"ping\\\"\",\"model\":\"m\"}\n",
	    "data: {\"model\":\"L\",\"type\":\"ping\"}\n"
	    "data: {\"type\":\"pin\\u0067\",\"model\":\"L\"}\n"
	    "data: {\"typ\\u0065\":\"ping\",\"model\":\"L\"}\n"
	    "data: {\"type\":1,\"model\":\"L\"}\n"
	    "data: {\"message\":{\"type\":\"ping\",\"model\":\"L\"}}\n"
	    "data: {\"a\":{\"type\":\"ping\"},\"model\":\"L\"}\n"
	    "data: {\"a\":\"\\\"type\\\":\\\"ping\\\"\",\"model\":\"L\"}\n");
	/* A JSON answer is never skipped on its type (a Messages body). */
	mrw_check_all(0, "\"L\"",
	    "{\"type\":\"content_block_delta\",\"model\":\"m\"}",
	    "{\"type\":\"content_block_delta\",\"model\":\"L\"}");
	mrw_check_all(0, "\"L\"",
	    "{\"id\":\"x\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\"}",
	    "{\"id\":\"x\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"L\"}");
}

/* A long type split at every byte: a long "response." type skips too. */
static void
test_mrw_type_long_every_split(void **state)
{
	char in[600], want[600];
	size_t n;

	(void)state;
	n = (size_t)snprintf(in, sizeof in,
	    "data: {\"type\":\"response.%0300d\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.completed\",\"model\":\"m\"}\n", 7);
	assert_true(n < sizeof in);
	snprintf(want, sizeof want,
	    "data: {\"type\":\"response.%0300d\",\"model\":\"m\"}\n"
	    "data: {\"type\":\"response.completed\",\"model\":\"L\"}\n", 7);
	mrw_check_long(1, "\"L\"", in, want);
}

static void
test_mrw_literal_escapes(void **state)
{
	size_t n;
	char *s;

	(void)state;
	s = sl_mrw_literal("a\"b\\c\n\x01", 7, &n);
	assert_non_null(s);
	assert_int_equal(n, strlen("\"a\\\"b\\\\c\\u000a\\u0001\""));
	assert_memory_equal(s, "\"a\\\"b\\\\c\\u000a\\u0001\"", n);
	free(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_first_top_level_member),
		cmocka_unit_test(test_read_decodes_escapes_in_key_and_value),
		cmocka_unit_test(test_read_non_string_bad_json_and_no_body),
		cmocka_unit_test(test_read_too_long_name),
		cmocka_unit_test(test_read_multipart_model_field),
		cmocka_unit_test(test_read_multipart_refuses_what_readers_read_differently),
		cmocka_unit_test(test_rewrite_sets_every_top_level_model),
		cmocka_unit_test_setup_teardown(test_pick_splits_by_weight_smoothly,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_route_alias_allow_list_and_rewrite,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_route_without_a_model, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_list_per_tenant_sorted, setup,
		    teardown),
		cmocka_unit_test(test_fallback_chain_order),
		cmocka_unit_test(test_fallback_never_after_the_first_byte_of_an_answer),
		cmocka_unit_test(test_fallback_only_where_no_runner_can_have_started),
		cmocka_unit_test(test_fallback_only_for_a_request_routed_by_model),
		cmocka_unit_test(test_retarget_json_and_form),
		cmocka_unit_test(test_mrw_json_top_level_only),
		cmocka_unit_test(test_mrw_sse_data_lines),
		cmocka_unit_test(test_mrw_responses_stream),
		cmocka_unit_test(test_mrw_responses_incomplete_and_failed),
		cmocka_unit_test(test_mrw_messages_stream),
		cmocka_unit_test(test_mrw_message_start_every_split),
		cmocka_unit_test(test_mrw_responses_and_messages_bodies),
		cmocka_unit_test(test_mrw_chat_body_nested_message_untouched),
		cmocka_unit_test(test_mrw_sub_key_not_an_object),
		cmocka_unit_test(test_mrw_sub_deeper_untouched),
		cmocka_unit_test(test_mrw_first_model_met_decides),
		cmocka_unit_test(test_mrw_sub_escapes),
		cmocka_unit_test(test_mrw_type_no_model_events),
		cmocka_unit_test(test_mrw_type_long_every_split),
		cmocka_unit_test(test_mrw_literal_escapes),
	};

	return sl_unit_run(tests);
}

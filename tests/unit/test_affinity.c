/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for src/affinity.c: which text of a request is hashed, the
 * chained block hashes (shared prefixes share exactly their hashes, values
 * pinned), the per-worker table (longest prefix, overwrite, LRU eviction,
 * drops, and a long random run against a plain model), and rendezvous
 * choice (stable when a replica goes, even over four).
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

#include <jansson.h>

#include "sl_affinity.h"

#define NH 64

/* ------------------------------------------------------------------ helpers */

static size_t
body_hashes(const char *body, size_t block, uint64_t *h, size_t max)
{
	size_t len = strlen(body), n;
	char *p = malloc(len ? len : 1);   /* exact size: no NUL to lean on */

	assert_non_null(p);
	memcpy(p, body, len);
	n = sl_affinity_hashes(p, len, block, h, max);
	free(p);
	return n;
}

static size_t
text_hashes(const char *text, size_t block, uint64_t *h, size_t max)
{
	return sl_affinity_hash_text(text, strlen(text), block, h, max);
}

/* The hashes of body must equal those of text (non-empty). */
static void
assert_body_is_text(const char *body, const char *text, size_t block)
{
	uint64_t a[NH], b[NH];
	size_t na = body_hashes(body, block, a, NH), nb = text_hashes(text, block, b, NH);

	assert_true(nb > 0);
	assert_int_equal(na, nb);
	assert_memory_equal(a, b, na * sizeof(a[0]));
}

static uint64_t
xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* ------------------------------------------------------ what gets hashed */

static void
test_chat_string_contents_are_concatenated(void **state)
{
	(void)state;
	assert_body_is_text("{\"model\":\"m\",\"messages\":["
	    "{\"role\":\"system\",\"content\":\"You are terse.\"},"
	    "{\"role\":\"user\",\"content\":\"Name three primes below twenty.\"},"
	    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
	    "{\"role\":\"user\",\"content\":\"And one more.\"}],\"stream\":true}",
	    "You are terse.Name three primes below twenty.And one more.", 8);
}

static void
test_chat_parts_take_only_text_parts(void **state)
{
	(void)state;
	assert_body_is_text("{\"messages\":[{\"role\":\"user\",\"content\":["
	    "{\"type\":\"text\",\"text\":\"What is in \"},"
	    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAA\"}},"
	    "{\"type\":\"input_text\",\"text\":\"NOT THIS\"},"
	    "{\"type\":\"text\"},"
	    "{\"type\":\"text\",\"text\":\"this picture?\"}]},"
	    "{\"role\":\"user\",\"content\":\" Be brief.\"}]}",
	    "What is in this picture? Be brief.", 8);
}

static void
test_completions_prompt_string_and_array(void **state)
{
	(void)state;
	assert_body_is_text("{\"model\":\"m\",\"prompt\":\"Once upon a time there\",\"max_tokens\":5}",
	    "Once upon a time there", 8);
	assert_body_is_text("{\"prompt\":[\"Once upon \",\"a time\",17,[1,2],\" there\"]}",
	    "Once upon a time there", 8);
	/* Embedded NUL (\u0000) is part of the text. */
	{
		uint64_t a[NH], b[NH];
		size_t na = body_hashes("{\"prompt\":\"ab\\u0000cd\"}", 2, a, NH);
		size_t nb = sl_affinity_hash_text("ab\0cd", 5, 2, b, NH);

		assert_int_equal(na, 2);
		assert_int_equal(nb, 2);
		assert_memory_equal(a, b, sizeof(a[0]) * 2);
	}
}

static void
test_where_contents_are_cut_does_not_matter(void **state)
{
	uint64_t a[NH], b[NH];
	size_t na, nb;

	(void)state;
	na = body_hashes("{\"messages\":[{\"content\":\"abcdefghij\"},{\"content\":\"klmnopqrstu\"}]}",
	    4, a, NH);
	nb = body_hashes("{\"messages\":[{\"content\":\"ab\"},{\"content\":[{\"type\":\"text\","
	    "\"text\":\"cdefghijklm\"}]},{\"content\":\"nopqrstu\"}]}", 4, b, NH);
	assert_int_equal(na, 5);
	assert_int_equal(nb, 5);
	assert_memory_equal(a, b, sizeof(a[0]) * 5);
}

static void
test_no_prompt_gives_nothing(void **state)
{
	uint64_t h[NH];

	(void)state;
	assert_int_equal(body_hashes("not json", 8, h, NH), 0);
	assert_int_equal(body_hashes("", 8, h, NH), 0);
	assert_int_equal(body_hashes("{\"messages\":[{\"role\":\"user\"", 8, h, NH), 0);
	assert_int_equal(body_hashes("[\"prompt\"]", 8, h, NH), 0);
	assert_int_equal(body_hashes("\"prompt\"", 8, h, NH), 0);
	assert_int_equal(body_hashes("{\"model\":\"m\"}", 8, h, NH), 0);
	assert_int_equal(body_hashes("{\"prompt\":\"\"}", 8, h, NH), 0);
	assert_int_equal(body_hashes("{\"prompt\":[1,2,3]}", 8, h, NH), 0);
	assert_int_equal(body_hashes("{\"messages\":[],\"prompt\":\"ignored\"}", 8, h, NH), 0);
	assert_int_equal(body_hashes("{\"messages\":{},\"prompt\":\"used\"}", 8, h, NH), 1);
	assert_int_equal(body_hashes("{\"messages\":[{\"content\":[{\"type\":\"image_url\"}]}]}",
	    8, h, NH), 0);
	assert_int_equal(body_hashes("{\"prompt\":\"abc\"}", 0, h, NH), 0);
	assert_int_equal(body_hashes("{\"prompt\":\"abc\"}", 8, h, 0), 0);
	assert_int_equal(sl_affinity_hashes_json(NULL, 8, h, NH), 0);
}

/* The walker over the text gives the hashes jansson's tree gives. */
static void
test_text_walk_matches_the_tree(void **state)
{
	static const char *bodies[] = {
		"{\"messages\":[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
		"{\"role\":\"user\",\"content\":\"caf\\u00e9 \\ud83d\\ude00 \\\"q\\\" \\\\ \\/ "
		"\\b\\f\\n\\r\\t \\u0000 end\"}]}",
		"{\"messages\":[{\"content\":[{\"type\":\"text\",\"text\":\"part one, \"},"
		"{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}},{\"type\":\"t\\u0065xt\","
		"\"text\":\"part two\",\"text\":\"the last text wins\"},{\"text\":\"no type\"},"
		"[\"not an object\"],{\"type\":\"text\",\"text\":42}]},7,null,"
		"{\"content\":\"first\",\"content\":\"second content wins over the first\"}]}",
		"{\"model\":\"m\",\"prompt\":[\"one \",2,{\"a\":\"b\"},\"three four five six\"]}",
		"{\"prompt\":\"\\u00e9\\u00e9\\u00e9\\u00e9 a long enough prompt to make blocks\","
		"\"messages\":\"not an array\"}",
		" {\"n\":[1,2.5,-3e2,true,false,null,{\"x\":[[],{}]}],\"messages\":[{\"content\":"
		"\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 raw UTF-8 in a message\"}]} ",
	};
	uint64_t a[NH], b[NH];
	size_t i, na, nb, block;
	json_error_t err;
	json_t *root;

	(void)state;
	for (i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
		for (block = 1; block <= 9; block += 4) {
			root = json_loadb(bodies[i], strlen(bodies[i]), JSON_ALLOW_NUL, &err);
			assert_non_null(root);
			nb = sl_affinity_hashes_json(root, block, b, NH);
			json_decref(root);
			na = body_hashes(bodies[i], block, a, NH);
			assert_true(nb > 0);
			assert_int_equal(na, nb);
			assert_memory_equal(a, b, na * sizeof(a[0]));
		}
}

/* Bodies a Python runner takes and jansson does not still have a prompt. */
static void
test_python_bodies_are_hashed(void **state)
{
	uint64_t h[NH];

	(void)state;
	assert_body_is_text("\xef\xbb\xbf{\"t\":NaN,\"x\":1e999,\"prompt\":\"abcdefgh\"}",
	    "abcdefgh", 4);
	/* a lone surrogate is U+FFFD */
	assert_body_is_text("{\"prompt\":\"ab\\udc00cd\"}", "ab\xef\xbf\xbd" "cd", 2);
	assert_int_equal(body_hashes("{\"prompt\":\"ab\",}", 1, h, NH), 0);
	assert_int_equal(body_hashes("{\"prompt\":\"a\xff\"}", 1, h, NH), 0);
}

/* Weighted rendezvous: shares follow the weights; equal weights are the unweighted choice. */
static void
test_rendezvous_weighted_shares(void **state)
{
	uint64_t ids[3] = { 11, 22, 33 }, key;
	int w[3] = { 3, 1, 1 }, eq[3] = { 7, 7, 7 }, got[3] = { 0, 0, 0 };
	size_t i;

	(void)state;
	for (i = 0; i < 100000; i++) {
		key = sl_affinity_id("k") + i * 0x9E3779B97F4A7C15ULL;
		got[sl_affinity_rendezvous_weighted(key, ids, w, 3)]++;
		assert_int_equal(sl_affinity_rendezvous_weighted(key, ids, eq, 3),
		    sl_affinity_rendezvous(key, ids, 3));
	}
	/* 60,000 / 20,000 / 20,000; binomial sigma about 155 */
	assert_in_range(got[0], 59000, 61000);
	assert_in_range(got[1], 19000, 21000);
	assert_in_range(got[2], 19000, 21000);
}

/* ------------------------------------------------------------- the chain */

static void
test_only_full_blocks_except_a_short_prompt(void **state)
{
	uint64_t h[NH], g[NH];
	char text[200];

	(void)state;
	memset(text, 'a', sizeof(text));
	assert_int_equal(sl_affinity_hash_text(text, 1, 64, h, NH), 1);
	assert_int_equal(sl_affinity_hash_text(text, 63, 64, h, NH), 1);
	assert_int_equal(sl_affinity_hash_text(text, 64, 64, h, NH), 1);
	assert_int_equal(sl_affinity_hash_text(text, 127, 64, h, NH), 1);
	assert_int_equal(sl_affinity_hash_text(text, 128, 64, h, NH), 2);
	assert_int_equal(sl_affinity_hash_text(text, 200, 64, h, NH), 3);
	assert_int_equal(sl_affinity_hash_text(text, 0, 64, h, NH), 0);
	/* A short prompt's one hash is not the hash of a full block. */
	assert_int_equal(sl_affinity_hash_text(text, 63, 64, h, NH), 1);
	assert_int_equal(sl_affinity_hash_text(text, 64, 64, g, NH), 1);
	assert_true(h[0] != g[0]);
	/* The length counts, not only the bytes (zero padding is not content). */
	assert_int_equal(sl_affinity_hash_text("ab", 2, 64, h, NH), 1);
	assert_int_equal(sl_affinity_hash_text("ab\0", 3, 64, g, NH), 1);
	assert_true(h[0] != g[0]);
}

static void
test_shared_prefix_shares_exactly_its_full_blocks(void **state)
{
	char a[1000], b[1000];
	uint64_t ha[NH], hb[NH];
	size_t block, k, cut, n, i;
	uint64_t seed = 88172645463325252ULL;

	(void)state;
	for (i = 0; i < sizeof(a); i++)
		a[i] = (char)(' ' + xorshift(&seed) % 90);
	for (block = 1; block <= 70; block += 23) {
		for (cut = 0; cut < 600; cut += 37) {
			memcpy(b, a, sizeof(a));
			b[cut] = (char)(b[cut] == 'x' ? 'y' : 'x');   /* first difference at cut */
			n = sl_affinity_hash_text(a, sizeof(a), block, ha, NH);
			assert_int_equal(sl_affinity_hash_text(b, sizeof(b), block, hb, NH), n);
			k = cut / block;   /* full blocks before the difference */
			for (i = 0; i < n; i++) {
				if (i < k)
					assert_true(ha[i] == hb[i]);
				else
					assert_true(ha[i] != hb[i]);
			}
		}
	}
}

static void
test_max_keeps_the_prefix_and_chain_is_incremental(void **state)
{
	char t[640];
	uint64_t all[NH], few[NH], part[NH];
	size_t n;

	(void)state;
	memset(t, 'q', sizeof(t));
	t[5] = 'z';
	n = sl_affinity_hash_text(t, sizeof(t), 64, all, NH);
	assert_int_equal(n, 10);
	assert_int_equal(sl_affinity_hash_text(t, sizeof(t), 64, few, 3), 3);
	assert_memory_equal(all, few, 3 * sizeof(all[0]));
	/* The first 4 blocks of a longer prompt are the hashes of those 4 blocks alone. */
	assert_int_equal(sl_affinity_hash_text(t, 256, 64, part, NH), 4);
	assert_memory_equal(all, part, 4 * sizeof(all[0]));
	/* Equal blocks in a row still hash differently (chained). */
	assert_true(all[2] != all[3]);
}

static void
test_hash_values_are_pinned(void **state)
{
	uint64_t h[NH];

	(void)state;
	/* These values are part of the contract between sluice nodes. */
	assert_int_equal(sl_affinity_hash_text("The quick brown fox jumps over the lazy dog", 43, 16,
	    h, NH), 2);
	assert_true(h[0] == 0x7fc9748e11746bfcULL);
	assert_true(h[1] == 0x7a5b96f12faef4e0ULL);
	assert_true(sl_affinity_id("http://10.0.0.1:8000") == 0xd60beb4b73ae0aafULL);
	assert_true(sl_affinity_id("") == 0x8a3cf4470d20f1a9ULL);
	{
		uint64_t ids[4];

		ids[0] = sl_affinity_id("http://10.0.0.1:8000");
		ids[1] = sl_affinity_id("http://10.0.0.2:8000");
		ids[2] = sl_affinity_id("http://10.0.0.3:8000");
		ids[3] = sl_affinity_id("http://10.0.0.4:8000");
		assert_int_equal(sl_affinity_rendezvous(h[0], ids, 4), 3);
		assert_int_equal(sl_affinity_rendezvous(h[1], ids, 4), 1);
		assert_int_equal(sl_affinity_rendezvous(0, ids, 4), 3);
	}
}

/* ------------------------------------------------------------- the table */

static void
test_new_refuses_zero_and_huge(void **state)
{
	struct sl_affinity *a;

	(void)state;
	assert_null(sl_affinity_new(0));
	assert_null(sl_affinity_new(SL_AFFINITY_MAX_CAPACITY + 1));
	a = sl_affinity_new(1);
	assert_non_null(a);
	assert_int_equal(sl_affinity_capacity(a), 1);
	assert_int_equal(sl_affinity_size(a), 0);
	sl_affinity_free(a);
	sl_affinity_free(NULL);
}

static void
test_lookup_finds_the_longest_known_prefix(void **state)
{
	struct sl_affinity *a = sl_affinity_new(1024);
	uint64_t conv[8] = { 11, 12, 13, 14, 15, 16, 17, 18 }, other[3] = { 11, 12, 99 };
	size_t m = 77;

	(void)state;
	assert_int_equal(sl_affinity_lookup(a, 0, conv, 8, &m), -1);
	assert_int_equal(m, 0);
	sl_affinity_record(a, 0, conv, 3, 2);           /* turn 1 went to replica 2 */
	assert_int_equal(sl_affinity_size(a), 3);
	assert_int_equal(sl_affinity_lookup(a, 0, conv, 8, &m), 2);   /* turn 2 */
	assert_int_equal(m, 3);
	sl_affinity_record(a, 0, conv, 6, 2);
	sl_affinity_record(a, 0, other, 3, 1);          /* shares 2 blocks, now on 1 */
	assert_int_equal(sl_affinity_size(a), 7);
	assert_int_equal(sl_affinity_lookup(a, 0, conv, 8, &m), 2);
	assert_int_equal(m, 6);
	assert_int_equal(sl_affinity_lookup(a, 0, conv, 2, &m), 1);   /* overwritten */
	assert_int_equal(m, 2);
	assert_int_equal(sl_affinity_lookup(a, 0, other, 3, &m), 1);
	assert_int_equal(m, 3);
	/* Another upstream knows nothing of these. */
	assert_int_equal(sl_affinity_lookup(a, 1, conv, 8, &m), -1);
	assert_int_equal(m, 0);
	sl_affinity_free(a);
}

/* A prompt's last block is marked; a prefix only ever inside prompts is not. */
static void
test_lookup_end_tells_an_earlier_turn_from_a_shared_prefix(void **state)
{
	struct sl_affinity *a = sl_affinity_new(1024);
	uint64_t conv[8] = { 1, 2, 3, 14, 15, 16, 17, 18 };
	uint64_t other[6] = { 1, 2, 3, 24, 25, 26 }, third[5] = { 1, 2, 3, 34, 35 };
	uint64_t shorty = 77;
	size_t m = 9;
	int ended = 5;

	(void)state;
	assert_int_equal(sl_affinity_lookup_end(a, 0, conv, 8, &m, &ended), -1);
	assert_int_equal(m, 0);
	assert_int_equal(ended, 0);
	sl_affinity_record(a, 0, conv, 5, 2);           /* turn 1: 3 shared + 2 own */
	sl_affinity_record(a, 0, other, 6, 1);          /* another conversation */
	/* Turn 2 of conv: the end of turn 1, on 2. */
	assert_int_equal(sl_affinity_lookup_end(a, 0, conv, 8, &m, &ended), 2);
	assert_int_equal(m, 5);
	assert_int_equal(ended, 1);
	/* A new conversation knows only the shared 3 blocks (last routed to 1). */
	assert_int_equal(sl_affinity_lookup_end(a, 0, third, 5, &m, &ended), 1);
	assert_int_equal(m, 3);
	assert_int_equal(ended, 0);
	/* The mark stays when a longer turn passes over it, on any replica. */
	sl_affinity_record(a, 0, conv, 8, 3);
	assert_int_equal(sl_affinity_lookup_end(a, 0, conv, 5, &m, &ended), 3);
	assert_int_equal(m, 5);
	assert_int_equal(ended, 1);
	assert_int_equal(sl_affinity_lookup_end(a, 0, conv, 8, &m, &ended), 3);
	assert_int_equal(ended, 1);
	/* A prompt shorter than a block is one hash, and ends itself. */
	sl_affinity_record(a, 0, &shorty, 1, 0);
	assert_int_equal(sl_affinity_lookup_end(a, 0, &shorty, 1, &m, NULL), 0);
	assert_int_equal(sl_affinity_lookup_end(a, 0, &shorty, 1, &m, &ended), 0);
	assert_int_equal(ended, 1);
	/* lookup() answers the same replica and length. */
	assert_int_equal(sl_affinity_lookup(a, 0, third, 5, &m), 3);
	assert_int_equal(m, 3);
	sl_affinity_free(a);
}

static void
test_lookup_is_exact_across_a_hole(void **state)
{
	struct sl_affinity *a = sl_affinity_new(64);
	uint64_t x[5] = { 1, 2, 3, 4, 5 }, y[2] = { 1, 2 };
	size_t m;

	(void)state;
	sl_affinity_record(a, 3, x, 5, 0);
	sl_affinity_record(a, 3, y, 2, 1);      /* the shared blocks move to 1 ... */
	sl_affinity_drop_replica(a, 3, 1);      /* ... and 1 goes down: a hole at 0, 1 */
	assert_int_equal(sl_affinity_size(a), 3);
	assert_int_equal(sl_affinity_lookup(a, 3, x, 5, &m), 0);
	assert_int_equal(m, 5);
	assert_int_equal(sl_affinity_lookup(a, 3, x, 2, &m), -1);
	assert_int_equal(m, 0);
	sl_affinity_free(a);
}

static void
test_lru_evicts_least_recently_recorded(void **state)
{
	struct sl_affinity *a = sl_affinity_new(4);
	uint64_t p[2] = { 100, 101 }, q[2] = { 200, 201 }, r[1] = { 300 }, h;
	size_t m;

	(void)state;
	sl_affinity_record(a, 0, p, 2, 0);
	sl_affinity_record(a, 0, q, 2, 1);
	assert_int_equal(sl_affinity_size(a), 4);
	sl_affinity_record(a, 0, p, 1, 0);      /* refresh p[0] only */
	sl_affinity_record(a, 0, r, 1, 2);      /* full: evicts the oldest, p[1] */
	assert_int_equal(sl_affinity_size(a), 4);
	h = 101;
	assert_int_equal(sl_affinity_lookup(a, 0, &h, 1, &m), -1);
	assert_int_equal(sl_affinity_lookup(a, 0, p, 2, &m), 0);
	assert_int_equal(m, 1);
	sl_affinity_record(a, 0, p, 2, 0);      /* evicts q[1] (q[0] is newer) */
	assert_int_equal(sl_affinity_lookup(a, 0, q, 2, &m), 1);
	assert_int_equal(m, 1);
	assert_int_equal(sl_affinity_lookup(a, 0, r, 1, &m), 2);
	assert_int_equal(sl_affinity_size(a), 4);
	sl_affinity_free(a);
}

static void
test_record_longer_than_capacity_keeps_the_prefix(void **state)
{
	struct sl_affinity *a = sl_affinity_new(8);
	uint64_t h[20];
	size_t i, m;

	(void)state;
	for (i = 0; i < 20; i++)
		h[i] = 1000 + i;
	sl_affinity_record(a, 0, h, 20, 3);
	assert_int_equal(sl_affinity_size(a), 8);
	assert_int_equal(sl_affinity_lookup(a, 0, h, 20, &m), 3);
	assert_int_equal(m, 8);
	sl_affinity_free(a);
}

static void
test_drops(void **state)
{
	struct sl_affinity *a = sl_affinity_new(256);
	uint64_t h[10];
	size_t i, m;

	(void)state;
	for (i = 0; i < 10; i++)
		h[i] = 0xabc000 + i;
	sl_affinity_record(a, 0, h, 4, 0);
	sl_affinity_record(a, 0, h + 4, 3, 1);
	sl_affinity_record(a, 1, h, 10, 1);     /* same hashes, other upstream */
	assert_int_equal(sl_affinity_size(a), 17);
	sl_affinity_drop_replica(a, 0, 1);
	assert_int_equal(sl_affinity_size(a), 14);
	assert_int_equal(sl_affinity_lookup(a, 0, h, 7, &m), 0);
	assert_int_equal(m, 4);
	assert_int_equal(sl_affinity_lookup(a, 1, h, 10, &m), 1);
	assert_int_equal(m, 10);
	sl_affinity_drop_upstream(a, 1);
	assert_int_equal(sl_affinity_size(a), 4);
	assert_int_equal(sl_affinity_lookup(a, 1, h, 10, &m), -1);
	sl_affinity_drop_upstream(a, 0);
	assert_int_equal(sl_affinity_size(a), 0);
	/* Reusable after being emptied. */
	sl_affinity_record(a, 0, h, 10, 5);
	assert_int_equal(sl_affinity_lookup(a, 0, h, 10, &m), 5);
	assert_int_equal(m, 10);
	sl_affinity_free(a);
}

/*
 * A long random run against a plain model (an array with a recency stamp
 * per entry): every lookup answer and the size agree after each step.
 * Small hash values and few upstreams make probe chains collide and the
 * index wrap, which is where deletion by backward shift can go wrong.
 */
struct model_ent {
	uint64_t hash;
	uint32_t up;
	int replica;
	uint64_t stamp;
};

static void
model_record(struct model_ent *m, size_t *n, size_t cap, uint64_t *clock, uint32_t up,
    const uint64_t *h, size_t k, int replica)
{
	size_t i, j, old;

	while (k > 0) {
		k--;
		for (i = 0; i < *n; i++)
			if (m[i].hash == h[k] && m[i].up == up)
				break;
		if (i == *n) {
			if (*n == cap) {
				for (old = 0, j = 1; j < *n; j++)
					if (m[j].stamp < m[old].stamp)
						old = j;
				m[old] = m[--*n];
			}
			i = (*n)++;
			m[i].hash = h[k];
			m[i].up = up;
		}
		m[i].replica = replica;
		m[i].stamp = ++*clock;
	}
}

static int
model_lookup(const struct model_ent *m, size_t n, uint32_t up, const uint64_t *h, size_t k,
    size_t *matched)
{
	size_t i;

	while (k > 0) {
		k--;
		for (i = 0; i < n; i++) {
			if (m[i].hash == h[k] && m[i].up == up) {
				*matched = k + 1;
				return m[i].replica;
			}
		}
	}
	*matched = 0;
	return -1;
}

static void
model_drop(struct model_ent *m, size_t *n, uint32_t up, int any, int replica)
{
	size_t i = 0;

	while (i < *n) {
		if (m[i].up == up && (any || m[i].replica == replica))
			m[i] = m[--*n];
		else
			i++;
	}
}

static void
test_random_run_matches_a_model(void **state)
{
	enum { CAP = 61, STEPS = 40000 };
	struct sl_affinity *a = sl_affinity_new(CAP);
	struct model_ent m[CAP];
	size_t n = 0, k, i, got_m, want_m;
	uint64_t clock = 0, seed = 0x9E3779B97F4A7C15ULL, h[12], r;
	uint32_t up;
	int got, want, step;

	(void)state;
	for (step = 0; step < STEPS; step++) {
		r = xorshift(&seed);
		up = (uint32_t)(r >> 8) % 3;
		k = 1 + (size_t)(r >> 16) % 12;
		for (i = 0; i < k; i++)
			h[i] = xorshift(&seed) % 150;
		switch ((r >> 32) % 16) {
		case 0:
			sl_affinity_drop_replica(a, up, (int)(r >> 40) % 4);
			model_drop(m, &n, up, 0, (int)(r >> 40) % 4);
			break;
		case 1:
			if ((r >> 40) % 8 == 0) {
				sl_affinity_drop_upstream(a, up);
				model_drop(m, &n, up, 1, 0);
			}
			break;
		case 2: case 3: case 4: case 5: case 6: case 7:
			sl_affinity_record(a, up, h, k, (int)(r >> 44) % 4);
			model_record(m, &n, CAP, &clock, up, h, k, (int)(r >> 44) % 4);
			break;
		default:
			got = sl_affinity_lookup(a, up, h, k, &got_m);
			want = model_lookup(m, n, up, h, k, &want_m);
			if (got != want || got_m != want_m)
				fail_msg("step %d: lookup %d/%zu, model %d/%zu", step, got, got_m, want,
				    want_m);
			break;
		}
		if (sl_affinity_size(a) != n)
			fail_msg("step %d: size %u, model %zu", step, sl_affinity_size(a), n);
	}
	sl_affinity_free(a);
}

/* ------------------------------------------------------------ rendezvous */

static void
test_rendezvous_empty_and_single(void **state)
{
	uint64_t id = sl_affinity_id("http://a:8000");

	(void)state;
	assert_int_equal(sl_affinity_rendezvous(42, NULL, 0), -1);
	assert_int_equal(sl_affinity_rendezvous(42, &id, 1), 0);
}

static void
test_rendezvous_even_and_stable_when_one_goes(void **state)
{
	enum { KEYS = 10000 };
	uint64_t ids[4], three[3];
	int count[4] = { 0, 0, 0, 0 }, before, after;
	size_t i, moved = 0;
	uint64_t key;
	char url[64];

	(void)state;
	for (i = 0; i < 4; i++) {
		snprintf(url, sizeof(url), "http://10.0.0.%zu:8000", i + 1);
		ids[i] = sl_affinity_id(url);
	}
	three[0] = ids[0];
	three[1] = ids[1];
	three[2] = ids[3];   /* replica 2 removed */
	for (i = 0; i < KEYS; i++) {
		assert_int_equal(sl_affinity_hash_text((const char *)&i, sizeof(i), 64, &key, 1), 1);
		before = sl_affinity_rendezvous(key, ids, 4);
		assert_true(before >= 0 && before < 4);
		count[before]++;
		after = sl_affinity_rendezvous(key, three, 3);
		after = after == 2 ? 3 : after;   /* back to the 4-replica index */
		if (before != 2)
			assert_int_equal(after, before);   /* only replica 2's keys move */
		else
			moved++;
		assert_int_equal(sl_affinity_rendezvous(key, ids, 4), before);
	}
	/* 2500 expected each; sd ~43, so +-250 is far outside chance. */
	for (i = 0; i < 4; i++)
		if (count[i] < 2250 || count[i] > 2750)
			fail_msg("replica %zu got %d of %d keys", i, count[i], KEYS);
	assert_int_equal(moved, (size_t)count[2]);
}

static void
test_rendezvous_ties_go_to_the_lowest_index(void **state)
{
	uint64_t ids[3] = { 7, 7, 7 };

	(void)state;
	assert_int_equal(sl_affinity_rendezvous(123, ids, 3), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chat_string_contents_are_concatenated),
		cmocka_unit_test(test_text_walk_matches_the_tree),
		cmocka_unit_test(test_rendezvous_weighted_shares),
		cmocka_unit_test(test_python_bodies_are_hashed),
		cmocka_unit_test(test_chat_parts_take_only_text_parts),
		cmocka_unit_test(test_completions_prompt_string_and_array),
		cmocka_unit_test(test_where_contents_are_cut_does_not_matter),
		cmocka_unit_test(test_no_prompt_gives_nothing),
		cmocka_unit_test(test_only_full_blocks_except_a_short_prompt),
		cmocka_unit_test(test_shared_prefix_shares_exactly_its_full_blocks),
		cmocka_unit_test(test_max_keeps_the_prefix_and_chain_is_incremental),
		cmocka_unit_test(test_hash_values_are_pinned),
		cmocka_unit_test(test_new_refuses_zero_and_huge),
		cmocka_unit_test(test_lookup_finds_the_longest_known_prefix),
		cmocka_unit_test(test_lookup_end_tells_an_earlier_turn_from_a_shared_prefix),
		cmocka_unit_test(test_lookup_is_exact_across_a_hole),
		cmocka_unit_test(test_lru_evicts_least_recently_recorded),
		cmocka_unit_test(test_record_longer_than_capacity_keeps_the_prefix),
		cmocka_unit_test(test_drops),
		cmocka_unit_test(test_random_run_matches_a_model),
		cmocka_unit_test(test_rendezvous_empty_and_single),
		cmocka_unit_test(test_rendezvous_even_and_stable_when_one_goes),
		cmocka_unit_test(test_rendezvous_ties_go_to_the_lowest_index),
	};

	return sl_unit_run(tests);
}

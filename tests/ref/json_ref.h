/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * A reference reader of request bodies for the fuzz targets: what a Python
 * runner does with the bytes of a body (FastAPI: json.loads(bytes), then
 * pydantic in lax mode), written for clarity, with a tree, recursion and
 * none of sl_json.c's shortcuts. fuzz_usage holds the request editor
 * (src/usage_request.c over src/json.c) to it both ways: counted iff this reads an
 * object.
 *
 * json.loads(bytes) here means: the bytes decoded as UTF-8 with Python's
 * "surrogatepass" (so encoded surrogates ED A0..BF xx are text), after one
 * leading UTF-8 BOM if any (utf-8-sig); then Python's JSON grammar: RFC 8259
 * plus NaN, Infinity, -Infinity; whitespace is space, tab, LF, CR; no raw
 * control character (< 0x20) in a string; \uXXXX escapes of any code unit
 * (a lone surrogate included); duplicate keys, the last wins.
 * Two documented differences, each one sluice accepting more than the
 * runner (harmless: the runner refuses, nothing is charged):
 *  - no limit of 4300 digits on integers (Python's int() has one),
 *  - nesting up to 2048 containers (Python's recursion limit stops near
 *    1000), as sl_json.h and jansson allow.
 * Out of scope: bodies json.loads would decode as UTF-16 or UTF-32 (its
 * detect_encoding); sluice reads UTF-8 only.
 */
#ifndef SL_JSON_REF_H
#define SL_JSON_REF_H

#include <stddef.h>
#include <stdint.h>

enum rj_type { RJ_NULL, RJ_FALSE, RJ_TRUE, RJ_NUM, RJ_STR, RJ_ARR, RJ_OBJ };

struct rj {
	enum rj_type t;
	size_t s, e;            /* its text in the input: [s, e) */
	/* RJ_STR: the decoded string as UTF-8 (surrogates as 3 bytes each) */
	unsigned char *str;
	size_t len;
	int is_int;             /* RJ_NUM: no fraction, no exponent */
	/* RJ_ARR, RJ_OBJ: n values; RJ_OBJ: key[i] is value i's key (RJ_STR) */
	struct rj **kid, **key;
	size_t n, cap;
};

/* The body read as described above, or NULL where json.loads fails. */
struct rj *rj_parse(const char *p, size_t len);
void rj_free(struct rj *v);

/* An object's member named name (ASCII), the last of duplicates; NULL if none. */
const struct rj *rj_get(const struct rj *obj, const char *name);

/* v read as a pydantic lax bool: 1, 0, or -1 (refused). NULL (absent) is -1. */
int rj_bool(const struct rj *v);

/* Python's == on the two values (dicts: last duplicate wins, any order). */
int rj_equal(const struct rj *a, const struct rj *b);

/*
 * Replace obj's member name (or add it) by a copy-free reference to v: a
 * member appended last, which wins. v is owned by obj afterwards.
 */
int rj_set(struct rj *obj, const char *name, struct rj *v);

/* A new true, or an object {"include_usage": true}; NULL without memory. */
struct rj *rj_new_true(void);
struct rj *rj_new_usage_option(void);

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * JSON text without a tree: validation and walks over request bodies.
 *
 * A request body can be as large as max_body_bytes; building it (jansson)
 * costs a node per value and seconds of a worker's loop for megabytes of
 * small values. These functions validate a body in one pass that allocates
 * nothing, then walk the validated text by byte offsets.
 *
 * What sl_json_object() accepts is what a Python runner's json.loads
 * accepts (vLLM, SGLang): RFC 8259 JSON, plus a leading UTF-8 BOM, NaN,
 * Infinity, -Infinity, numbers of any size, lone surrogate escapes and
 * UTF-8-encoded surrogates (json.loads(bytes) decodes "surrogatepass"). It
 * refuses what those runners refuse: other invalid UTF-8, raw control
 * characters in strings, bad escapes, leading zeros, trailing garbage, and
 * nesting deeper than SL_JSON_MAXDEPTH (jansson's limit too). It reads
 * UTF-8 only: a body json.loads would take as UTF-16 or UTF-32 is refused.
 *
 * The walkers (sl_json_skip, sl_json_find, sl_json_first, sl_json_after,
 * sl_json_decode) are for text sl_json_object() validated: they bound every
 * access but do not validate again.
 */
#ifndef SL_JSON_H
#define SL_JSON_H

#include <stddef.h>

#define SL_JSON_MAXDEPTH 2048

#define JSON_WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r')

/* Offsets of a value in the text: [vs, ve). */
struct sl_json_span {
	size_t vs, ve;
};

/* A top-level member looked for: the span of its last occurrence. */
struct sl_json_member {
	const char *name;
	struct sl_json_span v;
	int found;
};

/*
 * Validate p[0..len) as one JSON object. On success (0): *open and *close
 * are the offsets of its braces, *nmemb its member count, and each m[i]
 * says whether a top-level member of that name exists (duplicates: the
 * last wins, as in jansson and Python). -1: not a JSON object.
 */
int sl_json_object(const char *p, size_t len, struct sl_json_member *m, size_t nm,
    size_t *open, size_t *close, size_t *nmemb);

/* A top-level member looked for: the span of its FIRST occurrence. */
struct sl_json_first {
	const char *name;
	struct sl_json_span v;   /* valid when count > 0 */
	size_t count;            /* top-level members of that name */
};

/*
 * Validate p[0..len) as one JSON object, as sl_json_object does, and find
 * the first top-level member named f->name (keys compared with their
 * escapes decoded: "mo\u0064el" is model), in the same single pass.
 * 0, or -1: not a JSON object.
 */
int sl_json_object_first(const char *p, size_t len, struct sl_json_first *f);

/*
 * 1 if json.loads(bytes) would decode p[0..len) as UTF-16 or UTF-32 (a BOM
 * of either, or a NUL among the first bytes: RFC 4627 section 3, as
 * Python's json.detect_encoding reads it), else 0. Such a body is JSON to
 * a Python runner but not to sl_json_object(), which reads UTF-8 only.
 */
int sl_json_wide(const char *p, size_t len);

/* The first offset >= i that is not JSON whitespace, or len. */
size_t sl_json_ws(const char *p, size_t len, size_t i);

/* *i at a value: move past it. -1 if the text ends first. */
int sl_json_skip(const char *p, size_t len, size_t *i);

/*
 * The object opening at p[open]: *last the value of its last member named
 * name (*found), *close its closing brace, *nmemb its member count.
 */
int sl_json_find(const char *p, size_t len, size_t open, const char *name,
    struct sl_json_span *last, int *found, size_t *close, size_t *nmemb);

/* 1 if the string token p[s..e) (quotes included) decodes to ASCII name. */
int sl_json_key_is(const char *p, size_t s, size_t e, const char *name);

/* The value of hex digit c, or -1. */
int sl_json_hexval(char c);

/* 1 if the value v is exactly the text t. */
int sl_json_span_is(const char *p, struct sl_json_span v, const char *t);

/*
 * Arrays: *i at '[': sl_json_first moves *i to the first element and
 * returns 1, or returns 0 for an empty array. *i just past an element:
 * sl_json_after moves *i to the next one and returns 1, or returns 0 at ']'.
 */
int sl_json_first(const char *p, size_t len, size_t *i);
int sl_json_after(const char *p, size_t len, size_t *i);

/*
 * Decode the string token p[s..e) (quotes included), handing the bytes to
 * sink in runs: raw UTF-8 as it is, escapes as the bytes they stand for
 * (\u0000 a NUL byte, a surrogate pair as one 4-byte sequence, a lone
 * surrogate as U+FFFD). Stops early when sink returns non-zero, and returns
 * that value (0 when the whole string went).
 */
int sl_json_decode(const char *p, size_t s, size_t e,
    int (*sink)(void *arg, const unsigned char *b, size_t n), void *arg);

/*
 * JSON-escape src (slen bytes) into dst (always terminated, cut short when
 * it does not fit). Well-formed UTF-8 is kept as it is; a byte that is not
 * part of one is written as \u00XX, so the string is valid JSON whatever
 * the bytes were.
 */
void sl_json_escape(char *dst, size_t dlen, const char *src, size_t slen);

#endif

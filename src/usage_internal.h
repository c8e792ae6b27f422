/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * What the files of token usage promise one another; sl_usage.h is what
 * they promise the rest of sluice.
 *
 *   usage.c          the usage object: a "usage" member's bytes read into
 *                    struct sl_usage, as jansson and usage_from_obj() would
 *   usage_request.c  the request editor (nothing of it is shared here)
 *   usage_scan.c     the SSE scanner: lines, the JSON lexer, the hold and
 *                    cut of the usage event
 *   usage_simd.c     the scanner's block loaders: class masks of 64 bytes
 */
#ifndef SL_USAGE_INTERNAL_H
#define SL_USAGE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(SL_USAGE_NO_SIMD) && \
    !defined(SL_USAGE_NO_AVX2)
#include <immintrin.h>
#define SL_USAGE_AVX2 1         /* used when the CPU has it (asked once per run) */
#endif

#include "sl_usage.h"

/* ------------------------------------------------------------------ usage object */

/*
 * The bytes p[0..len) of a usage object as the scanner copied them: 1 with
 * *u filled when they are one JSON object whose "prompt_tokens" and
 * "completion_tokens" are non-negative integers ("total_tokens" optional,
 * likewise), 0 for anything else (*u then unspecified).
 */
int usage_obj_read(const char *p, size_t len, struct sl_usage *u);

/* ------------------------------------------------------------------ block loaders */

/*
 * Byte classes: the bytes that end a skip. Inside a string only its end,
 * an escape and a line end matter; between values (below the top level)
 * only strings, brackets and line ends do: commas, colons, numbers,
 * literals and blanks change nothing there (but a comma at the top level
 * in drop mode, where a "usage":null member may start).
 */
enum { C_STR = 1, C_VAL = 2, C_VAL1 = 4 };
extern const uint8_t usage_cls[256];

/*
 * Class masks of 64 bytes of a data line, computed once and read by
 * lex_fast() with a count of trailing zeros per token instead of a scan
 * per token. Bit j describes base + j; the bytes from the run's end on are
 * set in str and val as if they were line ends, so a search stops there.
 */
struct blk {
	uintptr_t base;         /* the masks' first byte; lo - 64 before a load */
	const char *lo;         /* the call's input: loads may start there */
	uint64_t str;           /* C_STR: " \ CR LF */
	uint64_t val;           /* C_VAL: " CR LF { } [ ] */
	uint64_t cm;            /* commas (C_VAL1 is val | cm) */
	int avx2;               /* the CPU has AVX2 (asked once per run) */
};

/*
 * b's masks for [p, p + 64), p < e, b->base set to p; nothing before
 * b->lo or at or past e is read, and the bits of the bytes from e on are
 * set in str and val (a line end) and clear in cm. The same masks either
 * way; the AVX2 one only where the CPU has AVX2.
 */
void usage_blk_load(struct blk *b, const char *p, const char *e);
#ifdef SL_USAGE_AVX2
void usage_blk_load_avx2(struct blk *b, const char *p, const char *e);
#endif

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The SSE scanner's block loaders: the class masks of 64 bytes of a data
 * line (struct blk, usage_lexer.h), with SSE2 16 bytes at a time, with
 * AVX2 32 (where the CPU has it: the scanner asks once per run), or a byte
 * at a time from usage_cls[] elsewhere. Called once per 64 bytes, out of
 * line; what reads the masks a token at a time is the scanner's.
 */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "usage_lexer.h"

/* The class of each byte (C_*, usage_lexer.h). */
const uint8_t usage_cls[256] = {
	['"'] = C_STR | C_VAL | C_VAL1, ['\\'] = C_STR,
	['\r'] = C_STR | C_VAL | C_VAL1, ['\n'] = C_STR | C_VAL | C_VAL1,
	['{'] = C_VAL | C_VAL1, ['['] = C_VAL | C_VAL1, ['}'] = C_VAL | C_VAL1,
	[']'] = C_VAL | C_VAL1,
	[','] = C_VAL1,    /* drop mode, top level: a "usage":null member may follow */
};

#if defined(__SSE2__) && !defined(SL_USAGE_NO_SIMD)
/* The three masks of 16 bytes v, shifted right by sh, placed at bit j. */
static inline __attribute__((always_inline)) void
chunk16(__m128i v, unsigned sh, unsigned j, uint64_t *str, uint64_t *val, uint64_t *cm)
{
	__m128i ql, br, v20;

	ql = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
	    _mm_cmpeq_epi8(v, _mm_set1_epi8('\r'))), _mm_cmpeq_epi8(v, _mm_set1_epi8('\n')));
	/* [ and ] are { and } with bit 5 clear: one compare each */
	v20 = _mm_or_si128(v, _mm_set1_epi8(0x20));
	br = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v20, _mm_set1_epi8('{')),
	    _mm_cmpeq_epi8(v20, _mm_set1_epi8('}'))), ql);
	*str |= (uint64_t)((unsigned)_mm_movemask_epi8(_mm_or_si128(ql,
	    _mm_cmpeq_epi8(v, _mm_set1_epi8('\\')))) >> sh) << j;
	*val |= (uint64_t)((unsigned)_mm_movemask_epi8(br) >> sh) << j;
	*cm |= (uint64_t)((unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v,
	    _mm_set1_epi8(','))) >> sh) << j;
}
#endif

#ifdef SL_USAGE_AVX2
/*
 * The masks of the 32 bytes at p, one bit a byte. A set of bytes whose low
 * nibbles differ is one lookup and one compare: a table maps each low
 * nibble to the set's byte with it (0x80, never a match, where none), so
 * a byte is in the set where the lookup gives it back (a byte with bit 7
 * set looks up 0). [ ] { } are { } with bit 5 set first.
 */
static inline __attribute__((target("avx2"), always_inline)) void
half32_avx2(const char *p, uint32_t *str, uint32_t *val, uint32_t *cm)
{
#define X ((char)0x80)
	const __m128i t_ql = _mm_setr_epi8(X, X, '"', X, X, X, X, X, X, X, '\n', X, X, '\r', X, X);
	const __m128i t_str = _mm_setr_epi8(X, X, '"', X, X, X, X, X, X, X, '\n', X, '\\',
	    '\r', X, X);
	const __m128i t_br = _mm_setr_epi8(X, X, X, X, X, X, X, X, X, X, X, '{', X, '}', X, X);
#undef X
	__m256i v = _mm256_loadu_si256((const __m256i *)(const void *)p);
	__m256i v20 = _mm256_or_si256(v, _mm256_set1_epi8(0x20)), ql, br;

	ql = _mm256_cmpeq_epi8(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t_ql), v), v);
	br = _mm256_cmpeq_epi8(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t_br), v20),
	    v20);
	*str = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_shuffle_epi8(
	    _mm256_broadcastsi128_si256(t_str), v), v));
	*val = (uint32_t)_mm256_movemask_epi8(_mm256_or_si256(ql, br));
	*cm = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(',')));
}

/* The masks of the 64 bytes at p with AVX2: two 32-byte halves. */
static inline __attribute__((target("avx2"), always_inline)) void
load64_avx2(const char *p, uint64_t *str, uint64_t *val, uint64_t *cm)
{
	uint32_t s0, v0, c0, s1, v1, c1;

	half32_avx2(p, &s0, &v0, &c0);
	half32_avx2(p + 32, &s1, &v1, &c1);
	*str = (uint64_t)s1 << 32 | s0;
	*val = (uint64_t)v1 << 32 | v0;
	*cm = (uint64_t)c1 << 32 | c0;
}
#endif

/* The masks of the 64 bytes at p, all of them readable, without AVX2. */
static inline __attribute__((always_inline)) void
load64(const char *p, uint64_t *str, uint64_t *val, uint64_t *cm)
{
	unsigned j;

	*str = *val = *cm = 0;
#if defined(__SSE2__) && !defined(SL_USAGE_NO_SIMD)
	for (j = 0; j < 64; j += 16)
		chunk16(_mm_loadu_si128((const __m128i *)(const void *)(p + j)), 0, j,
		    str, val, cm);
#else
	for (j = 0; j < 64; j++) {
		unsigned k = usage_cls[(unsigned char)p[j]];

		*str |= (uint64_t)((k & C_STR) != 0) << j;
		*val |= (uint64_t)((k & C_VAL) != 0) << j;
		*cm |= (uint64_t)(p[j] == ',') << j;
	}
#endif
}

/*
 * Masks of [p, p + 64), p < e; nothing before b->lo or at or past e is
 * read. A block short of e is taken from the input's last 64 bytes where
 * it has that many. Out of line: once per 64 bytes, and it keeps
 * blk_next() small enough to inline. Without AVX2 (and for
 * usage_blk_load_avx2() on an input shorter than 64 bytes).
 */
__attribute__((noinline)) void
usage_blk_load(struct blk *b, const char *p, const char *e)
{
	uint64_t str = 0, val = 0, cm = 0, endm;
	size_t len = (size_t)(e - p);
	unsigned j;

	b->base = (uintptr_t)p;
	if (len >= 64) {
		load64(p, &b->str, &b->val, &b->cm);
		return;
	}
	endm = ~(uint64_t)0 << len;
	if (e - b->lo >= 64) {
		/* the input's last 64 bytes, this block at their end */
		load64(e - 64, &str, &val, &cm);
		str >>= 64 - len;
		val >>= 64 - len;
		cm >>= 64 - len;
	} else {
#if defined(__SSE2__) && !defined(SL_USAGE_NO_SIMD)
		for (j = 0; j + 16 <= len; j += 16)
			chunk16(_mm_loadu_si128((const __m128i *)(const void *)(p + j)), 0, j,
			    &str, &val, &cm);
		if (j < len) {
			char pad[16];

			if (e - b->lo >= 16) {
				/* the input's last 16 bytes, this chunk at their end */
				chunk16(_mm_loadu_si128((const __m128i *)(const void *)(e - 16)),
				    (unsigned)(16 - (len - j)), j, &str, &val, &cm);
			} else {
				memcpy(pad, p + j, len - j);
				memset(pad + (len - j), ' ', 16 - (len - j));
				chunk16(_mm_loadu_si128((const __m128i *)(const void *)pad), 0, j,
				    &str, &val, &cm);
			}
		}
#else
		for (j = 0; j < len; j++) {
			unsigned k = usage_cls[(unsigned char)p[j]];

			str |= (uint64_t)((k & C_STR) != 0) << j;
			val |= (uint64_t)((k & C_VAL) != 0) << j;
			cm |= (uint64_t)(p[j] == ',') << j;
		}
#endif
	}
	b->str = str | endm;
	b->val = val | endm;
	b->cm = cm & ~endm;
}

#ifdef SL_USAGE_AVX2
/* usage_blk_load() where the CPU has AVX2: the same masks, one call fewer. */
__attribute__((target("avx2"), noinline)) void
usage_blk_load_avx2(struct blk *b, const char *p, const char *e)
{
	uint64_t str, val, cm, endm;
	size_t len = (size_t)(e - p);

	if (len >= 64) {
		b->base = (uintptr_t)p;
		load64_avx2(p, &b->str, &b->val, &b->cm);
		return;
	}
	if (e - b->lo < 64) {
		usage_blk_load(b, p, e);
		return;
	}
	/* the input's last 64 bytes, this block at their end */
	load64_avx2(e - 64, &str, &val, &cm);
	endm = ~(uint64_t)0 << len;
	b->base = (uintptr_t)p;
	b->str = str >> (64 - len) | endm;
	b->val = val >> (64 - len) | endm;
	b->cm = cm >> (64 - len) & ~endm;
}
#endif

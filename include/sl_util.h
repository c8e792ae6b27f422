/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_util: the one monotonic clock and the one string hash, for every
 * module (inline: they run per request).
 *
 * The clock is CLOCK_MONOTONIC, which every process of a node shares:
 * deadlines, token windows and leases kept in the shared region compare
 * across workers and the master. The hash is FNV-1a (64 bits); sl_hash64
 * adds a mixer for tables indexed by the low bits.
 */
#ifndef SL_UTIL_H
#define SL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* A duration in milliseconds (a config value) as libev's seconds. */
static inline double
sl_ms_to_s(uint64_t ms)
{
	return (double)ms / 1000.0;
}

static inline uint64_t
sl_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int64_t
sl_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Seconds, with their fraction: the master's deadlines and backoffs. */
static inline double
sl_mono_s(void)
{
	return (double)sl_mono_ns() / 1e9;
}

static inline uint64_t
sl_mono_sec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec;
}

#define SL_FNV_OFFSET 0xcbf29ce484222325ULL
#define SL_FNV_PRIME 0x100000001b3ULL

/* FNV-1a of p[0..n), from h (SL_FNV_OFFSET to start). */
static inline uint64_t
sl_fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *s = p;
	size_t i;

	for (i = 0; i < n; i++) {
		h ^= s[i];
		h *= SL_FNV_PRIME;
	}
	return h;
}

/* FNV-1a of p[0..n), then a mixer: every bit of it reaches the low bits. */
static inline uint64_t
sl_hash64(const void *p, size_t n)
{
	uint64_t h = sl_fnv1a(SL_FNV_OFFSET, p, n);

	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	return h;
}

#endif

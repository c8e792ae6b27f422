/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_console: what the operator's console on the admin listener needs
 * beside the master's own state (sluice.8, ADMIN ENDPOINTS):
 *
 *  - the page: src/console.html, console.css, console.js and favicon.svg,
 *    embedded in the binary at build time (Makefile.am turns each into a
 *    C array), so it works offline and fetches nothing but its own files
 *    and /status.json;
 *  - a window of samples of cumulative counters, one a second, from which
 *    the "last minute" numbers of /status.json are differences;
 *  - a quantile read from histogram bucket counts, and a JSON string
 *    writer.
 *
 * Pure: no I/O, no clock, no globals beyond the constant page.
 */
#ifndef SL_CONSOLE_H
#define SL_CONSOLE_H

#include <stddef.h>
#include <stdint.h>

#include "sl_admin.h"

/* One file of the page. */
struct sl_console_asset {
	const char *path;            /* "/", "/console.css", ... */
	const char *content_type;
	const unsigned char *data;
	size_t len;
};

/* The embedded file served at path, or NULL. */
const struct sl_console_asset *sl_console_asset(const char *path);

/*
 * A ring of nsamples vectors of counters, each stamped with the time it
 * was taken (seconds, any monotonic clock). The caller keeps the layout
 * of a vector the same from one push to the next; a vector may grow (new
 * indices at its end read 0 in older samples).
 */
struct sl_window;

/* NULL when out of memory. */
struct sl_window *sl_window_new(size_t nsamples);
void sl_window_free(struct sl_window *);

/* Copy v[0..n) in as the newest sample, taken at `at`; -1: no memory. */
int sl_window_push(struct sl_window *, double at, const uint64_t *v, size_t n);

/*
 * The oldest sample taken at or after `since` (*n: its length), or NULL
 * when there is none: what "over the last minute" subtracts.
 */
const uint32_t *sl_window_since(const struct sl_window *, double since,
    size_t *n);

/*
 * Elements i..i+n of every sample read 0 from now on: the counters of an
 * index given to another name start again from 0.
 */
void sl_window_forget(struct sl_window *, size_t i, size_t n);

/*
 * cur minus element i of base (base_n elements, NULL: none), 0 for an
 * element base does not have, modulo 2^32 (samples keep 32 bits: a
 * counter that passed a multiple of 2^32 in between is still exact). An
 * index reset for reuse is forgotten first (sl_window_forget).
 */
uint64_t sl_window_delta(const uint32_t *base, size_t base_n, size_t i,
    uint64_t cur);

/*
 * The q-quantile (0 < q < 1) of observations counted in n + 1 buckets,
 * cum[i] the cumulative count at or below bounds[i] (cum[n]: all of them),
 * interpolated linearly inside the bucket as Prometheus'
 * histogram_quantile() does; an answer in the +Inf bucket is bounds[n-1].
 * -1 when nothing was counted.
 */
double sl_console_quantile(const double *bounds, int n, const uint64_t *cum,
    double q);

/* s as a JSON string, quotes included. */
void sl_console_json_str(struct sl_str *o, const char *s);

#endif

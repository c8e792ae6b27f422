/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_loadmetrics: a model runner's load, read from its Prometheus page.
 *
 * Pure: no I/O, no logging, no globals, no allocation. The master scrapes
 * each replica's metrics endpoint and hands the body here; what comes back
 * is published per replica in the shared region.
 *
 * Names read (exact names only: `vllm:num_requests_waiting_by_reason`,
 * `..._total`, `..._bucket`, `..._sum`, `..._count` never match):
 *
 *   signal    vLLM                          TGI                     llama.cpp
 *   waiting   vllm:num_requests_waiting     tgi_queue_size          llamacpp:requests_deferred
 *   running   vllm:num_requests_running     tgi_batch_current_size  llamacpp:requests_processing
 *   kv        vllm:kv_cache_usage_perc      -                       llamacpp:kv_cache_usage_ratio
 *             vllm:gpu_cache_usage_perc (vLLM < 0.10)
 *
 * Both vLLM cache gauges are fractions 0..1 despite the `perc`.
 * waiting and running are summed over label sets (vLLM's data-parallel
 * engines each print their own `engine="N"` line); kv is the largest over
 * label sets, clamped to 0..1 (the fullest engine is the one that refuses).
 *
 * Format: Prometheus text exposition 0.0.4 (and the OpenMetrics lines it
 * overlaps with): `# ...` comment lines (HELP, TYPE, EOF), blank lines, LF
 * or CRLF line ends, a last line without an end, label sets with escaped
 * `\"`, `\\` and `\n` in values, an optional timestamp (or anything else)
 * after the value. Values are read without the C library's locale: decimal
 * with optional exponent, NaN and +/-Inf. A sample whose value is not
 * finite or is negative is ignored, as is a line that does not parse.
 */
#ifndef SL_LOADMETRICS_H
#define SL_LOADMETRICS_H

#include <stddef.h>

struct sl_load_sample {
	int have_waiting, have_running, have_kv;  /* 1 when the page had the metric */
	double waiting;    /* requests queued, summed over label sets */
	double running;    /* requests running, summed */
	double kv_cache;   /* KV-cache use 0..1 (max over label sets) */
};

/*
 * Parse a Prometheus text exposition (format 0.0.4) body. Returns how many of
 * the three signals were found (0..3); never reads past len; body need not be
 * NUL-terminated. *out is cleared first; a signal counts as found ("had") when
 * at least one of its samples had a finite, non-negative value, and a signal
 * not found reads 0.
 */
int sl_loadmetrics_parse(const char *body, size_t len, struct sl_load_sample *out);

/*
 * Read one sample value as the parser does: [+-] digits [. digits]
 * [e|E [+-] digits], or NaN / Inf / +Inf / -Inf (any case), to within a
 * couple of units in the last place (19 significant digits kept, scaled by
 * exact powers of ten; no strtod, so no locale). Exposed for
 * the tests and the fuzz target. Returns 0 and sets *v when s[0..len) is
 * exactly one such number, -1 otherwise (then *v is untouched).
 */
int sl_loadmetrics_number(const char *s, size_t len, double *v);

#endif

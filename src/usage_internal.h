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
 */
#ifndef SL_USAGE_INTERNAL_H
#define SL_USAGE_INTERNAL_H

#include <stddef.h>

#include "sl_usage.h"

/* ------------------------------------------------------------------ usage object */

/*
 * The bytes p[0..len) of a usage object as the scanner copied them: 1 with
 * *u filled when they are one JSON object whose "prompt_tokens" and
 * "completion_tokens" are non-negative integers ("total_tokens" optional,
 * likewise), 0 for anything else (*u then unspecified).
 */
int usage_obj_read(const char *p, size_t len, struct sl_usage *u);

#endif

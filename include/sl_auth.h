/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_auth: API key -> tenant lookup. A hash index over every key of the
 * configuration, so a request costs one hash and one constant-time compare
 * however many keys there are. The compare runs in time independent of
 * where the bytes differ; what a probe reveals is at most whether some key
 * shares the token's 64-bit hash.
 */
#ifndef SL_AUTH_H
#define SL_AUTH_H

#include <stddef.h>

#include "sl_config.h"

struct sl_keyidx;

/* Build the index over cfg's keys (cfg must outlive it). NULL on ENOMEM. */
struct sl_keyidx *sl_keyidx_build(const struct sl_config *cfg);
void sl_keyidx_free(struct sl_keyidx *);

/* Tenant index (into cfg->tenants) for the token, or -1. */
int sl_keyidx_lookup(const struct sl_keyidx *, const char *tok, size_t len);

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * API key index: open addressing, power-of-two table at most half full,
 * built by the master once per generation and read by its workers (16
 * bytes a slot: 100,000 keys cost 4 MiB, shared by every worker).
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sl_auth.h"
#include "sl_util.h"
#include "sl_http.h"

struct slot {
	const char *key;     /* NULL: empty */
	uint32_t hash;       /* the key's hash, low half */
	int32_t tenant;
};

struct sl_keyidx {
	struct slot *slots;
	size_t mask;
};


struct sl_keyidx *
sl_keyidx_build(const struct sl_config *cfg)
{
	struct sl_keyidx *x;
	size_t n = 0, size = 8, t, k;

	for (t = 0; t < cfg->ntenants; t++)
		n += cfg->tenants[t].nkeys;
	while (size < n * 2)
		size *= 2;
	x = calloc(1, sizeof(*x));
	if (x == NULL || (x->slots = calloc(size, sizeof(*x->slots))) == NULL) {
		free(x);
		return NULL;
	}
	x->mask = size - 1;
	for (t = 0; t < cfg->ntenants; t++)
		for (k = 0; k < cfg->tenants[t].nkeys; k++) {
			const char *key = cfg->tenants[t].keys[k];
			size_t len = strlen(key), i;
			uint64_t h = sl_fnv1a(SL_FNV_OFFSET, key, len);

			for (i = (size_t)h & x->mask; x->slots[i].key != NULL;
			    i = (i + 1) & x->mask)
				;
			x->slots[i].hash = (uint32_t)h;
			x->slots[i].key = key;
			x->slots[i].tenant = (int32_t)t;
		}
	return x;
}

void
sl_keyidx_free(struct sl_keyidx *x)
{
	if (x != NULL) {
		free(x->slots);
		free(x);
	}
}

int
sl_keyidx_lookup(const struct sl_keyidx *x, const char *tok, size_t len)
{
	uint64_t h = sl_fnv1a(SL_FNV_OFFSET, tok, len);
	size_t i;
	int found = -1;

	for (i = (size_t)h & x->mask; x->slots[i].key != NULL;
	    i = (i + 1) & x->mask) {
		const struct slot *s = &x->slots[i];

		if (s->hash == (uint32_t)h && found < 0 &&
		    sl_ct_equal(s->key, strlen(s->key), tok, len))
			found = s->tenant;
	}
	return found;
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_prom: the admin listener's /metrics page, Prometheus text format
 * 0.0.4, rendered by the master from the shared region.
 *
 * The page's families, their order, names, help texts and label values
 * are the interface (sluice.8, METRICS): a series may be added, never
 * renamed or reordered. Reading costs O(tenants + replicas + model
 * slots); nothing is written, to the region or elsewhere.
 *
 * The module reads what the master shows it in a struct sl_page_in and
 * nothing else of the master.
 */
#ifndef SL_PROM_H
#define SL_PROM_H

#include <stddef.h>
#include <stdint.h>

#include "sl_admin.h"
#include "sl_cluster.h"
#include "sl_config.h"
#include "sl_queue.h"
#include "sl_shm.h"
#include "sl_slots.h"

/* What the admin pages read of the master (also sl_status_json.h). */
struct sl_page_in {
	const struct sl_gen *cur;            /* the serving generation */
	const struct sl_slots *slots;        /* names of slots, the region */
	struct sl_queue *queue;              /* the pools' fair queue */
	struct sl_cluster_m *cluster;        /* NULL: one node */
	int workers;                 /* running workers of cur, not draining */
	unsigned reloads_ok, reloads_failed;
	double started;              /* the master's start, monotonic seconds */
};

/* Append the /metrics page to o. */
void sl_prom_render(const struct sl_page_in *p, struct sl_str *o);

/*
 * A replica's state by shared index, at now (sl_mono_ms): streams in
 * flight, 1 when up by its probes, busy (Retry-After), ejected.
 */
long sl_prom_value_streams(struct sl_shm *shm, size_t slot, int64_t now);
long sl_prom_value_up(struct sl_shm *shm, size_t slot, int64_t now);
long sl_prom_value_busy(struct sl_shm *shm, size_t slot, int64_t now);
long sl_prom_value_ejected(struct sl_shm *shm, size_t slot, int64_t now);
/*
 * The runner's own load as load_metrics last scraped it: 1 and the
 * replica's queue and KV-cache use (per mille; each -1 when its page
 * lacks it) when up scrapes and the sample is fresh, else 0.
 */
int sl_prom_replica_load(struct sl_shm *shm, const struct sl_upstream_conf *up,
    size_t slot, int64_t now, int32_t *waiting, int32_t *kv);

#endif

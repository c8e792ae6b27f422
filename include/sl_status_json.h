/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_status_json: the console's /status.json on the admin listener
 * (sluice.8, ADMIN ENDPOINTS), rendered by the master from the shared
 * region with the readers of /metrics (sl_prom.h).
 *
 * Its "last minute" numbers are the counters now minus a sample taken
 * at most SL_STATUS_SPAN_S ago: the master calls sl_status_sample every
 * SL_STATUS_SAMPLE_S into windows of SL_STATUS_SAMPLES samples
 * (sl_console.h). The keys of the document are the interface: the
 * console's page reads them. Reading writes nothing but the samples.
 */
#ifndef SL_STATUS_JSON_H
#define SL_STATUS_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "sl_console.h"
#include "sl_prom.h"
#include "sl_slots.h"

#define SL_STATUS_SAMPLES 13
#define SL_STATUS_SAMPLE_S 5.0
#define SL_STATUS_SPAN_S 60.0

/*
 * The console's windows: SL_INDEX_VALUES counters per shared index
 * (window), SL_MODEL_VALUES per model slot (mwindow), and the scratch a
 * sample is built in. Owned by the master; NULL windows: no console.
 */
struct sl_status_windows {
	struct sl_window *window;
	struct sl_window *mwindow;
	uint64_t *sample;
	size_t sample_cap;
};

/* Push a sample of the counters of s's slots, taken at now, into w. */
void sl_status_sample(struct sl_status_windows *w, const struct sl_slots *s,
    double now);

/* Append /status.json at now (monotonic seconds, as p->started) to o. */
void sl_status_render(const struct sl_page_in *p,
    const struct sl_status_windows *w, double now, struct sl_str *o);

#endif

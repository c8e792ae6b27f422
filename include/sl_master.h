/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_master: the master process. Owns the listen sockets and the shared
 * region, forks and reaps workers, reclaims a dead worker's slots, and
 * handles the signals (HUP reload, TERM/INT drain, QUIT immediate exit).
 */
#ifndef SL_MASTER_H
#define SL_MASTER_H

#include "sl_config.h"

/*
 * Run the master with a validated config read from path; takes ownership
 * of cfg. Returns the process exit status.
 */
int sl_master_run(const char *path, struct sl_config *cfg);

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_worker: one worker process. It owns its connections from accept to
 * close, one libev loop, a few libcurl multi handles (shards: upstream
 * connections are reused within one), and a row of the shared region.
 */
#ifndef SL_WORKER_H
#define SL_WORKER_H

#include <stddef.h>
#include <sys/types.h>

#include "sl_worker_state.h"

/* What the master hands a worker at fork. Borrowed, never freed by the worker. */
struct sl_worker_args {
	const struct sl_config *cfg;
	struct sl_shm *shm;
	const size_t *tenant_slot;   /* config tenant index -> shm tenant index */
	const struct sl_keyidx *keys;   /* API key -> config tenant index */
	const size_t *upstream_slot; /* config upstream index -> shm upstream index */
	/* config upstream index -> fair queue pool (0: no queue) */
	const size_t *queue_slot;
	/* config model index -> shm model slot (sl_shm.h); NULL: no models: */
	const size_t *model_slot;
	/* [upstream][replica] -> shared index of the replica (sl_upstream.h) */
	const size_t *const *replica_slot;
	/* shared index -> its epoch when the worker was forked (sl_shm.h) */
	const uint32_t *replica_epoch;
	size_t row;                  /* this worker's shm row */
	struct sl_cluster_shm *cluster_shm;   /* NULL: no `cluster:` */
	struct sl_queue *queue;      /* the fair queue (sl_queue.h) */
	struct sl_stored *stored;    /* stored responses' replicas (sl_stored.h) */
	int listen_fd;               /* this worker's SO_REUSEPORT socket */
	int index;                   /* worker number, for logs */
	unsigned generation;
	pid_t master_pid;            /* its parent: a change means it died */
};


/* Run the worker; returns the process exit status. Call in the child. */
int sl_worker_main(const struct sl_worker_args *);

#endif

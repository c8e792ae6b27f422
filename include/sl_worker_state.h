/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_worker_state: what every module of a worker process shares: struct
 * sl_worker (its loop, the config, its row of the shared region, pools,
 * transfers, connections and their lists). The process itself (accept,
 * signals, drain: worker.c) is above the modules that read this; they
 * never call it.
 */
#ifndef SL_WORKER_STATE_H
#define SL_WORKER_STATE_H

#include <curl/curl.h>
#include <ev.h>
#include <stddef.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "sl_auth.h"
#include "sl_buf.h"
#include "sl_cluster.h"
#include "sl_config.h"
#include "sl_model.h"
#include "sl_queue.h"
#include "sl_shm.h"
#include "sl_upstream.h"

struct sl_conn;
struct sl_h1;
struct sl_h2;

struct sl_worker {
	struct ev_loop *loop;
	const struct sl_config *cfg;
	struct sl_shm *shm;
	const size_t *tenant_slot;
	/*
	 * Shared index -> its epoch when this worker was forked: an index
	 * whose epoch moved since was given to another tenant or replica
	 * after a reload removed ours (sl_shm.h).
	 */
	const uint32_t *index_epoch;
	const size_t *upstream_slot;
	const size_t *queue_slot;    /* config upstream -> queue pool; 0: none */
	const size_t *model_slot;    /* config model -> shm model slot; NULL */
	struct sl_pools *pools;      /* replica choice, per upstream */
	struct sl_models *models;    /* target choice, per model; NULL: no models: */
	struct sl_cluster_w *cluster; /* Redis leases; NULL: one node */
	struct sl_queue *queue;      /* the fair queue; NULL: none */
	struct sl_stored *stored;    /* stored responses' replicas; NULL: none */
	ev_io queue_io;              /* its eventfd for this row: grants */
	TAILQ_HEAD(, sl_conn) queued;    /* connections in CS_QUEUED */
	size_t row;
	int index;
	int access_fd;               /* -1: access log off */
	const struct sl_keyidx *keys;   /* API key -> tenant: the master's */
	ev_timer gauge_timer;
	ev_signal sig_usr1;

	int listen_fd;
	ev_io accept_io;
	int spare_fd;                /* released on EMFILE to shed one connection */
	/*
	 * An epoll set of the client sockets we stopped reading (pipelined
	 * bytes over the input buffer), watched for EPOLLRDHUP only: their
	 * client leaving is seen at once although their input is unread.
	 */
	int hup_fd;
	ev_io hup_io;
	ev_timer accept_retry;       /* also bounds accept_await */
	int accept_await;            /* not accepting until Redis answers
	                              * (sl_cluster_worker_await) */

	struct sl_transfers *xfers;  /* libcurl multi shards, easy handles */
	struct sl_blocks blocks;     /* 4 KiB blocks: input and stream buffers */

	ev_signal sig_term, sig_int, sig_quit, sig_usr2;
	ev_timer drain_timer;
	int draining;

	size_t nconns;               /* HTTP/1.x and HTTP/2 connections */
	TAILQ_HEAD(, sl_conn) conns;     /* exchanges: requests in progress */
	TAILQ_HEAD(, sl_h1) h1s;         /* HTTP/1.x connections (h1.c) */
	TAILQ_HEAD(, sl_h2) h2s;         /* HTTP/2 connections (h2.c) */
	size_t nh2;
	TAILQ_HEAD(, sl_conn) dirty;     /* exchanges with bytes to flush */
	TAILQ_HEAD(, sl_h1) idle;        /* kept alive, oldest first (h1.c) */
	ev_prepare flush_prep;
	/* Scratch of the response path, used by one callback at a time. */
	struct sl_mrw_buf mrw_buf;   /* an answer with its "model" set back */
	char *scan_buf;              /* a scanned read's bytes that go out */
	size_t scan_buf_cap;
};

#endif

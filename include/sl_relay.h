/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_relay: one client connection, an explicit state machine from accept
 * to close: read the head, authenticate, admit, read the body, relay the
 * upstream response through the bounded stream buffer, keep-alive.
 */
#ifndef SL_RELAY_H
#define SL_RELAY_H

#include <curl/curl.h>

struct sl_worker;
struct sl_shard;
struct sl_conn;

/* Take over an accepted, non-blocking client fd. */
void sl_conn_new(struct sl_worker *, int fd);

/*
 * The upstream transfer of an easy handle finished (CURLMSG_DONE); arg is
 * the worker. The sl_transfer_hooks `done` of the worker's transfers.
 */
void sl_conn_upstream_done(void *arg, struct sl_shard *, CURL *easy,
    CURLcode result);

/* Worker shutdown began: close idle connections, close others when done. */
void sl_conn_drain_all(struct sl_worker *);

/* Close every connection now, cutting streams (drain timeout or SIGQUIT). */
void sl_conn_close_all(struct sl_worker *);

/* Write out what the callbacks of this loop iteration queued. */
void sl_conn_flush_dirty(struct sl_worker *);

/* The same, as the sl_transfer_hooks `flush` (arg is the worker). */
void sl_conn_flush_dirty_hook(void *arg);

/* Publish this worker's gauges (paused streams, buffered bytes...). */
void sl_conn_gauges(struct sl_worker *);

/* w->hup_fd is readable: close the connections whose client left. */
void sl_conn_hup_event(struct sl_worker *);

/* The fair queue's eventfd of w's row is readable: start granted waiters. */
void sl_conn_queue_event(struct sl_worker *);

/* Once a second: waiters' deadlines follow their pool's timeout now. */
void sl_conn_queue_tick(struct sl_worker *);

/* Refuse a connection over max_connections with a 503 and close it. */
void sl_conn_refuse(struct sl_worker *, int fd);
/* At max_connections: close the longest idle kept-alive connection; 1 if one was. */
int sl_conn_reap_idle(struct sl_worker *);

#endif

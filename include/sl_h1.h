/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_h1: an HTTP/1.x client connection, from accept to close: the socket
 * and its options, the TLS handshake (ALPN h2 hands the connection to
 * h2.c), reads into one input block, writev of what its exchange has,
 * keep-alive and pipelining, linger after a refusal, idle connections.
 * Each request is an exchange of its own (sl_exchange.h).
 */
#ifndef SL_H1_H
#define SL_H1_H

struct sl_worker;

/* Take over an accepted, non-blocking client fd. */
void sl_h1_new(struct sl_worker *, int fd);

/* Refuse a connection over max_connections with a 503 and close it. */
void sl_h1_refuse(struct sl_worker *, int fd);

/* At max_connections: close the longest idle kept-alive connection; 1 if one was. */
int sl_h1_reap_idle(struct sl_worker *);

/* Worker shutdown began: close connections idle between requests. */
void sl_h1_drain_all(struct sl_worker *);

/* Close every connection now (after sl_conn_close_all ended their requests). */
void sl_h1_close_all(struct sl_worker *);

/* w->hup_fd is readable: close the connections whose client left. */
void sl_h1_hup_event(struct sl_worker *);

#endif

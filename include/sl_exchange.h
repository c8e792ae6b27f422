/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_exchange: one request and its response, apart from the framing that
 * carries them. An HTTP/1.x connection (h1.c) carries one exchange at a
 * time, opened at the first byte of each request; an HTTP/2 connection
 * (h2.c) carries many, one per stream. A framing reaches an exchange only
 * through the entry points below, and the exchange reaches its framing
 * only through the function table the framing gave it: h1.c and h2.c
 * depend on this header, the exchange depends on neither.
 *
 * The request reaches the exchange as HTTP/1.1 bytes (HTTP/2 writes the
 * head it decoded as a request line and header lines, and the body as-is,
 * or chunked when its length is unknown): auth, limits, admission, model
 * routing and errors are the same code for both protocols. The response
 * waits in the exchange as the head text it built (status line and header
 * lines, which HTTP/2 turns into its own form) and body bytes in its
 * bounded stream buffer. HTTP/1.x writes them as the socket takes them
 * (sl_exchange_peek and sl_exchange_drain: one writev, no copy); HTTP/2
 * pulls body bytes as the client's flow-control window allows
 * (sl_exchange_pull). A stream whose client does not read fills its
 * buffer and pauses its own upstream, and only its own.
 */
#ifndef SL_EXCHANGE_H
#define SL_EXCHANGE_H

#include <ev.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <curl/curl.h>

struct sl_worker;
struct sl_conn;
struct sl_shard;

/* What an exchange may ask of the connection or stream carrying it (ctx). */
struct sl_framing {
	const char *proto;   /* the access log's "proto": "h1", "h2" */
	/*
	 * 1: HTTP/1.x. send() writes at once what the socket takes, so the
	 * tenant slot of a complete response is given back before its last
	 * write (sluice.8) and taken back if bytes are left over; the body is
	 * framed by the exchange (chunked, or ended by the close for an
	 * HTTP/1.0 client). 0: HTTP/2 frames it and pulls it.
	 */
	int http1;
	/*
	 * Output waits in the exchange (its head, body bytes, or the end):
	 * send what the client can take now, or say that it waits. -1: the
	 * client is gone (the exchange closes).
	 */
	int (*send)(void *ctx);
	/*
	 * The exchange takes request bytes again (after an admission's wait,
	 * say): offer what waits, from the loop, not from inside this call.
	 */
	void (*input)(void *ctx);
	/* A 1xx head to send now (100 Continue); NULL: the framing has none. */
	void (*interim)(void *ctx, const char *p, size_t n);
	/*
	 * The response went out whole and its request was read: the
	 * exchange is over and lets go of ctx. close: the connection may not
	 * carry another request; linger: the client may still be sending the
	 * body of a refused request (read it to its end before closing, or
	 * the close could reset the answer away). NULL: the framing ends the
	 * exchange itself (sl_exchange_closed).
	 */
	void (*done)(void *ctx, int close, int linger);
	/*
	 * The exchange ends before its stream did (a cut stream, an error):
	 * reset the stream or close the connection; ctx is not used again.
	 * cut: the response was not whole (the client must not take it as
	 * complete).
	 */
	void (*reset)(void *ctx, int cut);
};

/*
 * A new exchange: fd and peer are the connection's (logs); t_ready is when
 * the connection became ready for this request (its head's time counts
 * from there), t_rx when its first byte arrived (0: not known). NULL when
 * out of memory (the framing refuses the request).
 */
struct sl_conn *sl_exchange_open(struct sl_worker *, const struct sl_framing *,
    void *ctx, int fd, const char *peer, ev_tstamp t_ready, ev_tstamp t_rx);

/*
 * Request bytes (the head, body, chunk framing): parsed now as far as the
 * exchange takes them. Returns how many it took; the rest waits in the
 * framing until input() (an exchange waiting for admission or for its
 * upstream takes none). The exchange may end inside the call.
 */
size_t sl_exchange_feed(struct sl_conn *, const char *p, size_t n);

/*
 * Output for a framing that writes: iovecs (at most 3) of what waits, the
 * head's unsent part first, then body bytes; 0 when none. Drain n bytes
 * once written.
 */
int sl_exchange_peek(const struct sl_conn *, struct iovec iov[3]);
void sl_exchange_drain(struct sl_conn *, size_t n);
/* Bytes wait to be written (the response's head or body). */
int sl_exchange_waiting(const struct sl_conn *);

/*
 * For a framing that builds its own head: the response head when one
 * waits (HTTP/1.1 text: status line, header lines, blank line), and
 * whether body bytes follow (pulled with sl_exchange_pull). 0: no head
 * yet.
 */
int sl_exchange_head(const struct sl_conn *, const char **head, size_t *len,
    int *body);
/* The framing took the head sl_exchange_head gave it. */
void sl_exchange_head_sent(struct sl_conn *);

/*
 * Body bytes for the client, at most len, into buf; *eof set when they are
 * the last (the response is complete). 0 and no *eof: none yet (send()
 * will say when). A response the runner cut never ends this way: once its
 * last byte is pulled, the exchange resets the stream (reset(), cut) a
 * moment later (SL_CUT_GRACE).
 */
size_t sl_exchange_pull(struct sl_conn *, uint8_t *buf, size_t len, int *eof);

/* The connection can take bytes again: write, resume, finish. */
void sl_exchange_writable(struct sl_conn *);

/*
 * The stream or connection is closed: done (the whole response went out)
 * or not (the client reset it, or its connection is gone). The exchange
 * ends here and never uses ctx again.
 */
void sl_exchange_closed(struct sl_conn *, int done);

/* Keep the exchange while a framing's entry point looks at it. */
void sl_exchange_hold(struct sl_conn *);
void sl_exchange_unhold(struct sl_conn *);

/* ---- the worker's side ---- */

/*
 * The upstream transfer of an easy handle finished (CURLMSG_DONE); arg is
 * the worker. The sl_transfer_hooks `done` of the worker's transfers.
 */
void sl_conn_upstream_done(void *arg, struct sl_shard *, CURL *easy,
    CURLcode result);

/* Close every exchange now, cutting streams (drain timeout or SIGQUIT). */
void sl_conn_close_all(struct sl_worker *);

/* Write out what the callbacks of this loop iteration queued. */
void sl_conn_flush_dirty(struct sl_worker *);

/* The same, as the sl_transfer_hooks `flush` (arg is the worker). */
void sl_conn_flush_dirty_hook(void *arg);

/* Publish this worker's gauges (paused streams, buffered bytes...). */
void sl_conn_gauges(struct sl_worker *);

/* The fair queue's eventfd of w's row is readable: start granted waiters. */
void sl_conn_queue_event(struct sl_worker *);

/* Once a second: waiters' deadlines follow their pool's timeout now. */
void sl_conn_queue_tick(struct sl_worker *);

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_h2: HTTP/2 framing (nghttp2) over a TLS connection whose ALPN chose
 * h2. One connection, many streams; each stream is one exchange
 * (sl_exchange.h) with its own admission, stream buffer and backpressure.
 */
#ifndef SL_H2_H
#define SL_H2_H

#include <stdint.h>

struct sl_worker;

/* Why a connection or stream was ended by the protocol's rules. */
enum sl_h2_err {
	SL_H2_E_PROTOCOL,         /* PROTOCOL_ERROR */
	SL_H2_E_FLOW_CONTROL,     /* a window update past 2^31-1, data past
	                           * the window */
	SL_H2_E_FRAME_SIZE,
	SL_H2_E_COMPRESSION,      /* HPACK that does not decode */
	SL_H2_E_REFUSED_STREAM,   /* more open streams than h2_max_streams */
	SL_H2_E_STREAM_CLOSED,    /* frames on a closed stream */
	SL_H2_E_FLOOD,            /* SETTINGS, PING or empty frames flood,
	                           * CONTINUATION flood */
	SL_H2_E_RAPID_RESET,      /* streams reset past nghttp2's rate limit */
	SL_H2_E_HEADER_SIZE,      /* a header list over max_header_bytes */
	SL_H2_E_BAD_PREFACE,      /* not the HTTP/2 connection preface */
	SL_H2_E_SETTINGS_TIMEOUT,
	SL_H2_E_OTHER,
	SL_H2_E_MAX
};

const char *sl_h2_err_name(enum sl_h2_err);

/*
 * Take over a connection (its socket and TLS state) whose handshake chose
 * h2. The caller forgets both. On failure the connection is closed.
 */
void sl_h2_start(struct sl_worker *, int fd, void *ssl, const char *peer);

/* Shutdown began: GOAWAY to every connection; each closes when idle. */
void sl_h2_drain_all(struct sl_worker *);

/* Close every connection now (their exchanges end as client_gone). */
void sl_h2_close_all(struct sl_worker *);

/* Open connections and streams of this worker (gauges). */
void sl_h2_counts(struct sl_worker *, uint64_t *conns, uint64_t *streams);

#endif

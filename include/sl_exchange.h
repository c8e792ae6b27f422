/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_exchange: one request and its response, apart from the framing that
 * carries them. An HTTP/1.x connection carries one exchange at a time
 * on its socket (exchange_h1.c); an HTTP/2 connection (h2.c) carries
 * many, one per stream, and reaches each only through the entry points
 * below (exchange_stream.c). The
 * exchange reaches an HTTP/2 stream only through the function table its
 * framing gave it, so h2.c depends on this header and the exchange does not
 * depend on h2.c.
 *
 * The request reaches the exchange as HTTP/1.1 bytes (the framing writes
 * the head it decoded as a request line and header lines, and the body
 * as-is, or chunked when its length is unknown): auth, limits, admission,
 * model routing and errors are the same code for both protocols. The
 * response leaves as the head text the exchange built (status line and
 * header lines, which the framing turns into its own form) and body bytes
 * pulled from the exchange's bounded stream buffer as the client's flow
 * control window allows: a stream whose window is closed fills its buffer
 * and pauses its own upstream, and only its own.
 */
#ifndef SL_EXCHANGE_H
#define SL_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct sl_worker;
struct sl_conn;

/* What an exchange may ask of the stream carrying it (ctx: the stream). */
struct sl_framing {
	/*
	 * The response head is ready: head is HTTP/1.1 text (status line,
	 * header lines, blank line); body: body bytes may follow (pulled with
	 * sl_exchange_pull). -1: the stream cannot take it.
	 */
	int (*respond)(void *ctx, const char *head, size_t len, int body);
	/* Body bytes (or the end of the body) wait to be pulled. */
	void (*resume)(void *ctx);
	/* n bytes of request body were taken: the client may send more. */
	void (*consume)(void *ctx, size_t n);
	/*
	 * The exchange ends before the stream did (a cut stream, an error):
	 * reset the stream; ctx is not used again. cut: the response was not
	 * whole (the client must not take it as complete).
	 */
	void (*reset)(void *ctx, int cut);
};

/*
 * A new exchange on a stream: fd and peer are the connection's (logs);
 * NULL when out of memory (the framing refuses the stream).
 */
struct sl_conn *sl_exchange_open(struct sl_worker *, const struct sl_framing *,
    void *ctx, int fd, const char *peer);

/*
 * Request bytes for the exchange (the head, body, chunk framing); raw is
 * how many of them the client's flow control counted (body bytes), to be
 * given back through consume() once the exchange took them. -1: more than
 * the request may have (the exchange answers or has ended).
 */
int sl_exchange_input(struct sl_conn *, const void *p, size_t n, size_t raw);

/*
 * Body bytes for the client, at most len, into buf; *eof set when they are
 * the last (the response is complete). 0 and no *eof: none yet (resume()
 * will say when).
 */
size_t sl_exchange_pull(struct sl_conn *, uint8_t *buf, size_t len, int *eof);

/*
 * The stream is closed: done (the whole response went out) or not (the
 * client reset it, or its connection is gone). The exchange ends here.
 * Returns how many flow-controlled body bytes it held and never gave back
 * through consume(): the framing returns them to its connection's window.
 */
size_t sl_exchange_closed(struct sl_conn *, int done);

#endif

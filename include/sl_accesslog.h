/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_accesslog: one JSON line per request, from a record.
 *
 * The exchange fills a struct sl_access_rec when its request ends (counted
 * and its slot free) and sl_access_write() writes it with one write(2): on
 * an O_APPEND file the lines of all workers stay whole. Every string in
 * the record is escaped here; bytes that are not UTF-8 become \u00XX, so
 * a line is valid JSON whatever a client sent. The fields are sluice.8's
 * ACCESS LOG, in its order.
 *
 * How a request ended (the "end" field) is an enum; so is why a
 * connection or stream was closed, and sl_end_of_close() says which end a
 * close makes of the request it cuts.
 */
#ifndef SL_ACCESSLOG_H
#define SL_ACCESSLOG_H

#include <stddef.h>
#include <stdint.h>

/* The access log's "end". */
enum sl_end {
	SL_END_NONE,             /* not decided yet */
	SL_END_DONE,             /* the whole response went out */
	SL_END_CLIENT_GONE,      /* the client left or was cut */
	SL_END_STALL,            /* the client read nothing for too long */
	SL_END_DRAINED,          /* cut at the end of a drain */
	SL_END_UPSTREAM_ERROR,   /* the upstream failed mid-response */
	SL_END_TIMEOUT,          /* a deadline passed */
	SL_END_REJECTED,         /* answered by sluice itself */
	SL_END_COUNT
};

/* Why a connection (or an HTTP/2 stream) is closed. */
enum sl_close {
	SL_CLOSE_DONE,           /* its last response went out */
	SL_CLOSE_CLIENT_GONE,    /* read or write failed, EOF, reset */
	SL_CLOSE_KEEPALIVE,      /* idle between requests, or reaped for room */
	SL_CLOSE_IDLE,           /* no byte of its first request in time */
	SL_CLOSE_STALL,          /* the client stopped reading */
	SL_CLOSE_UPSTREAM_IDLE,  /* the upstream went quiet mid-response */
	SL_CLOSE_TIMEOUT,        /* another deadline */
	SL_CLOSE_UPSTREAM_ERROR, /* the upstream failed after the head */
	SL_CLOSE_BUG,            /* a state that should not be */
	SL_CLOSE_TLS,            /* its handshake failed */
	SL_CLOSE_H2,             /* handed over to HTTP/2 */
	SL_CLOSE_DRAIN,          /* idle when the worker drains */
	SL_CLOSE_DRAINED,        /* still busy when the drain ends */
	SL_CLOSE_COUNT
};

extern const char *const sl_end_names[SL_END_COUNT];
extern const char *const sl_close_names[SL_CLOSE_COUNT];

/* The end a close makes of the request it cuts. */
enum sl_end sl_end_of_close(enum sl_close);

struct sl_access_rec {
	int worker;
	const char *peer;            /* "addr:port", written as it is */
	const char *tenant;          /* NULL: "-" */
	const char *method;
	const char *url;             /* the query is not logged */
	size_t url_len;
	int status;
	uint64_t bytes_out;
	double ttfb_ms, duration_ms, paused_ms, queued_ms;
	enum sl_end end;
	const char *replica;         /* NULL: "-" */
	int tries;
	uint64_t prompt_tokens, completion_tokens;
	const char *usage;           /* NULL: "none" */
	const char *affinity;        /* "-", "hit", "miss", "spill" */
	const char *model;           /* as the client named it; NULL: "-" */
	const char *api;             /* sl_api_names[]; NULL: "other" */
	size_t model_len;
	const char *upstream_model;  /* as sent on; NULL: "-" */
	const char *proto;           /* "h1", "h2" */
};

/* One line for rec on fd (nothing when fd < 0). */
void sl_access_write(int fd, const struct sl_access_rec *rec);

#endif

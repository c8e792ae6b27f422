/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_transfer: one upstream try of a request, on libcurl.
 *
 * It builds the request's header list (the client's lines that are passed
 * on, X-Forwarded-For, then the upstream's fixed tail), sets up an easy
 * handle of the worker's transfers (sl_upstream.h) for the replica and
 * starts it, never lets libcurl send a prompt twice, tells "out of
 * descriptors" from "cannot connect", and stops or discards the handle.
 * What the upstream answers (head lines, body bytes) goes to the callbacks
 * the exchange gives; the end comes through the transfers' done hook. The
 * transfer knows nothing of clients, framings or tenants.
 */
#ifndef SL_TRANSFER_H
#define SL_TRANSFER_H

#include <stddef.h>
#include <curl/curl.h>

struct sl_transfers;
struct sl_shard;
struct sl_req;

struct sl_xfer {
	CURL *easy;                /* NULL: no try in flight */
	struct sl_shard *shard;    /* the multi handle easy is in */
	char *url;                 /* the replica's base and the target */
	struct curl_slist *hdrs;   /* the header list: nodes in hdr_block, */
	void *hdr_block;           /* then the upstream's tail */
	struct curl_slist **hdr_link;   /* the tail hangs here; NULL: hdrs
	                                 * is the tail */
	int hdr_ct, hdr_accept;    /* the client sent Content-Type, Accept */
	int idempotent;            /* GET or HEAD: may be sent again */
	int sends;                 /* times libcurl was about to send it */
	int resend_refused;        /* a second send was refused */
	int no_fds;                /* its socket() hit EMFILE/ENFILE */
};

/*
 * Where the upstream's answer goes: arg is their data and CURLOPT_PRIVATE.
 * head and body are set once per easy handle (a reused one keeps them):
 * every try of a worker must pass the same two functions.
 */
struct sl_xfer_sink {
	curl_write_callback head;  /* each line of the response head */
	curl_write_callback body;  /* body bytes; may pause */
	void *arg;
};

/*
 * The header list for req to upstream up of xfers: the client's lines
 * but hop-by-hop ones, Host, Authorization, Content-Length, Expect and
 * (identity set) Accept-Encoding, which becomes identity; every
 * X-Forwarded-For hop, then peer. One block, no printf. -1: out of
 * memory or a NUL in a line.
 */
int sl_xfer_headers(struct sl_xfer *, struct sl_transfers *, size_t up,
    const struct sl_req *, const char *peer, int identity);

/* A fallback to upstream up: its tail hangs where the last one's did. */
void sl_xfer_retail(struct sl_xfer *, struct sl_transfers *, size_t up);

/*
 * An easy handle set up for req on the replica whose URL is base (the
 * target appended), answering to sink. -1: out of memory or handles.
 */
int sl_xfer_prepare(struct sl_xfer *, struct sl_transfers *,
    const struct sl_xfer_sink *, long connect_ms, const char *base,
    const struct sl_req *);

/* The prepared handle goes out: 0, or -1 (then stop it). */
int sl_xfer_launch(struct sl_xfer *, struct sl_transfers *);

/*
 * The try ends here (a no-op without one): its handle goes back to
 * xfers, or is discarded when libcurl sent the request again (a handle
 * counts those retries until it is reset).
 */
void sl_xfer_stop(struct sl_xfer *, struct sl_transfers *);

/* The request is over: its header list and URL are freed. */
void sl_xfer_clear(struct sl_xfer *);

#endif

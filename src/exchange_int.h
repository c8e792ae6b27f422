/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * What the rooms of the exchange share: struct sl_conn (one request, on
 * whatever framing carries it: h1.c's connection or h2.c's stream), its
 * states and the functions one room calls in another. The rooms, each
 * calling only those below it:
 *
 *   exchange_framing.c   its framing's side (sl_exchange.h): opened, fed, the
 *                        response taken (written or pulled)
 *   exchange.c           the request's life: the head's rules, auth and
 *                        admission, answers made here, the response handed to
 *                        the framing, a try's end, the request's end
 *   exchange_response.c  the runner's answer: its head made the client's, body
 *                        bytes through the model rewrite and the usage scanner
 *                        into the bounded stream buffer, pause and resume
 *   exchange_tries.c     which replica, and what follows a failure: model route,
 *                        fallback, the fair queue's wait, retries; what is left
 *                        to answer comes back as a verdict
 *   exchange_core.c      the ground floor: states and deadlines, the slot given
 *                        back, the flush queue, the last reference
 *
 * The request's state machine:
 *
 *   HEAD ──head parsed──▶ route, auth, admit ──▶ BODY ──body read──▶ UPSTREAM
 *     ▲                        │ refused                                │ head
 *     │                        ▼                                        ▼
 *     └──── keep-alive ◀──── LOCAL (error response) ◀── or ────────── STREAM
 *
 * Callbacks only record facts and move the machine; nothing is freed inside
 * a libcurl callback (they return an error code, and the exchange is
 * finished when libcurl reports the transfer done). Every exit path of an
 * admitted request goes through conn_release(), which gives the tenant slot
 * back exactly once. An entry point (an event, a callback) holds the
 * exchange with depth++ and leaves with conn_unref(): it is freed there,
 * never in the middle of a call chain that may still look at it.
 */
#ifndef SL_EXCHANGE_INT_H
#define SL_EXCHANGE_INT_H

#include <ev.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "sl_accesslog.h"
#include "sl_api.h"
#include "sl_buf.h"
#include "sl_exchange.h"
#include "sl_http.h"
#include "sl_meter.h"
#include "sl_model.h"
#include "sl_queue.h"
#include "sl_reply.h"
#include "sl_shm.h"
#include "sl_stored.h"
#include "sl_transfer.h"
#include "sl_upstream.h"
#include "sl_worker_state.h"

/*
 * A stream whose body reads come less than this apart (seconds) lets its
 * usage scanner keep a template of the last event (a few hundred bytes):
 * the CPU it saves is spent at that pace; a slow stream keeps no copy.
 */
#define SCAN_KEEP_PACE 0.25

#define CHUNK_FRAMING 32            /* "%zx\r\n" + "\r\n", generously */
/* The stream buffer's cap when not stretched for one oversized write. */
#define BASE_CAP(c) ((c)->w->cfg->stream_buffer + CHUNK_FRAMING)
#define LINGER_SECONDS 2.0

enum conn_state {
	CS_HEAD,       /* waiting for or reading a request head */
	CS_ADMIT,      /* head read, node slot held, waiting for a cluster lease */
	CS_BODY,       /* admitted, reading the request body */
	CS_UPSTREAM,   /* request sent upstream, waiting for its response head */
	CS_STREAM,     /* relaying the upstream response */
	CS_LOCAL,      /* writing a response made here (errors) */
	CS_QUEUED      /* body read, waiting in the fair queue for a replica */
};

struct sl_conn {
	TAILQ_ENTRY(sl_conn) entry;
	struct sl_worker *w;
	int fd;                    /* its connection's (logs only) */
	enum conn_state state;
	ev_timer timer;
	char peer[64];

	/*
	 * The framing that carries it (sl_exchange.h): an HTTP/1.x
	 * connection or an HTTP/2 stream, reached only through fr.
	 */
	const struct sl_framing *fr;
	void *fr_ctx;              /* NULL once the framing let go */
	int end_out;               /* the response's end went to the framing */

	/* Request side. */
	struct sl_req req;
	ev_tstamp t_req;           /* when the connection became ready for it */
	ev_tstamp t_rx;            /* first byte of the current request; 0: none */
	ev_tstamp t_body;          /* when its body began to be read */

	/* Admission. */
	int tenant;                /* config index, -1 before auth */
	int slot_held;
	int32_t lease;             /* cluster lease; -1: none */
	size_t up_idx;             /* the request's upstream (conn_route_model) */
	int model;                 /* its model (cfg->models); -1: none */
	enum sl_api api;           /* the API it speaks (sl_api.h), from its
	                            * head; SL_API_OTHER before */
	char *mname;               /* the model as the client named it, for
	                            * the access log (mname_len bytes); NULL */
	size_t mname_len;
	const char *msent;         /* the model sent upstream (config); NULL */
	size_t mtarget;            /* the target of model it was sent to */
	struct sl_model_span mspan;   /* where the body names its model */
	int mrw_on;                /* the answer's "model" is set back */
	struct sl_mrw mrw;         /* to mlit (its JSON literal, malloc'd) */
	char *mlit;
	size_t fb_k;               /* next entry of its fallback chain */
	int mroute;                /* the model and target it was routed to: */
	size_t troute;             /* its fallback chain's origin */
	int tries_base;            /* tries before its upstream's first */
	int fb_model, fb_target;   /* a busy head's fallback, whose replica
	                            * is retry_next; -1: none */
	struct sl_cl_wait *admit_wait;   /* CS_ADMIT: the lease asked for */

	/* CS_QUEUED: its place in the fair queue (sl_queue.h). */
	uint64_t qhandle;          /* 0: not waiting */
	size_t qpool;              /* the queue's pool index */
	ev_tstamp t_queued;
	ev_tstamp queued_total;    /* seconds this request waited (queued_ms) */
	int q_retry_after;         /* for its 503 queue_timeout */
	uint64_t q_charged;        /* tokens charged to its pool's service
	                            * counter so far (fair queue) */
	TAILQ_ENTRY(sl_conn) qentry;   /* on w->queued */

	/* Response side. */
	struct sl_head rh;         /* response head being written */
	size_t rh_off;             /* how much of it went out */
	struct sl_buf out;         /* body bytes (framed) waiting for the client */
	int chunked;               /* frame the body with chunked encoding */
	int body_allowed;          /* not HEAD, not 1xx/204/304 */
	int head_sent;             /* client head built */
	int close_after;           /* close once the response is written */
	int resp_done;             /* the response is complete in rh/out */

	/* Upstream. */
	struct sl_xfer xf;         /* the try in flight (sl_transfer.h) */
	struct sl_xfer_sink sink;  /* where its head and body go */
	int status;                /* upstream status */
	struct sl_resp_head uh;    /* upstream response head, filtered */
	int upstream_bad;          /* malformed upstream head */
	int paused;                /* CURL_WRITEFUNC_PAUSE returned */
	size_t pending;            /* size of the refused chunk, framed */
	int client_gone;           /* EOF/RST/EPIPE seen on the client */

	/* The pool: which replica this try went to, and the tries so far. */
	int replica;               /* replica of the current try; -1: none */
	int last_replica;          /* of the last try, for the access log */
	uint64_t tried;            /* replicas tried for this request (bits) */
	int tries;                 /* tries started for this request */
	int reported;              /* the current try's outcome was reported */
	int retry_next;            /* busy head: the replica picked for the
	                            * next try (slot held); -1: none */
	int busy_code;             /* that head's status */
	int affinity;              /* 0: none; 1 + enum sl_aff_outcome */
	/*
	 * Stored responses (sl_stored.h): the request names one whose
	 * replica is up (pinned: it goes there only, owner is that
	 * replica); its answer's id is learnt (learn: POST /v1/responses),
	 * read by idscan until found (NULL: not read, or no more).
	 */
	int pinned;
	int owner;
	int learn;
	struct sl_stored_scan *idscan;
	ev_tstamp t_upstream;      /* last upstream activity */
	ev_tstamp t_client;        /* last client progress while bytes wait */

	/* Tokens: what the response cost (sl_meter.h). */
	struct sl_meter meter;

	/* Accounting for the current request (metrics, access log). */
	int req_active;            /* a request is being answered */
	enum sl_end end;           /* how it ended, when decided early */
	ev_tstamp t_start;         /* request began (first byte or head) */
	ev_tstamp t_first;         /* first response byte relayed; 0: none */
	ev_tstamp t_content;       /* its first content reached the client's
	                            * buffer (conn_flush); 0: none */
	int resp_sse;              /* the relayed response is an event stream */
	int cut;                   /* the runner failed after the head: the
	                            * response ends cut (no last chunk, or
	                            * RST_STREAM), after a terminal event */
	uint32_t tail;             /* the last body bytes given the client */
	uint8_t tail_n;            /* how many of them (at most 4) */
	uint32_t sse_events;       /* events given the client (Responses) */
	ev_tstamp t_cut;           /* a cut response's last byte was pulled
	                            * (HTTP/2): reset SL_CUT_GRACE later */
	enum sl_close cut_close;   /* why a cut response's connection closes */
	ev_tstamp t_pause;         /* current pause began */
	ev_tstamp paused_total;
	uint64_t bytes_out;        /* bytes written to the client */

	TAILQ_ENTRY(sl_conn) dirty_entry;
	int dirty;                 /* on w->dirty: bytes to flush this turn */
	TAILQ_ENTRY(sl_conn) idle_entry;
	int idle_listed;           /* on w->idle: was idle after a response */

	int depth;                 /* entry points on the stack */
	int dead;                  /* closed; freed when depth drops to 0 */
};

/*
 * The rooms call one way, down this list: a room calls the ones below it
 * and none above (test_layout holds them to it).
 *
 * exchange_framing.c: the framing's calls (sl_exchange.h), declared there.
 *
 * exchange.c: the request's life.
 */
void conn_init(struct sl_conn *c, struct sl_worker *w, int fd);
size_t conn_process(struct sl_conn *c, const char *p, size_t n);
void conn_error(struct sl_conn *c, enum sl_err e, const char *message,
    int retry_after);
void conn_request_end(struct sl_conn *c, enum sl_end end);
void conn_close(struct sl_conn *c, enum sl_close why);
int conn_flush(struct sl_conn *c);
void conn_after_write(struct sl_conn *c);

/* exchange_response.c: the runner's answer to the client. */
size_t upstream_header_cb(char *p, size_t size, size_t nitems, void *arg);
size_t upstream_write_cb(char *p, size_t size, size_t nmemb, void *arg);
int conn_head_model(struct sl_conn *c);
/*
 * How long a cut HTTP/2 stream's reset waits after its last byte: a client
 * that reads the RST_STREAM in the same read as the data discards the
 * data (curl, Node), the partial answer and the failure told with it.
 */
#define SL_CUT_GRACE 0.1
int conn_head_ratelimit(struct sl_conn *c);
void conn_tell_failure(struct sl_conn *c, const char *why);
void conn_maybe_resume(struct sl_conn *c);
void conn_usage_charge(struct sl_conn *c);
void conn_queue_charge_running(struct sl_conn *c);
void conn_usage_reset(struct sl_conn *c);
void conn_usage_finish(struct sl_conn *c);
void conn_mrw_free(struct sl_conn *c);

/*
 * exchange_tries.c: which replica, and what follows a failure. What it
 * leaves to answer comes back as a verdict, never as a call up.
 */
struct sl_verdict {
	int answer;                /* 1: answer err here; 0: a try started,
	                            * or the request waits in the queue */
	enum sl_err err;
	int retry_after;
	char msg[400];             /* "": the error's own message */
};

static inline int
sl_verdict(struct sl_verdict *v, enum sl_err e, const char *msg, int ra)
{
	v->answer = 1;
	v->err = e;
	v->retry_after = ra;
	snprintf(v->msg, sizeof(v->msg), "%s", msg != NULL ? msg : "");
	return -1;
}

void conn_start_upstream(struct sl_conn *c, struct sl_verdict *v);
int conn_retry(struct sl_conn *c, enum sl_uerr kind, CURLcode result,
    struct sl_verdict *v);
void conn_busy_next(struct sl_conn *c, struct sl_verdict *v);
struct sl_conn *conn_queue_grant(struct sl_worker *w,
    const struct sl_queue_grant *g, struct sl_verdict *v);
int conn_try(struct sl_conn *c, int r);
void conn_abort_upstream(struct sl_conn *c);
void conn_report_try(struct sl_conn *c, int code);
void conn_queue_leave(struct sl_conn *c, enum sl_queue_outcome why);
int conn_fallback_find(struct sl_conn *c, enum sl_fb_cause why, int *m, int *t);

/* exchange_core.c: the ground floor. */
const char *conn_state_name(enum conn_state s);
void conn_set_state(struct sl_conn *c, enum conn_state s);
ev_tstamp conn_deadline(struct sl_conn *c);
void conn_timer_update(struct sl_conn *c);
void conn_release(struct sl_conn *c);
void conn_mark_dirty(struct sl_conn *c);
void conn_unref(struct sl_conn *c);
void conn_count_uerr(struct sl_conn *c, enum sl_uerr kind);
size_t conn_model_slot(const struct sl_conn *c);

/* The upstream of the current request: valid once its body is read. */
static inline size_t
conn_upstream_idx(const struct sl_conn *c)
{
	return c->up_idx;
}

#endif

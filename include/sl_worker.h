/*
 * sl_worker: one worker process. It owns its connections from accept to
 * close, one libev loop, a few libcurl multi handles (shards: upstream
 * connections are reused within one), and a row of the shared region.
 */
#ifndef SL_WORKER_H
#define SL_WORKER_H

#include <curl/curl.h>
#include <ev.h>
#include <stddef.h>
#include <sys/queue.h>

#include "sl_auth.h"
#include "sl_config.h"
#include "sl_shm.h"
#include "sl_upstream.h"

struct sl_conn;
struct sl_worker;

/*
 * One libcurl multi handle and its connection cache. libcurl 7.88 walks
 * every connection of a cache when a transfer starts (to find one to
 * reuse) and when one is removed (close_connect_only): O(connections) per
 * request. Streams fill shard 0 first, then the next, SL_SHARD_STREAMS at
 * a time, so a walk is short whatever the concurrency and a light load
 * still reuses a handful of connections.
 */
#define SL_SHARD_STREAMS 32

/* Finished easy handles kept (reset) for the next transfers. */
#define SL_EASY_POOL 128

struct sl_shard {
	CURLM *multi;                /* NULL: dormant (its connections closed) */
	ev_timer timer;
	struct sl_worker *w;
	unsigned active;             /* transfers in this multi */
	ev_tstamp idle_since;        /* when active last dropped to 0 */
};

/*
 * A shard other than the first, idle this long, is closed (its cached
 * upstream connections with it): libcurl only prunes a cache when a
 * transfer starts in it, so after a burst the shards it spilled into would
 * otherwise hold their idle connections, half-closed by the upstream, for
 * good.
 */
#define SL_SHARD_IDLE_SECONDS 10.0

/* What the master hands a worker at fork. Borrowed, never freed by the worker. */
struct sl_worker_args {
	const struct sl_config *cfg;
	struct sl_shm *shm;
	const size_t *tenant_slot;   /* config tenant index -> shm tenant index */
	const size_t *upstream_slot; /* config upstream index -> shm upstream index */
	/* [upstream][replica] -> shared index of the replica (sl_upstream.h) */
	const size_t *const *replica_slot;
	size_t row;                  /* this worker's shm row */
	int listen_fd;               /* this worker's SO_REUSEPORT socket */
	int index;                   /* worker number, for logs */
	unsigned generation;
};

struct sl_worker {
	struct ev_loop *loop;
	const struct sl_config *cfg;
	struct sl_shm *shm;
	const size_t *tenant_slot;
	const size_t *upstream_slot;
	struct sl_pools *pools;      /* replica choice, per upstream */
	size_t row;
	int index;
	int access_fd;               /* -1: access log off */
	struct sl_keyidx *keys;      /* API key -> tenant */
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
	ev_timer accept_retry;

	struct sl_shard *shards;     /* created on demand, never moved */
	size_t nshards, maxshards;

	ev_signal sig_term, sig_int, sig_quit, sig_usr2;
	ev_timer drain_timer;
	int draining;

	size_t nconns;
	TAILQ_HEAD(, sl_conn) conns;
	TAILQ_HEAD(, sl_conn) dirty;     /* connections with bytes to flush */
	ev_prepare flush_prep;

	size_t curl_bufsize;         /* CURLOPT_BUFFERSIZE for every stream */
	CURL *easy_pool[SL_EASY_POOL];   /* reset handles, ready for reuse */
	size_t neasy;
};

/* Run the worker; returns the process exit status. Call in the child. */
int sl_worker_main(const struct sl_worker_args *);

/* The shard a new transfer goes to; NULL if none can be created. */
struct sl_shard *sl_worker_shard(struct sl_worker *);

/* A transfer left the shard (its handle was removed from the multi). */
void sl_worker_shard_done(struct sl_shard *);

/* An easy handle for a new transfer (a pooled one, reset), or NULL. */
CURL *sl_worker_easy_get(struct sl_worker *);

/* A transfer's handle, out of its multi: keep it for reuse or free it. */
void sl_worker_easy_put(struct sl_worker *, CURL *);

/* Options every upstream transfer of this worker gets (socket buffers). */
void sl_worker_easy_setopts(struct sl_worker *, CURL *);

#endif

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Internal to the cluster code; the model is in sl_cluster.h.
 *
 *   cluster.c         the region the master and its workers share: cells,
 *                     rows, the node's mode and fence
 *   cluster_redis.c   one Redis connection's life, the same for both
 *                     sides: connect, greeting (AUTH), connect deadline,
 *                     backoff, script loading, loss; error accounting and
 *                     the refusal log
 *   cluster_worker.c  the worker side: leases asked and released, token
 *                     charges, the verdicts a request gets
 *   cluster_master.c  the master side: registration, heartbeat (renew,
 *                     re-add), fencing, reclaiming rows, metrics
 *   cluster_sentinel.c  with cluster.sentinels: asking them for the
 *                     master (the master process only), and the one
 *                     +switch-master subscription; the master publishes
 *                     the answer in the region for its workers
 *
 * The worker and master sides call cluster_redis.c and cluster.c; those
 * two call neither side: a connection tells its owner through its hooks.
 */
#ifndef SL_CLUSTER_INT_H
#define SL_CLUSTER_INT_H

#include <ev.h>
#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "sl_cluster.h"
#include "sl_util.h"
#include "sl_log.h"

#define NODES_KEY "sluice:nodes"

/* ---- the shared region (cluster.c) ------------------------------------ */


/* A cell's word: generation << 8 | state. */
enum cell_state {
	CELL_FREE = 0,
	CELL_PENDING,      /* acquire sent, no answer yet */
	CELL_HELD,         /* Redis holds the lease */
	CELL_LOCAL         /* admitted without Redis (on_redis_down) */
};
#define CELL_STATE(w) ((unsigned)((w) & 0xffu))
#define CELL_GEN(w) ((uint32_t)((w) >> 8))
#define CELL_WORD(gen, st) (((uint64_t)(gen) << 8) | (uint64_t)(st))

struct cell {
	_Atomic uint64_t word;
	_Atomic uint32_t tslot;     /* shared tenant index */
	uint32_t pad;
};

enum cl_err { ERR_CONNECT = 0, ERR_TIMEOUT, ERR_REPLY, ERR_FENCED, ERR_MAX };
extern const char *const cl_err_names[ERR_MAX];   /* metric labels */

#define RTT_BUCKETS 13
extern const double cl_rtt_bounds[RTT_BUCKETS];  /* seconds, ascending */

/*
 * A worker row's connection: the node says it admits through Redis only
 * while no worker of it is ROW_CONNECTING (its admissions would go by
 * on_redis_down). The master sets ROW_STARTING before it forks the
 * worker and ROW_UNUSED when it is dead; the worker the rest. A STARTING
 * worker does not accept yet (sl_cluster_worker_await): it admits nothing,
 * by Redis or otherwise, so the node's mode does not count it; it turns
 * READY at its connection's first answer, or CONNECTING when it starts
 * accepting without one.
 */
enum { ROW_UNUSED = 0, ROW_CONNECTING, ROW_READY, ROW_STARTING };

/* Per worker row; written only by its worker (row 0: the master). */
struct row {
	_Atomic uint32_t hwm;        /* cells below it may be in use */
	_Atomic uint32_t state;      /* ROW_* */
	_Atomic uint64_t errors[ERR_MAX];
	_Atomic uint64_t rtt[RTT_BUCKETS + 1];
	_Atomic uint64_t rtt_sum_ns;
	char pad2[64];
};

#define MODE_DOWN 0    /* on_redis_down */
#define MODE_REDIS 1

struct sl_cluster_shm {
	uint64_t epoch;              /* this master's boot, in every member */
	size_t rows, cells;
	size_t size;
	_Atomic int32_t mode;
	_Atomic int32_t live_nodes;  /* last seen; 0: never */
	/*
	 * CLOCK_MONOTONIC (ns) at which the master stops trusting the leases
	 * it last had acknowledged: lease_ttl - 2 x heartbeat after that
	 * heartbeat (fence_at). A worker checks it on every admission, so a
	 * master stopped or dead fences its workers on time as well.
	 */
	_Atomic int64_t fence_ns;
	/*
	 * 1: a worker's acquire found sluice:nodes without this node (a
	 * FLUSHALL with the connections up) before the master noticed: the
	 * node admits by on_redis_down and must not say "redis". Cleared by
	 * the master's next registration that finds its entry (cm_round
	 * snapshots it when it sends one).
	 */
	_Atomic int32_t unknown;
	/*
	 * With cluster.sentinels: the master's address the master process
	 * found (asked the sentinels, checked ROLE), for the workers to
	 * connect to; written only by the master, under a sequence lock
	 * (addr_seq odd while it writes; cl_addr_read). Empty: none known.
	 */
	_Atomic uint32_t addr_seq;
	char addr[80];
	/* A worker met a reason to ask the sentinels again (a failed
	 * connection, READONLY, LOADING, a ROLE of replica): the master asks. */
	_Atomic int32_t reask;
	_Atomic uint64_t failovers;  /* switches of the master's address */
	char pad[28];
	struct row row[];            /* then rows * cells struct cell */
};

#define MEMBER_MAX 128

struct cell *cl_cell_at(struct sl_cluster_shm *, size_t row, size_t i);
/* A lease's member, "NODE:EPOCH:ROW.CELL.GEN", into dst (MEMBER_MAX). */
int cl_member_fmt(char *dst, size_t len, const char *node, uint64_t epoch,
    size_t row, size_t i, uint32_t gen);
void cl_row_state(struct sl_cluster_shm *, size_t row, uint32_t st);

/* The master: publish addr ("IP:port"; "" none). Workers: read it into
 * dst[80]; returns the sequence number it was read at (even). */
void cl_addr_publish(struct sl_cluster_shm *, const char *addr);
uint32_t cl_addr_read(struct sl_cluster_shm *, char dst[80]);

/* ---- one Redis connection (cluster_redis.c) --------------------------- */

#define BACKOFF_MIN 0.1          /* s, the first reconnect */
#define BACKOFF_MAX 5.0          /* s, doubling up to it */
#define REFUSAL_QUIET 60.0       /* s between two logs of one refusal */

/* Count an error of kind e, or a round trip of s seconds, on a row. */
void cl_row_err(struct sl_cluster_shm *, size_t row, enum cl_err e);
void cl_row_rtt(struct sl_cluster_shm *, size_t row, double s);

/* NULL, or an error reply. */
int cl_reply_is_error(const redisReply *);

/*
 * Log a refusal by Redis (what: "AUTH refused", "heartbeat"; str: its
 * answer): once, then at most once every REFUSAL_QUIET per process with
 * how many went unlogged, with a hint where the answer names the fix.
 */
void cl_log_refusal(enum sl_log_level, const char *what, const char *str);

/* "IP:port", "[v6]:port" or "unix:/path" (checked by the config). */
struct cl_addr {
	char host[64];
	int port;
	const char *path;   /* unix socket, or NULL */
};

/* How a connection ended, as its owner's gone hook hears it. */
enum cl_gone {
	CL_GONE_FAILED,      /* the connect failed; why: hiredis's error */
	CL_GONE_LOST,        /* Redis closed it; why: the error, NULL if clean */
	CL_GONE_REFUSED,     /* the greeting was refused (logged, counted;
	                        a sentinel's: why is its reply, for the owner) */
	CL_GONE_DROPPED      /* cl_redis_drop(); why: the caller's, or NULL */
};

struct cl_redis;

/* The owner's side of its connection; called from hiredis or a drop. */
struct cl_redis_hooks {
	void (*up)(struct cl_redis *);          /* the connect completed */
	/* The context is freed (ac is NULL): back off and connect again. */
	void (*gone)(struct cl_redis *, enum cl_gone, const char *why);
};

/*
 * One async connection to cluster.redis, owned by a worker (driven by
 * libev) or by the master (driven by its ppoll() loop: want_read and
 * want_write say which events it waits for). Owns the context: ac is
 * NULL while there is none; connected once the connect completed.
 * Counts its connect failures and refused greetings on row `row`.
 */
struct cl_redis {
	struct cl_addr addr;
	const char *password;        /* the owner's; NULL: no AUTH */
	struct sl_cluster_shm *cs;
	size_t row;
	struct ev_loop *loop;        /* NULL: the owner polls */
	int greet;                   /* PING without a password; the greeting's
	                                answer resets the backoff */
	int check_role;              /* after the greeting, ROLE: anything but
	                                a master is refused (CL_GONE_REFUSED) */
	const struct cl_redis_hooks *hooks;
	void *owner;

	redisAsyncContext *ac;
	int connected;
	int want_read, want_write;   /* polled only */
	double backoff;              /* s, the next reconnect's delay */
};

void cl_redis_init(struct cl_redis *, const char *redis, const char *password,
    struct sl_cluster_shm *, size_t row, struct ev_loop *, int greet,
    const struct cl_redis_hooks *, void *owner);

/*
 * Start a connect: the context, its event hooks, and the greeting
 * (AUTH, or PING when greet) queued ahead of anything the owner queues.
 * 0, or -1 when there is no context (a failed open counted as a connect
 * error): the owner backs off.
 */
int cl_redis_open(struct cl_redis *);

/* A new address (ac must be NULL): the next open goes there. */
void cl_redis_set_addr(struct cl_redis *, const char *redis);

/* Redis's error answers that say it is not (or not yet) a usable master:
 * READONLY (a replica), LOADING (a restart or a resync). */
int cl_reply_not_master(const redisReply *);

/* Free the context (its pending callbacks get NULL) and call gone. */
void cl_redis_drop(struct cl_redis *, const char *why);

/* Leaving: write what is queued if connected, free, no hook. */
void cl_redis_close(struct cl_redis *);

/* The delay before the next connect; doubles it up to BACKOFF_MAX. */
double cl_redis_backoff_next(struct cl_redis *);
/* Redis answered on this connection: the next backoff starts small. */
void cl_redis_answered(struct cl_redis *);
/* How long a connect may take (10 x cluster.timeout, at least 1 s). */
double cl_redis_connect_limit(uint64_t timeout_ms);

/* Queue SCRIPT LOAD of script (len bytes); cb gets the sha. */
int cl_redis_load(struct cl_redis *, const char *script, size_t len,
    redisCallbackFn *cb, void *priv);
/* A SCRIPT LOAD answer's sha into sha[41]; else sha is left alone. */
void cl_redis_take_sha(const redisReply *, char sha[41]);

/* A callback that only counts an error answer (priv: the cl_redis). */
void cl_redis_count_cb(redisAsyncContext *, void *reply, void *priv);

/* Polled connections: the fd to poll (0: none), and the work on wake. */
int cl_redis_pollfd(const struct cl_redis *, struct pollfd *);
void cl_redis_handle(struct cl_redis *, const struct pollfd *);

/*
 * A blocking connection with tv as connect and command timeout: NULL
 * (out of memory) or a context to check ->err of. cl_redis_auth_sync
 * sends AUTH when there is a password: 0, or -1 refused (counted, logged).
 */
redisContext *cl_redis_open_sync(const struct cl_redis *, struct timeval tv);
int cl_redis_auth_sync(struct cl_redis *, redisContext *);

/* ---- the sentinels (cluster_sentinel.c), the master process only ----- */

struct cl_sentinel;

/* NULL when out of memory; cfg->cluster.nsentinels > 0. */
struct cl_sentinel *cl_sentinel_new(const struct sl_config *cfg);
void cl_sentinel_free(struct cl_sentinel *);
/* A reload's cluster.timeout, for the subscription and the log. */
void cl_sentinel_reconf(struct cl_sentinel *, uint64_t timeout_ms);

/*
 * Ask the sentinels in order SENTINEL get-master-addr-by-name, each
 * bounded by timeout_ms (blocking: the master process at start, and when
 * its connection fails). 0: addr ("IP:port" or "[v6]:port") is the
 * answer of the majority of the sentinels that answered, who the first
 * of them; -1: none, or no majority (each reason logged).
 */
int cl_sentinel_ask(struct cl_sentinel *, uint64_t timeout_ms, char *addr,
    size_t alen, char *who, size_t wlen);

/*
 * The +switch-master subscription, a polled connection to one sentinel
 * at a time (the next one, with backoff, when it is lost).
 */
int cl_sentinel_pollfd(const struct cl_sentinel *, struct pollfd *);
double cl_sentinel_timeout(const struct cl_sentinel *, double now);
void cl_sentinel_service(struct cl_sentinel *, const struct pollfd *, int n,
    double now);
/*
 * 1 once for each +switch-master of cluster.master_name heard since the
 * last call: the new address in addr, the sentinel that said it in who.
 */
int cl_sentinel_switched(struct cl_sentinel *, char *addr, size_t alen,
    char *who, size_t wlen);
/* cluster.master_name. */
const char *cl_sentinel_name(const struct cl_sentinel *);
/* Leaving the master process (in a child after fork: close_in_child). */
void cl_sentinel_close_in_child(struct cl_sentinel *);

#endif

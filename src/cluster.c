/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Cluster admission through Redis leases. See sl_cluster.h for the model;
 * sluice.8 (CLUSTER) for what an operator sees and the overshoot bounds.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libev.h>

#include "sl_cluster.h"
#include "sl_log.h"

/* ---- the scripts ------------------------------------------------------ */

/*
 * KEYS[1] the tenant's lease set, KEYS[2] its token window, KEYS[3]
 * sluice:nodes; ARGV max_streams, member, lease ttl (ms),
 * tokens_per_minute (0: none), node. A node that sluice:nodes does not
 * hold live is answered -1 before anything else: Redis lost its state
 * (restarted empty, FLUSHALL) or the node's master stopped renewing, and
 * the lease set may lack the leases of streams in flight that the nodes
 * have not added again yet; counting an admission against it would
 * overshoot. The window next: a hash of Redis-clock seconds to the tokens charged
 * in them; fields 60 s old are dropped; at or over the budget the answer
 * is {tokens, seconds until the window has room}. Then the lease: prune,
 * refuse at max (unless the member is already in: idempotent), add. The
 * key expires with its last lease, so abandoned tenants leave nothing.
 */
static const char acquire_lua[] =
    "local t=redis.call('TIME') "
    "local now=tonumber(t[1])*1000+math.floor(tonumber(t[2])/1000) "
    "local reg=redis.call('ZSCORE',KEYS[3],ARGV[5]) "
    "if not reg or tonumber(reg)<=now then return -1 end "
    "local b=tonumber(ARGV[4]) "
    "if b>0 then "
    "local s=tonumber(t[1]) local h=redis.call('HGETALL',KEYS[2]) "
    "local sum=0 local old={} local bk={} "
    "for i=1,#h,2 do local k=tonumber(h[i]) local v=tonumber(h[i+1]) "
    "if k==nil or v==nil or k<=s-60 then old[#old+1]=h[i] "
    "else sum=sum+v bk[#bk+1]={k,v} end end "
    "if #old>0 then redis.call('HDEL',KEYS[2],unpack(old)) end "
    "if sum>=b then "
    "table.sort(bk,function(x,y) return x[1]<y[1] end) "
    "local left=sum local ra=60 "
    "for i=1,#bk do left=left-bk[i][2] "
    "if left<b then ra=bk[i][1]+60-s break end end "
    "if ra<1 then ra=1 end return {sum,ra} end end "
    "redis.call('ZREMRANGEBYSCORE',KEYS[1],'-inf',now) "
    "if not redis.call('ZSCORE',KEYS[1],ARGV[2]) and "
    "redis.call('ZCARD',KEYS[1])>=tonumber(ARGV[1]) then return 0 end "
    "redis.call('ZADD',KEYS[1],now+tonumber(ARGV[3]),ARGV[2]) "
    "local top=redis.call('ZRANGE',KEYS[1],-1,-1,'WITHSCORES') "
    "redis.call('PEXPIREAT',KEYS[1],top[2]) "
    "return 1";

/*
 * KEYS[1] the tenant's token window; ARGV tokens. Charged to the current
 * second of the Redis clock (the one the acquire script reads); the key
 * outlives the window by a minute when nothing more is charged. The first
 * write drops the second that just left the window (HDEL): at maxmemory
 * Redis refuses a script whose first write may grow memory, and the lease
 * scripts, whose first write is ZREMRANGEBYSCORE, go on working there, so
 * the charges must too, or the budget would silently stop holding.
 */
static const char charge_lua[] =
    "local s=tonumber(redis.call('TIME')[1]) "
    "redis.call('HDEL',KEYS[1],tostring(s-60)) "
    "redis.call('HINCRBY',KEYS[1],tostring(s),ARGV[1]) "
    "redis.call('EXPIRE',KEYS[1],120) "
    "return 1";

/*
 * KEYS[1] the tenant's lease set; ARGV "XX" (renew only members still
 * there) or "ADD" (re-add after Redis was lost), ttl (ms), members...
 * Returns the positions (1-based) of the members XX found missing: a
 * lease released a moment ago, or one Redis lost (evicted, flushed, its
 * key deleted); the master tells them apart by whether the stream is
 * still in flight.
 */
static const char renew_lua[] =
    "local t=redis.call('TIME') "
    "local now=tonumber(t[1])*1000+math.floor(tonumber(t[2])/1000) "
    "local exp=now+tonumber(ARGV[2]) "
    "redis.call('ZREMRANGEBYSCORE',KEYS[1],'-inf',now) "
    "local gone={} "
    "for i=3,#ARGV do "
    "if ARGV[1]~='XX' then redis.call('ZADD',KEYS[1],exp,ARGV[i]) "
    "elseif redis.call('ZSCORE',KEYS[1],ARGV[i]) then "
    "redis.call('ZADD',KEYS[1],'XX',exp,ARGV[i]) "
    "else gone[#gone+1]=i-2 end end "
    "local top=redis.call('ZRANGE',KEYS[1],-1,-1,'WITHSCORES') "
    "if top[2] then redis.call('PEXPIREAT',KEYS[1],top[2]) end "
    "return gone";

/*
 * KEYS[1] sluice:nodes; ARGV node, ttl (ms), the expiry this node set at
 * its last registration (0: none known), "1" when the node rejoins (its
 * leases were re-added just before, on the same connection) else "0".
 * Returns {live nodes, the expiry set now, 1 if the node's entry is live
 * with another expiry than the one this node set: another node registers
 * under the same name, 1 if the entry of a node that does not rejoin is
 * gone}. A gone entry is not added back: Redis lost its state (restarted
 * empty, FLUSHALL) or the node stalled past lease_ttl, so its leases may
 * be gone too; it is added by the rejoin after they are, so that a node
 * counted in sluice:nodes has its leases in the sets.
 */
static const char register_lua[] =
    "local t=redis.call('TIME') "
    "local now=tonumber(t[1])*1000+math.floor(tonumber(t[2])/1000) "
    "redis.call('ZREMRANGEBYSCORE',KEYS[1],'-inf',now) "
    "local old=redis.call('ZSCORE',KEYS[1],ARGV[1]) "
    "if not old and ARGV[4]=='0' then "
    "return {redis.call('ZCARD',KEYS[1]),0,0,1} end "
    "local mine=tonumber(ARGV[3]) "
    "local clash=0 "
    "if old and mine~=0 and tonumber(old)~=mine then clash=1 end "
    "local exp=now+tonumber(ARGV[2]) "
    "redis.call('ZADD',KEYS[1],exp,ARGV[1]) "
    "local top=redis.call('ZRANGE',KEYS[1],-1,-1,'WITHSCORES') "
    "redis.call('PEXPIREAT',KEYS[1],top[2]) "
    "return {redis.call('ZCARD',KEYS[1]),exp,clash,0}";

#define NODES_KEY "sluice:nodes"

/* ---- the shared region ----------------------------------------------- */

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
static const char *const err_names[ERR_MAX] = {
	"connect", "timeout", "reply", "fenced"
};

#define RTT_BUCKETS 13
static const double rtt_bounds[RTT_BUCKETS] = {
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1.0
};

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
	char pad[28];
	struct row row[];            /* then rows * cells struct cell */
};

static struct cell *
cell_at(struct sl_cluster_shm *cs, size_t row, size_t i)
{
	struct cell *base = (struct cell *)(void *)&cs->row[cs->rows];

	return &base[row * cs->cells + i];
}

struct sl_cluster_shm *
sl_cluster_shm_create(size_t rows, size_t cells)
{
	struct sl_cluster_shm *cs;
	struct timespec ts;
	size_t size;
	void *p;

	size = sizeof(*cs) + rows * sizeof(struct row) +
	    rows * cells * sizeof(struct cell);
	p = mmap(NULL, size, PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	cs = p;
	cs->rows = rows;
	cs->cells = cells;
	cs->size = size;
	clock_gettime(CLOCK_REALTIME, &ts);
	cs->epoch = ((uint64_t)ts.tv_sec << 24) ^ (uint64_t)ts.tv_nsec ^
	    ((uint64_t)getpid() << 44);
	atomic_store(&cs->mode, MODE_DOWN);
	return cs;
}

void
sl_cluster_shm_destroy(struct sl_cluster_shm *cs)
{
	if (cs != NULL)
		munmap(cs, cs->size);
}

/* "NODE:EPOCH:ROW.CELL.GEN" */
static int
member_fmt(char *dst, size_t len, const char *node, uint64_t epoch, size_t row,
    size_t i, uint32_t gen)
{
	return snprintf(dst, len, "%s:%016" PRIx64 ":%zu.%zu.%" PRIu32, node,
	    epoch, row, i, gen);
}

#define MEMBER_MAX 128

static int64_t
mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

static void
row_state(struct sl_cluster_shm *cs, size_t row, uint32_t st)
{
	atomic_store_explicit(&cs->row[row].state, st, memory_order_release);
}

static void
row_err(struct sl_cluster_shm *cs, size_t row, enum cl_err e)
{
	atomic_store_explicit(&cs->row[row].errors[e],
	    atomic_load_explicit(&cs->row[row].errors[e], memory_order_relaxed) + 1,
	    memory_order_relaxed);
}

static void
row_rtt(struct sl_cluster_shm *cs, size_t row, double s)
{
	struct row *r = &cs->row[row];
	int b;

	for (b = 0; b < RTT_BUCKETS && s > rtt_bounds[b]; b++)
		;
	atomic_store_explicit(&r->rtt[b],
	    atomic_load_explicit(&r->rtt[b], memory_order_relaxed) + 1,
	    memory_order_relaxed);
	atomic_store_explicit(&r->rtt_sum_ns,
	    atomic_load_explicit(&r->rtt_sum_ns, memory_order_relaxed) +
	    (uint64_t)(s * 1e9), memory_order_relaxed);
}

/* "IP:port", "[v6]:port" or "unix:/path" (checked by the config). */
struct addr {
	char host[64];
	int port;
	const char *path;   /* unix socket, or NULL */
};

static void
addr_parse(const char *s, struct addr *a)
{
	const char *colon = strrchr(s, ':');
	size_t n;

	memset(a, 0, sizeof(*a));
	if (strncmp(s, "unix:", 5) == 0) {
		a->path = s + 5;
		return;
	}
	if (colon == NULL)
		return;
	a->port = atoi(colon + 1);
	if (s[0] == '[') {
		s++;
		n = (size_t)(colon - s) - 1;
	} else
		n = (size_t)(colon - s);
	if (n >= sizeof(a->host))
		n = sizeof(a->host) - 1;
	memcpy(a->host, s, n);
	a->host[n] = '\0';
}

/*
 * A new async connection to a, or NULL (a failed context is freed here, so
 * no callback of it ever runs). The connect itself completes later.
 */
static redisAsyncContext *
redis_open(const struct addr *a)
{
	redisAsyncContext *ac;

	if (a->path != NULL)
		ac = redisAsyncConnectUnix(a->path);
	else
		ac = redisAsyncConnect(a->host, a->port);
	if (ac != NULL && ac->err) {
		redisAsyncFree(ac);
		ac = NULL;
	}
	return ac;
}

static int
reply_is_error(const redisReply *r)
{
	return r == NULL || r->type == REDIS_REPLY_ERROR;
}

/* ---- worker ---------------------------------------------------------- */

#define MAX_PENDING 4096         /* acquires waiting for Redis at once */
#define TIMEOUTS_TO_RECONNECT 8  /* in a row, with no reply between */
#define BACKOFF_MIN 0.1
#define BACKOFF_MAX 5.0

struct sl_cl_wait {
	struct sl_cluster_w *cw;
	sl_cl_cb *cb;           /* NULL: cancelled */
	void *arg;
	int32_t cell;
	uint32_t gen;
	int tenant;
	int decided;            /* the verdict was given */
	int replied;            /* hiredis is done with this record */
	int retried;            /* NOSCRIPT: sent again with EVAL */
	int replied_full;       /* Redis refused: full, or out of tokens */
	int retry_after;        /* a token refusal's Retry-After */
	ev_tstamp t0;
	ev_timer timer;
};

struct sl_cluster_w {
	struct ev_loop *loop;
	const struct sl_config *cfg;
	struct sl_shm *shm;
	struct sl_cluster_shm *cs;
	size_t row;
	const size_t *tenant_slot;
	char **keys;             /* per config tenant: sluice:{NAME}:leases */
	char **tkeys;            /* and sluice:{NAME}:tokens */
	struct addr addr;

	redisAsyncContext *ac;
	int connected;
	int in_cb;               /* inside a hiredis callback */
	char sha[41];            /* the acquire script, once loaded */
	char csha[41];           /* the charge script, once loaded */
	ev_timer retry;          /* reconnect, or the connect deadline */
	ev_prepare flush;        /* commands queued this turn go out at its end */
	double backoff;
	ev_tstamp connect_tried;  /* the last cw_connect */
	int timeouts_in_row;
	size_t npending;
	int stale;               /* the master's heartbeat is too old: fenced */
	void (*ready_cb)(void *);  /* sl_cluster_worker_await's, once */
	void *ready_arg;
	ev_tstamp unknown_logged; /* Redis did not know the node (-1), logged */

	/*
	 * Per config tenant: the cluster's token window was found full, and
	 * stays full at least until `until` (what Redis said, less the second
	 * its clock may be ahead of ours) while the budget is still `tpm`.
	 */
	struct tok_full {
		ev_tstamp until;
		int32_t tpm;
	} *tok_full;

	int32_t *cell_tenant;    /* config tenant per cell */
	uint32_t *free;          /* free cells below hwm */
	size_t nfree;
	uint32_t hwm, cap;
};

static void cw_connect(struct sl_cluster_w *);

/*
 * Commands queued during a loop turn are written once, at its end (one
 * write for all of them, before libev applies watcher changes, so the
 * adapter's write watcher costs no epoll_ctl), not a turn later.
 */
static void
cw_flush_cb(struct ev_loop *loop, ev_prepare *p, int revents)
{
	struct sl_cluster_w *cw = p->data;

	(void)revents;
	ev_prepare_stop(loop, p);
	if (cw->ac != NULL && cw->connected)
		redisAsyncHandleWrite(cw->ac);
}

static void
cw_queued(struct sl_cluster_w *cw)
{
	if (!ev_is_active(&cw->flush))
		ev_prepare_start(cw->loop, &cw->flush);
}

static void
cw_schedule(struct sl_cluster_w *cw)
{
	double d = cw->backoff;

	cw->backoff = cw->backoff * 2 > BACKOFF_MAX ? BACKOFF_MAX : cw->backoff * 2;
	/* Jitter, so the workers of every node do not come back at once. */
	d *= 0.75 + 0.5 * ((double)(rand() % 1000) / 1000.0);
	ev_timer_stop(cw->loop, &cw->retry);
	ev_timer_set(&cw->retry, d, 0.0);
	ev_timer_start(cw->loop, &cw->retry);
}

/* Drop the connection (pending acquires get their NULL reply) and retry. */
static void
cw_drop(struct sl_cluster_w *cw, const char *why)
{
	redisAsyncContext *ac = cw->ac;

	if (ac == NULL)
		return;
	if (why != NULL)        /* (NULL: the caller logged why) */
		sl_warn("cluster: dropping the Redis connection: %s", why);
	cw->ac = NULL;
	cw->connected = 0;
	cw->sha[0] = cw->csha[0] = '\0';
	row_state(cw->cs, cw->row, ROW_CONNECTING);
	redisAsyncFree(ac);
	cw_schedule(cw);
}

static void
cw_on_connect(const redisAsyncContext *ac, int status)
{
	struct sl_cluster_w *cw = ac->data;

	if (cw == NULL || ac != cw->ac)
		return;
	if (status != REDIS_OK) {
		sl_debug("cluster: connect failed: %s", ac->errstr);
		row_err(cw->cs, cw->row, ERR_CONNECT);
		cw->ac = NULL;   /* hiredis frees it */
		cw->connected = 0;
		row_state(cw->cs, cw->row, ROW_CONNECTING);
		cw_schedule(cw);
		return;
	}
	cw->connected = 1;
	/*
	 * The backoff is reset by the first answer (cw_sha_cb), not here:
	 * a Redis that accepts the connection and then refuses AUTH would
	 * otherwise be reconnected to ten times a second.
	 */
	ev_timer_stop(cw->loop, &cw->retry);
}

static void
cw_on_disconnect(const redisAsyncContext *ac, int status)
{
	struct sl_cluster_w *cw = ac->data;

	if (cw == NULL || ac != cw->ac)
		return;
	cw->ac = NULL;
	cw->connected = 0;
	cw->sha[0] = cw->csha[0] = '\0';
	row_state(cw->cs, cw->row, ROW_CONNECTING);
	if (status != REDIS_OK) {
		row_err(cw->cs, cw->row, ERR_CONNECT);
		sl_warn("cluster: Redis connection lost: %s", ac->errstr);
	}
	cw_schedule(cw);
}

/*
 * Redis refusing the same way at every reconnect or heartbeat (a password
 * missing or wrong) is logged once, then at most once a minute per process
 * with how many refusals went unlogged; the error counters count each one.
 * The line says what to fix where the reply tells it.
 */
#define REFUSAL_QUIET 60.0

static struct {
	char msg[128];
	double t;
	unsigned long more;
} refusal;

static void
log_refusal(enum sl_log_level level, const char *what, const char *str)
{
	double now = ev_time();
	char msg[128];
	const char *hint = "";
	int same;

	snprintf(msg, sizeof(msg), "%s: %s", what, str != NULL ? str : "(no reply)");
	same = strcmp(msg, refusal.msg) == 0;
	if (same && now - refusal.t < REFUSAL_QUIET) {
		refusal.more++;
		return;
	}
	if (str != NULL && strncmp(str, "NOAUTH", 6) == 0)
		hint = " (Redis wants a password: set cluster.password)";
	else if (str != NULL && (strncmp(str, "WRONGPASS", 9) == 0 ||
	    strstr(str, "invalid password") != NULL))
		hint = " (check cluster.password)";
	if (same && refusal.more > 0)
		sl_log(level, "cluster: %s%s; %lu more in the last %.0f s", msg, hint,
		    refusal.more, now - refusal.t);
	else
		sl_log(level, "cluster: %s%s", msg, hint);
	memcpy(refusal.msg, msg, sizeof(msg));
	refusal.t = now;
	refusal.more = 0;
}

static void
cw_auth_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cluster_w *cw = priv;
	redisReply *reply = r;

	if (reply == NULL || ac != cw->ac)
		return;
	if (reply->type == REDIS_REPLY_ERROR) {
		row_err(cw->cs, cw->row, ERR_REPLY);
		log_refusal(SL_LOG_ERROR, "AUTH refused", reply->str);
		cw_drop(cw, NULL);
	}
}

static void
cw_sha_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cluster_w *cw = priv;
	redisReply *reply = r;

	if (reply == NULL || ac != cw->ac)
		return;
	/* Behind AUTH on the connection: Redis took us, back off less. */
	cw->backoff = BACKOFF_MIN;
	if (reply->type == REDIS_REPLY_STRING && reply->len == 40)
		memcpy(cw->sha, reply->str, 41);
	/* Answered (the acquire falls back to EVAL without the sha). */
	if (reply->type != REDIS_REPLY_ERROR) {
		void (*cb)(void *) = cw->ready_cb;

		row_state(cw->cs, cw->row, ROW_READY);
		cw->ready_cb = NULL;
		if (cb != NULL)
			cb(cw->ready_arg);   /* it only starts a watcher */
	}
}

int
sl_cluster_worker_await(struct sl_cluster_w *cw, void (*cb)(void *), void *arg)
{
	cw->ready_cb = NULL;
	if (cb == NULL)
		return 1;
	if (atomic_load_explicit(&cw->cs->row[cw->row].state,
	    memory_order_acquire) != ROW_STARTING)
		return 1;
	if (atomic_load_explicit(&cw->cs->mode, memory_order_acquire) !=
	    MODE_REDIS) {
		/* The node admits by on_redis_down anyway: so does this one. */
		row_state(cw->cs, cw->row, ROW_CONNECTING);
		return 1;
	}
	cw->ready_cb = cb;
	cw->ready_arg = arg;
	return 0;
}

void
sl_cluster_worker_await_end(struct sl_cluster_w *cw)
{
	cw->ready_cb = NULL;
	if (atomic_load_explicit(&cw->cs->row[cw->row].state,
	    memory_order_acquire) == ROW_STARTING)
		row_state(cw->cs, cw->row, ROW_CONNECTING);
}

static void
cw_csha_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cluster_w *cw = priv;
	redisReply *reply = r;

	if (reply == NULL || ac != cw->ac)
		return;
	if (reply->type == REDIS_REPLY_STRING && reply->len == 40)
		memcpy(cw->csha, reply->str, 41);
}

static void
cw_retry_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_cluster_w *cw = t->data;

	(void)loop;
	(void)revents;
	if (cw->ac != NULL && !cw->connected) {
		/* The connect deadline passed. */
		row_err(cw->cs, cw->row, ERR_CONNECT);
		cw_drop(cw, "connect timed out");
		return;
	}
	if (cw->ac == NULL)
		cw_connect(cw);
}

static void
cw_connect(struct sl_cluster_w *cw)
{
	const struct sl_cluster_conf *cc = &cw->cfg->cluster;
	redisAsyncContext *ac;
	const char *argv[3];
	size_t argl[3];
	double deadline;

	cw->connect_tried = ev_time();
	if ((ac = redis_open(&cw->addr)) == NULL) {
		row_err(cw->cs, cw->row, ERR_CONNECT);
		cw_schedule(cw);
		return;
	}
	ac->data = cw;
	if (redisLibevAttach(cw->loop, ac) != REDIS_OK) {
		redisAsyncFree(ac);
		cw_schedule(cw);
		return;
	}
	redisAsyncSetConnectCallback(ac, cw_on_connect);
	redisAsyncSetDisconnectCallback(ac, cw_on_disconnect);
	cw->ac = ac;
	cw->connected = 0;
	/* Queued before the connect completes; hiredis sends them in order. */
	if (cc->password != NULL)
		redisAsyncCommand(ac, cw_auth_cb, cw, "AUTH %s", cc->password);
	argv[0] = "SCRIPT";
	argv[1] = "LOAD";
	argv[2] = acquire_lua;
	argl[0] = 6;
	argl[1] = 4;
	argl[2] = sizeof(acquire_lua) - 1;
	redisAsyncCommandArgv(ac, cw_sha_cb, cw, 3, argv, argl);
	argv[2] = charge_lua;
	argl[2] = sizeof(charge_lua) - 1;
	redisAsyncCommandArgv(ac, cw_csha_cb, cw, 3, argv, argl);
	deadline = (double)cc->timeout_ms / 1000.0 * 10;
	if (deadline < 1.0)
		deadline = 1.0;
	ev_timer_stop(cw->loop, &cw->retry);
	ev_timer_set(&cw->retry, deadline, 0.0);
	ev_timer_start(cw->loop, &cw->retry);
}

struct sl_cluster_w *
sl_cluster_worker_new(struct ev_loop *loop, const struct sl_config *cfg,
    struct sl_shm *shm, struct sl_cluster_shm *cs, size_t row,
    const size_t *tenant_slot)
{
	struct sl_cluster_w *cw;
	size_t i, n;

	if ((cw = calloc(1, sizeof(*cw))) == NULL)
		return NULL;
	cw->loop = loop;
	cw->cfg = cfg;
	cw->shm = shm;
	cw->cs = cs;
	cw->row = row;
	cw->tenant_slot = tenant_slot;
	cw->backoff = BACKOFF_MIN;
	addr_parse(cfg->cluster.redis, &cw->addr);
	if ((cw->keys = calloc(cfg->ntenants ? cfg->ntenants : 1,
	    sizeof(char *))) == NULL || (cw->tkeys = calloc(cfg->ntenants ?
	    cfg->ntenants : 1, sizeof(char *))) == NULL ||
	    (cw->tok_full = calloc(cfg->ntenants ? cfg->ntenants : 1,
	    sizeof(*cw->tok_full))) == NULL)
		goto fail;
	for (i = 0; i < cfg->ntenants; i++) {
		n = strlen(cfg->tenants[i].name) + 32;
		if ((cw->keys[i] = malloc(n)) == NULL ||
		    (cw->tkeys[i] = malloc(n)) == NULL)
			goto fail;
		snprintf(cw->keys[i], n, "sluice:{%s}:leases", cfg->tenants[i].name);
		snprintf(cw->tkeys[i], n, "sluice:{%s}:tokens", cfg->tenants[i].name);
	}
	/* The master reclaimed this row before handing it out. */
	atomic_store(&cs->row[row].hwm, 0);
	if (atomic_load(&cs->row[row].state) != ROW_STARTING)
		row_state(cs, row, ROW_CONNECTING);
	ev_timer_init(&cw->retry, cw_retry_cb, 0.0, 0.0);
	cw->retry.data = cw;
	ev_prepare_init(&cw->flush, cw_flush_cb);
	cw->flush.data = cw;
	srand((unsigned)getpid() ^ (unsigned)time(NULL));
	cw_connect(cw);
	return cw;
fail:
	sl_cluster_worker_free(cw);
	return NULL;
}

void
sl_cluster_worker_free(struct sl_cluster_w *cw)
{
	size_t i;

	if (cw == NULL)
		return;
	ev_timer_stop(cw->loop, &cw->retry);
	ev_prepare_stop(cw->loop, &cw->flush);
	if (cw->ac != NULL) {
		redisAsyncContext *ac = cw->ac;

		/* Release commands still queued go out first, if they can. */
		if (cw->connected)
			redisAsyncHandleWrite(ac);
		cw->ac = NULL;
		redisAsyncFree(ac);
	}
	if (cw->keys != NULL)
		for (i = 0; i < cw->cfg->ntenants; i++)
			free(cw->keys[i]);
	free(cw->keys);
	if (cw->tkeys != NULL)
		for (i = 0; i < cw->cfg->ntenants; i++)
			free(cw->tkeys[i]);
	free(cw->tkeys);
	free(cw->tok_full);
	free(cw->cell_tenant);
	free(cw->free);
	free(cw);
}

static int32_t
cell_alloc(struct sl_cluster_w *cw, int tenant)
{
	struct cell *c;
	uint32_t i;
	uint64_t w;

	if (cw->nfree > 0) {
		i = cw->free[--cw->nfree];
	} else {
		if (cw->hwm >= cw->cs->cells)
			return -1;
		if (cw->hwm == cw->cap) {
			uint32_t ncap = cw->cap ? cw->cap * 2 : 256;
			int32_t *t;
			uint32_t *f;

			if (ncap > cw->cs->cells)
				ncap = (uint32_t)cw->cs->cells;
			if ((t = realloc(cw->cell_tenant, ncap * sizeof(*t))) == NULL)
				return -1;
			cw->cell_tenant = t;
			if ((f = realloc(cw->free, ncap * sizeof(*f))) == NULL)
				return -1;
			cw->free = f;
			cw->cap = ncap;
		}
		i = cw->hwm++;
		atomic_store_explicit(&cw->cs->row[cw->row].hwm, cw->hwm,
		    memory_order_release);
	}
	c = cell_at(cw->cs, cw->row, i);
	w = atomic_load_explicit(&c->word, memory_order_relaxed);
	cw->cell_tenant[i] = tenant;
	atomic_store_explicit(&c->tslot, (uint32_t)cw->tenant_slot[tenant],
	    memory_order_relaxed);
	atomic_store_explicit(&c->word, CELL_WORD(CELL_GEN(w) + 1, CELL_PENDING),
	    memory_order_release);
	return (int32_t)i;
}

static void
cell_set(struct sl_cluster_w *cw, int32_t i, unsigned st)
{
	struct cell *c = cell_at(cw->cs, cw->row, (size_t)i);
	uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);

	atomic_store_explicit(&c->word, CELL_WORD(CELL_GEN(w), st),
	    memory_order_release);
}

static uint32_t
cell_gen(struct sl_cluster_w *cw, int32_t i)
{
	return CELL_GEN(atomic_load_explicit(&cell_at(cw->cs, cw->row,
	    (size_t)i)->word, memory_order_relaxed));
}

static void
cw_member(struct sl_cluster_w *cw, int32_t i, char *dst)
{
	member_fmt(dst, MEMBER_MAX, cw->cfg->cluster.node, cw->cs->epoch, cw->row,
	    (size_t)i, cell_gen(cw, i));
}

static void
cw_count_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cluster_w *cw = priv;

	(void)ac;
	if (r != NULL && reply_is_error(r))
		row_err(cw->cs, cw->row, ERR_REPLY);
}

/* A charge in flight, kept to be sent again as EVAL after a NOSCRIPT. */
struct charge {
	struct sl_cluster_w *cw;
	int tenant;
	int eval;                /* sent as EVAL (no script cache needed) */
	uint64_t tokens;
};

static int send_charge(struct sl_cluster_w *, struct charge *);

/*
 * A charge's answer. A NOSCRIPT (SCRIPT FLUSH, with the connection up)
 * sends the same charge again as EVAL: dropping it would undercount the
 * tenant's window across the cluster. Owns ch.
 */
static void
cw_charge_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct charge *ch = priv;
	struct sl_cluster_w *cw = ch->cw;
	redisReply *reply = r;

	if (reply != NULL && ac == cw->ac && reply_is_error(reply)) {
		if (!ch->eval && strncmp(reply->str, "NOSCRIPT", 8) == 0) {
			cw->csha[0] = '\0';   /* the next charges are EVALs */
			ch->eval = 1;
			if (send_charge(cw, ch) == 0)
				return;
		}
		row_err(cw->cs, cw->row, ERR_REPLY);
	}
	free(ch);
}

/*
 * Free a cell; if Redis may hold (or be about to add) its lease, remove it.
 * Sent behind any acquire of the same cell on this connection, so it wins.
 */
static void
cell_free(struct sl_cluster_w *cw, int32_t i, int zrem)
{
	char member[MEMBER_MAX];
	const char *argv[3];
	size_t argl[3];

	if (zrem && cw->ac != NULL && cw->connected) {
		cw_member(cw, i, member);
		argv[0] = "ZREM";
		argv[1] = cw->keys[cw->cell_tenant[i]];
		argv[2] = member;
		argl[0] = 4;
		argl[1] = strlen(argv[1]);
		argl[2] = strlen(member);
		redisAsyncCommandArgv(cw->ac, cw_count_cb, cw, 3, argv, argl);
		/* Out now: a client told "done" may be admitted elsewhere next. */
		if (!cw->in_cb && cw->ac != NULL)
			redisAsyncHandleWrite(cw->ac);
		else
			cw_queued(cw);
	}
	cell_set(cw, i, CELL_FREE);
	cw->free[cw->nfree++] = (uint32_t)i;
}

/*
 * The tenant's max_streams and tokens_per_minute as the master published
 * them last, not this worker's copy: a worker retiring at a reload that
 * still admits a request whose head was in flight applies the new limits,
 * as it does without a cluster.
 */
static int32_t
tenant_max(const struct sl_cluster_w *cw, int tenant)
{
	return sl_shm_limit(cw->shm, cw->tenant_slot[tenant]);
}

static int32_t
tenant_tpm(const struct sl_cluster_w *cw, int tenant)
{
	return sl_shm_token_budget(cw->shm, cw->tenant_slot[tenant]);
}

/* local_share's part of total for this node: ceil(total / live nodes). */
static int32_t
node_share(struct sl_cluster_w *cw, int32_t total)
{
	int32_t live = atomic_load_explicit(&cw->cs->live_nodes,
	    memory_order_relaxed);

	if (live < 1)
		live = 1;
	return (total + live - 1) / live;
}

/* What on_redis_down says for a request whose node slot is held. */
static enum sl_cl_verdict
fail_verdict(struct sl_cluster_w *cw, int tenant)
{
	int32_t share, inflight;

	switch (cw->cfg->cluster.on_redis_down) {
	case SL_DOWN_CLOSED:
		return SL_CL_CLOSED;
	case SL_DOWN_LOCAL_FULL:
		return SL_CL_ADMIT;
	default:
		share = node_share(cw, tenant_max(cw, tenant));
		/* The node's streams of the tenant, this one included. */
		inflight = sl_shm_inflight(cw->shm, cw->tenant_slot[tenant]);
		return inflight <= share ? SL_CL_ADMIT : SL_CL_FULL;
	}
}

/*
 * 1 when the master still says the node admits through Redis but its last
 * acknowledged heartbeat is older than the fence allows: the master is
 * stopped (SIGSTOP, a debugger, a machine swapping) or dead, nobody renews
 * the leases this worker would take, and they would expire under streams
 * still in flight. Checked on every admission; said once per episode.
 */
static int
cw_stale(struct sl_cluster_w *cw)
{
	int stale = mono_ns() >= atomic_load_explicit(&cw->cs->fence_ns,
	    memory_order_acquire);

	if (stale && !cw->stale)
		sl_warn("cluster: the master's last acknowledged heartbeat is "
		    "older than lease_ttl - 2 x heartbeat (the master is stopped "
		    "or dead); refusing cluster admissions");
	else if (!stale && cw->stale)
		sl_info("cluster: the master's heartbeat is acknowledged again");
	cw->stale = stale;
	return stale;
}

/* This worker asks Redis now (else on_redis_down decides). */
static int
cw_by_redis(const struct sl_cluster_w *cw)
{
	return atomic_load_explicit(&cw->cs->mode, memory_order_acquire) ==
	    MODE_REDIS && cw->ac != NULL && cw->connected &&
	    mono_ns() < atomic_load_explicit(&cw->cs->fence_ns,
	    memory_order_acquire);
}

/*
 * The node admits through Redis again but this worker's own connection is
 * still in its backoff (grown to seconds while Redis was away): connect
 * now rather than admit by on_redis_down meanwhile; at most once a second
 * (a Redis at maxclients takes the master and refuses its workers).
 */
static void
cw_reconnect_now(struct sl_cluster_w *cw)
{
	if (cw->ac != NULL || ev_time() - cw->connect_tried < 1.0)
		return;
	ev_timer_stop(cw->loop, &cw->retry);
	cw_connect(cw);
}

static void
wait_free(struct sl_cl_wait *w)
{
	ev_timer_stop(w->cw->loop, &w->timer);
	free(w);
}

/* Give the verdict of a request that waited (reply, deadline or loss). */
static void
wait_decide(struct sl_cl_wait *w, enum sl_cl_verdict v)
{
	struct sl_cluster_w *cw = w->cw;

	w->decided = 1;
	ev_timer_stop(cw->loop, &w->timer);
	if (w->cb == NULL)
		return;
	if (v == SL_CL_ADMIT) {
		if (cell_gen(cw, w->cell) == w->gen &&
		    CELL_STATE(atomic_load(&cell_at(cw->cs, cw->row,
		    (size_t)w->cell)->word)) == CELL_PENDING)
			cell_set(cw, w->cell, CELL_LOCAL);
	} else
		/* Refused by Redis: nothing to remove; else the acquire may
		 * still run behind us, and the ZREM behind it undoes it. */
		cell_free(cw, w->cell, !w->replied_full);
	w->cb(w->arg, v, w->retry_after);
}

static void
wait_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_cl_wait *w = t->data;
	struct sl_cluster_w *cw = w->cw;

	(void)loop;
	(void)revents;
	if (!w->decided) {
		if (!w->replied) {
			row_err(cw->cs, cw->row, ERR_TIMEOUT);
			cw->timeouts_in_row++;
		}
		wait_decide(w, fail_verdict(cw, w->tenant));
	}
	if (w->replied)
		wait_free(w);
	else if (cw->timeouts_in_row >= TIMEOUTS_TO_RECONNECT) {
		cw->timeouts_in_row = 0;
		cw_drop(cw, "Redis stopped answering");
	}
}

static int send_acquire(struct sl_cluster_w *, struct sl_cl_wait *, int eval);

static void
acquire_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cl_wait *w = priv;
	struct sl_cluster_w *cw = w->cw;
	redisReply *reply = r;

	(void)ac;
	cw->npending--;
	if (reply == NULL) {
		/* Connection gone: decide from the loop, not inside hiredis. */
		w->replied = 1;
		if (w->decided || w->cb == NULL) {
			wait_free(w);
			return;
		}
		ev_timer_stop(cw->loop, &w->timer);
		ev_timer_set(&w->timer, 0.0, 0.0);
		ev_timer_start(cw->loop, &w->timer);
		return;
	}
	cw->timeouts_in_row = 0;
	row_rtt(cw->cs, cw->row, ev_time() - w->t0);
	cw->in_cb++;
	if (reply->type == REDIS_REPLY_ERROR && !w->retried &&
	    strncmp(reply->str, "NOSCRIPT", 8) == 0) {
		/* The script cache was flushed (restart, SCRIPT FLUSH). */
		cw->sha[0] = '\0';
		w->retried = 1;
		if (send_acquire(cw, w, 1) == 0) {
			cw->in_cb--;
			return;
		}
	}
	if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
	    reply->element[0]->type == REDIS_REPLY_INTEGER &&
	    reply->element[1]->type == REDIS_REPLY_INTEGER) {
		/* {tokens in the window, seconds until it has room} */
		long long ra = reply->element[1]->integer;

		ra = ra < 1 ? 1 : ra > 60 ? 60 : ra;
		/*
		 * Charges only add to the window: it has no room for ra - 1
		 * s at least (Redis counts whole seconds of its clock). Until
		 * then this worker refuses the tenant itself, without a slot
		 * or a round trip (sl_cluster_tokens_full).
		 */
		if (ra > 1) {
			cw->tok_full[w->tenant].until = ev_now(cw->loop) +
			    (double)(ra - 1);
			cw->tok_full[w->tenant].tpm = tenant_tpm(cw, w->tenant);
		}
		if (!w->decided) {
			w->replied_full = 1;
			w->retry_after = (int)ra;
			wait_decide(w, SL_CL_TOKENS);
		}
	} else if (reply->type != REDIS_REPLY_INTEGER) {
		row_err(cw->cs, cw->row, ERR_REPLY);
		sl_warn("cluster: acquire: unexpected reply: %s",
		    reply->type == REDIS_REPLY_ERROR ? reply->str : "not an integer");
		if (!w->decided)
			wait_decide(w, fail_verdict(cw, w->tenant));
	} else if (reply->integer == -1) {
		/*
		 * sluice:nodes does not hold this node: Redis lost its state
		 * with the connection up (FLUSHALL) and the master has not
		 * noticed yet (within a heartbeat). Nothing was added.
		 */
		atomic_store(&cw->cs->unknown, 1);
		if (ev_now(cw->loop) - cw->unknown_logged >= REFUSAL_QUIET) {
			cw->unknown_logged = ev_now(cw->loop);
			sl_warn("cluster: Redis does not know node %s (flushed or "
			    "restarted); admitting by on_redis_down until the "
			    "master has re-added its leases",
			    cw->cfg->cluster.node);
		}
		if (!w->decided) {
			w->replied_full = 1;
			wait_decide(w, fail_verdict(cw, w->tenant));
		}
	} else if (reply->integer == 1) {
		if (!w->decided) {
			cell_set(cw, w->cell, CELL_HELD);
			wait_decide(w, SL_CL_ADMIT);
		} else if (w->cb != NULL && cell_gen(cw, w->cell) == w->gen &&
		    CELL_STATE(atomic_load(&cell_at(cw->cs, cw->row,
		    (size_t)w->cell)->word)) == CELL_LOCAL) {
			/* Admitted by on_redis_down after the deadline: now held. */
			cell_set(cw, w->cell, CELL_HELD);
		}
	} else if (!w->decided) {
		w->replied_full = 1;
		wait_decide(w, SL_CL_FULL);
	}
	cw->in_cb--;
	wait_free(w);
}

static int
send_acquire(struct sl_cluster_w *cw, struct sl_cl_wait *w, int eval)
{
	char member[MEMBER_MAX], max[16], ttl[24], tpm[16];
	const char *argv[11];
	size_t argl[11];
	int i;

	cw_member(cw, w->cell, member);
	snprintf(max, sizeof(max), "%" PRId32, tenant_max(cw, w->tenant));
	snprintf(ttl, sizeof(ttl), "%" PRIu64, cw->cfg->cluster.lease_ttl_ms);
	snprintf(tpm, sizeof(tpm), "%" PRId32, tenant_tpm(cw, w->tenant));
	if (!eval && cw->sha[0] != '\0') {
		argv[0] = "EVALSHA";
		argv[1] = cw->sha;
	} else {
		argv[0] = "EVAL";
		argv[1] = acquire_lua;
	}
	argv[2] = "3";
	argv[3] = cw->keys[w->tenant];
	argv[4] = cw->tkeys[w->tenant];
	argv[5] = NODES_KEY;
	argv[6] = max;
	argv[7] = member;
	argv[8] = ttl;
	argv[9] = tpm;
	argv[10] = cw->cfg->cluster.node;
	for (i = 0; i < 11; i++)
		argl[i] = strlen(argv[i]);
	if (redisAsyncCommandArgv(cw->ac, acquire_cb, w, 11, argv, argl) !=
	    REDIS_OK)
		return -1;
	cw->npending++;
	cw_queued(cw);
	return 0;
}

enum sl_cl_verdict
sl_cluster_acquire(struct sl_cluster_w *cw, int tenant, sl_cl_cb *cb,
    void *arg, int32_t *lease, struct sl_cl_wait **wait)
{
	struct sl_cl_wait *w;
	enum sl_cl_verdict v;
	int32_t i;
	int mode = atomic_load_explicit(&cw->cs->mode, memory_order_acquire);

	*lease = -1;
	*wait = NULL;
	/*
	 * Fenced by the master's silence: not on_redis_down, whose local
	 * modes assume the other nodes share the loss, while here they admit
	 * the whole max_streams through Redis.
	 */
	if (mode == MODE_REDIS && cw_stale(cw))
		return SL_CL_CLOSED;
	if (mode == MODE_REDIS && cw->ac == NULL)
		cw_reconnect_now(cw);
	if ((i = cell_alloc(cw, tenant)) < 0)
		/* Out of cells (or memory): decided here, without a lease. */
		return fail_verdict(cw, tenant);
	if (mode != MODE_REDIS || cw->ac == NULL || !cw->connected ||
	    cw->npending >= MAX_PENDING || (w = calloc(1, sizeof(*w))) == NULL) {
		v = fail_verdict(cw, tenant);
		if (v == SL_CL_ADMIT) {
			cell_set(cw, i, CELL_LOCAL);
			*lease = i;
		} else
			cell_free(cw, i, 0);
		return v;
	}
	w->cw = cw;
	w->cb = cb;
	w->arg = arg;
	w->cell = i;
	w->gen = cell_gen(cw, i);
	w->tenant = tenant;
	w->t0 = ev_time();
	ev_timer_init(&w->timer, wait_timer_cb,
	    (double)cw->cfg->cluster.timeout_ms / 1000.0, 0.0);
	w->timer.data = w;
	if (send_acquire(cw, w, 0) == -1) {
		free(w);
		v = fail_verdict(cw, tenant);
		if (v == SL_CL_ADMIT) {
			cell_set(cw, i, CELL_LOCAL);
			*lease = i;
		} else
			cell_free(cw, i, 0);
		return v;
	}
	ev_timer_start(cw->loop, &w->timer);
	*lease = i;
	*wait = w;
	return SL_CL_PENDING;
}

void
sl_cluster_cancel(struct sl_cluster_w *cw, struct sl_cl_wait *w)
{
	if (w == NULL)
		return;
	if (!w->decided)
		cell_free(cw, w->cell, 1);
	w->cb = NULL;
	w->decided = 1;
	ev_timer_stop(cw->loop, &w->timer);
	if (w->replied)
		wait_free(w);
}

void
sl_cluster_release(struct sl_cluster_w *cw, int32_t lease)
{
	struct cell *c;

	if (lease < 0 || (uint32_t)lease >= cw->hwm)
		return;
	c = cell_at(cw->cs, cw->row, (size_t)lease);
	if (CELL_STATE(atomic_load(&c->word)) == CELL_FREE)
		return;
	cell_free(cw, lease, 1);
}

int64_t
sl_cluster_token_budget(struct sl_cluster_w *cw, int tenant)
{
	int32_t tpm = tenant_tpm(cw, tenant);

	if (tpm <= 0)
		return 0;
	if (cw_by_redis(cw))
		return -1;   /* the acquire script decides */
	if (cw->cfg->cluster.on_redis_down != SL_DOWN_LOCAL_SHARE)
		return tpm;   /* closed refuses anyway */
	return node_share(cw, tpm);
}

int
sl_cluster_tokens_full(struct sl_cluster_w *cw, int tenant, int *retry_after)
{
	const struct tok_full *f = &cw->tok_full[tenant];
	ev_tstamp left = f->until - ev_now(cw->loop);

	/* A budget changed by a reload, or none (0 is never -1), ends it. */
	if (left <= 0 || f->tpm != tenant_tpm(cw, tenant) ||
	    sl_cluster_token_budget(cw, tenant) != -1)
		return 0;
	/* Redis's own answer would be about a second more. */
	*retry_after = (int)left + 2 > 60 ? 60 : (int)left + 2;
	return 1;
}

/* Queue ch on the worker's connection; on success hiredis holds it. */
static int
send_charge(struct sl_cluster_w *cw, struct charge *ch)
{
	char n[24];
	const char *argv[5];
	size_t argl[5];
	int i;

	if (cw->ac == NULL || !cw->connected)
		return -1;
	snprintf(n, sizeof(n), "%" PRIu64, ch->tokens);
	if (!ch->eval && cw->csha[0] != '\0') {
		argv[0] = "EVALSHA";
		argv[1] = cw->csha;
	} else {
		ch->eval = 1;
		argv[0] = "EVAL";
		argv[1] = charge_lua;
	}
	argv[2] = "1";
	argv[3] = cw->tkeys[ch->tenant];
	argv[4] = n;
	for (i = 0; i < 5; i++)
		argl[i] = strlen(argv[i]);
	if (redisAsyncCommandArgv(cw->ac, cw_charge_cb, ch, 5, argv, argl) !=
	    REDIS_OK)
		return -1;
	cw_queued(cw);
	return 0;
}

void
sl_cluster_charge(struct sl_cluster_w *cw, int tenant, uint64_t tokens)
{
	struct charge *ch;

	if (tokens == 0 || tenant < 0 || (size_t)tenant >= cw->cfg->ntenants ||
	    tenant_tpm(cw, tenant) <= 0 ||
	    cw->ac == NULL || !cw->connected ||
	    (ch = calloc(1, sizeof(*ch))) == NULL)
		return;
	ch->cw = cw;
	ch->tenant = tenant;
	ch->tokens = tokens;
	if (send_charge(cw, ch) == -1)
		free(ch);
}

/* ---- master ---------------------------------------------------------- */

#define RENEW_CHUNK 256          /* members per renew call */

struct rcell {
	uint32_t tslot;
	uint32_t row, i;
	uint32_t failed;             /* Redis does not hold its lease: an
	                                error answer, or missing at renewal */
	uint64_t word;
};

/* A call of a heartbeat round, in the order sent (and answered). */
struct rcall {
	struct rcell *v;             /* its members; NULL: the registration */
	size_t n;
};

struct sl_cluster_m {
	struct sl_cluster_shm *cs;
	sl_cl_name_fn *name_of;
	void *name_arg;
	char *node;
	char *password;
	struct addr addr;
	char *redis;
	uint64_t ttl_ms, hb_ms, timeout_ms;
	int down_mode;

	redisAsyncContext *ac;
	int connected;
	int want_read, want_write;
	int ever_acked;
	double connect_at;           /* next connect attempt */
	double connect_deadline;
	double backoff;

	double next_hb;
	double last_ack;
	/*
	 * The timing the last acknowledged renew was sent with, and that of
	 * the round out now: after a reload the leases in Redis still expire
	 * by the old lease_ttl until a round on the new one is acknowledged.
	 */
	uint64_t ack_ttl_ms, ack_hb_ms;
	uint64_t round_ttl_ms, round_hb_ms;
	int round_out;               /* replies the round still waits for */
	int round_failed;
	int round_readd;
	int round_unknown;           /* cs->unknown when the round was sent */
	double round_t0;
	struct rcell *rc;            /* cells the round adds (ZADD) */
	size_t nrc;
	struct rcell *rx;            /* and renews (ZADD XX) */
	size_t nrx;
	struct rcall *calls;         /* the round's calls, answered in order */
	size_t ncalls, call_next;
	int32_t live_seen;
	/*
	 * After a loss (the connection, a fence, the node's registration
	 * gone) the live count is not trusted below the one known before it
	 * (floor_live) until lease_ttl after Redis first answered again
	 * (floor_until; 0: not yet): nodes re-register one by one, and an
	 * empty sluice:nodes would give every node's local_share the whole
	 * max_streams. A rejoining node also waits, in its on_redis_down mode,
	 * for that many nodes (each registers after re-adding its leases)
	 * before it admits through Redis again.
	 */
	int floor_on;
	int32_t floor_live;
	double floor_until;
	int waiting_logged;
	long long reg_exp;           /* expiry of our last registration; 0: unknown */
	double clash_logged;         /* when a name clash was last logged */
};

static double
mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void cm_publish_fence(struct sl_cluster_m *);

/* Forget the cells and calls of the round out (answered or abandoned). */
static void
round_free(struct sl_cluster_m *cm)
{
	free(cm->rc);
	cm->rc = NULL;
	cm->nrc = 0;
	free(cm->rx);
	cm->rx = NULL;
	cm->nrx = 0;
	free(cm->calls);
	cm->calls = NULL;
	cm->ncalls = cm->call_next = 0;
}

/* What local_share divides by: the live count, floored after a loss. */
static void
cm_publish_live(struct sl_cluster_m *cm)
{
	int32_t live = cm->live_seen;

	if (cm->floor_on && cm->floor_until > 0 && mono() >= cm->floor_until)
		cm->floor_on = 0;
	if (cm->floor_on && cm->floor_live > live)
		live = cm->floor_live;
	atomic_store(&cm->cs->live_nodes, live);
}

static void
cm_set_mode(struct sl_cluster_m *cm, int mode, const char *why)
{
	if (atomic_load(&cm->cs->mode) == mode)
		return;
	if (mode == MODE_DOWN) {
		/* A loss: keep the count known before it (see floor_live). */
		if (!cm->floor_on || cm->live_seen > cm->floor_live)
			cm->floor_live = cm->live_seen;
		cm->floor_on = cm->floor_live > 0;
		cm->floor_until = 0;
		cm->waiting_logged = 0;
	}
	atomic_store(&cm->cs->mode, mode);
	if (mode == MODE_REDIS)
		sl_info("cluster: admitting through Redis at %s (%d live node(s))",
		    cm->redis, (int)cm->live_seen);
	else
		sl_warn("cluster: %s; admitting by on_redis_down: %s", why,
		    sl_redis_down_name(cm->down_mode));
}

static void cm_add_read(void *p) { ((struct sl_cluster_m *)p)->want_read = 1; }
static void cm_del_read(void *p) { ((struct sl_cluster_m *)p)->want_read = 0; }
static void cm_add_write(void *p) { ((struct sl_cluster_m *)p)->want_write = 1; }
static void cm_del_write(void *p) { ((struct sl_cluster_m *)p)->want_write = 0; }
static void
cm_cleanup(void *p)
{
	struct sl_cluster_m *cm = p;

	cm->want_read = cm->want_write = 0;
}

static void
cm_lost(struct sl_cluster_m *cm, const char *why)
{
	double now = mono();

	cm->connected = 0;
	cm->round_out = 0;
	round_free(cm);
	cm->connect_at = now + cm->backoff;
	cm->backoff = cm->backoff * 2 > BACKOFF_MAX ? BACKOFF_MAX : cm->backoff * 2;
	/*
	 * Redis may come back empty (a restart, a failover): the leases of
	 * the streams this node carries must be re-added before it trusts
	 * Redis again.
	 */
	cm_set_mode(cm, MODE_DOWN, why);
}

static void
cm_on_connect(const redisAsyncContext *ac, int status)
{
	struct sl_cluster_m *cm = ac->data;

	if (cm == NULL || ac != cm->ac)
		return;
	if (status != REDIS_OK) {
		row_err(cm->cs, 0, ERR_CONNECT);
		sl_debug("cluster: master connect failed: %s", ac->errstr);
		cm->ac = NULL;
		cm_lost(cm, "cannot connect to Redis");
		return;
	}
	cm->connected = 1;
	/* The backoff is reset by the first answer (cm_auth_cb), as above. */
	cm->next_hb = 0;   /* a round now: re-add, register */
}

static void
cm_on_disconnect(const redisAsyncContext *ac, int status)
{
	struct sl_cluster_m *cm = ac->data;

	if (cm == NULL || ac != cm->ac)
		return;
	cm->ac = NULL;
	if (status != REDIS_OK)
		row_err(cm->cs, 0, ERR_CONNECT);
	cm_lost(cm, "lost the Redis connection");
}

static void
cm_drop(struct sl_cluster_m *cm, const char *why)
{
	redisAsyncContext *ac = cm->ac;

	if (ac == NULL)
		return;
	cm->ac = NULL;
	redisAsyncFree(ac);
	cm_lost(cm, why);
}

/* The answer to the first command of a connection: AUTH, or PING. */
static void
cm_auth_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cluster_m *cm = priv;
	redisReply *reply = r;

	if (reply == NULL || ac != cm->ac)
		return;
	if (reply->type == REDIS_REPLY_ERROR) {
		row_err(cm->cs, 0, ERR_REPLY);
		log_refusal(SL_LOG_ERROR, "AUTH refused", reply->str);
		cm_drop(cm, "AUTH refused");
	} else
		cm->backoff = BACKOFF_MIN;
}

static void
cm_connect(struct sl_cluster_m *cm)
{
	redisAsyncContext *ac;

	if ((ac = redis_open(&cm->addr)) == NULL) {
		row_err(cm->cs, 0, ERR_CONNECT);
		cm_lost(cm, "cannot connect to Redis");
		return;
	}
	ac->data = cm;
	ac->ev.data = cm;
	ac->ev.addRead = cm_add_read;
	ac->ev.delRead = cm_del_read;
	ac->ev.addWrite = cm_add_write;
	ac->ev.delWrite = cm_del_write;
	ac->ev.cleanup = cm_cleanup;
	redisAsyncSetConnectCallback(ac, cm_on_connect);
	redisAsyncSetDisconnectCallback(ac, cm_on_disconnect);
	cm->ac = ac;
	cm->connected = 0;
	cm->want_read = cm->want_write = 0;
	if (cm->password != NULL)
		redisAsyncCommand(ac, cm_auth_cb, cm, "AUTH %s", cm->password);
	else
		redisAsyncCommand(ac, cm_auth_cb, cm, "PING");
	cm->connect_deadline = mono() + ((double)cm->timeout_ms / 1000.0 * 10 < 1.0 ?
	    1.0 : (double)cm->timeout_ms / 1000.0 * 10);
}

/*
 * The answer to register_lua: the live nodes, and whether another node
 * registers under this node's name (then both nodes' entries are one, the
 * live count is short by one and local_share's shares are too large).
 * -1 when it is not such an answer.
 */
static int
register_reply(struct sl_cluster_m *cm, const redisReply *r)
{
	double now;

	if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 4 ||
	    r->element[0]->type != REDIS_REPLY_INTEGER ||
	    r->element[1]->type != REDIS_REPLY_INTEGER ||
	    r->element[2]->type != REDIS_REPLY_INTEGER ||
	    r->element[3]->type != REDIS_REPLY_INTEGER)
		return -1;
	if (r->element[3]->integer != 0) {
		/*
		 * The node's registration is gone though it did not rejoin:
		 * Redis lost its state with the connection up (FLUSHALL, a
		 * failover behind a proxy) or the node stalled past lease_ttl.
		 * Its leases may be gone too: admit by on_redis_down until the
		 * next round has re-added them and registered (at once).
		 */
		cm_set_mode(cm, MODE_DOWN, "Redis lost this node's registration "
		    "(flushed, restarted, or the node stalled)");
		cm->next_hb = 0;
		cm->reg_exp = 0;
		return 0;
	}
	/*
	 * Registered and found: a worker's "unknown node" from before this
	 * round was sent is answered (rejoined, or a late reply).
	 */
	if (cm->round_unknown)
		atomic_store(&cm->cs->unknown, 0);
	cm->live_seen = (int32_t)r->element[0]->integer;
	if (cm->floor_on && cm->floor_until == 0)
		cm->floor_until = mono() + (double)cm->ttl_ms / 1000.0;
	cm_publish_live(cm);
	cm->reg_exp = r->element[1]->integer;
	if (r->element[2]->integer != 0) {
		now = mono();
		if (cm->clash_logged == 0 || now - cm->clash_logged >= 60) {
			cm->clash_logged = now;
			sl_err("cluster: another node registers as '%s' at %s: node "
			    "names must be unique, or the nodes count as one and "
			    "on_redis_down: local_share admits too much", cm->node,
			    cm->redis);
		}
	}
	return 0;
}

static void
cm_conf(struct sl_cluster_m *cm, const struct sl_config *cfg)
{
	double hb;

	cm->ttl_ms = cfg->cluster.lease_ttl_ms;
	cm->hb_ms = cfg->cluster.heartbeat_ms;
	cm->timeout_ms = cfg->cluster.timeout_ms;
	cm->down_mode = cfg->cluster.on_redis_down;
	/* A shorter heartbeat applies now, not after the old one elapsed. */
	hb = mono() + (double)cm->hb_ms / 1000.0;
	if (cm->next_hb > hb)
		cm->next_hb = hb;
}

struct sl_cluster_m *
sl_cluster_master_new(const struct sl_config *cfg, struct sl_cluster_shm *cs,
    sl_cl_name_fn *name_of, void *arg)
{
	struct sl_cluster_m *cm;

	if ((cm = calloc(1, sizeof(*cm))) == NULL)
		return NULL;
	cm->cs = cs;
	cm->name_of = name_of;
	cm->name_arg = arg;
	cm->node = strdup(cfg->cluster.node);
	cm->redis = strdup(cfg->cluster.redis);
	cm->password = cfg->cluster.password ? strdup(cfg->cluster.password) : NULL;
	if (cm->node == NULL || cm->redis == NULL ||
	    (cfg->cluster.password != NULL && cm->password == NULL)) {
		sl_cluster_master_free(cm);
		return NULL;
	}
	addr_parse(cm->redis, &cm->addr);
	cm_conf(cm, cfg);
	cm->backoff = BACKOFF_MIN;
	return cm;
}

void
sl_cluster_master_reconf(struct sl_cluster_m *cm, const struct sl_config *cfg)
{
	if (cm != NULL)
		cm_conf(cm, cfg);
}

void
sl_cluster_master_free(struct sl_cluster_m *cm)
{
	if (cm == NULL)
		return;
	if (cm->ac != NULL) {
		redisAsyncContext *ac = cm->ac;

		if (cm->connected) {
			/* Leaving cleanly: other nodes' shares grow at once. */
			redisAsyncCommand(ac, NULL, NULL, "ZREM %s %s", NODES_KEY,
			    cm->node);
			redisAsyncHandleWrite(ac);
		}
		cm->ac = NULL;
		redisAsyncFree(ac);
	}
	round_free(cm);
	free(cm->node);
	free(cm->redis);
	free(cm->password);
	free(cm);
}

void
sl_cluster_master_close_in_child(struct sl_cluster_m *cm)
{
	if (cm != NULL && cm->ac != NULL && cm->ac->c.fd >= 0)
		close(cm->ac->c.fd);
}

void
sl_cluster_master_start(struct sl_cluster_m *cm)
{
	struct timeval tv;
	redisContext *c;
	redisReply *r;
	char ttl[24];
	double t = (double)cm->timeout_ms / 1000.0;

	if (t < 0.5)
		t = 0.5;   /* a cold connection, once, at start */
	tv.tv_sec = (time_t)t;
	tv.tv_usec = (suseconds_t)((t - (double)tv.tv_sec) * 1e6);
	if (cm->addr.path != NULL)
		c = redisConnectUnixWithTimeout(cm->addr.path, tv);
	else
		c = redisConnectWithTimeout(cm->addr.host, cm->addr.port, tv);
	if (c == NULL || c->err) {
		row_err(cm->cs, 0, ERR_CONNECT);
		sl_warn("cluster: Redis at %s: %s; starting with on_redis_down: %s",
		    cm->redis, c ? c->errstr : "out of memory",
		    sl_redis_down_name(cm->down_mode));
		goto out;
	}
	redisSetTimeout(c, tv);
	if (cm->password != NULL) {
		r = redisCommand(c, "AUTH %s", cm->password);
		if (reply_is_error(r)) {
			row_err(cm->cs, 0, ERR_REPLY);
			log_refusal(SL_LOG_ERROR, "AUTH refused", r ? r->str : c->errstr);
			freeReplyObject(r);
			goto out;
		}
		freeReplyObject(r);
	}
	snprintf(ttl, sizeof(ttl), "%" PRIu64, cm->ttl_ms);
	r = redisCommand(c, "EVAL %s 1 %s %s %s 0 1", register_lua, NODES_KEY,
	    cm->node, ttl);
	if (register_reply(cm, r) == -1) {
		row_err(cm->cs, 0, r == NULL ? ERR_TIMEOUT : ERR_REPLY);
		sl_warn("cluster: registering node %s at %s failed: %s; starting "
		    "with on_redis_down: %s", cm->node, cm->redis,
		    r ? (r->type == REDIS_REPLY_ERROR ? r->str : "bad reply") :
		    c->errstr, sl_redis_down_name(cm->down_mode));
		freeReplyObject(r);
		goto out;
	}
	freeReplyObject(r);
	cm->last_ack = mono();
	cm->ack_ttl_ms = cm->ttl_ms;
	cm->ack_hb_ms = cm->hb_ms;
	cm->ever_acked = 1;
	cm->next_hb = cm->last_ack + (double)cm->hb_ms / 1000.0;
	sl_info("cluster: node %s registered at %s; %d live node(s)", cm->node,
	    cm->redis, (int)cm->live_seen);
	cm_publish_fence(cm);
	atomic_store(&cm->cs->mode, MODE_REDIS);
out:
	if (c != NULL)
		redisFree(c);
	cm->connect_at = 0;   /* the async connection, at the first turn */
}

static void
cm_register_cb(redisAsyncContext *ac, void *r, void *priv)
{
	(void)ac;
	(void)register_reply(priv, r);
}

static int
rcell_cmp(const void *a, const void *b)
{
	const struct rcell *x = a, *y = b;

	if (x->tslot != y->tslot)
		return x->tslot < y->tslot ? -1 : 1;
	return 0;
}

static void cm_round_cb(redisAsyncContext *, void *, void *);
static void cm_count_cb(redisAsyncContext *, void *, void *);

/*
 * Remember a call of the round (v NULL: the registration), so that its
 * answer, which comes in the order sent, can be told apart: an error for
 * one tenant's key is that tenant's, not a missing heartbeat.
 */
static void
round_call(struct sl_cluster_m *cm, struct rcell *v, size_t n)
{
	struct rcall *nc;

	if ((nc = realloc(cm->calls, (cm->ncalls + 1) * sizeof(*nc))) == NULL) {
		cm->round_failed = 1;   /* cannot tell the answers apart */
		return;
	}
	cm->calls = nc;
	nc[cm->ncalls].v = v;
	nc[cm->ncalls].n = n;
	cm->ncalls++;
}

struct rvec {
	struct rcell *v;
	size_t n, cap;
};

static void
rvec_push(struct rvec *a, uint32_t tslot, size_t row, size_t i, uint64_t w)
{
	struct rcell *nv;

	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 64;

		if ((nv = realloc(a->v, cap * sizeof(*nv))) == NULL)
			return;   /* renewed next round, or expires */
		a->v = nv;
		a->cap = cap;
	}
	a->v[a->n].tslot = tslot;
	a->v[a->n].row = (uint32_t)row;
	a->v[a->n].i = (uint32_t)i;
	a->v[a->n].word = w;
	a->v[a->n].failed = 0;
	a->n++;
}

/*
 * The cells whose leases this round renews (xx: ZADD XX, never bringing
 * back a lease released a moment ago) or adds (add: ZADD). Normally every
 * lease Redis holds or is about to hold is renewed, and streams admitted
 * without Redis (a worker whose connection was down, a late answer) are
 * added, so other nodes count them too. After Redis was lost (readd),
 * every lease that Redis held is added again as well.
 */
static void
collect(struct sl_cluster_m *cm, int readd, struct rvec *xx, struct rvec *add)
{
	struct sl_cluster_shm *cs = cm->cs;
	size_t r, i, hwm;
	uint64_t w;
	unsigned st;

	for (r = 1; r < cs->rows; r++) {
		hwm = atomic_load_explicit(&cs->row[r].hwm, memory_order_acquire);
		for (i = 0; i < hwm && i < cs->cells; i++) {
			struct cell *c = cell_at(cs, r, i);
			uint32_t t;

			w = atomic_load_explicit(&c->word, memory_order_acquire);
			st = CELL_STATE(w);
			if (st == CELL_FREE)
				continue;
			t = atomic_load_explicit(&c->tslot, memory_order_relaxed);
			if (st == CELL_LOCAL || (st == CELL_HELD && readd))
				rvec_push(add, t, r, i, w);
			else
				rvec_push(xx, t, r, i, w);
		}
	}
	if (xx->n > 1)
		qsort(xx->v, xx->n, sizeof(*xx->v), rcell_cmp);
	if (add->n > 1)
		qsort(add->v, add->n, sizeof(*add->v), rcell_cmp);
}

/*
 * One call per tenant and chunk of members: mode NULL sends ZREM (leases
 * given back), else the renew script with "XX" or "ADD". Returns the
 * number of calls sent.
 */
static int
send_grouped(struct sl_cluster_m *cm, struct rcell *v, size_t n,
    const char *mode, redisCallbackFn *cb)
{
	const char **argv;
	size_t *argl, a, j, k, m;
	char *members;
	char key[320], ttl[24];
	const char *name;
	int sent = 0;

	argv = malloc((RENEW_CHUNK + 6) * sizeof(*argv));
	argl = malloc((RENEW_CHUNK + 6) * sizeof(*argl));
	members = malloc((size_t)RENEW_CHUNK * MEMBER_MAX);
	if (argv == NULL || argl == NULL || members == NULL)
		goto out;
	snprintf(ttl, sizeof(ttl), "%" PRIu64, cm->ttl_ms);
	for (j = 0; j < n; j = k) {
		for (k = j; k < n && v[k].tslot == v[j].tslot &&
		    k - j < RENEW_CHUNK; k++)
			;
		if ((name = cm->name_of(cm->name_arg, v[j].tslot)) == NULL)
			continue;
		snprintf(key, sizeof(key), "sluice:{%s}:leases", name);
		a = 0;
		if (mode == NULL) {
			argv[a++] = "ZREM";
			argv[a++] = key;
		} else {
			argv[a++] = "EVAL";
			argv[a++] = renew_lua;
			argv[a++] = "1";
			argv[a++] = key;
			argv[a++] = mode;
			argv[a++] = ttl;
		}
		for (m = j; m < k; m++) {
			char *dst = members + (m - j) * MEMBER_MAX;

			member_fmt(dst, MEMBER_MAX, cm->node, cm->cs->epoch, v[m].row,
			    v[m].i, CELL_GEN(v[m].word));
			argv[a++] = dst;
		}
		for (m = 0; m < a; m++)
			argl[m] = strlen(argv[m]);
		if (redisAsyncCommandArgv(cm->ac, cb, cm, (int)a, argv, argl) !=
		    REDIS_OK)
			continue;
		sent++;
		if (cb == cm_round_cb)
			round_call(cm, &v[j], k - j);
	}
out:
	free(argv);
	free(argl);
	free(members);
	return sent;
}

/*
 * A held lease that Redis could not renew or add, or no longer has: held
 * no more. Returns 1 when the stream is still in flight (not released in
 * the meantime): a later round adds its lease again. Only a lease held
 * when the round was sent: one whose acquire was still on its way was
 * rightly missing then.
 */
static int
cell_unheld(struct sl_cluster_m *cm, const struct rcell *rc)
{
	struct cell *c = cell_at(cm->cs, rc->row, rc->i);
	uint64_t w = CELL_WORD(CELL_GEN(rc->word), CELL_HELD);

	if (CELL_STATE(rc->word) != CELL_HELD)
		return 0;

	return atomic_compare_exchange_strong(&c->word, &w,
	    CELL_WORD(CELL_GEN(rc->word), CELL_LOCAL));
}

static void
cm_round_done(struct sl_cluster_m *cm)
{
	size_t j, lost;

	if (cm->round_failed) {
		round_free(cm);
		return;
	}
	/*
	 * Streams in flight whose lease Redis does not hold: their tenant's
	 * call answered an error (its key holds another type), or the renewal
	 * found the lease gone although the stream was not released (evicted,
	 * flushed, the key deleted). They count as admitted without Redis, so
	 * the next round adds their leases again (once the key is usable);
	 * until then the other nodes do not see them.
	 */
	lost = 0;
	for (j = 0; j < cm->nrx; j++)
		if (cm->rx[j].failed)
			lost += (size_t)cell_unheld(cm, &cm->rx[j]);
	for (j = 0; j < cm->nrc; j++)
		if (cm->rc[j].failed)
			lost += (size_t)cell_unheld(cm, &cm->rc[j]);
	if (lost > 0)
		sl_warn("cluster: Redis does not hold %zu lease(s) of streams in "
		    "flight (evicted, flushed or a key of another type); adding "
		    "them again", lost);
	cm->last_ack = cm->round_t0;
	cm->ack_ttl_ms = cm->round_ttl_ms;
	cm->ack_hb_ms = cm->round_hb_ms;
	cm->ever_acked = 1;
	cm_publish_fence(cm);
	/*
	 * Added: a stream admitted without Redis is held now. A stream that
	 * ended while its lease was being added released it before the add
	 * ran (its worker's ZREM, on another connection): remove it again,
	 * or it would hold a slot until it expires.
	 */
	{
		struct rcell *gone = NULL, *ng;
		size_t ngone = 0;

		for (j = 0; j < cm->nrc; j++) {
			struct cell *c = cell_at(cm->cs, cm->rc[j].row, cm->rc[j].i);
			uint64_t w = cm->rc[j].word, cur;

			if (cm->rc[j].failed)
				continue;
			if (CELL_STATE(w) == CELL_LOCAL &&
			    atomic_compare_exchange_strong(&c->word, &w,
			    CELL_WORD(CELL_GEN(w), CELL_HELD)))
				continue;
			cur = atomic_load(&c->word);
			if (CELL_GEN(cur) == CELL_GEN(cm->rc[j].word) &&
			    CELL_STATE(cur) != CELL_FREE)
				continue;   /* still the same stream */
			if ((ng = realloc(gone, (ngone + 1) * sizeof(*ng))) == NULL)
				continue;
			gone = ng;
			gone[ngone++] = cm->rc[j];
		}
		if (ngone > 0 && cm->ac != NULL)
			send_grouped(cm, gone, ngone, NULL, cm_count_cb);
		free(gone);
	}
	if (cm->round_readd && cm->reg_exp != 0) {
		if (cm->nrc > 0)
			sl_info("cluster: re-added %zu lease(s) of streams in flight",
			    cm->nrc);
		/*
		 * Every node registers after re-adding its leases: once as
		 * many nodes as before the loss are registered, the sets hold
		 * their leases again, and an admission counted against them is
		 * exact. A node gone meanwhile: its leases expired by the end
		 * of the floor.
		 */
		cm_publish_live(cm);
		if (!cm->floor_on || cm->live_seen >= cm->floor_live)
			cm_set_mode(cm, MODE_REDIS, NULL);
		else if (!cm->waiting_logged) {
			cm->waiting_logged = 1;
			sl_info("cluster: Redis answers again; %d of the %d node(s) "
			    "live before are registered: admitting by on_redis_down "
			    "until the others have re-added their leases (at most "
			    "lease_ttl)", (int)cm->live_seen, (int)cm->floor_live);
		}
	}
	round_free(cm);
}

static void
cm_round_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cluster_m *cm = priv;
	redisReply *reply = r;
	struct rcall *call;

	(void)ac;
	if (cm->round_out <= 0)
		return;   /* a round abandoned with its connection */
	call = cm->call_next < cm->ncalls ? &cm->calls[cm->call_next++] : NULL;
	if (reply != NULL && reply->type == REDIS_REPLY_ARRAY && call != NULL &&
	    call->v != NULL) {
		size_t j;

		/* Members the renewal found missing. */
		for (j = 0; j < reply->elements; j++)
			if (reply->element[j]->type == REDIS_REPLY_INTEGER &&
			    reply->element[j]->integer >= 1 &&
			    (size_t)reply->element[j]->integer <= call->n)
				call->v[reply->element[j]->integer - 1].failed = 1;
	}
	if (reply_is_error(reply)) {
		if (reply != NULL && call != NULL && call->v != NULL) {
			size_t j;

			/* One tenant's key: its streams, not the heartbeat. */
			for (j = 0; j < call->n; j++)
				call->v[j].failed = 1;
		} else
			cm->round_failed = 1;
		if (reply != NULL) {
			row_err(cm->cs, 0, ERR_REPLY);
			log_refusal(SL_LOG_WARN, "heartbeat", reply->str);
		}
	}
	if (--cm->round_out == 0)
		cm_round_done(cm);
}

static void
cm_round_register_cb(redisAsyncContext *ac, void *r, void *priv)
{
	cm_register_cb(ac, r, priv);
	cm_round_cb(ac, r, priv);
}

/* Register the node and renew (or re-add) every lease it holds. */
static void
cm_round(struct sl_cluster_m *cm, double now)
{
	const char *argv[8];
	size_t argl[8], i;
	char ttl[24], mine[24];
	struct rvec xx = { NULL, 0, 0 }, add = { NULL, 0, 0 };
	int readd = atomic_load(&cm->cs->mode) != MODE_REDIS;

	cm->round_t0 = now;
	cm->round_ttl_ms = cm->ttl_ms;
	cm->round_hb_ms = cm->hb_ms;
	cm->round_failed = 0;
	cm->round_readd = readd;
	cm->round_unknown = atomic_load(&cm->cs->unknown);
	cm->round_out = 0;
	round_free(cm);
	snprintf(ttl, sizeof(ttl), "%" PRIu64, cm->ttl_ms);
	snprintf(mine, sizeof(mine), "%lld", readd ? 0LL : cm->reg_exp);
	/* An answer lost on the way must not look like another node's. */
	cm->reg_exp = 0;
	collect(cm, readd, &xx, &add);
	/* Kept until the round is answered: its calls point into them. */
	cm->rx = xx.v;
	cm->nrx = xx.n;
	cm->rc = add.v;
	cm->nrc = add.n;
	cm->round_out += send_grouped(cm, xx.v, xx.n, "XX", cm_round_cb);
	cm->round_out += send_grouped(cm, add.v, add.n, "ADD", cm_round_cb);
	/*
	 * The registration last: Redis runs one connection's commands in
	 * order, so another node that sees this one registered after a loss
	 * sees its leases re-added too.
	 */
	argv[0] = "EVAL";
	argv[1] = register_lua;
	argv[2] = "1";
	argv[3] = NODES_KEY;
	argv[4] = cm->node;
	argv[5] = ttl;
	argv[6] = mine;
	argv[7] = readd ? "1" : "0";
	for (i = 0; i < 8; i++)
		argl[i] = strlen(argv[i]);
	if (redisAsyncCommandArgv(cm->ac, cm_round_register_cb, cm, 8, argv,
	    argl) != REDIS_OK) {
		cm->round_failed = 1;   /* no heartbeat without it */
		if (cm->round_out == 0)
			round_free(cm);
		return;
	}
	cm->round_out++;
	round_call(cm, NULL, 0);
}

int
sl_cluster_master_pollfds(struct sl_cluster_m *cm, struct pollfd *pfd, int max)
{
	if (cm == NULL || cm->ac == NULL || max < 1 || cm->ac->c.fd < 0)
		return 0;
	pfd[0].fd = cm->ac->c.fd;
	pfd[0].events = (short)((cm->want_read ? POLLIN : 0) |
	    (cm->want_write ? POLLOUT : 0));
	pfd[0].revents = 0;
	return 1;
}

/*
 * When to stop trusting the leases: lease_ttl - 2 x heartbeat after the
 * last acknowledged renew was sent (Redis expires it no earlier than
 * lease_ttl after that), plus half a heartbeat for the round trip of the
 * next renew: at lease_ttl = 3 x heartbeat the next renew is only sent at
 * the deadline itself. Still 1.5 heartbeats before the leases expire.
 * The timing is that renew's own: a reload must not move the deadline of
 * leases Redis already holds.
 */
static double
fence_at(const struct sl_cluster_m *cm)
{
	double grace = (double)cm->ack_hb_ms / 2000.0;

	return cm->last_ack + (double)(cm->ack_ttl_ms - 2 * cm->ack_hb_ms) /
	    1000.0 + grace;
}

/* For the workers' own check (cw_stale): before the mode says "redis". */
static void
cm_publish_fence(struct sl_cluster_m *cm)
{
	atomic_store_explicit(&cm->cs->fence_ns, (int64_t)(fence_at(cm) * 1e9),
	    memory_order_release);
}

double
sl_cluster_master_timeout(struct sl_cluster_m *cm, double now)
{
	double t = -1, d;

	if (cm == NULL)
		return -1;
	now = mono();
#define EARLIER(x) do { d = (x) - now; if (d < 0) d = 0; \
	if (t < 0 || d < t) t = d; } while (0)
	if (cm->ac == NULL)
		EARLIER(cm->connect_at);
	else if (!cm->connected)
		EARLIER(cm->connect_deadline);
	else if (cm->round_out == 0)
		EARLIER(cm->next_hb);
	else
		EARLIER(cm->round_t0 + (double)cm->ttl_ms / 1000.0);
	if (atomic_load(&cm->cs->mode) == MODE_REDIS)
		EARLIER(fence_at(cm));
#undef EARLIER
	return t;
}

void
sl_cluster_master_service(struct sl_cluster_m *cm, const struct pollfd *pfd,
    int n, double now)
{
	if (cm == NULL)
		return;
	(void)now;
	now = mono();
	if (n > 0 && cm->ac != NULL && pfd[0].fd == cm->ac->c.fd) {
		if (pfd[0].revents & (POLLIN | POLLERR | POLLHUP))
			redisAsyncHandleRead(cm->ac);
		if (cm->ac != NULL && (pfd[0].revents & (POLLOUT | POLLERR)))
			redisAsyncHandleWrite(cm->ac);
	}
	if (cm->ac == NULL && now >= cm->connect_at)
		cm_connect(cm);
	if (cm->ac != NULL && !cm->connected && now >= cm->connect_deadline) {
		row_err(cm->cs, 0, ERR_CONNECT);
		cm_drop(cm, "connecting to Redis timed out");
	}
	if (cm->ac != NULL && cm->connected) {
		if (cm->round_out > 0 &&
		    now - cm->round_t0 > (double)cm->ttl_ms / 1000.0) {
			row_err(cm->cs, 0, ERR_TIMEOUT);
			cm_drop(cm, "Redis stopped answering the heartbeat");
		} else if (cm->round_out == 0 && now >= cm->next_hb) {
			cm->next_hb = now + (double)cm->hb_ms / 1000.0;
			cm_round(cm, now);
		}
	}
	/* Self-fencing: stop trusting leases before Redis expires them. */
	if (atomic_load(&cm->cs->mode) == MODE_REDIS && now >= fence_at(cm)) {
		row_err(cm->cs, 0, ERR_FENCED);
		cm_set_mode(cm, MODE_DOWN,
		    "no acknowledged heartbeat within lease_ttl - 2 x heartbeat");
	}
}

/* Fold a dead worker's counters into row 0, like sl_shm_retire_stats. */
static void
fold_row(struct sl_cluster_shm *cs, size_t row)
{
	struct row *from = &cs->row[row], *to = &cs->row[0];
	int k;

	for (k = 0; k < ERR_MAX; k++) {
		atomic_fetch_add(&to->errors[k], atomic_load(&from->errors[k]));
		atomic_store(&from->errors[k], 0);
	}
	for (k = 0; k <= RTT_BUCKETS; k++) {
		atomic_fetch_add(&to->rtt[k], atomic_load(&from->rtt[k]));
		atomic_store(&from->rtt[k], 0);
	}
	atomic_fetch_add(&to->rtt_sum_ns, atomic_load(&from->rtt_sum_ns));
	atomic_store(&from->rtt_sum_ns, 0);
}

static void
cm_count_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cluster_m *cm = priv;

	(void)ac;
	if (r != NULL && reply_is_error(r))
		row_err(cm->cs, 0, ERR_REPLY);
}

void
sl_cluster_master_reclaim_row(struct sl_cluster_m *cm, size_t row)
{
	struct sl_cluster_shm *cs;
	struct rcell *v = NULL, *nv;
	size_t n = 0, cap = 0, i, hwm;
	uint64_t w;

	if (cm == NULL || row == 0 || row >= cm->cs->rows)
		return;
	cs = cm->cs;
	hwm = atomic_load(&cs->row[row].hwm);
	for (i = 0; i < hwm && i < cs->cells; i++) {
		struct cell *c = cell_at(cs, row, i);

		w = atomic_load(&c->word);
		if (CELL_STATE(w) == CELL_FREE)
			continue;
		atomic_store(&c->word, CELL_WORD(CELL_GEN(w), CELL_FREE));
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			if ((nv = realloc(v, cap * sizeof(*v))) == NULL)
				continue;   /* that lease expires by itself */
			v = nv;
		}
		v[n].tslot = atomic_load(&c->tslot);
		v[n].row = (uint32_t)row;
		v[n].i = (uint32_t)i;
		v[n].word = w;
		n++;
	}
	atomic_store(&cs->row[row].hwm, 0);
	row_state(cs, row, ROW_UNUSED);
	fold_row(cs, row);
	if (n > 0) {
		if (n > 1)
			qsort(v, n, sizeof(*v), rcell_cmp);
		if (cm->ac != NULL && cm->connected) {
			send_grouped(cm, v, n, NULL, cm_count_cb);
			sl_info("cluster: removed %zu lease(s) of a dead worker", n);
		} else
			sl_warn("cluster: %zu lease(s) of a dead worker expire "
			    "within lease_ttl (Redis unreachable)", n);
	}
	free(v);
}

void
sl_cluster_master_row_started(struct sl_cluster_m *cm, size_t row, int started)
{
	if (cm != NULL && row > 0 && row < cm->cs->rows)
		row_state(cm->cs, row, started ? ROW_STARTING : ROW_UNUSED);
}

/*
 * "redis" only while every worker of the node admits through Redis: a
 * worker whose own connection is not back yet admits by on_redis_down.
 */
const char *
sl_cluster_mode(const struct sl_cluster_m *cm)
{
	const struct sl_cluster_shm *cs = cm->cs;
	size_t r;

	if (atomic_load(&cs->mode) != MODE_REDIS ||
	    atomic_load(&((struct sl_cluster_shm *)cs)->unknown) != 0)
		return sl_redis_down_name(cm->down_mode);
	for (r = 1; r < cs->rows; r++)
		if (atomic_load_explicit(&((struct sl_cluster_shm *)cs)->row[r].state,
		    memory_order_acquire) == ROW_CONNECTING)
			return sl_redis_down_name(cm->down_mode);
	return "redis";
}

static uint64_t
leases_held(const struct sl_cluster_shm *cs)
{
	uint64_t n = 0;
	size_t r, i, hwm;

	for (r = 1; r < cs->rows; r++) {
		hwm = atomic_load(&cs->row[r].hwm);
		for (i = 0; i < hwm && i < cs->cells; i++)
			if (CELL_STATE(atomic_load(&cell_at((struct sl_cluster_shm *)cs,
			    r, i)->word)) != CELL_FREE)
				n++;
	}
	return n;
}

int
sl_cluster_nodes(const struct sl_cluster_m *cm)
{
	return (int)atomic_load(&cm->cs->live_nodes);
}

uint64_t
sl_cluster_leases(const struct sl_cluster_m *cm)
{
	return leases_held(cm->cs);
}

void
sl_cluster_render(struct sl_cluster_m *cm, struct sl_str *o)
{
	static const char *const modes[] = {
		"redis", "local_share", "closed", "local_full"
	};
	struct sl_cluster_shm *cs = cm->cs;
	const char *cur = sl_cluster_mode(cm);
	uint64_t b[RTT_BUCKETS + 1], sum = 0, cum = 0, e;
	size_t r;
	int k;

	sl_str_printf(o, "# HELP sluice_cluster_up 1 while this node and every "
	    "worker of it admit through Redis leases, 0 in its on_redis_down "
	    "mode.\n"
	    "# TYPE sluice_cluster_up gauge\nsluice_cluster_up %d\n",
	    strcmp(cur, "redis") == 0);
	sl_str_printf(o, "# HELP sluice_cluster_mode How this node admits: 1 "
	    "for the current mode.\n# TYPE sluice_cluster_mode gauge\n");
	for (k = 0; k < 4; k++)
		sl_str_printf(o, "sluice_cluster_mode{mode=\"%s\"} %d\n", modes[k],
		    strcmp(cur, modes[k]) == 0);
	sl_str_printf(o, "# HELP sluice_cluster_nodes Live nodes last seen in "
	    "Redis.\n# TYPE sluice_cluster_nodes gauge\nsluice_cluster_nodes %d\n",
	    sl_cluster_nodes(cm));
	sl_str_printf(o, "# HELP sluice_cluster_leases Leases this node holds "
	    "for its streams in flight.\n# TYPE sluice_cluster_leases gauge\n"
	    "sluice_cluster_leases %" PRIu64 "\n", sl_cluster_leases(cm));
	memset(b, 0, sizeof(b));
	for (r = 0; r < cs->rows; r++) {
		for (k = 0; k <= RTT_BUCKETS; k++)
			b[k] += atomic_load_explicit(&cs->row[r].rtt[k],
			    memory_order_relaxed);
		sum += atomic_load_explicit(&cs->row[r].rtt_sum_ns,
		    memory_order_relaxed);
	}
	sl_str_printf(o, "# HELP sluice_cluster_rtt_seconds Round trip of an "
	    "admission to Redis.\n# TYPE sluice_cluster_rtt_seconds histogram\n");
	for (k = 0; k < RTT_BUCKETS; k++) {
		cum += b[k];
		sl_str_printf(o, "sluice_cluster_rtt_seconds_bucket{le=\"%g\"} %"
		    PRIu64 "\n", rtt_bounds[k], cum);
	}
	cum += b[RTT_BUCKETS];
	sl_str_printf(o, "sluice_cluster_rtt_seconds_bucket{le=\"+Inf\"} %" PRIu64
	    "\nsluice_cluster_rtt_seconds_sum %.6f\n"
	    "sluice_cluster_rtt_seconds_count %" PRIu64 "\n", cum,
	    (double)sum / 1e9, cum);
	sl_str_printf(o, "# HELP sluice_cluster_errors_total Failures talking "
	    "to Redis, by kind.\n# TYPE sluice_cluster_errors_total counter\n");
	for (k = 0; k < ERR_MAX; k++) {
		e = 0;
		for (r = 0; r < cs->rows; r++)
			e += atomic_load_explicit(&cs->row[r].errors[k],
			    memory_order_relaxed);
		sl_str_printf(o, "sluice_cluster_errors_total{kind=\"%s\"} %" PRIu64
		    "\n", err_names[k], e);
	}
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The worker side of cluster admission (sl_cluster.h, cluster_int.h):
 * a lease asked for each admitted stream and released at its end, the
 * tokens charged to the tenant's window, and the verdict a request gets
 * (at once, or through its callback). Its Redis connection is a
 * cl_redis on the worker's libev loop.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster_int.h"

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

/* ---- the worker and its connection ------------------------------------ */

#define MAX_PENDING 4096         /* acquires waiting for Redis at once */
#define TIMEOUTS_TO_RECONNECT 8  /* in a row, with no reply between */

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

	struct cl_redis rd;      /* the worker's own connection */
	/*
	 * With cluster.sentinels: the address the master published that this
	 * connection goes to (addr_seq its sequence number), checked every
	 * `follow` tick; doubt: Redis answered READONLY or LOADING.
	 */
	int sentinels;
	char addr[80];
	uint32_t addr_seq;
	ev_timer follow;
	int doubt;
	int in_cb;               /* inside a hiredis callback */
	char sha[41];            /* the acquire script, once loaded */
	char csha[41];           /* the charge script, once loaded */
	ev_timer retry;          /* reconnect, or the connect deadline */
	ev_prepare flush;        /* commands queued this turn go out at its end */
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

/* Still the address the master publishes (always, without sentinels). */
static int
cw_current(const struct sl_cluster_w *cw)
{
	return !cw->sentinels || atomic_load_explicit(&cw->cs->addr_seq,
	    memory_order_acquire) == cw->addr_seq;
}

/*
 * Redis said it is not the master (READONLY, LOADING): the master asks
 * the sentinels again, and this worker drops the connection from its
 * follow tick (not inside hiredis's callback).
 */
static void
cw_doubt(struct sl_cluster_w *cw)
{
	if (!cw->sentinels)
		return;
	atomic_store(&cw->cs->reask, 1);
	cw->doubt = 1;
}

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
	if (cw->rd.ac != NULL && cw->rd.connected)
		redisAsyncHandleWrite(cw->rd.ac);
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
	double d = cl_redis_backoff_next(&cw->rd);

	/* Jitter, so the workers of every node do not come back at once. */
	d *= 0.75 + 0.5 * ((double)(rand() % 1000) / 1000.0);
	ev_timer_stop(cw->loop, &cw->retry);
	ev_timer_set(&cw->retry, d, 0.0);
	ev_timer_start(cw->loop, &cw->retry);
}

static void
cw_up(struct cl_redis *rd)
{
	struct sl_cluster_w *cw = rd->owner;

	/*
	 * Connected: the connect deadline is over. The backoff is reset by
	 * the first answer (cw_sha_cb).
	 */
	ev_timer_stop(cw->loop, &cw->retry);
}

/* The connection is gone (pending acquires got their NULL reply): retry. */
static void
cw_gone(struct cl_redis *rd, enum cl_gone how, const char *why)
{
	struct sl_cluster_w *cw = rd->owner;

	if (how == CL_GONE_FAILED)
		sl_debug("cluster: connect failed: %s", why);
	else if (how == CL_GONE_LOST && why != NULL)
		sl_warn("cluster: Redis connection lost: %s", why);
	else if (how == CL_GONE_DROPPED && why != NULL)
		sl_warn("cluster: dropping the Redis connection: %s", why);
	else if (how == CL_GONE_REFUSED && why != NULL)
		sl_warn("cluster: Redis refused: %s", why);
	/* A failure, a refusal, a ROLE of replica: maybe a failover. */
	if (cw->sentinels && how != CL_GONE_DROPPED)
		atomic_store(&cw->cs->reask, 1);
	cw->sha[0] = cw->csha[0] = '\0';
	cl_row_state(cw->cs, cw->row, ROW_CONNECTING);
	cw_schedule(cw);
}

static const struct cl_redis_hooks cw_hooks = { cw_up, cw_gone };

static void
cw_sha_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cluster_w *cw = priv;
	redisReply *reply = r;

	if (reply == NULL || ac != cw->rd.ac)
		return;
	/* Behind AUTH on the connection: Redis took us, back off less. */
	cl_redis_answered(&cw->rd);
	cl_redis_take_sha(reply, cw->sha);
	/* Answered (the acquire falls back to EVAL without the sha). */
	if (reply->type != REDIS_REPLY_ERROR) {
		void (*cb)(void *) = cw->ready_cb;

		cl_row_state(cw->cs, cw->row, ROW_READY);
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
		cl_row_state(cw->cs, cw->row, ROW_CONNECTING);
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
		cl_row_state(cw->cs, cw->row, ROW_CONNECTING);
}

static void
cw_csha_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct sl_cluster_w *cw = priv;
	redisReply *reply = r;

	if (reply == NULL || ac != cw->rd.ac)
		return;
	cl_redis_take_sha(reply, cw->csha);
}

static void
cw_retry_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_cluster_w *cw = t->data;

	(void)loop;
	(void)revents;
	if (cw->rd.ac != NULL && !cw->rd.connected) {
		/* The connect deadline passed. */
		cl_row_err(cw->cs, cw->row, ERR_CONNECT);
		cl_redis_drop(&cw->rd, "connect timed out");
		return;
	}
	if (cw->rd.ac == NULL)
		cw_connect(cw);
}

/*
 * With sentinels, every tick: the master published another address (a
 * failover), or Redis cast doubt: leave this connection, take the new one.
 */
static void
cw_follow_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_cluster_w *cw = t->data;

	(void)revents;
	if (cw_current(cw) && !cw->doubt)
		return;
	cw->doubt = 0;
	if (cw->rd.ac != NULL)
		cl_redis_drop(&cw->rd, cw_current(cw) ? "Redis answers READONLY "
		    "or LOADING: not the master now" : "the Redis master moved");
	if (!cw_current(cw)) {
		/* Straight to the new address, not after the backoff. */
		cl_redis_answered(&cw->rd);
		ev_timer_stop(loop, &cw->retry);
		cw_connect(cw);
	}
}

static void
cw_connect(struct sl_cluster_w *cw)
{
	cw->connect_tried = ev_time();
	if (cw->sentinels) {
		cw->addr_seq = cl_addr_read(cw->cs, cw->addr);
		if (cw->addr[0] == '\0') {
			/* The master knows none yet: its publication brings us. */
			cw_schedule(cw);
			return;
		}
		cl_redis_set_addr(&cw->rd, cw->addr);
	}
	if (cl_redis_open(&cw->rd) == -1) {
		cw_schedule(cw);
		return;
	}
	/* Behind the greeting; hiredis sends them in order. */
	cl_redis_load(&cw->rd, acquire_lua, sizeof(acquire_lua) - 1, cw_sha_cb,
	    cw);
	cl_redis_load(&cw->rd, charge_lua, sizeof(charge_lua) - 1, cw_csha_cb,
	    cw);
	ev_timer_stop(cw->loop, &cw->retry);
	ev_timer_set(&cw->retry,
	    cl_redis_connect_limit(cw->cfg->cluster.timeout_ms), 0.0);
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
	cw->sentinels = cfg->cluster.nsentinels > 0;
	cl_redis_init(&cw->rd, cfg->cluster.redis != NULL ? cfg->cluster.redis :
	    "", cfg->cluster.password, cs, row, loop, 0, &cw_hooks, cw);
	cw->rd.check_role = cw->sentinels;
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
		cl_row_state(cs, row, ROW_CONNECTING);
	ev_timer_init(&cw->retry, cw_retry_cb, 0.0, 0.0);
	cw->retry.data = cw;
	ev_prepare_init(&cw->flush, cw_flush_cb);
	cw->flush.data = cw;
	if (cw->sentinels) {
		double tick = (double)cfg->cluster.heartbeat_ms / 4000.0;

		tick = tick > 0.25 ? 0.25 : tick < 0.05 ? 0.05 : tick;
		ev_timer_init(&cw->follow, cw_follow_cb, tick, tick);
		cw->follow.data = cw;
		ev_timer_start(loop, &cw->follow);
	}
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
	if (cw->sentinels)
		ev_timer_stop(cw->loop, &cw->follow);
	/* Release commands still queued go out first, if they can. */
	cl_redis_close(&cw->rd);
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

/* ---- cells: one per admitted stream ----------------------------------- */

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
	c = cl_cell_at(cw->cs, cw->row, i);
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
	struct cell *c = cl_cell_at(cw->cs, cw->row, (size_t)i);
	uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);

	atomic_store_explicit(&c->word, CELL_WORD(CELL_GEN(w), st),
	    memory_order_release);
}

static uint32_t
cell_gen(struct sl_cluster_w *cw, int32_t i)
{
	return CELL_GEN(atomic_load_explicit(&cl_cell_at(cw->cs, cw->row,
	    (size_t)i)->word, memory_order_relaxed));
}

static void
cw_member(struct sl_cluster_w *cw, int32_t i, char *dst)
{
	cl_member_fmt(dst, MEMBER_MAX, cw->cfg->cluster.node, cw->cs->epoch, cw->row,
	    (size_t)i, cell_gen(cw, i));
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

	if (reply != NULL && ac == cw->rd.ac && cl_reply_not_master(reply))
		cw_doubt(cw);
	if (reply != NULL && ac == cw->rd.ac && cl_reply_is_error(reply)) {
		if (!ch->eval && strncmp(reply->str, "NOSCRIPT", 8) == 0) {
			cw->csha[0] = '\0';   /* the next charges are EVALs */
			ch->eval = 1;
			if (send_charge(cw, ch) == 0)
				return;
		}
		cl_row_err(cw->cs, cw->row, ERR_REPLY);
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

	/*
	 * Not on a connection to a master the sentinels replaced: the lease
	 * there is moot, and one the master re-added on the new master
	 * expires within lease_ttl, as it would behind a ZREM sent there.
	 */
	if (zrem && cw->rd.ac != NULL && cw->rd.connected && cw_current(cw)) {
		cw_member(cw, i, member);
		argv[0] = "ZREM";
		argv[1] = cw->keys[cw->cell_tenant[i]];
		argv[2] = member;
		argl[0] = 4;
		argl[1] = strlen(argv[1]);
		argl[2] = strlen(member);
		redisAsyncCommandArgv(cw->rd.ac, cl_redis_count_cb, &cw->rd, 3, argv, argl);
		/* Out now: a client told "done" may be admitted elsewhere next. */
		if (!cw->in_cb && cw->rd.ac != NULL)
			redisAsyncHandleWrite(cw->rd.ac);
		else
			cw_queued(cw);
	}
	cell_set(cw, i, CELL_FREE);
	cw->free[cw->nfree++] = (uint32_t)i;
}

/* ---- verdicts: Redis, on_redis_down, the fence ------------------------ */

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
	int stale = (int64_t)sl_mono_ns() >=
	    atomic_load_explicit(&cw->cs->fence_ns, memory_order_acquire);

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
	    MODE_REDIS && cw->rd.ac != NULL && cw->rd.connected && cw_current(cw) &&
	    (int64_t)sl_mono_ns() < atomic_load_explicit(&cw->cs->fence_ns,
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
	if (cw->rd.ac != NULL || ev_time() - cw->connect_tried < 1.0)
		return;
	ev_timer_stop(cw->loop, &cw->retry);
	cw_connect(cw);
}

/* ---- asking for a lease ----------------------------------------------- */

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
		    CELL_STATE(atomic_load(&cl_cell_at(cw->cs, cw->row,
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
			cl_row_err(cw->cs, cw->row, ERR_TIMEOUT);
			cw->timeouts_in_row++;
		}
		wait_decide(w, fail_verdict(cw, w->tenant));
	}
	if (w->replied)
		wait_free(w);
	else if (cw->timeouts_in_row >= TIMEOUTS_TO_RECONNECT) {
		cw->timeouts_in_row = 0;
		cl_redis_drop(&cw->rd, "Redis stopped answering");
	}
}

static int send_acquire(struct sl_cluster_w *, struct sl_cl_wait *, int eval);

/*
 * The acquire's answer {tokens in the window, seconds until it has room}:
 * refused for the tenant's token window.
 */
static void
acquire_out_of_tokens(struct sl_cluster_w *cw, struct sl_cl_wait *w,
    long long ra)
{
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
}

/*
 * The acquire's answer -1: sluice:nodes does not hold this node. Redis
 * lost its state with the connection up (FLUSHALL) and the master has not
 * noticed yet (within a heartbeat). Nothing was added.
 */
static void
acquire_node_unknown(struct sl_cluster_w *cw, struct sl_cl_wait *w)
{
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
}

/* The acquire's answer 1: Redis holds the lease. */
static void
acquire_held(struct sl_cluster_w *cw, struct sl_cl_wait *w)
{
	if (!w->decided) {
		cell_set(cw, w->cell, CELL_HELD);
		wait_decide(w, SL_CL_ADMIT);
	} else if (w->cb != NULL && cell_gen(cw, w->cell) == w->gen &&
	    CELL_STATE(atomic_load(&cl_cell_at(cw->cs, cw->row,
	    (size_t)w->cell)->word)) == CELL_LOCAL) {
		/* Admitted by on_redis_down after the deadline: now held. */
		cell_set(cw, w->cell, CELL_HELD);
	}
}

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
	cl_row_rtt(cw->cs, cw->row, ev_time() - w->t0);
	if (cl_reply_not_master(reply))
		cw_doubt(cw);
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
		acquire_out_of_tokens(cw, w, reply->element[1]->integer);
	} else if (reply->type != REDIS_REPLY_INTEGER) {
		cl_row_err(cw->cs, cw->row, ERR_REPLY);
		sl_warn("cluster: acquire: unexpected reply: %s",
		    reply->type == REDIS_REPLY_ERROR ? reply->str : "not an integer");
		if (!w->decided)
			wait_decide(w, fail_verdict(cw, w->tenant));
	} else if (reply->integer == -1) {
		acquire_node_unknown(cw, w);
	} else if (reply->integer == 1) {
		acquire_held(cw, w);
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
	if (redisAsyncCommandArgv(cw->rd.ac, acquire_cb, w, 11, argv, argl) !=
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
	if (mode == MODE_REDIS && cw->rd.ac == NULL)
		cw_reconnect_now(cw);
	if ((i = cell_alloc(cw, tenant)) < 0)
		/* Out of cells (or memory): decided here, without a lease. */
		return fail_verdict(cw, tenant);
	if (mode != MODE_REDIS || cw->rd.ac == NULL || !cw->rd.connected ||
	    !cw_current(cw) || cw->npending >= MAX_PENDING || (w = calloc(1, sizeof(*w))) == NULL) {
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

/* ---- giving a lease back ---------------------------------------------- */

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
	c = cl_cell_at(cw->cs, cw->row, (size_t)lease);
	if (CELL_STATE(atomic_load(&c->word)) == CELL_FREE)
		return;
	cell_free(cw, lease, 1);
}

/* ---- token windows and charges ---------------------------------------- */

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

	/* Nor a charge: the old master's window is no one's now. */
	if (cw->rd.ac == NULL || !cw->rd.connected || !cw_current(cw))
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
	if (redisAsyncCommandArgv(cw->rd.ac, cw_charge_cb, ch, 5, argv, argl) !=
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
	    cw->rd.ac == NULL || !cw->rd.connected ||
	    (ch = calloc(1, sizeof(*ch))) == NULL)
		return;
	ch->cw = cw;
	ch->tenant = tenant;
	ch->tokens = tokens;
	if (send_charge(cw, ch) == -1)
		free(ch);
}

/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The master side of cluster admission (sl_cluster.h, cluster_int.h): the
 * node's registration and heartbeat (renewing every lease its workers
 * hold, re-adding them after Redis was lost), self-fencing, the dead
 * worker's leases, the node's mode, and the sluice_cluster_* metrics.
 * Its Redis connection is a cl_redis polled from the master's loop.
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

/* ---- the master and its connection ------------------------------------ */

#define RENEW_CHUNK 256          /* members per renew call */
#define SWITCH_SETTLE_S 60.0     /* s after a +switch-master that an answer
                                    naming the old master is a laggard's */

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
	char redis[80];              /* the master's address; "" none known */
	/*
	 * With cluster.sentinels: who tells where the master is, and the
	 * moments to ask them again.
	 */
	struct cl_sentinel *sent;
	/*
	 * After a +switch-master: the master it switched from, until when an
	 * answer naming it is a lagging sentinel's (the others learn of the
	 * switch a moment later), and whether the next connect may go to the
	 * switch's address without asking.
	 */
	char sw_from[80];
	double sw_until;
	int sw_fresh;
	int not_master;              /* Redis answered READONLY or LOADING */
	double reask_at;             /* a worker's reask is honoured from */
	uint64_t ttl_ms, hb_ms, timeout_ms;
	int down_mode;

	struct cl_redis rd;          /* the master's connection, polled */
	int ever_acked;
	double connect_at;           /* next connect attempt */
	double connect_deadline;

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

	if (cm->floor_on && cm->floor_until > 0 && sl_mono_s() >= cm->floor_until)
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

static void
cm_lost(struct sl_cluster_m *cm, const char *why)
{
	double now = sl_mono_s();

	cm->rd.connected = 0;
	cm->round_out = 0;
	round_free(cm);
	cm->connect_at = now + cl_redis_backoff_next(&cm->rd);
	/*
	 * Redis may come back empty (a restart, a failover): the leases of
	 * the streams this node carries must be re-added before it trusts
	 * Redis again.
	 */
	cm_set_mode(cm, MODE_DOWN, why);
}

static void
cm_up(struct cl_redis *rd)
{
	struct sl_cluster_m *cm = rd->owner;

	/* The backoff is reset by the greeting's answer (cl_redis). */
	cm->next_hb = 0;   /* a round now: re-add, register */
}

static void
cm_gone(struct cl_redis *rd, enum cl_gone how, const char *why)
{
	struct sl_cluster_m *cm = rd->owner;

	switch (how) {
	case CL_GONE_FAILED:
		sl_debug("cluster: master connect failed: %s", why);
		cm_lost(cm, "cannot connect to Redis");
		break;
	case CL_GONE_LOST:
		cm_lost(cm, "lost the Redis connection");
		break;
	default:
		cm_lost(cm, why);
		break;
	}
}

static const struct cl_redis_hooks cm_hooks = { cm_up, cm_gone };

/*
 * The address in use changed to addr, as sentinel `who` said: a
 * failover. Counted and logged once per switch, published to the workers.
 */
static void
cm_follow(struct sl_cluster_m *cm, const char *addr, const char *who,
    const char *how)
{
	if (strcmp(addr, cm->redis) == 0)
		return;
	if (cm->redis[0] != '\0') {
		atomic_fetch_add(&cm->cs->failovers, 1);
		sl_err("cluster: Redis master '%s' switched from %s to %s (sentinel "
		    "%s, %s)", cl_sentinel_name(cm->sent), cm->redis, addr, who,
		    how);
	} else
		sl_info("cluster: Redis master '%s' is %s (sentinel %s)",
		    cl_sentinel_name(cm->sent), addr, who);
	snprintf(cm->redis, sizeof(cm->redis), "%s", addr);
	cl_addr_publish(cm->cs, cm->redis);
}

/*
 * With sentinels: where the master is now (asked before every connect:
 * a failed connection is the first sign of a failover). 0, or -1: none
 * known, the node stays in on_redis_down and asks again after backoff.
 */
/*
 * An answer that names the master a +switch-master switched from, soon
 * after: sentinels that have not heard of the failover yet. Following it
 * would count a failover back, and write to a master the sentinels have
 * just replaced.
 */
static int
cm_stale(struct sl_cluster_m *cm, const char *addr, const char *who)
{
	if (cm->sw_from[0] == '\0' || strcmp(addr, cm->sw_from) != 0 ||
	    sl_mono_s() >= cm->sw_until)
		return 0;
	sl_warn("cluster: sentinel %s still names %s, the master '%s' switched "
	    "from; keeping %s", who, addr, cl_sentinel_name(cm->sent), cm->redis);
	return 1;
}

static int
cm_locate(struct sl_cluster_m *cm)
{
	char addr[80], who[80];

	if (cm->sent == NULL)
		return 0;
	if (cm->sw_fresh) {
		/* A +switch-master named it a moment ago: go there. */
		cm->sw_fresh = 0;
		cl_redis_set_addr(&cm->rd, cm->redis);
		return 0;
	}
	if (cl_sentinel_ask(cm->sent, cm->timeout_ms, addr, sizeof(addr), who,
	    sizeof(who)) == -1)
		return -1;
	if (!cm_stale(cm, addr, who))
		cm_follow(cm, addr, who, "asked");
	cl_redis_set_addr(&cm->rd, cm->redis);
	return 0;
}

static void
cm_connect(struct sl_cluster_m *cm)
{
	cm->not_master = 0;
	if (cm_locate(cm) == -1) {
		cm_lost(cm, "no sentinel names the Redis master");
		return;
	}
	if (cl_redis_open(&cm->rd) == -1) {
		cm_lost(cm, "cannot connect to Redis");
		return;
	}
	cm->connect_deadline = sl_mono_s() + cl_redis_connect_limit(cm->timeout_ms);
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
		cm->floor_until = sl_mono_s() + (double)cm->ttl_ms / 1000.0;
	cm_publish_live(cm);
	cm->reg_exp = r->element[1]->integer;
	if (r->element[2]->integer != 0) {
		now = sl_mono_s();
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
	if (cm->sent != NULL)
		cl_sentinel_reconf(cm->sent, cm->timeout_ms);
	/* A shorter heartbeat applies now, not after the old one elapsed. */
	hb = sl_mono_s() + (double)cm->hb_ms / 1000.0;
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
	if (cfg->cluster.redis != NULL)
		snprintf(cm->redis, sizeof(cm->redis), "%s", cfg->cluster.redis);
	cm->password = cfg->cluster.password ? strdup(cfg->cluster.password) : NULL;
	if (cm->node == NULL ||
	    (cfg->cluster.password != NULL && cm->password == NULL) ||
	    (cfg->cluster.nsentinels > 0 &&
	    (cm->sent = cl_sentinel_new(cfg)) == NULL)) {
		sl_cluster_master_free(cm);
		return NULL;
	}
	cl_redis_init(&cm->rd, cm->redis, cm->password, cs, 0, NULL, 1, &cm_hooks,
	    cm);
	/* What the sentinels name is checked to be a master before use. */
	cm->rd.check_role = cm->sent != NULL;
	cm_conf(cm, cfg);
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
	/* Leaving cleanly: other nodes' shares grow at once. */
	if (cm->rd.ac != NULL && cm->rd.connected)
		redisAsyncCommand(cm->rd.ac, NULL, NULL, "ZREM %s %s", NODES_KEY,
		    cm->node);
	cl_redis_close(&cm->rd);
	cl_sentinel_free(cm->sent);
	round_free(cm);
	free(cm->node);
	free(cm->password);
	free(cm);
}

void
sl_cluster_master_close_in_child(struct sl_cluster_m *cm)
{
	if (cm != NULL && cm->rd.ac != NULL && cm->rd.ac->c.fd >= 0)
		close(cm->rd.ac->c.fd);
	if (cm != NULL)
		cl_sentinel_close_in_child(cm->sent);
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
	c = NULL;
	if (cm_locate(cm) == -1) {
		cl_row_err(cm->cs, 0, ERR_CONNECT);
		sl_warn("cluster: no sentinel names Redis master '%s'; starting "
		    "with on_redis_down: %s", cl_sentinel_name(cm->sent),
		    sl_redis_down_name(cm->down_mode));
		goto out;
	}
	c = cl_redis_open_sync(&cm->rd, tv);
	if (c == NULL || c->err) {
		cl_row_err(cm->cs, 0, ERR_CONNECT);
		sl_warn("cluster: Redis at %s: %s; starting with on_redis_down: %s",
		    cm->redis, c ? c->errstr : "out of memory",
		    sl_redis_down_name(cm->down_mode));
		goto out;
	}
	if (cl_redis_auth_sync(&cm->rd, c) == -1)
		goto out;
	if (cm->sent != NULL) {
		r = redisCommand(c, "ROLE");
		if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
		    r->element[0]->type == REDIS_REPLY_STRING &&
		    strcmp(r->element[0]->str, "master") != 0) {
			cl_row_err(cm->cs, 0, ERR_REPLY);
			sl_warn("cluster: %s is not a master (ROLE: %s); starting with "
			    "on_redis_down: %s", cm->redis, r->element[0]->str,
			    sl_redis_down_name(cm->down_mode));
			freeReplyObject(r);
			goto out;
		}
		freeReplyObject(r);
	}
	snprintf(ttl, sizeof(ttl), "%" PRIu64, cm->ttl_ms);
	r = redisCommand(c, "EVAL %s 1 %s %s %s 0 1", register_lua, NODES_KEY,
	    cm->node, ttl);
	if (register_reply(cm, r) == -1) {
		cl_row_err(cm->cs, 0, r == NULL ? ERR_TIMEOUT : ERR_REPLY);
		sl_warn("cluster: registering node %s at %s failed: %s; starting "
		    "with on_redis_down: %s", cm->node, cm->redis,
		    r ? (r->type == REDIS_REPLY_ERROR ? r->str : "bad reply") :
		    c->errstr, sl_redis_down_name(cm->down_mode));
		freeReplyObject(r);
		goto out;
	}
	freeReplyObject(r);
	cm->last_ack = sl_mono_s();
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

/* ---- the heartbeat: renew, re-add, register --------------------------- */

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
			struct cell *c = cl_cell_at(cs, r, i);
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

			cl_member_fmt(dst, MEMBER_MAX, cm->node, cm->cs->epoch, v[m].row,
			    v[m].i, CELL_GEN(v[m].word));
			argv[a++] = dst;
		}
		for (m = 0; m < a; m++)
			argl[m] = strlen(argv[m]);
		if (redisAsyncCommandArgv(cm->rd.ac, cb, cm, (int)a, argv, argl) !=
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
	struct cell *c = cl_cell_at(cm->cs, rc->row, rc->i);
	uint64_t w = CELL_WORD(CELL_GEN(rc->word), CELL_HELD);

	if (CELL_STATE(rc->word) != CELL_HELD)
		return 0;

	return atomic_compare_exchange_strong(&c->word, &w,
	    CELL_WORD(CELL_GEN(rc->word), CELL_LOCAL));
}

/*
 * Added: a stream admitted without Redis is held now. A stream that
 * ended while its lease was being added released it before the add
 * ran (its worker's ZREM, on another connection): remove it again,
 * or it would hold a slot until it expires.
 */
static void
round_settle_added(struct sl_cluster_m *cm)
{
	struct rcell *gone = NULL, *ng;
	size_t j, ngone = 0;

	for (j = 0; j < cm->nrc; j++) {
		struct cell *c = cl_cell_at(cm->cs, cm->rc[j].row, cm->rc[j].i);
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
	if (ngone > 0 && cm->rd.ac != NULL)
		send_grouped(cm, gone, ngone, NULL, cm_count_cb);
	free(gone);
}

/*
 * A round that re-added the node's leases after a loss, and registered:
 * admit through Redis again once as many nodes are back as before.
 */
static void
round_rejoined(struct sl_cluster_m *cm)
{
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
	round_settle_added(cm);
	if (cm->round_readd && cm->reg_exp != 0)
		round_rejoined(cm);
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
	if (cm->sent != NULL && cl_reply_not_master(reply))
		cm->not_master = 1;   /* dropped from the loop: ask again */
	if (cl_reply_is_error(reply)) {
		if (reply != NULL && call != NULL && call->v != NULL) {
			size_t j;

			/* One tenant's key: its streams, not the heartbeat. */
			for (j = 0; j < call->n; j++)
				call->v[j].failed = 1;
		} else
			cm->round_failed = 1;
		if (reply != NULL) {
			cl_row_err(cm->cs, 0, ERR_REPLY);
			cl_log_refusal(SL_LOG_WARN, "heartbeat", reply->str);
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
	if (redisAsyncCommandArgv(cm->rd.ac, cm_round_register_cb, cm, 8, argv,
	    argl) != REDIS_OK) {
		cm->round_failed = 1;   /* no heartbeat without it */
		if (cm->round_out == 0)
			round_free(cm);
		return;
	}
	cm->round_out++;
	round_call(cm, NULL, 0);
}

/* ---- the master's loop and self-fencing ------------------------------- */

int
sl_cluster_master_pollfds(struct sl_cluster_m *cm, struct pollfd *pfd, int max)
{
	int n;

	if (cm == NULL || max < 1)
		return 0;
	n = cl_redis_pollfd(&cm->rd, &pfd[0]);
	if (cm->sent != NULL && n < max)
		n += cl_sentinel_pollfd(cm->sent, &pfd[n]);
	return n;
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
	now = sl_mono_s();
#define EARLIER(x) do { d = (x) - now; if (d < 0) d = 0; \
	if (t < 0 || d < t) t = d; } while (0)
	if (cm->rd.ac == NULL)
		EARLIER(cm->connect_at);
	else if (!cm->rd.connected)
		EARLIER(cm->connect_deadline);
	else if (cm->round_out == 0)
		EARLIER(cm->next_hb);
	else
		EARLIER(cm->round_t0 + (double)cm->ttl_ms / 1000.0);
	if (atomic_load(&cm->cs->mode) == MODE_REDIS)
		EARLIER(fence_at(cm));
	if (cm->sent != NULL) {
		if ((d = cl_sentinel_timeout(cm->sent, now)) >= 0)
			EARLIER(now + d);
		if (cm->not_master || atomic_load(&cm->cs->reask) != 0)
			EARLIER(cm->reask_at);
	}
#undef EARLIER
	return t;
}

/*
 * The sentinels' side of a turn: a +switch-master heard, Redis answering
 * READONLY or LOADING on the master's connection, a worker that met one
 * of those. Each sends the node to the new master through a loss (the
 * re-add and the wait for the nodes known live, as after a restart).
 */
static void
cm_sentinels(struct sl_cluster_m *cm, const struct pollfd *pfd, int n,
    double now)
{
	char addr[80], who[80];

	cl_sentinel_service(cm->sent, pfd, n, now);
	if (cl_sentinel_switched(cm->sent, addr, sizeof(addr), who,
	    sizeof(who)) && strcmp(addr, cm->redis) != 0) {
		snprintf(cm->sw_from, sizeof(cm->sw_from), "%s", cm->redis);
		cm->sw_until = now + SWITCH_SETTLE_S;
		cm->sw_fresh = 1;
		cm_follow(cm, addr, who, "+switch-master");
		cl_redis_answered(&cm->rd);   /* no backoff: go there now */
		if (cm->rd.ac != NULL)
			cl_redis_drop(&cm->rd, "the Redis master switched");
		cm->connect_at = now;
		return;
	}
	if (now < cm->reask_at)
		return;
	if (cm->not_master) {
		cm->not_master = 0;
		cm->reask_at = now + 1.0;
		atomic_store(&cm->cs->reask, 0);
		if (cm->rd.ac != NULL)
			cl_redis_drop(&cm->rd, "Redis answers READONLY or LOADING: "
			    "not the master now");
		cm->connect_at = now;
	} else if (atomic_exchange(&cm->cs->reask, 0) != 0) {
		/* A worker's doubt: ask; a switch moves the node there. */
		cm->reask_at = now + 1.0;
		if (cl_sentinel_ask(cm->sent, cm->timeout_ms, addr, sizeof(addr),
		    who, sizeof(who)) == 0 && strcmp(addr, cm->redis) != 0 &&
		    !cm_stale(cm, addr, who)) {
			cm_follow(cm, addr, who, "asked");
			cl_redis_answered(&cm->rd);
			if (cm->rd.ac != NULL)
				cl_redis_drop(&cm->rd, "the Redis master switched");
			cm->connect_at = now;
		}
	}
}

void
sl_cluster_master_service(struct sl_cluster_m *cm, const struct pollfd *pfd,
    int n, double now)
{
	int nrd;

	if (cm == NULL)
		return;
	(void)now;
	now = sl_mono_s();
	nrd = n > 0 && cm->rd.ac != NULL && pfd[0].fd == cm->rd.ac->c.fd;
	if (nrd)
		cl_redis_handle(&cm->rd, &pfd[0]);
	if (cm->sent != NULL)
		cm_sentinels(cm, pfd + nrd, n - nrd, now);
	if (cm->rd.ac == NULL && now >= cm->connect_at)
		cm_connect(cm);
	if (cm->rd.ac != NULL && !cm->rd.connected && now >= cm->connect_deadline) {
		cl_row_err(cm->cs, 0, ERR_CONNECT);
		cl_redis_drop(&cm->rd, "connecting to Redis timed out");
	}
	if (cm->rd.ac != NULL && cm->rd.connected) {
		if (cm->round_out > 0 &&
		    now - cm->round_t0 > (double)cm->ttl_ms / 1000.0) {
			cl_row_err(cm->cs, 0, ERR_TIMEOUT);
			cl_redis_drop(&cm->rd, "Redis stopped answering the heartbeat");
		} else if (cm->round_out == 0 && now >= cm->next_hb) {
			cm->next_hb = now + (double)cm->hb_ms / 1000.0;
			cm_round(cm, now);
		}
	}
	/* Self-fencing: stop trusting leases before Redis expires them. */
	if (atomic_load(&cm->cs->mode) == MODE_REDIS && now >= fence_at(cm)) {
		cl_row_err(cm->cs, 0, ERR_FENCED);
		cm_set_mode(cm, MODE_DOWN,
		    "no acknowledged heartbeat within lease_ttl - 2 x heartbeat");
	}
}

/* ---- dead workers' rows ----------------------------------------------- */

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

	cl_redis_count_cb(ac, r, &cm->rd);
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
		struct cell *c = cl_cell_at(cs, row, i);

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
	cl_row_state(cs, row, ROW_UNUSED);
	fold_row(cs, row);
	if (n > 0) {
		if (n > 1)
			qsort(v, n, sizeof(*v), rcell_cmp);
		if (cm->rd.ac != NULL && cm->rd.connected) {
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
		cl_row_state(cm->cs, row, started ? ROW_STARTING : ROW_UNUSED);
}

/* ---- the node's view and metrics -------------------------------------- */

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
			if (CELL_STATE(atomic_load(&cl_cell_at((struct sl_cluster_shm *)cs,
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

const char *
sl_cluster_master_addr(const struct sl_cluster_m *cm)
{
	return cm->redis;
}

uint64_t
sl_cluster_failovers(const struct sl_cluster_m *cm)
{
	return atomic_load(&cm->cs->failovers);
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
		    PRIu64 "\n", cl_rtt_bounds[k], cum);
	}
	cum += b[RTT_BUCKETS];
	sl_str_printf(o, "sluice_cluster_rtt_seconds_bucket{le=\"+Inf\"} %" PRIu64
	    "\nsluice_cluster_rtt_seconds_sum %.6f\n"
	    "sluice_cluster_rtt_seconds_count %" PRIu64 "\n", cum,
	    (double)sum / 1e9, cum);
	sl_str_printf(o, "# HELP sluice_cluster_failovers_total Switches of the "
	    "Redis master the sentinels named (cluster.sentinels).\n"
	    "# TYPE sluice_cluster_failovers_total counter\n"
	    "sluice_cluster_failovers_total %" PRIu64 "\n",
	    sl_cluster_failovers(cm));
	sl_str_printf(o, "# HELP sluice_cluster_errors_total Failures talking "
	    "to Redis, by kind.\n# TYPE sluice_cluster_errors_total counter\n");
	for (k = 0; k < ERR_MAX; k++) {
		e = 0;
		for (r = 0; r < cs->rows; r++)
			e += atomic_load_explicit(&cs->row[r].errors[k],
			    memory_order_relaxed);
		sl_str_printf(o, "sluice_cluster_errors_total{kind=\"%s\"} %" PRIu64
		    "\n", cl_err_names[k], e);
	}
}
